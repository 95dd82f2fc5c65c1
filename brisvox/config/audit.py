"""The file-mode audit of ``brisvoxd check``: secrets others can read, directories others can enter.

Owns the warnings (one line each, never fatal by themselves; ``brisvoxd check
--strict`` turns them into exit 1):

* a secret key (:data:`brisvox.config.secrets.SECRET_KEYS`) given inline in a
  config file that group or others may read;
* a secret given as ``K_file`` whose file group or others may read;
* a secret source that cannot be read here (``K_env`` unset, no
  ``$CREDENTIALS_DIRECTORY`` outside systemd): the check runs outside the
  service's environment, so this is worth a line, not an error;
* the runtime dir, the state dir (the daemonized log file, the default call
  records) or the call records' directory or ``.jsonl`` file with any access
  for group or others.

Invariants: the audit only reads (``stat`` and the config file), never creates
a directory, and never prints a secret value.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from brisvox.config.secrets import inline_secrets, secret_files

DOC = "docs/SECURITY.md"


def _readable_by_others(path: str | os.PathLike[str]) -> int | None:
    """The mode of ``path`` when group or others may read it, else None (also when absent)."""
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        return None
    return mode if mode & 0o044 else None


def secret_warnings(path: str | os.PathLike[str], data: dict[str, Any] | None = None) -> list[str]:
    """Inline secrets in a readable config file, and readable secret files."""
    if data is None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return []
    out = []
    mode = _readable_by_others(path)
    if mode is not None:
        for key in inline_secrets(data):
            out.append(f"{path}: {key} is inline in a file group or others can read (mode {mode:04o}): "
                       f"chmod 0600 {path} (owned by the daemon's user), or give it as "
                       f"{key.split('.')[-1]}_credential / _file / _env ({DOC})")
    for key, fpath in secret_files(data):
        fmode = _readable_by_others(fpath)
        if fmode is not None:
            out.append(f"{path}: {key}: {fpath} is readable by group or others (mode {fmode:04o}): chmod 0600 {fpath}")
    return out


def records_target(cfg: Any) -> Path | None:
    """Where the agent processes write call records (``[calls]``), None when they write none."""
    from brisvox.runtime.paths import state_dir

    calls = cfg.section("calls")
    if not calls.records:
        return None
    return Path(calls.path).expanduser() if calls.path else state_dir(cfg) / "calls"


def dir_warnings(cfg: Any) -> list[str]:
    """The runtime dir, the state dir and the call records' place when group or others can get in."""
    from brisvox.runtime.paths import loose_mode_problem, runtime_dir, state_dir

    places = [("daemon.runtime_dir", runtime_dir(cfg)), ("daemon.state_dir", state_dir(cfg))]
    target = records_target(cfg)
    if target is not None:
        places.append(("calls.path", target))
    out = []
    seen: set[Path] = set()
    for key, p in places:
        if p in seen:
            continue
        seen.add(p)
        problem = loose_mode_problem(p)
        if problem:
            out.append(f"{key}: {problem}")
    return out


def audit(cfg: Any, path: str | os.PathLike[str], unresolved: list[str]) -> list[str]:
    """Every warning of the audit, one line each (``unresolved``: from :func:`secrets.deferred`)."""
    return [*secret_warnings(path), *(f"{u} (in this environment; the daemon reads it at start)" for u in unresolved),
            *dir_warnings(cfg)]
