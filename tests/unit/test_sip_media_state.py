"""The call's media state on a real gateway core and real RTP sockets, with an agent process
stood in for (its link's requests and sends captured; the SIP socket's sends captured, the
peer's messages fed in):

* a dial's early media: 180 rings (no agent side yet); a 183 with SDP starts the agent side
  with ``CallStart.media = "early"``, the far end's RTP reaches the call's ``in`` ring, and
  the gateway sends no RTP towards it, with bot audio waiting; the 200 sends
  ``CallMedia("answered")`` with the dial's times in order, reports them in the dial's
  result, and RTP flows out;
* forking and the later answer: a 200 whose SDP names another address than the 183's is
  applied (RTP goes there); a 200 without SDP takes its own dialog's 183 answer, and is
  ``incompatible media`` from a dialog that sent none;
* a 183 whose SDP cannot be used is ignored and counted, the 200 still answers;
* a change while the agent side starts is sent after its CallAccepted, once;
* a dial that fails after early media started the agent side keeps the rings until the
  agent's CallEnded (not released by the dial's failure); an agent side that cannot start
  during early media CANCELs the dial;
* an inbound call put on hold (``a=sendonly``, ``a=inactive`` or ``c=0.0.0.0``) and taken off
  it: ``CallMedia("held")`` then ``"answered"``, no RTP sent while held, RTP again after.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
from typing import Any

import numpy as np
import pytest

from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core.gateway_core import GatewayCore
from brisvox.gateway.transports import assemble
from brisvox.wire import rtp
from brisvox.wire.sip_dialog import make_response
from brisvox.wire.sip_message import SipMessage, parse
from ipc import frames as F
from tests.unit.test_sip_admission_props import Wire, invite, sdp_body, segments, settle

_seq = itertools.count(1)
CALLEE = ("127.0.0.1", 5099)


class Agent:
    """Stands in for agent process ``agent-0``: records what the gateway sends it; CallStart
    is accepted once ``accept`` is set (or refused with ``refuse``)."""

    def __init__(self) -> None:
        self.frames: list[F.Frame] = []
        self.accept = asyncio.Event()
        self.accept.set()
        self.refuse = False

    async def request(self, peer: str, frame: F.Frame, timeout: float) -> F.Frame:
        self.frames.append(frame)
        await self.accept.wait()
        if self.refuse:
            return F.ErrorReply(kind="full", call_id=getattr(frame, "call_id", ""))
        return F.CallAccepted(call_id=getattr(frame, "call_id", ""), worker=-1)

    def send(self, peer: str, frame: F.Frame, cid: int | str | None = None) -> bool:
        self.frames.append(frame)
        return True

    def of(self, kind: type) -> list[Any]:
        return [f for f in self.frames if isinstance(f, kind)]


async def started(**sip: Any) -> tuple[GatewayCore, Any, Wire, Agent]:
    lo = 30000 + (os.getpid() * 23 + next(_seq) * 211) % 12000 & ~1
    settings = GatewaySettings(
        GatewayConfig(echo_use_workers=False, max_calls=4),
        SipConfig(port=0, rtp_port_min=lo, rtp_port_max=lo + 200, **sip),
        WebSocketConfig(enabled=False))
    core = assemble(settings, instance=f"sm{os.getpid()}x{next(_seq)}")
    agent = Agent()
    core.links.request = agent.request  # type: ignore[method-assign]
    core.links.send = agent.send  # type: ignore[method-assign]
    await core.start()
    core.peer_load.add_agent("agent-0")
    ua = core.listeners["sip"]
    wire = Wire()
    ua.transactions.transport = wire
    return core, ua, wire, agent


def sent(wire: Wire, method: str) -> list[tuple[SipMessage, Any]]:
    return [(parse(d), a) for d, a in wire.sent if d.startswith(method.encode() + b" ")]


def respond(ua: Any, inv: SipMessage, status: int, tag: str = "callee1", **kw: Any) -> None:
    ua.transactions.datagram_received(make_response(inv, status, to_tag=tag, **kw).serialize(), CALLEE)


def media_sdp(port: int, direction: str = "sendrecv") -> bytes:
    return sdp_body(port=str(port), extra=f"a={direction}\r\n")


class Peer:
    """The far end's RTP socket: sends PCMU frames, counts what it receives."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.seq = 0

    def send(self, to_port: int, n: int = 5) -> None:
        for _ in range(n):
            self.seq += 1
            self.sock.sendto(rtp.build(0, self.seq == 1, self.seq, self.seq * 160, 0x4242, b"\x00" * 160),
                             ("127.0.0.1", to_port))

    def received(self) -> int:
        n = 0
        while True:
            try:
                self.sock.recv(2048)
            except BlockingIOError:
                return n
            n += 1

    def close(self) -> None:
        self.sock.close()


