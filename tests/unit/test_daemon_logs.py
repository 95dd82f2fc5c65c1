"""Log lines: JSON records tagged with role and pid, and the supervisor's line forwarder."""

from __future__ import annotations

import logging
import os

import orjson

from brisvox.daemon.logs import MAX_LINE, JsonFormatter, LineForwarder, wrap_line


def test_json_formatter_tags_role_name_pid():
    rec = logging.LogRecord("brisvox.x", logging.WARNING, __file__, 1, "hello %s", ("there",), None)
    d = orjson.loads(JsonFormatter("worker", "worker-2").format(rec))
    assert d["role"] == "worker" and d["name"] == "worker-2" and d["pid"] == os.getpid()
    assert d["level"] == "warning" and d["msg"] == "hello there" and d["logger"] == "brisvox.x"


def test_wrap_line_passes_json_and_wraps_the_rest():
    assert wrap_line(b'{"a":1}\n', "agent", "agent-0", 5, "json") == b'{"a":1}\n'
    d = orjson.loads(wrap_line(b"Segmentation fault\n", "agent", "agent-0", 5, "json"))
    assert d["msg"] == "Segmentation fault" and d["role"] == "agent" and d["pid"] == 5
    text = wrap_line(b'{"ts":0,"level":"error","name":"worker-1","pid":9,"logger":"l","msg":"m"}\n',
                     "worker", "worker-1", 9, "text")
    assert b"ERROR" in text and b"worker-1[9]" in text and text.endswith(b"m\n")


def test_forwarder_joins_partial_lines_and_cuts_long_ones():
    r, w = os.pipe()
    out_r, out_w = os.pipe()
    fwd = LineForwarder(r, "worker", "worker-0", 77, "json", out_fd=out_w)
    os.write(w, b"first par")
    assert fwd.pump() and fwd.lines == 0
    os.write(w, b"t\nsecond\n" + b"x" * (MAX_LINE + 10) + b"\n")
    assert fwd.pump()
    os.write(w, b"unterminated")
    os.close(w)
    assert not fwd.pump()  # EOF
    fwd.close()
    os.close(out_w)
    data = b""
    while chunk := os.read(out_r, 1 << 20):
        data += chunk
    os.close(out_r)
    lines = [orjson.loads(x) for x in data.splitlines()]
    assert [x["msg"][:6] for x in lines] == ["first ", "second", "x" * 6, "unterm"]
    assert len(lines[2]["msg"]) == MAX_LINE  # cut
    assert lines[0]["msg"] == "first part" and all(x["pid"] == 77 for x in lines)
    assert fwd.cut == 1
