"""A real daemon with ``[tracing] exporter = "otlp"`` sends each call's trace to an OTLP/HTTP
collector (a loopback HTTP server here, decoding the protobuf the SDK posts): the call span
and its turns, with the call id, and no transcript in any attribute.

One WebSocket call with the scripted providers (the same as tests/system/test_call_daemon.py),
a barge-in included.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import orjson
import pytest
import soundfile as sf
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.harness.call_daemon import SPEECH, config
from bench.harness.daemon import Daemon, ws_port
from brisvox.sim.ws_caller import ANSWER, SECOND, one_call

pytestmark = pytest.mark.system

USER = ["what time do you close", "wait a moment"]


class Collector(BaseHTTPRequestHandler):
    got: list[ExportTraceServiceRequest] = []

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        Collector.got.append(req)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return


def spans() -> list[tuple[str, dict[str, object], bytes, bytes]]:
    out = []
    for req in list(Collector.got):
        for rs in req.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    attrs = {a.key: a.value.string_value or a.value.int_value or a.value.bool_value
                             for a in s.attributes}
                    out.append((s.name, attrs, s.span_id, s.parent_span_id))
    return out


def test_a_call_trace_reaches_an_otlp_collector(short_tmp):
    Collector.got = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    speech, _ = sf.read(SPEECH, dtype="int16")
    script = short_tmp / "script.json"
    script.write_bytes(orjson.dumps({"user": USER, "bot": [ANSWER, SECOND]}))
    cfg = config(short_tmp, script)
    with open(cfg, "a") as f:
        f.write(f'\n[tracing]\nexporter = "otlp"\nendpoint = "http://127.0.0.1:{srv.server_port}/v1/traces"\n')
    d = Daemon(short_tmp, config=cfg, real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(60)
        port = ws_port(d.child(snap, "gateway-0"))
        res = asyncio.run(one_call(port, speech, seed=1))
        deadline = time.monotonic() + 20  # the batch processor exports every 5 s
        while time.monotonic() < deadline and not any(n == "call" for n, *_ in spans()):
            time.sleep(0.2)
    finally:
        d.close()
        srv.shutdown()
    got = spans()
    calls = [s for s in got if s[0] == "call"]
    assert len(calls) == 1, [s[0] for s in got]
    _, attrs, call_span, parent = calls[0]
    assert attrs["brisvox.call_id"] == res["call_id"] and parent == b""
    turns = [s for s in got if s[0] == "turn"]
    assert len(turns) >= 2 and all(s[3] == call_span for s in turns)
    assert {"llm", "tts"} <= {s[0] for s in got}
    for name, a, *_ in got:
        assert a["brisvox.call_id"] == res["call_id"], name
        for v in a.values():
            assert not any(w in str(v) for w in (*USER, ANSWER[:20], SECOND[:20])), (name, a)
