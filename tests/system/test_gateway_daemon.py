"""The gateway role inside brisvoxd: boots through ChildRuntime, reports its bound
endpoints in the handshake, serves an echo call, shows its counters in /metrics,
and a bad [sip] key stops the daemon with a config error naming it."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest
from websockets.asyncio.client import connect

from bench.harness.daemon import Daemon, write_config, ws_port
from brisvox.wire.native import NativeStream, server_message
from tests.system.daemon_promparse import parse

pytestmark = pytest.mark.system

GATEWAY_ONLY = {"BRISVOX_TEST_ROLE_MAIN": "gateway=brisvox.gateway.process:main"}
PORTS = """
[gateway]
echo_use_workers = false
echo_delay_ms = 100

[sip]
port = 0
rtp_port_min = 47000
rtp_port_max = 47998

[websocket]
routes = [{ path = "/twilio", protocol = "twilio", agent = "default" },
          { path = "/ws", protocol = "native", agent = "default", agents = ["echo"] }]
port = 0
trust_loopback = true
"""


def test_gateway_role_serves_a_call_and_reports_metrics(short_tmp):
    d = Daemon(short_tmp, config=write_config(short_tmp, workers=1, agents=1, extra=PORTS), env=GATEWAY_ONLY)
    try:
        d.start()
        snap = d.wait_ready(30)
        gw = d.child(snap, "gateway-0")
        port = ws_port(gw)
        assert gw["endpoints"]["sip"].startswith("127.0.0.1:")

        async def call() -> int:
            n = 0
            async with connect(f"ws://127.0.0.1:{port}/ws/echo") as ws:
                await ws.send(NativeStream(8000).start())
                assert server_message(orjson.loads(await ws.recv())).event == "started"
                for _ in range(25):
                    await ws.send(b"\x10\x00" * 160)
                    await asyncio.sleep(0.02)
                deadline = time.monotonic() + 1.5
                while time.monotonic() < deadline:
                    try:
                        async with asyncio.timeout(0.2):
                            m = await ws.recv()
                    except TimeoutError:
                        continue
                    n += isinstance(m, bytes)
            return n

        assert asyncio.run(call()) >= 25
        d.wait_for(lambda s: (d.child(s, "gateway-0").get("stats") or {}).get("calls_released", 0) >= 1,
                   10, "the call to be released")
        status, text = d.metrics_text()
        assert status == 200
        fams = parse(text)
        stats = {dict(lab)["stat"]: v for (_, lab), v in fams["brisvox_child_stat"]["samples"].items()
                 if dict(lab).get("role") == "gateway"}
        assert stats["calls_released"] >= 1 and stats["call_packets_in_total"] >= 25
        assert stats["call_frames_out_total"] >= 25
    finally:
        d.close()


def test_bad_gateway_key_is_a_config_error(short_tmp):
    d = Daemon(short_tmp, config=write_config(short_tmp, workers=1, agents=1, extra=PORTS + "bogus_key = 1\n"),
               env=GATEWAY_ONLY)
    try:
        d.start()
        code = d.wait_exit(30)
        assert code == 2
        assert "websocket.bogus_key" in d.logs()
    finally:
        d.close()