class Result:
    def __init__(self) -> None:
        self.got: list[tuple[dict[str, Any] | None, str]] = []

    def __call__(self, data: dict[str, Any] | None, error: str) -> None:
        self.got.append((data, error))


async def dialled(ua: Any, wire: Wire, res: Result) -> SipMessage:
    ua.dial(f"sip:bob@{CALLEE[0]}:{CALLEE[1]}", "bench", res)
    assert await settle(lambda: bool(sent(wire, "INVITE")))
    (inv, _), = sent(wire, "INVITE")
    return inv


def bot_audio(core: GatewayCore) -> None:
    """The agent's reply in the out ring, announced: the pacer would send it if it could."""
    call = next(iter(core.table.calls.values()))
    call.out_ring.write(np.full(8000, 1000, dtype=np.int16))
    core.note_utterance(call, 1, 0)


def test_early_media_reaches_the_call_unanswered_and_the_answer_brings_the_times():
    async def run() -> None:
        core, ua, wire, agent = await started()
        res, peer = Result(), Peer()
        try:
            inv = await dialled(ua, wire, res)
            await asyncio.sleep(0.03)
            respond(ua, inv, 180)  # ringing: no media, no agent side yet
            await asyncio.sleep(0.03)
            assert agent.of(F.CallStart) == []
            respond(ua, inv, 183, body=media_sdp(peer.port))  # sendrecv: still nothing is sent before the 200
            assert await settle(lambda: bool(agent.of(F.CallStart)))
            start, = agent.of(F.CallStart)
            assert start.media == "early"
            call = next(iter(core.table.calls.values()))
            leg = call.leg
            assert call.media == "early" and leg.state == "outgoing" and not leg.can_send
            assert await settle(lambda: call.state == "active")
            before = call.in_ring.write_pos
            peer.send(leg.rtp_port, 10)
            assert await settle(lambda: call.in_ring.write_pos >= before + 10 * 160)  # early audio reached the call
            bot_audio(core)
            await asyncio.sleep(0.25)  # a dozen pacer ticks with audio waiting
            assert peer.received() == 0  # nothing towards the far end before the answer
            assert res.got == [] and agent.of(F.CallMedia) == []
            await asyncio.sleep(0.02)
            respond(ua, inv, 200, contact="<sip:bob@127.0.0.1:5099>", body=media_sdp(peer.port))
            assert await settle(lambda: bool(res.got))
            data, error = res.got[0]
            assert error == "" and data is not None and data["call_id"] == call.call_id
            assert 0 <= data["ringing_at_ms"] <= data["progress_at_ms"] <= data["answered_at_ms"]
            assert data["answered_at_ms"] - data["ringing_at_ms"] >= 250
            media, = agent.of(F.CallMedia)
            assert media.state == "answered" and media.call_id == call.call_id
            assert media.dial == {k: data[k] for k in ("ringing_at_ms", "progress_at_ms", "answered_at_ms")}
            assert len(sent(wire, "ACK")) == 1
            assert await settle(lambda: peer.received() > 0)  # answered: the bot is heard
            st = ua.stats()
            assert st["sip_dial_early_media"] == 1 and st["sip_dial_answered"] == 1
        finally:
            peer.close()
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_a_200_whose_sdp_differs_is_applied_and_one_without_sdp_takes_its_dialogs_183():
    async def run() -> None:
        core, ua, wire, agent = await started()
        res, early, answerer = Result(), Peer(), Peer()
        try:
            inv = await dialled(ua, wire, res)
            respond(ua, inv, 183, tag="forkA", body=media_sdp(early.port, "sendonly"))
            assert await settle(lambda: bool(agent.of(F.CallStart)))
            leg = next(iter(core.table.calls.values())).leg
            assert leg.latch == ("127.0.0.1", early.port)
            respond(ua, inv, 200, tag="forkB", contact="<sip:bob@127.0.0.1:5099>", body=media_sdp(answerer.port))
            assert await settle(lambda: bool(res.got))
            assert res.got[0][1] == "" and leg.remote == ("127.0.0.1", answerer.port)
            assert leg.latch == ("127.0.0.1", answerer.port) and not leg.early_media
            bot_audio(core)
            assert await settle(lambda: answerer.received() > 0)
            assert early.received() == 0
        finally:
            early.close()
            answerer.close()
            await core.stop()

    asyncio.run(run())

    async def no_sdp(tag_200: str) -> tuple[Result, Any]:
        core, ua, wire, agent = await started()
        res, early = Result(), Peer()
        try:
            inv = await dialled(ua, wire, res)
            respond(ua, inv, 183, tag="forkA", body=media_sdp(early.port))
            assert await settle(lambda: bool(agent.of(F.CallStart)))
            respond(ua, inv, 200, tag=tag_200, contact="<sip:bob@127.0.0.1:5099>")
            assert await settle(lambda: bool(res.got))
            call = next(iter(core.table.calls.values()), None)
            stats = ua.stats()
            if res.got[0][1]:  # refused: the agent side, started by the 183, hears the end
                assert await settle(lambda: bool(agent.of(F.CallEnd)))
                assert len(core.table) == 1  # its rings wait for its CallEnded
                core._on_frame(F.CallEnded(call_id=agent.of(F.CallEnd)[0].call_id, reason="bye"), "agent-0", None)
                assert await settle(lambda: len(core.table) == 0)
            else:
                assert call is not None and call.leg.remote == ("127.0.0.1", early.port)
            return res, stats
        finally:
            early.close()
            await core.stop()

    res, _ = asyncio.run(no_sdp("forkA"))
    assert res.got[0][1] == ""
    res, stats = asyncio.run(no_sdp("forkB"))
    assert res.got[0][1].startswith("incompatible media") and stats["sip_dial_bad_answer"] == 1


