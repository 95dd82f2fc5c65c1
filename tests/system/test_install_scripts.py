"""The install steps fail with one line naming what failed and the command that fixes it.

Runs the real scripts (``scripts/install-apt.sh``, ``scripts/install-venv.sh``)
the way ``make install`` does, against failures made here without touching
the machine: a Python that does not exist, a dependency no index has (pip with
``--no-index`` and an empty find-links folder, so nothing is downloaded), and
``apt-get`` answering as it does for a package that does not exist (a stand-in
first on PATH; ``dpkg-query`` is the real one).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.system, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


def one_line(stderr: str) -> str:
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


BACKEND = """\
# a PEP 517 backend of a project whose only dependency no index has (metadata only)
import os


def get_requires_for_build_editable(config_settings=None):
    return []


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    d = os.path.join(metadata_directory, "fake_app-0.1.dist-info")
    os.makedirs(d)
    with open(os.path.join(d, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\\nName: fake-app\\nVersion: 0.1\\nRequires-Dist: {dep}\\n")
    return "fake_app-0.1.dist-info"


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    raise RuntimeError("never reached: the dependency cannot be resolved")
"""


def project(tmp_path: Path, dependency: str) -> Path:
    """A project laid out as brisvox's is for the venv script, with an in-tree build backend."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "install-venv.sh", tmp_path / "scripts")
    (tmp_path / "pyproject.toml").write_text(
        '[build-system]\nrequires = []\nbuild-backend = "fake_backend"\nbackend-path = ["."]\n')
    (tmp_path / "fake_backend.py").write_text(BACKEND.format(dep=dependency))
    (tmp_path / "constraints.txt").write_text("")
    return tmp_path


def test_a_missing_python_is_named_with_its_fix(tmp_path: Path) -> None:
    d = project(tmp_path, "orjson")
    p = subprocess.run(["bash", "scripts/install-venv.sh", "python3.99-not-here", "local"], cwd=d,
                       capture_output=True, text=True, timeout=30)
    line = one_line(p.stderr)
    assert p.returncode == 1 and "'python3.99-not-here' not found" in line and "apt-get install python3" in line


def test_a_dependency_pip_cannot_get_is_named_with_its_fix(tmp_path: Path) -> None:
    d = project(tmp_path, "zzz-no-such-distribution-brisvox")
    empty = tmp_path / "wheels"
    empty.mkdir()
    # offline: the venv's pip sees no index and an empty folder, and asks the in-tree backend
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(empty)}
    p = subprocess.run(["bash", "scripts/install-venv.sh", sys.executable, "local"], cwd=d, env=env,
                       capture_output=True, text=True, timeout=150)
    line = one_line(p.stderr)
    assert p.returncode == 1 and line.startswith("install: pip could not install"), line
    assert "zzz-no-such-distribution-brisvox" in line and "for zzz-no-such-distribution-brisvox's error" in line
    assert "(log: .venv-install.log)" in line and "make install" in line
    assert (d / ".venv-install.log").is_file()  # pip's whole output is kept for the reader


def test_a_debian_package_apt_cannot_find_is_named_with_its_fix(tmp_path: Path) -> None:
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text('#!/bin/sh\n[ "$1" = update ] && exit 0\n'
                                  'echo "E: Unable to locate package brisvox-no-such-pkg" >&2\nexit 100\n')
    (fake / "apt-get").chmod(0o755)
    (fake / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (fake / "sudo").chmod(0o755)
    lst = tmp_path / "apt-packages.txt"
    lst.write_text("# test\nbrisvox-no-such-pkg\nbrisvox-test-only-pkg  test\n")
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "BRISVOX_APT_LIST": str(lst)}
    p = subprocess.run(["bash", str(ROOT / "scripts" / "install-apt.sh"), "run"], env=env,
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 1
    line = one_line(p.stderr)
    assert "brisvox-no-such-pkg" in line and "Unable to locate package" in line and "apt-get install" in line
    assert "brisvox-test-only-pkg" not in p.stdout + p.stderr  # the run profile skips test packages
    bad = subprocess.run(["bash", str(ROOT / "scripts" / "install-apt.sh"), "nightly"], env=env,
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "unknown profile" in one_line(bad.stderr)
