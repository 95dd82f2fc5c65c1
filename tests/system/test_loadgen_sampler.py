"""The load benchmark's process-tree sampler: CPU split by process role (real processes)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from bench.loadgen.sampler import TreeSampler

BURN = """
import sys, time, setproctitle
setproctitle.setproctitle(sys.argv[1])
end = time.process_time() + float(sys.argv[2])
while time.process_time() < end:
    pass
time.sleep(30)
"""


@pytest.mark.serial  # CPU time per role
def test_cpu_is_split_by_role_from_the_process_title() -> None:
    procs = [subprocess.Popen([sys.executable, "-c", BURN, title, burn])
             for title, burn in (("brisvoxd: worker 0", "0.6"), ("brisvoxd: agent 1", "0.1"))]
    try:
        sampler = TreeSampler([p.pid for p in procs], interval=0.05)
        t0 = time.monotonic()
        sampler.start()
        time.sleep(1.5)  # both finish burning well inside the window
        sampler.stop()
        t1 = time.monotonic()
        roles = sampler.cpu_by_role(t0, t1)
        assert set(roles) == {"worker", "agent"}
        assert roles["worker"] > 0.4  # its 0.6 s, less what it burned before the first sample
        assert roles["agent"] < 0.2
        assert roles["worker"] + roles["agent"] <= sampler.cpu_seconds(t0, t1) + 0.05
    finally:
        for p in procs:
            p.kill()
            p.wait(5)