def test_a_bad_early_sdp_is_ignored_and_the_200_answers():
    async def run() -> None:
        core, ua, wire, agent = await started()
        res, peer = Result(), Peer()
        try:
            inv = await dialled(ua, wire, res)
            respond(ua, inv, 183, body=sdp_body(host="192.0.2.7", port=str(peer.port)))  # outside [sip] allow
            await asyncio.sleep(0.05)
            assert agent.of(F.CallStart) == [] and ua.stats()["sip_dial_bad_early_sdp"] == 1
            respond(ua, inv, 200, contact="<sip:bob@127.0.0.1:5099>", body=media_sdp(peer.port))
            assert await settle(lambda: bool(res.got))
            data, error = res.got[0]
            assert error == "" and data is not None
            assert data["ringing_at_ms"] is not None and data["progress_at_ms"] is None
            start, = agent.of(F.CallStart)
            assert start.media == "answered"
            assert await settle(lambda: bool(agent.of(F.CallMedia)))  # the dial's times follow the start
            media, = agent.of(F.CallMedia)
            assert media.state == "answered" and set(media.dial) == {"ringing_at_ms", "answered_at_ms"}
        finally:
            peer.close()
            await core.stop()

    asyncio.run(run())


def test_an_answer_while_the_agent_side_starts_is_told_after_its_call_accepted():
    async def run() -> None:
        core, ua, wire, agent = await started()
        res, peer = Result(), Peer()
        try:
            agent.accept.clear()
            inv = await dialled(ua, wire, res)
            respond(ua, inv, 183, body=media_sdp(peer.port))
            assert await settle(lambda: bool(agent.of(F.CallStart)))
            respond(ua, inv, 200, contact="<sip:bob@127.0.0.1:5099>", body=media_sdp(peer.port))
            await asyncio.sleep(0.05)
            assert res.got == [] and agent.of(F.CallMedia) == []  # nothing before CallAccepted
            agent.accept.set()
            assert await settle(lambda: bool(res.got))
            assert res.got[0][1] == ""
            assert [type(f) for f in agent.frames] == [F.CallStart, F.CallMedia]
            assert agent.frames[1].state == "answered"
            assert agent.frames[0].media == "early"
        finally:
            peer.close()
            await core.stop()

    asyncio.run(run())


