"""Fixtures shared by every test level.

* ``short_tmp``: a short directory under /tmp (ipc socket paths are limited
  to 107 bytes; pytest's tmp_path can be longer). Removed after the test.
* ``shm_clean``: yields this test process's ring instance tag; fails the test
  if it leaves a ``/dev/shm/brisvox.<instance>.*`` segment of that instance
  behind, and removes them either way (other processes' segments are theirs).
* ``vrun``: run a coroutine function on virtual time.
* the speech fixtures (``scripts/make_fixtures.py``, ``tests/fixtures/generated/``) are built
  before the first system or e2e test of the process: many tests read the WAV files directly,
  and under pytest-xdist no order makes a test that builds them run first (``ensure`` holds
  an flock, so parallel workers build them once).

``make test`` runs the tests marked ``serial`` (wall-clock timing) alone, then those marked
``serial_light`` a few at a time, then the others in pytest-xdist workers (``-n``, ``--dist loadfile``); what a test binds or creates is unique per
process (ports: ``tests/system/gateway_harness.free_port``; shared memory: the instance tag;
directories: ``short_tmp``, ``tmp_path``). Under ``--dist loadfile`` the files of
``LOCAL_MODELS`` (real-time calls through, or CPU-bound runs of, the local Whisper / LLM /
Piper / Smart Turn models) are one unit of work, so they never run at the same time as each
other, and the files go out in ``_schedule_rank`` order (collection order within a rank):
those files first, then the system and e2e tests that mostly wait, then the CPU-bound rest.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
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


@pytest.fixture(scope="session", autouse=True)
def _speech_fixtures(request):
    heavy = (ROOT / "tests" / "system", ROOT / "tests" / "e2e")
    if any(Path(item.path).is_relative_to(d) for item in request.session.items for d in heavy):
        spec = importlib.util.spec_from_file_location("make_fixtures", ROOT / "scripts" / "make_fixtures.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        try:
            mod.ensure()
        except (OSError, subprocess.CalledProcessError):  # no espeak-ng or sox: the tests that read them say so
            pass


@pytest.fixture
def vrun():
    from brisvox.sim.vloop import run_virtual

    return run_virtual


LOCAL_MODELS = frozenset({
    "tests/e2e/test_e2e_calls.py",
    "tests/e2e/test_local_stack.py",
    "tests/e2e/test_local_llm_prefix.py",
    "tests/e2e/test_local_stt_early.py",
    "tests/e2e/test_warm_transfer_spoken.py",
    "tests/e2e/test_worker_models.py",
    "tests/e2e/test_worker_smart_turn_accuracy.py",
    "tests/system/test_playground.py",
})


def _schedule_rank(scope: str) -> int:
    if scope == "local models":
        return 0
    return 1 if scope.startswith(("tests/system/", "tests/e2e/")) else 2


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LocalModelsTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return "local models" if path in LOCAL_MODELS else path

        def _assign_work_unit(self, node) -> None:
            if self.workqueue:  # the first file of the lowest rank goes next
                self.workqueue.move_to_end(min(self.workqueue, key=_schedule_rank), last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # collection order within a rank
    return LocalModelsTogether(config, log)


def pytest_configure(config):
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
