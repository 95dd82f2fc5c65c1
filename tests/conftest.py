"""Fixtures shared by every test level.

* ``short_tmp``: a short directory under /tmp (ipc socket paths are limited
  to 107 bytes; pytest's tmp_path can be longer). Removed after the test.
* ``shm_clean``: yields this test process's ring instance tag; fails the test
  if it leaves a ``/dev/shm/brisvox.<instance>.*`` segment of that instance
  behind, and removes them either way (other processes' segments are theirs).
* ``vrun``: run a coroutine function on virtual time.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def short_tmp():
    d = tempfile.mkdtemp(prefix="bv", dir="/tmp")
    try:
        yield Path(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def shm_clean():
    from ipc.ring import SHM_DIR, instance_id

    inst = instance_id()
    before = {p.name for p in SHM_DIR.glob(f"brisvox.{inst}.*")}
    yield inst
    left = sorted(p.name for p in SHM_DIR.glob(f"brisvox.{inst}.*") if p.name not in before)
    for name in left:
        (SHM_DIR / name).unlink(missing_ok=True)
    assert not left, f"test leaked shared-memory segments: {left}"


@pytest.fixture
def vrun():
    from brisvox.sim.vloop import run_virtual

    return run_virtual


def pytest_configure(config):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
