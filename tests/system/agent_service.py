"""A small agent service speaking docs/AGENT_PROTOCOL.md directly (no SDK): the tests' peer.

Run as ``python tests/system/agent_service.py PORT SECRET LOG``: it serves one behaviour per
URL path (``/main``, ``/narrow``, ``/collide``, ``/cmds``, ``/noop``, ``/drop``, ``/dial``: the
command frames of the JSON list in ``$AGENT_SERVICE_DIAL``, one every 0.5 s from 1 s after
``session.ready``), checks the handshake
signature itself (HTTP 401 otherwise), and appends every frame it receives (and every
handshake it refused) as one JSON line to LOG, with the path and the session.

Tools: ``lookup`` (ReadOnly, answers at once), ``book_table`` (SideEffect, 1.5 s timeout, its
body takes 3 s), ``slow_lookup`` (ReadOnly, 0.5 s timeout, answers after 1.5 s: a late
result), ``never`` (SideEffect, 0.5 s timeout, never answers), ``noop`` (ReadOnly).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import sys
import time
from http import HTTPStatus
from typing import Any

import websockets

OBJ: dict[str, Any] = {"type": "object", "properties": {}}
TOOLS = {
    "lookup": {"kind": "read_only", "timeout_ms": 2000},
    "book_table": {"kind": "side_effect", "timeout_ms": 1500,
                   "parameters": {"type": "object", "required": ["name"],
                                  "properties": {"name": {"type": "string"}}}},
    "slow_lookup": {"kind": "read_only", "timeout_ms": 500},
    "never": {"kind": "side_effect", "timeout_ms": 500},
    "noop": {"kind": "read_only", "timeout_ms": 1000},
}
PATHS = {
    "/main": ["lookup", "book_table", "slow_lookup", "never"],
    "/narrow": ["lookup", "book_table"],
    "/collide": ["lookup", "end_call"],
    "/cmds": [],
    "/noop": ["noop"],
    "/drop": ["lookup", "book_table"],  # drops the connection at book_table's call, answers it after the re-dial
    "/dial": [],
}


def decl(name: str) -> dict[str, Any]:
    t = TOOLS.get(name, {"kind": "read_only", "timeout_ms": 1000})
    return {"name": name, "description": f"The {name} tool.", "parameters": t.get("parameters", OBJ),
            "kind": t["kind"], "timeout_ms": t["timeout_ms"], "filler_after_ms": None}


class Service:
    def __init__(self, secret: str, log_path: str) -> None:
        self.secret = secret
        self.log = open(log_path, "a", buffering=1) if log_path != "-" else None  # noqa: SIM115
        self.dropped: dict[str, str] = {}  # session -> the id of the call whose connection /drop cut
        self.nonces: set[str] = set()  # of the handshakes accepted: a replay is refused

    def note(self, path: str, session: str, frame: Any) -> None:
        if self.log is not None:
            self.log.write(json.dumps({"path": path, "session": session, "at": time.time(), "frame": frame}) + "\n")

    def check(self, conn: Any, request: Any) -> Any:
        sig = request.headers.get("X-Brisvox-Signature", "")
        session = request.headers.get("X-Brisvox-Session", "")
        parts = dict(p.split("=", 1) for p in sig.split(",") if "=" in p)
        try:
            t = int(parts.get("t", ""))
        except ValueError:
            t = 0
        nonce = parts.get("n", "")
        want = hmac.new(self.secret.encode(), f"v2.{t}.{nonce}.{session}".encode(), hashlib.sha256).hexdigest()
        if abs(time.time() - t) > 30 or not nonce or nonce in self.nonces \
                or not hmac.compare_digest(parts.get("v2", ""), want):
            self.note(request.path, session, {"type": "refused_401"})
            return conn.respond(HTTPStatus.UNAUTHORIZED, "bad signature\n")
        self.nonces.add(nonce)  # a test run is short: every nonce is kept
        return None

    async def serve(self, ws: Any) -> None:
        path = ws.request.path
        offer = json.loads(await ws.recv())
        session = offer.get("session", "")
        self.note(path, session, offer)
        names = PATHS.get(path, [])
        await ws.send(json.dumps({"type": "session.accept", "session": session, "tools": [decl(n) for n in names],
                                  "subscribe": ["user_turn", "bot_turn", "tool_outcome", "hangup"]}))
        tasks: set[asyncio.Task[None]] = set()

        def later(coro: Any) -> None:
            t = asyncio.get_running_loop().create_task(coro)
            tasks.add(t)
            t.add_done_callback(tasks.discard)

        async def send_after(delay: float, frame: dict[str, Any]) -> None:
            await asyncio.sleep(delay)
            await ws.send(json.dumps(frame))

        async for raw in ws:
            f = json.loads(raw)
            self.note(path, session, f)
            kind = f.get("type")
            if kind == "tool.call" and path == "/drop" and f.get("name") == "book_table" and not offer.get("resume"):
                self.dropped[session] = f["id"]
                await ws.close()  # the link goes down with the call waiting: brisvox re-dials
                return
            if kind == "session.ready":
                if path == "/drop" and offer.get("resume") and session in self.dropped:
                    await ws.send(json.dumps({"type": "tool.result", "id": self.dropped.pop(session), "ok": True,
                                              "result": {"booking": "BK-LATE"}}))  # after the link dropped
                if path == "/narrow":
                    await ws.send(json.dumps({"type": "tools.set", "names": ["lookup", "not_declared"]}))
                if path == "/dial":
                    dials = json.loads(os.environ.get("AGENT_SERVICE_DIAL", "[]"))
                    for i, cmd in enumerate(dials):
                        later(send_after(1.0 + 0.5 * i, {"type": "command", "name": "dial", **cmd}))
                if path == "/cmds":
                    later(send_after(3.0, {"type": "command", "id": "k1", "name": "say", "text": "One moment please."}))
                    later(send_after(3.2, {"type": "command", "id": "k0", "name": "say", "text": "x" * 1001}))
                    later(send_after(6.0, {"type": "command", "id": "k2", "name": "end_call", "reason": "done"}))
            elif kind == "tool.call":
                later(self.tool(ws, f))

    async def tool(self, ws: Any, f: dict[str, Any]) -> None:
        name, rid = f["name"], f["id"]
        if name == "never":
            return
        if name == "book_table":
            await asyncio.sleep(3.0)
            result: Any = {"booking": "BK-9", "name": f["arguments"].get("name", "")}
        elif name == "slow_lookup":
            await asyncio.sleep(1.5)
            result = {"slots": ["late"]}
        else:
            result = {"slots": ["19:00", "20:00"]} if name == "lookup" else {}
        await ws.send(json.dumps({"type": "tool.result", "id": rid, "ok": True, "result": result}))


async def main(port: int, secret: str, log_path: str) -> None:
    svc = Service(secret, log_path)
    async with websockets.serve(svc.serve, "127.0.0.1", port, process_request=svc.check, compression=None):
        print("ready", flush=True)
        await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], sys.argv[3]))
