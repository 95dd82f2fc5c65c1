"""Secret values of ``brisvoxd.toml``: inline, from the environment, a file or a systemd credential.

Owns how a secret config key gets its value, for every section that has one
(:data:`SECRET_KEYS`), and for the provider API keys of the agent files
(:func:`credential`). A secret key ``K`` of a section can be given in exactly
one of four forms::

    K = "s3cret"                  # inline (the file must then be owner-only)
    K_env = "VAR"                 # the environment variable VAR, read at start
    K_file = "/etc/brisvox/k"     # the file's content, read at start
    K_credential = "name"         # $CREDENTIALS_DIRECTORY/name (systemd LoadCredential=)

Invariants:

* :func:`resolve_secrets` returns the table with every ``K_env``/``K_file``/
  ``K_credential`` key removed and ``K`` set to the value read, so a section
  parser sees only ``K``; a table without those forms is returned unchanged.
* An inline ``K = ""`` means "not set" and does not count as a form; two
  non-empty forms of one key are a :class:`ConfigError` naming the second.
* A value read from a source is never empty: a missing variable, an unset
  ``$CREDENTIALS_DIRECTORY``, an unreadable or empty file or an empty value
  is a :class:`ConfigError` naming the dotted key of the form
  (``websocket.native_secret_file``) and what to fix. Surrounding whitespace
  (a file's trailing newline) is stripped. Files are read once, at parse
  time: at start and at each reload, in the supervisor; the children inherit
  the parsed values across ``fork``.
* Inside :func:`deferred` (``brisvoxd check`` and the CLI commands that only
  need the runtime dir, run outside the service's environment) a source that
  cannot be read is recorded in the yielded list instead of raised, and ``K``
  is set to :data:`UNRESOLVED` (so checks that a secret is configured still
  pass; the value is never used to authenticate: ``brisvoxd start`` and
  reload parse strictly); structural errors (two forms, a wrong type, a
  relative path, a bad credential name) still raise.
* Nothing here logs or formats a secret value.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from brisvox.config.errors import ConfigError

# section -> its keys that hold secrets (each may take the _env/_file/_credential forms)
SECRET_KEYS: dict[str, tuple[str, ...]] = {
    "websocket": ("native_secret", "twilio_auth_token", "plivo_auth_token"),
}
FORMS = ("env", "file", "credential")
CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"
MAX_SECRET_BYTES = 64 * 1024
UNRESOLVED = "(unresolved secret)"  # the stand-in value inside deferred()

_DEFERRED: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("brisvox_deferred_secrets",
                                                                            default=None)


@contextlib.contextmanager
def deferred() -> Iterator[list[str]]:
    """Parse configs without failing on unreadable secret sources; yields the problems found."""
    problems: list[str] = []
    token = _DEFERRED.set(problems)
    try:
        yield problems
    finally:
        _DEFERRED.reset(token)


def _read_file(path: Path, key: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as e:
        raise ConfigError(key, f"cannot read {path}: {e.strerror}") from None
    if len(data) > MAX_SECRET_BYTES:
        raise ConfigError(key, f"{path} is larger than {MAX_SECRET_BYTES} bytes: not a secret")
    try:
        return data.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(key, f"{path} is not UTF-8 text") from None


def credential_path(name: str, key: str, env: Mapping[str, str] | None = None) -> Path:
    """``$CREDENTIALS_DIRECTORY/<name>``; ConfigError when the directory is not set."""
    env = os.environ if env is None else env
    directory = env.get(CREDENTIALS_ENV, "")
    if not directory:
        raise ConfigError(key, f"${CREDENTIALS_ENV} is not set: credential {name!r} exists only in a "
                               "systemd service with LoadCredential= (give the secret another way elsewhere)")
    return Path(directory) / name


def _check_name(value: Any, key: str, what: str) -> str:
    if type(value) is not str or not value:
        raise ConfigError(key, f"expected {what}, got {value!r}")
    return value


def _read_source(form: str, ref: str, key: str, env: Mapping[str, str]) -> str:
    """The secret a ``K_<form> = ref`` names; ConfigError naming ``key`` when it cannot be read."""
    if form == "env":
        if ref not in env:
            raise ConfigError(key, f"environment variable {ref} is not set")
        value = env[ref].strip()
        where = f"environment variable {ref}"
    elif form == "file":
        value = _read_file(Path(ref), key)
        where = ref
    else:
        path = credential_path(ref, key, env)
        value = _read_file(path, key)
        where = str(path)
    if not value:
        raise ConfigError(key, f"{where} is empty")
    return value


def _check_ref(form: str, ref: Any, key: str) -> str:
    if form == "env":
        return _check_name(ref, key, "the name of an environment variable")
    if form == "file":
        ref = _check_name(ref, key, "an absolute file path")
        if not Path(ref).is_absolute():
            raise ConfigError(key, f"expected an absolute file path, got {ref!r}")
        return str(ref)
    ref = _check_name(ref, key, "a credential name")
    if "/" in ref or ref in (".", ".."):
        raise ConfigError(key, f"expected a credential name (no '/'), got {ref!r}")
    return str(ref)


def resolve_secrets(table: Mapping[str, Any] | None, where: str, keys: Iterable[str],
                    env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``table`` with each secret key's ``_env``/``_file``/``_credential`` form read into the key."""
    out = dict(table or {})
    env = os.environ if env is None else env
    collect = _DEFERRED.get()
    for k in keys:
        given = [f"{k}_{form}" for form in FORMS if f"{k}_{form}" in out]
        if not given:
            continue
        inline = out.get(k)
        if inline not in (None, ""):
            raise ConfigError(f"{where}.{given[0]}", f"give only one of {k}, {', '.join(given)}")
        if len(given) > 1:
            raise ConfigError(f"{where}.{given[1]}", f"give only one of {', '.join(given)}")
        name = given[0]
        form = name[len(k) + 1:]
        key = f"{where}.{name}"
        ref = _check_ref(form, out.pop(name), key)
        try:
            out[k] = _read_source(form, ref, key, env)
        except ConfigError as e:
            if collect is None:
                raise
            collect.append(str(e))
            out[k] = UNRESOLVED
    return out


def credential(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The systemd credential ``name`` (``$CREDENTIALS_DIRECTORY/<name>``), or None when absent.

    Used for provider API keys: a key variable that is not set in the
    environment is looked up as a credential of the same name. Unreadable or
    empty counts as absent (the caller reports the missing key).
    """
    env = os.environ if env is None else env
    directory = env.get(CREDENTIALS_ENV, "")
    if not directory or not name or "/" in name:
        return None
    try:
        return _read_file(Path(directory) / name, name) or None
    except ConfigError:
        return None


def inline_secrets(data: Mapping[str, Any]) -> list[str]:
    """Dotted keys of the secrets given inline (non-empty) in a parsed TOML document."""
    found = []
    for section, keys in SECRET_KEYS.items():
        table = data.get(section)
        if not isinstance(table, dict):
            continue
        found += [f"{section}.{k}" for k in keys if isinstance(table.get(k), str) and table[k]]
    return found


def secret_files(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """``(dotted key, path)`` of every secret given as ``K_file`` in a parsed TOML document."""
    found = []
    for section, keys in SECRET_KEYS.items():
        table = data.get(section)
        if not isinstance(table, dict):
            continue
        found += [(f"{section}.{k}_file", table[f"{k}_file"]) for k in keys
                  if isinstance(table.get(f"{k}_file"), str) and table[f"{k}_file"]]
    return found