def test_a_dial_failing_after_early_media_ends_its_started_agent_side():
    async def run() -> None:
        core, ua, wire, agent = await started()
        res, peer = Result(), Peer()
        try:
            inv = await dialled(ua, wire, res)
            respond(ua, inv, 183, body=media_sdp(peer.port))
            assert await settle(lambda: bool(agent.of(F.CallStart)))
            call = next(iter(core.table.calls.values()))
            assert await settle(lambda: call.state == "active")
            respond(ua, inv, 486)
            assert res.got == [(None, "busy")]
            end, = agent.of(F.CallEnd)
            assert end.reason == "busy"
            await asyncio.sleep(0.05)
            assert len(core.table) == 1  # the agent still has the rings: not released under it
            core._on_frame(F.CallEnded(call_id=call.call_id, reason="bye"), "agent-0", None)
            assert await settle(lambda: len(core.table) == 0)
            assert ua.stats()["rtp_ports_in_use"] == 0
        finally:
            peer.close()
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def test_an_agent_side_that_cannot_start_during_early_media_cancels_the_dial():
    async def run() -> None:
        core, ua, wire, agent = await started()
        res, peer = Result(), Peer()
        try:
            agent.refuse = True
            inv = await dialled(ua, wire, res)
            respond(ua, inv, 183, body=media_sdp(peer.port))
            assert await settle(lambda: bool(res.got))
            assert res.got[0][0] is None and res.got[0][1].startswith("agent unavailable")
            (cancel, _), = sent(wire, "CANCEL")
            ua.transactions.datagram_received(make_response(cancel, 200).serialize(), CALLEE)
            respond(ua, inv, 487)
            assert await settle(lambda: len(core.table) == 0)
            assert len(res.got) == 1 and ua.stats()["sip_dial_failed_agent_unavailable"] == 1
        finally:
            peer.close()
            await core.stop()
        assert segments(core) == []

    asyncio.run(run())


def in_dialog(method: str, inv: bytes, ok: SipMessage, cseq: int, body: bytes = b"") -> bytes:
    """The caller's ``method`` in the dialog that ``ok`` (our 200 to ``inv``) confirmed."""
    first = parse(inv)
    ctype = "Content-Type: application/sdp\r\n" if body else ""
    head = (f"{method} {ok.get('contact').strip('<>')} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:5099;branch=z9hG4bK{method[:2]}{cseq}x{os.getpid()};rport\r\n"
            f"From: {first.get('from')}\r\nTo: {ok.get('to')}\r\nCall-ID: {first.call_id}\r\n"
            f"CSeq: {cseq} {method}\r\nContact: <sip:a@127.0.0.1:5099>\r\nMax-Forwards: 70\r\n"
            f"{ctype}Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def oks(wire: Wire) -> list[SipMessage]:
    return [parse(d) for d, _ in wire.sent if d.startswith(b"SIP/2.0 200")]


HOLDS = {"sendonly": lambda port: media_sdp(port, "sendonly"), "inactive": lambda port: media_sdp(port, "inactive"),
         "c=0.0.0.0": lambda port: sdp_body(host="0.0.0.0", port=str(port))}


@pytest.mark.parametrize("hold", sorted(HOLDS))
def test_hold_and_resume_reach_the_agent_and_nothing_is_sent_while_held(hold):
    async def run() -> None:
        core, ua, wire, agent = await started(users={"echo": "bench"})
        peer = Peer()
        try:
            first = invite(body=media_sdp(peer.port))
            ua.transactions.datagram_received(first, CALLEE)
            assert await settle(lambda: 200 in wire.statuses())
            ok = oks(wire)[0]
            ua.transactions.datagram_received(in_dialog("ACK", first, ok, 1), CALLEE)
            call = next(iter(core.table.calls.values()))
            start, = agent.of(F.CallStart)
            assert start.media == "answered"
            bot_audio(core)
            assert await settle(lambda: peer.received() > 0)  # the bot is heard
            ua.transactions.datagram_received(in_dialog("INVITE", first, ok, 2, HOLDS[hold](peer.port)), CALLEE)
            assert await settle(lambda: bool(agent.of(F.CallMedia)))
            assert (b"a=recvonly" if hold == "sendonly" else b"a=inactive" if hold == "inactive" else
                    b"a=sendrecv") in oks(wire)[-1].body
            ua.transactions.datagram_received(in_dialog("ACK", first, ok, 2), CALLEE)
            held, = agent.of(F.CallMedia)
            assert held.state == "held" and call.media == "held" and not call.leg.can_send
            await asyncio.sleep(0.05)
            peer.received()  # what left before the hold was applied
            call.out_ring.write(np.full(4000, 1000, dtype=np.int16))
            await asyncio.sleep(0.3)
            assert peer.received() == 0  # held: no RTP at all
            ua.transactions.datagram_received(in_dialog("INVITE", first, ok, 3, media_sdp(peer.port)), CALLEE)
            assert await settle(lambda: len(agent.of(F.CallMedia)) == 2)
            assert agent.of(F.CallMedia)[1].state == "answered" and call.leg.can_send
            assert await settle(lambda: peer.received() > 0)  # audio resumed
            st = core.stats()
            assert st["sip_hold"] == 1 and st["sip_unhold"] == 1
            assert st["calls_media_held"] == 1 and st["calls_media_answered"] == 1
        finally:
            peer.close()
            await core.stop()

    asyncio.run(run())
