"""The local LLM's threads per generation (workers/local_llm.py, SpareCores): one per core the
host left idle between the previous generation's end and this one's start, never the
generation's own time counted as load, one thread when nothing is known."""

from __future__ import annotations

import pytest

from workers.local_llm import SPARE_WINDOW_S, SpareCores


class Host:
    """A host clock and its idle-time counter (seconds of idle CPU summed over the cores)."""

    def __init__(self) -> None:
        self.t = 100.0
        self.idle_s = 5000.0

    def run(self, seconds: float, busy_cores: float, cores: int = 2) -> None:
        self.t += seconds
        self.idle_s += seconds * (cores - busy_cores)


@pytest.fixture
def host() -> Host:
    return Host()


def test_nothing_known_before_the_first_generation_ended_one_thread(host: Host) -> None:
    s = SpareCores(clock=lambda: host.t, idle=lambda: host.idle_s, cores=2)
    assert s.threads(2) == 1  # no mark yet
    s.mark()
    host.run(SPARE_WINDOW_S / 2, 0.0)
    assert s.threads(2) == 1  # back to back: too short to tell


def test_a_quiet_gap_gives_two_threads_a_loaded_one_one(host: Host) -> None:
    s = SpareCores(clock=lambda: host.t, idle=lambda: host.idle_s, cores=2)
    s.mark()
    host.run(4.0, 0.3)  # a caller speaking: VAD ticks, Smart Turn, Piper's tail
    assert s.spare() == pytest.approx(1.7)
    assert s.threads(2) == 2
    s.mark()
    host.run(1.0, 2.0)  # the generation itself (two threads), then the next one at once
    s.mark()  # its end: its own time is not in the next gap
    host.run(3.0, 0.5)
    assert s.threads(2) == 2
    s.mark()
    host.run(3.0, 0.8)  # other calls' Whisper and Piper: 1.2 cores idle
    assert s.threads(2) == 1
    s.mark()
    host.run(3.0, 1.9)
    assert s.threads(2) == 1


def test_the_bound_the_cores_and_a_one_core_host(host: Host) -> None:
    four = SpareCores(clock=lambda: host.t, idle=lambda: host.idle_s, cores=4)
    four.mark()
    host.run(2.0, 0.0, cores=4)
    assert four.threads(2) == 2 and four.threads(8) == 4 and four.threads(1) == 1
    one = SpareCores(clock=lambda: host.t, idle=lambda: host.idle_s, cores=1)
    one.mark()
    host.run(2.0, 0.0, cores=1)
    assert one.threads(2) == 1


def test_the_host_reading_is_real() -> None:
    s = SpareCores()  # psutil's cpu_times and this process's affinity
    assert s.cores >= 1
    s.mark()
    assert 0.0 <= s.spare() <= s.cores
