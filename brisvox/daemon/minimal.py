"""Minimal role main: the real child main loop with no role work behind it.

Until a role's owner registers its own main in ``brisvox/daemon/roles.py``,
every role runs this: bind the child's ROUTER inbox, complete the handshake,
beat every loop turn, report counters with each pong, answer every valid
request with ``ErrorReply(kind="unsupported")``, count and drop garbage, and
return 0 once a stop is requested (a drain has no calls to wait for).

Invariant: the loop never blocks longer than ``_TICK_MS`` so the heartbeat
age stays far below the supervisor's heartbeat timeout.
"""

from __future__ import annotations

import zmq

from brisvox.runtime.child_runtime import ChildRuntime
from ipc.bus import bind, endpoint_path, make_socket
from ipc.codec import DecodeGuard, encode
from ipc.frames import ErrorReply

_TICK_MS = 200


def main(rt: ChildRuntime) -> int:
    ctx = rt.zmq_context()
    inbox = make_socket(ctx, zmq.ROUTER)
    ep = rt.inbox_endpoint(rt.role, rt.index)
    bind(inbox, ep)
    guard = DecodeGuard(f"{rt.name} inbox")
    served = 0
    reply_failed = 0
    rt.ready({"inbox": ep})
    try:
        while not rt.stopping.is_set():
            rt.heartbeat()
            if inbox.poll(_TICK_MS):
                for _ in range(256):
                    try:
                        parts = inbox.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(parts) != 2:
                        guard.errors["malformed"] = guard.errors.get("malformed", 0) + 1
                        continue
                    got = guard.decode_env(parts[1])
                    if got is None:
                        continue
                    frame, cid = got
                    served += 1
                    reply = ErrorReply(kind="unsupported", detail=f"minimal {rt.role} does not serve {frame.TYPE}")
                    try:
                        inbox.send_multipart([parts[0], encode(reply, cid=cid)], zmq.NOBLOCK)
                    except zmq.ZMQError:
                        reply_failed += 1
            rt.report(0, {"requests": served, "reply_failed": reply_failed,
                          "decode_errors": dict(guard.errors)})
    finally:
        inbox.close(0)
        path = endpoint_path(ep)
        if path is not None:
            path.unlink(missing_ok=True)
    return 0
