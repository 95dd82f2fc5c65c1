"""The load benchmark's CPU rows: server and load generator side by side, and the implied capacity.

The arithmetic under test: server CPU ms per call-second = CPU per call (a
fraction of one core) x 1000; implied calls per core = 1000 ms / that; on k
cores, k times it. The rows say "implied, not measured"; "held" is untouched.
"""

from __future__ import annotations

import pytest

from bench.loadgen import harness
from bench.loadgen.sampler import TreeSampler


def level(cpu_per_call: float, client: float | None) -> harness.Level:
    return harness.Level(n=10, summary={}, cpu_per_call=cpu_per_call, mem_per_call_mb=1.0, pss_idle_mb=1.0,
                         pss_load_mb=1.0, idle_cpu=0.0, processes=4, client_cpu_per_call=client)


def test_implied_capacity_is_1000_ms_over_server_ms_per_call_second():
    assert harness.implied_capacity(16.0, 2) == (62.5, 125.0)
    assert harness.implied_capacity(8.0, 1) == (125.0, 125.0)
    per_core, total = harness.implied_capacity(3.0, 4)
    assert per_core == pytest.approx(333.333, rel=1e-4) and total == pytest.approx(1333.333, rel=1e-4)
    assert harness.implied_capacity(0.0, 2) == (None, None)
    assert harness.implied_capacity(-1.0, 2) == (None, None)
    assert harness.implied_capacity(10.0, 0) == (None, None)


def test_cpu_rows_server_and_generator_and_implied():
    lv = level(0.016, 0.004)  # 16 ms server, 4 ms load generator per call-second
    assert lv.server_ms_per_call_s == pytest.approx(16.0)
    assert lv.client_ms_per_call_s == pytest.approx(4.0)
    rows = {r[0]: r for r in harness.cpu_rows("x N=10:", lv, cores=2)}
    assert rows["x N=10: server CPU per call-second (server processes only)"][1:3] == (16.0, "ms")
    assert rows["x N=10: load generator CPU per call-second (same machine, not subtracted)"][1] == 4.0
    assert rows["x N=10: load generator share of the measured CPU"][1] == 20.0
    implied = {k: v for k, v in rows.items() if "implied" in k}
    assert len(implied) == 2 and all("not measured" in k for k in implied)
    assert rows["x N=10: implied calls per core (1000 ms / server CPU per call-second; implied, not measured)"][1] \
        == 62.5
    assert rows["x N=10: implied calls on 2 cores serving only the server (implied, not measured)"][1] == 125
    assert lv.held is False  # the rows never change the measured verdict


def test_cpu_rows_without_a_generator_sample_and_zero_cpu():
    rows = {r[0]: r[1] for r in harness.cpu_rows("x:", level(0.0, None), cores=3)}
    assert rows["x: load generator CPU per call-second (same machine, not subtracted)"] is None
    assert not any("share" in k for k in rows)
    assert rows["x: implied calls on 3 cores serving only the server (implied, not measured)"] is None


def test_usable_cores_is_the_runtimes():
    from brisvox.runtime.cpu import usable_cores

    assert harness.usable_cores() == usable_cores()  # the affinity, at most the cgroup's CPU quota


def test_generator_cpu_is_the_windowed_difference_of_its_samples():
    """What measure_level divides by the call-seconds: the interpolated CPU between the window's ends."""
    s = TreeSampler([])
    s.cpu = [(0.0, 1.0, 1), (1.0, 1.5, 1), (2.0, 2.5, 1)]
    assert s.cpu_seconds(0.5, 2.0) == pytest.approx(2.5 - 1.25)
    assert s.cpu_seconds(3.0, 5.0) == 0.0  # after the last sample: nothing more


@pytest.mark.serial  # CPU time of a child
def test_a_sampler_given_its_root_later_samples_that_process():
    """run_loadgen hands the generator's pid to a root-less sampler after the spawn."""
    import subprocess
    import sys
    import time

    s = TreeSampler([], interval=0.05)
    p = subprocess.Popen([sys.executable, "-c",
                          "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"])
    t0 = time.monotonic()
    s.roots = [p.pid]
    s.start()
    p.communicate(timeout=10)
    s.stop()
    assert 0.2 <= s.cpu_seconds(t0, time.monotonic()) <= 1.0
