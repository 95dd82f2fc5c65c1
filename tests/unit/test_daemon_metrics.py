"""/metrics rendering: strict Prometheus text, escaped labels, every role x state present."""

from __future__ import annotations

from brisvox.daemon.metrics import render
from tests.system.daemon_promparse import PromError, parse, value


def snapshot() -> dict:
    child = {
        "role": "worker", "index": 1, "name": "worker-1", "pid": 42, "state": "ready", "uptime_s": 3.5,
        "restarts": 2, "boot_failures": 0, "pss_bytes": 10 << 20, "calls": 3, "beat_ms": 120,
        "hung": 1, "memory_restarts": 0, "events": {'odd"kind\\': 2},
        "stats": {"ticks": 10, "nested": {"a b": 1.5, "flag": True}, "text": "ignored",
                  "decode_errors": {"malformed": 4}},
    }
    failed = dict(child, index=0, name="worker-0", state="failed", pss_bytes=None, beat_ms=-1, stats=None,
                  events={})
    return {
        "daemon": {"uptime_s": 9.0, "state": "running", "ready": True, "calls": 3, "pss_bytes": 5 << 20,
                   "decode_errors": {"supervisor": {"unknown_peer": 1}, "control": {}},
                   "log_lines": {"worker": 7}, "http_requests": 2},
        "children": [failed, child],
    }


def test_render_parses_strictly_with_the_expected_values():
    fams = parse(render(snapshot()))
    assert value(fams, "brisvox_up") == 1
    assert value(fams, "brisvox_children", role="worker", state="failed") == 1
    assert value(fams, "brisvox_children", role="gateway", state="ready") == 0
    assert value(fams, "brisvox_child_restarts_total", role="worker", index="1") == 2
    assert value(fams, "brisvox_child_heartbeat_age_seconds", role="worker", index="1") == 0.12
    assert value(fams, "brisvox_child_stat", role="worker", index="1", stat="nested.a_b") == 1.5
    assert value(fams, "brisvox_child_stat", role="worker", index="1", stat="nested.flag") == 1
    assert value(fams, "brisvox_child_events_total", role="worker", index="1", kind='odd"kind\\') == 2
    assert value(fams, "brisvox_decode_errors_total", process="worker-1", kind="malformed") == 4
    assert value(fams, "brisvox_decode_errors_total", process="supervisor", kind="unknown_peer") == 1
    assert value(fams, "brisvox_log_lines_total", role="worker") == 7
    # absent readings produce no series rather than a fake zero
    assert ("brisvox_child_memory_pss_bytes", (("index", "0"), ("role", "worker"))) not in \
        fams["brisvox_child_memory_pss_bytes"]["samples"]
    for name, fam in fams.items():
        assert fam["help"] and fam["type"] in ("gauge", "counter", "histogram")
        assert (fam["type"] == "counter") == name.endswith("_total")


def test_the_strict_parser_rejects_what_scrapers_would_choke_on():
    bad = [
        "x 1",  # no trailing newline
        "x 1\n",  # no TYPE
        "# TYPE x gauge\nx{a=\"\\q\"} 1\n",  # illegal escape
        "# TYPE x gauge\nx 1\nx 2\n",  # duplicate series
        "# TYPE x gauge\nx one\n",  # bad value
        "# TYPE x gauge\n# TYPE y gauge\ny 1\nx 1\n",  # not contiguous
    ]
    for text in bad:
        try:
            parse(text)
        except PromError:
            continue
        raise AssertionError(f"accepted {text!r}")
