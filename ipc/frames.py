"""Every control frame of brisvox, in one file: read this to see the whole protocol.

Frames are frozen slotted dataclasses registered with a type tag
(:func:`ipc.codec.frame`) and travel as orjson objects over ZeroMQ
(``ipc/bus.py``). Audio never travels in a frame: it lives in rings
(``ipc/ring.py``) and frames carry ring *positions* (absolute sample counts).

Conventions:

* Times that cross processes are ``time.monotonic_ns()`` values (``*_ns``):
  CLOCK_MONOTONIC is one clock for every process on the host.
* ``call_id`` is the gateway's id for a call (``[A-Za-z0-9_-]``, used in ring
  names). Rings are named by ``ipc.ring.ring_name(instance, call_id, kind)``.
* Requests that expect a reply carry a correlation id in the envelope
  (``encode(frame, cid=...)``), not in the frame.

Sections, in the order data flows: supervisor <-> child, command plane,
gateway <-> agent, worker lanes. Add a frame to its section.
"""

from __future__ import annotations

from typing import Any

from ipc.codec import (
    DecodeGuard,
    Frame,
    FrameError,
    decode,
    decode_env,
    encode,
    frame,
    frame_types,
)

__all__ = [
    "DecodeGuard",
    "Frame",
    "FrameError",
    "decode",
    "decode_env",
    "encode",
    "frame",
    "frame_types",
]

ROLES = ("gateway", "worker", "agent")


# --- supervisor <-> child (the child's DEALER, the supervisor's ROUTER) ------------


@frame("hello")
class Hello(Frame):
    """Child -> supervisor, first frame: the init handshake. ``ok`` False = boot failed."""

    role: str
    index: int
    pid: int
    ok: bool = True
    error: str = ""
    endpoints: dict[str, str] | None = None  # what the child serves (role-specific)


@frame("ping")
class Ping(Frame):
    """Supervisor -> child health probe."""

    seq: int
    sent_ns: int


@frame("pong")
class Pong(Frame):
    """Child -> supervisor answer to :class:`Ping`, with a small load report."""

    seq: int
    sent_ns: int
    calls: int = 0
    stats: dict[str, Any] | None = None


@frame("shutdown")
class Shutdown(Frame):
    """Supervisor -> child: stop within ``grace_s`` (after which SIGTERM, then SIGKILL)."""

    reason: str
    grace_s: float
    drain: bool = False  # finish live calls first (up to grace_s)


@frame("shutdown_ack")
class ShutdownAck(Frame):
    """Child -> supervisor: shutdown request received; exit follows."""

    pid: int


@frame("child_event")
class ChildEvent(Frame):
    """Child -> supervisor, unsolicited: something operators should see (counted, logged)."""

    kind: str
    detail: str = ""
    data: dict[str, Any] | None = None


# --- command plane (brisvoxd CLI <-> supervisor, REQ-style over DEALER/ROUTER) -------


@frame("command")
class Command(Frame):
    """CLI -> supervisor. ``name`` is one of status, stop, drain, reload."""

    name: str
    args: dict[str, Any] | None = None


@frame("command_reply")
class CommandReply(Frame):
    """Supervisor -> CLI."""

    ok: bool
    data: dict[str, Any] | None = None
    error: str = ""


# --- gateway <-> agent process ------------------------------------------------------


# --- worker lanes (gateway/actor <-> inference worker) ------------------------------


@frame("error")
class ErrorReply(Frame):
    """Typed error answer to any request. ``kind`` is a stable label (counted)."""

    kind: str
    detail: str = ""
    call_id: str = ""
