"""Bad-input logging stays bounded: first occurrence per site, then one line per interval with
the count suppressed, bounded sites, never raises."""

from __future__ import annotations

import logging

from brisvox.runtime.log_limit import OVERFLOW, LogLimiter


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_first_then_counted_then_one_line_per_interval(caplog) -> None:
    clock = Clock()
    lim = LogLimiter(logging.getLogger("t.limit"), interval_s=10.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="t.limit"):
        out = [lim("sip_parse", "bad datagram from %s", f"1.2.3.{i}") for i in range(1000)]
        clock.t = 11.0
        out.append(lim("sip_parse", "bad datagram from %s", "9.9.9.9"))
    assert out.count(True) == 2 and lim.lines == 2
    assert lim.suppressed == {"sip_parse": 999}
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs[0] == "bad datagram from 1.2.3.0"
    assert msgs[1].startswith("bad datagram from 9.9.9.9 (999 more like it")


def test_sites_are_bounded_and_a_bad_format_never_raises() -> None:
    lim = LogLimiter(logging.getLogger("t.limit2"), max_sites=3, clock=Clock())
    for i in range(10):
        lim(f"site{i}", "x")
    assert len(lim._last) == 4 and OVERFLOW in lim._last
    assert lim("fmt", "%d %d", "only one") in (True, False)
