"""A fake brisvox: the daemon's side of the agent protocol, for the SDK's tests.

It dials the service as the daemon does (signed handshake, one connection per call) and
speaks the frames of docs/AGENT_PROTOCOL.md.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from brisvox_agent import SESSION_HEADER, SIGNATURE_HEADER, sign

SECRET = "test-secret"
CALL = {"call_id": "call-1", "agent": "booking", "transport": "twilio",
        "caller": "+4930123", "called": "+4930999", "params": {"tier": "gold"}}


def run(coro_fn: Callable[[], Awaitable[Any]], timeout: float = 20.0) -> Any:
    async def main() -> Any:
        async with asyncio.timeout(timeout):
            return await coro_fn()

    return asyncio.run(main())


class FakeBrisvox:
    def __init__(self, url: str, session: str = "sess-1", secret: str = SECRET) -> None:
        self.url, self.session, self.secret = url, session, secret
        self.ws: ClientConnection | None = None

    async def connect(self, *, t: int | None = None, signature: str | None = None,
                      headers: dict[str, str] | None = None) -> ClientConnection:
        hdrs = {SESSION_HEADER: self.session,
                SIGNATURE_HEADER: signature or sign(self.secret, self.session,
                                                    int(time.time()) if t is None else t)}
        if headers is not None:
            hdrs = headers
        self.ws = await connect(self.url, additional_headers=hdrs, max_size=None)
        return self.ws

    async def send(self, frame: dict[str, Any] | str) -> None:
        assert self.ws is not None
        await self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    async def recv(self, timeout: float = 3.0) -> dict[str, Any]:
        assert self.ws is not None
        message = await asyncio.wait_for(self.ws.recv(), timeout)
        frame = json.loads(message)
        assert isinstance(frame, dict)
        return frame

    async def expect(self, kind: str, timeout: float = 3.0) -> dict[str, Any]:
        frame = await self.recv(timeout)
        assert frame["type"] == kind, frame
        return frame

    async def silent(self, within: float = 0.3) -> None:
        """Nothing arrives within ``within`` seconds."""
        try:
            frame = await self.recv(within)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected frame {frame}")

    async def offer(self, *, call: dict[str, Any] | None = None, resume: bool = False,
                    local_tools: list[str] | None = None, ready: bool = True) -> dict[str, Any]:
        """Connect, offer the call, and answer its accept with session.ready; the answer."""
        if self.ws is None:
            await self.connect()
        await self.send({"type": "session.offer", "v": 1, "session": self.session, "resume": resume,
                         "call": CALL if call is None else call,
                         "local_tools": ["end_call"] if local_tools is None else local_tools})
        answer = await self.recv()
        if ready and answer["type"] == "session.accept":
            await self.send({"type": "session.ready", "tools": [t["name"] for t in answer["tools"]],
                             "refused": []})
        return answer

    async def call(self, rid: str, name: str, arguments: dict[str, Any] | None = None, *,
                   key: str | None = None, epoch: int = 3, call_id: str = "t3.0") -> None:
        await self.send({"type": "tool.call", "id": rid, "call_id": call_id, "name": name,
                         "arguments": arguments or {}, "idempotency_key": key or f"key-{rid}",
                         "epoch": epoch, "deadline_ms": 5000})

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


class Gathered(list[Any]):
    """A list a test can wait on: ``await g.reach(n)``."""

    def __init__(self) -> None:
        super().__init__()
        self._changed = asyncio.Event()

    def add(self, item: Any) -> None:
        self.append(item)
        self._changed.set()

    async def reach(self, n: int) -> None:
        while len(self) < n:
            self._changed.clear()
            await self._changed.wait()
