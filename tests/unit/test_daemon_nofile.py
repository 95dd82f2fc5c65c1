"""The daemon's file limit (brisvox/daemon/nofile.py), its report, and the metrics endpoint's accept errors."""

from __future__ import annotations

import errno
import logging
import os
import resource
import socket

import pytest

from brisvox.daemon import nofile
from brisvox.daemon.httpd import ACCEPT_PAUSE_S, MiniHttp
from brisvox.daemon.metrics import render
from brisvox.daemon.nofile import LOW_NOFILE, NofileLimit, check_line, describe, plan
from brisvox.runtime.log_limit import LogLimiter
from tests.system.daemon_promparse import parse, value

INF = resource.RLIM_INFINITY


def test_plan_raises_the_soft_limit_to_the_hard_one_and_never_lowers_it():
    assert plan(1024, 65536, 1 << 20) == 65536
    assert plan(65536, 65536, 1 << 20) == 65536
    assert plan(1024, INF, 1 << 20) == 1 << 20  # an infinite hard limit: the kernel's nr_open
    assert plan(INF, INF, 1 << 20) == INF
    assert plan(4096, 2048, 1 << 20) == 4096  # never lower (a soft above the hard cannot happen, but)


def _in_a_child(fn) -> tuple[int, int]:
    """Run ``fn`` in a forked child (it changes the process's limit); returns what the child reported."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            got = fn()
            os.write(w, f"{got[0]} {got[1]}".encode())
        finally:
            os._exit(0)
    os.close(w)
    data = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    soft, hard = data.split()
    return int(soft), int(hard)


def test_raise_nofile_lifts_a_1024_soft_limit_to_the_hard_one_and_says_so():
    soft0, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != INF and hard <= 1024:
        pytest.skip(f"the hard limit here is {hard}")

    def lowered_then_raised() -> tuple[int, int]:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        lim = nofile.raise_nofile()
        assert lim.before == 1024 and not lim.error
        warn, line = describe(lim)
        assert f"raised from 1024 to {lim.soft}" in line and warn == lim.low
        return resource.getrlimit(resource.RLIMIT_NOFILE)

    soft, got_hard = _in_a_child(lowered_then_raised)
    assert got_hard == hard and soft == (hard if hard != INF else int(nofile.NR_OPEN.read_text()))
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft0, hard)  # the test process untouched


def test_nofile_of_reads_another_process_and_none_for_a_gone_one():
    pid = os.fork()
    if pid == 0:
        os.read(os.pipe()[0], 1)  # blocks until killed
        os._exit(0)
    try:
        assert nofile.nofile_of(pid) == resource.getrlimit(resource.RLIMIT_NOFILE)
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert nofile.nofile_of(pid) is None


def test_a_low_hard_limit_is_a_warning_naming_the_fix():
    warn, line = describe(NofileLimit(1024, 1024, 1024))
    assert warn and f"below {LOW_NOFILE}" in line and "LimitNOFILE=" in line
    warn, line = describe(NofileLimit(65536, 65536, 1024))
    assert not warn and "raised from 1024 to 65536" in line
    warn, line = check_line(NofileLimit(65536, 65536, 1024))
    assert not warn and "soft 1024, hard 65536" in line and "raises the soft limit to 65536" in line
    warn, _ = describe(NofileLimit(1024, 65536, 1024, "setrlimit(65536): denied"))
    assert warn


def test_metrics_show_each_process_nofile_limit():
    snap = {"daemon": {"uptime_s": 1.0, "state": "running", "ready": True, "calls": 0,
                       "nofile": {"soft": 65536, "hard": 65536, "before": 1024, "error": ""}},
            "children": [{"role": "worker", "index": 0, "name": "worker-0", "pid": 5, "state": "ready",
                          "restarts": 0, "boot_failures": 0, "hung": 0, "memory_restarts": 0, "pss_bytes": None,
                          "uptime_s": 1.0, "calls": 0, "beat_ms": -1, "nofile": {"soft": 65536, "hard": 65536}}]}
    fams = parse(render(snap))
    assert value(fams, "brisvox_nofile_limit", role="supervisor", index="0", limit="soft") == 65536
    assert value(fams, "brisvox_nofile_limit", role="worker", index="0", limit="hard") == 65536


class _FailingListener:
    """A listener whose accept() fails like a process out of file descriptors."""

    def __init__(self, real: socket.socket) -> None:
        self.real = real
        self.calls = 0

    def fileno(self) -> int:
        return self.real.fileno()

    def accept(self):
        self.calls += 1
        raise OSError(errno.EMFILE, "Too many open files")

    def close(self) -> None:
        self.real.close()


def test_accept_out_of_descriptors_is_counted_logged_once_and_pauses_the_listener(caplog):
    limiter = LogLimiter(logging.getLogger("brisvox.supervisor"))
    http = MiniHttp("127.0.0.1", 0, lambda m, p: (200, "text/plain", b"ok"), log_limit=limiter)
    fake = _FailingListener(http.listener)
    http.listener = fake  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.ERROR, logger="brisvox.supervisor"):
            now = 100.0
            for i in range(50):  # the loop wakes 50 times with the listener readable
                http.handle({fake.fileno(): 1}, now + i * 0.01)
        # paused after the first failure: no busy accept loop, one line, all counted
        assert fake.calls == 2  # at 100.0, and once more after the 0.25 s pause
        assert http.refused()["accept_error"] == 2
        lines = [r for r in caplog.records if "accept() failed" in r.getMessage()]
        assert len(lines) == 1 and limiter.suppressed == {"metrics_accept": 1}
        paused_until = http.next_deadline()  # the loop's poll wakes for the end of the pause
        assert paused_until is not None and 100.49 < paused_until <= 100.49 + ACCEPT_PAUSE_S
        assert fake.fileno() not in dict(http.poll_items(paused_until - 0.01))
        assert fake.fileno() in dict(http.poll_items(paused_until))
    finally:
        http.close()
