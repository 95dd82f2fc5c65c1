"""The agent link's handshake cannot be replayed.

The real daemon dials an agent service built with the Python SDK (``sdk/python``, in this
process) through a recording TCP relay, once per call; the relay keeps each connection's
HTTP upgrade request byte for byte. Sent again to the service within the clock window, the
captured request is refused: HTTP 401 "replayed handshake", counted in the service's
``handshakes_refused``, and no second session exists. On the old tree the replay was
answered 101 (the signature covered only the timestamp and the session).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.harness.daemon import Daemon, agents_config, write_config, ws_port
from brisvox.client.native import NativeTransport
from brisvox.client.transport import BotEvents
from tests.system import gateway_harness
from tests.system.test_agent_sdk_daemon import (
    agent as agent_file,  # its [agent_link] agent, "sdkbook"
)

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "sdk" / "python" / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "sdk" / "python" / "src"))

from brisvox_agent import Agent  # noqa: E402

SECRET = "replay-secret-for-tests"
NATIVE = "native-secret-for-tests"  # the call's credential (loopback is not trusted by default)


class Service:
    """The SDK's Agent and a recording relay in front of it, on one loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.heads: list[bytes] = []  # each relayed connection's request head, as sent
        self.relay_port = gateway_harness.free_port(socket.SOCK_STREAM)
        self.agent = Agent(secret=SECRET, port=0)
        self._stop: asyncio.Event | None = None
        self._up = threading.Event()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self._main(),), daemon=True)
        self.thread.start()
        assert self._up.wait(10), "the service did not start"

    async def _main(self) -> None:
        self._stop = asyncio.Event()

        @self.agent.tool(kind="read_only")
        async def lookup(ctx: Any) -> dict[str, Any]:
            """Look something up."""
            return {}

        async with self.agent:
            server = await asyncio.start_server(self._relay, "127.0.0.1", self.relay_port)
            async with server:
                self._up.set()
                await self._stop.wait()

    async def _relay(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        sr, sw = await asyncio.open_connection("127.0.0.1", self.agent.port)
        head = b""
        with contextlib.suppress(Exception):
            head = await cr.readuntil(b"\r\n\r\n")
            self.heads.append(head)
            sw.write(head)

            async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
                with contextlib.suppress(Exception):
                    while data := await r.read(65536):
                        w.write(data)
                        await w.drain()
                w.close()

            await asyncio.gather(pipe(cr, sw), pipe(sr, cw))
        for w in (cw, sw):
            w.close()

    def close(self) -> None:
        if self._stop is not None:
            self.loop.call_soon_threadsafe(self._stop.set)
        self.thread.join(10)


async def call(url: str, seconds: float) -> None:
    t = NativeTransport(url, rate=8000, token=NATIVE)
    await t.open(BotEvents())
    frame = np.zeros(160, np.int16)
    t0 = time.monotonic()
    try:
        for n in range(int(seconds / 0.02)):
            await t.send_audio(frame)
            await asyncio.sleep(max(0.0, t0 + (n + 1) * 0.02 - time.monotonic()))
    finally:
        await t.close()


def replay(port: int, head: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(head)
        out = b""
        with contextlib.suppress(TimeoutError, OSError):
            while b"\r\n\r\n" not in out or len(out) < 12:
                chunk = s.recv(4096)
                if not chunk:
                    break
                out += chunk
            s.settimeout(0.3)
            out += s.recv(4096)
        return out


def test_a_captured_handshake_replayed_is_refused():
    tmp = Path(tempfile.mkdtemp(prefix="bvr", dir="/tmp"))
    svc = Service()
    d = None
    try:
        agents = tmp / "agents"
        agents.mkdir()
        (agents / "sdkbook.toml").write_text(agent_file(svc.relay_port))
        extra = agents_config(agents, tmp / "records", default_agent="sdkbook", websocket=f'native_secret = "{NATIVE}"')
        d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True,
                   env={"BRISVOX_AGENT_SECRET": SECRET})
        d.start()
        snap = d.wait_ready(90)
        asyncio.run(call(f"ws://127.0.0.1:{ws_port(d.child(snap, 'gateway-0'))}/ws", 2.0))
        assert svc.heads, "the daemon never dialled the agent service"
        head = svc.heads[0]
        assert b"x-brisvox-signature" in head.lower()
        sessions = len(svc.agent.sessions)
        got = replay(svc.agent.port, head)  # well inside the clock window
        assert got.startswith(b"HTTP/1.1 401"), got[:200]
        assert b"replayed handshake" in got
        assert svc.agent.handshakes_refused == {"replayed handshake": 1}
        assert len(svc.agent.sessions) <= sessions  # the replay opened nothing
    finally:
        if d is not None:
            d.close()
        svc.close()
        shutil.rmtree(tmp, ignore_errors=True)
