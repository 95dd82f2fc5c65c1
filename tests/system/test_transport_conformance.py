"""Transport conformance: every transport of the registry behaves the same at the real gateway.

One gateway process (``python -m brisvox.gateway``) and one fake agent
process (ZeroMQ) serve the whole module; each case places a fresh call
through one transport of :data:`brisvox.gateway.transports.TRANSPORTS`
(Twilio Media Streams, native WebSocket, Plivo Audio Streams, Telnyx Media
Streaming, Vonage Voice WebSockets, Exotel Voicebot streams, Asterisk
chan_websocket (:mod:`tests.system.asterisk_ws_peer` plays Asterisk), FreeSWITCH
mod_audio_stream (:mod:`tests.system.freeswitch_peer`), SIP/RTP;
every WebSocket one at ``/<name>``, native at ``/ws``; Asterisk's AudioSocket on its
own TCP listener), driven by the client's own transports (:mod:`brisvox.client`), an
AudioSocket peer written from the protocol's text (:mod:`tests.system.audiosocket_peer`),
raw sockets and the :mod:`brisvox.wire` builders, and checks what the caller and the agent see:

* ``clear``: a Clear stops the bot's audio at the peer within a tick
  (Twilio and native peers get a ``clear``, Asterisk ``FLUSH_MEDIA``, FreeSWITCH's handler ``{"type":"clear"}``; SIP's RTP and AudioSocket's audio stop) and Cleared
  answers a position no further than what was written;
* ``lazy_clear``: a lazy Clear read after the newer epoch's audio started
  stops nothing (no transport clear, every frame arrives, counted
  ``clears_after_newer``);
* ``pause``: Pause holds the audio (at most the frame in flight arrives),
  Resume delivers the rest: exactly the samples written;
* ``marks_release`` / ``marks_echo``: an agent's Mark comes back as
  MarkPlayed, on release or on the peer's echo;
* ``dtmf_in`` / ``dtmf_out``: digits both ways (Twilio's and Telnyx's outbound digits are
  in-band tones, checked by their two frequencies);
* ``transfer``: the agent's Transfer reaches the peer and its outcome
  comes back as TransferResult (Twilio's through the REST API: the module's
  gateway points ``twilio_api_base`` at a loopback stand-in,
  :mod:`tests.system.twilio_api_fake`, so its Twilio handshakes are signed);
* ``hangup``: the agent's Hangup ends the call at the peer; the peer's end
  reaches the agent as CallEnd;
* ``oversize`` / ``malformed``: refused and counted, and a live call on the
  same transport goes on (AudioSocket: a 64 KiB length, an unknown kind byte, each
  ending its own connection);
* ``fault_budget``: malformed messages on a live call's own connection are
  counted (the call's ``malformed``) and dropped, and audio keeps flowing
  both ways; one more than the budget (``[websocket] fault_max``, here
  :data:`FAULT_MAX`) closes that call with the kind's close code and a
  reason naming the budget, which is also the agent's CallEnd reason.

A capability a transport lacks is not skipped silently: the registry
entry's ``lacks`` names it with the reason, and the case reports that
reason as not applicable.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect

from brisvox.client.exotel import ExotelTransport
from brisvox.client.native import NativeTransport
from brisvox.client.plivo import PlivoTransport
from brisvox.client.sip import SipTransport
from brisvox.client.telnyx import TelnyxTransport
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport
from brisvox.client.vonage import VonageTransport
from brisvox.gateway.transports import CAPABILITIES, TRANSPORTS, websocket_protocols
from brisvox.wire import twilio
from brisvox.wire.g711 import PCMU
from brisvox.wire.native import NativeStream, server_message
from ipc import frames as F
from ipc.ring import Ring, ring_name
from tests.system.asterisk_ws_peer import AsteriskWsPeer
from tests.system.audiosocket_peer import AudioSocketPeer
from tests.system.audiosocket_peer import message as as_message
from tests.system.freeswitch_peer import FreeSwitchPeer
from tests.system.gateway_harness import FakeAgent, GatewayProc
from tests.system.twilio_api_fake import ACCOUNT, TOKEN, FakeTwilioApi

pytestmark = [pytest.mark.system, pytest.mark.timeout(120)]

FRAME = 160
RATE = 8000
WS_MAX = 65536
SIP_MAX = 8192
AS_MAX = 4096  # the module gateway's [audiosocket] max_message_bytes
FAULT_MAX = 5  # the module gateway's fault budget: 5 malformed messages within 10 s
# distinct values that survive G.711 mu-law exactly, one per 20 ms frame
LEVELS = np.unique(PCMU.decode(np.arange(256, dtype=np.uint8)))
LEVELS = LEVELS[np.abs(LEVELS) > 200][:100]
# every WebSocket transport of the registry at /<name> (native at /ws)
PATHS = {name: "/ws" if name == "native" else f"/{name}" for name in websocket_protocols()}
ROUTES = [{"path": path, "protocol": name, "agent": "default"} for name, path in PATHS.items()]


def tagged(n_frames: int, first: int = 0) -> np.ndarray:
    return np.repeat(LEVELS[first:first + n_frames], FRAME).astype(np.int16)


def cases() -> Iterator[Any]:
    """Every (transport, capability); a lacking one carries the registry's reason."""
    for cap in CAPABILITIES:
        for name, t in TRANSPORTS.items():
            if t.offers(cap):
                yield pytest.param(name, cap, id=f"{name}-{cap}")
            else:
                yield pytest.param(name, cap, id=f"{name}-{cap}", marks=pytest.mark.skip(
                    reason=f"not applicable to {name} (transport registry): {t.lacks[cap]}"))


# -- the module's gateway -------------------------------------------------------------


@pytest.fixture(scope="module")
def env() -> Iterator[tuple[GatewayProc, FakeAgent]]:
    tmp = Path(tempfile.mkdtemp(prefix="bvc", dir="/tmp"))
    try:
        with FakeTwilioApi() as api, FakeAgent(tmp) as agent, GatewayProc(
                tmp, peers={"agent-0": agent.endpoint}, inbox=True,
                gateway={"pause_max_ms": 5000},
                sip={"max_message_bytes": SIP_MAX},
                websocket={"max_message_bytes": WS_MAX, "fault_max": FAULT_MAX, "fault_window_s": 10.0,
                           # every case connects from 127.0.0.1, back to back: the per-source
                           # handshake limit (20/s by default) is not what this suite checks
                           "handshakes_per_s": 200, "routes": ROUTES, **api.config()},
                audiosocket={"max_message_bytes": AS_MAX}) as gw:
            yield gw, agent
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class NativeEcho(NativeTransport):
    """The native client in marks echo mode: it echoes every mark at once (it played it)."""

    def __init__(self, url: str, rate: int) -> None:
        super().__init__(url, rate)
        self.stream = NativeStream(rate, None, marks="echo")

    async def _receive(self) -> None:
        async for m in self.ws:
            now = time.monotonic()
            if isinstance(m, bytes):
                self._events.on_audio(np.frombuffer(m, dtype="<i2"), now)
                continue
            msg = server_message(orjson.loads(m))
            if msg.event == "mark":
                await self.ws.send(self.stream.mark(msg.name))
            elif msg.event == "clear":
                self._events.on_clear(now)


class Peer:
    """One call through one transport, as the caller sees it."""

    def __init__(self, kind: str, gw: GatewayProc, echo_marks: bool = False) -> None:
        self.kind = kind
        self.gw = gw
        if kind == "twilio":
            self.t: Any = TwilioTransport(f"ws://127.0.0.1:{gw.ws_port}/twilio")
            self.t.headers.update(signed(self.t.url))
            self.t.stream.account_sid = ACCOUNT  # the gateway's twilio_account_sid: a foreign one is refused 1008
        elif kind == "plivo":
            self.t = PlivoTransport(f"ws://127.0.0.1:{gw.ws_port}/plivo")
        elif kind == "telnyx":
            self.t = TelnyxTransport(f"ws://127.0.0.1:{gw.ws_port}/telnyx")
        elif kind == "vonage":  # audio/l16;rate=8000: the tagged levels are 8 kHz frames
            self.t = VonageTransport(f"ws://127.0.0.1:{gw.ws_port}/vonage", rate=RATE)
        elif kind == "exotel":  # raw/slin at 8 kHz: the tagged levels are 8 kHz frames
            self.t = ExotelTransport(f"ws://127.0.0.1:{gw.ws_port}/exotel", rate=RATE)
        elif kind == "audiosocket":
            self.t = AudioSocketPeer("127.0.0.1", gw.audiosocket_port)
        elif kind == "asterisk_ws":  # c(ulaw): the tagged levels survive mu-law
            self.t = AsteriskWsPeer(f"ws://127.0.0.1:{gw.ws_port}/asterisk_ws")
        elif kind == "freeswitch":  # mono 8k, L16
            self.t = FreeSwitchPeer(f"ws://127.0.0.1:{gw.ws_port}/freeswitch")
        elif kind == "native":
            url = f"ws://127.0.0.1:{gw.ws_port}/ws"
            self.t = NativeEcho(url, RATE) if echo_marks else NativeTransport(url, RATE)
        else:
            self.t = SipTransport(f"sip:conformance@127.0.0.1:{gw.sip_port}", codecs=("PCMU",))
        self.audio: list[tuple[float, np.ndarray]] = []
        self.n = 0
        self.clears: list[float] = []
        self.dtmf: list[str] = []
        self.ended: list[str] = []
        self.call_id = ""
        self.out: Ring | None = None
        self._talk: asyncio.Task[None] | None = None

    def _on_audio(self, pcm: np.ndarray, now: float) -> None:
        self.audio.append((now, pcm.copy()))
        self.n += len(pcm)

    async def open(self, agent: FakeAgent) -> Peer:
        seen = len(agent.of(F.CallStart))
        await self.t.open(BotEvents(on_audio=self._on_audio, on_clear=self.clears.append,
                                    on_dtmf=lambda d, now: self.dtmf.append(d),
                                    on_end=lambda why, now: self.ended.append(why)))
        start = await asyncio.to_thread(agent.wait_for, F.CallStart,
                                        lambda f: f in agent.of(F.CallStart)[seen:], 5.0)
        self.call_id = start.call_id
        deadline = time.monotonic() + 5.0  # the agent's CallAccepted makes it active (the pacer serves it)
        while (await asyncio.to_thread(self.gw.command, "calls")).get(self.call_id, {}).get("state") != "active":
            assert time.monotonic() < deadline, "the call did not become active"
            await asyncio.sleep(0.01)
        self.out = Ring.attach(ring_name(self.gw.instance, self.call_id, "out", start.ring_key))
        self._talk = asyncio.create_task(self._talk_loop())
        return self

    async def _talk_loop(self) -> None:
        silence = np.zeros(self.t.rate // 50, np.int16)
        t0 = time.monotonic()
        k = 0
        while True:
            await self.t.send_audio(silence)
            k += 1
            await asyncio.sleep(max(0.0, t0 + k * 0.02 - time.monotonic()))

    def samples(self) -> np.ndarray:
        return np.concatenate([a for _, a in self.audio]) if self.audio else np.zeros(0, np.int16)

    def between(self, t0: float, t1: float) -> int:
        return sum(len(a) for t, a in self.audio if t0 <= t < t1)

    async def until(self, pred: Any, timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if pred():
                return True
            await asyncio.sleep(0.01)
        return bool(pred())

    async def play(self, audio: np.ndarray, epoch: int, utterance: int, agent: FakeAgent) -> int:
        """The agent's side: write ``audio`` to the out ring and announce it; returns its start."""
        assert self.out is not None
        start = self.out.write_pos
        self.out.write(audio)
        agent.send(F.OutUtterance(call_id=self.call_id, utterance=utterance, epoch=epoch, out_pos=start))
        return start

    async def close(self) -> None:
        if self._talk is not None:
            self._talk.cancel()
            await asyncio.gather(self._talk, return_exceptions=True)
        await self.t.close()
        if self.out is not None:
            self.out.close()


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def stats(gw: GatewayProc) -> dict[str, Any]:
    return await asyncio.to_thread(gw.stats)


async def reply(agent: FakeAgent, cls: type, call_id: str, timeout: float = 5.0) -> Any:
    return await asyncio.to_thread(agent.wait_for, cls, lambda f: f.call_id == call_id, timeout)


# -- the cases ------------------------------------------------------------------------


async def case_clear(p: Peer, agent: FakeAgent) -> None:
    audio = tagged(100)
    await p.play(audio, 1, 1, agent)
    assert await p.until(lambda: p.n >= 10 * FRAME)
    agent.send(F.Clear(call_id=p.call_id, epoch=1, sent_ns=time.monotonic_ns()))
    cleared = await reply(agent, F.Cleared, p.call_id)
    at_cut = p.n
    await asyncio.sleep(0.3)
    assert p.n - at_cut <= 2 * FRAME, (p.n, at_cut)  # the frame in flight at most
    assert cleared.epoch == 1 and at_cut - 2 * FRAME <= cleared.position < len(audio)
    if p.kind not in ("sip", "audiosocket"):  # an RTP or AudioSocket peer just stops getting audio
        assert p.clears, "no clear message"


async def case_lazy_clear(p: Peer, agent: FakeAgent) -> None:
    before = (await stats(p.gw)).get("clears_after_newer", 0)
    first, second = tagged(5), tagged(40, first=5)
    await p.play(first, 1, 1, agent)
    start2 = await p.play(second, 2, 2, agent)
    assert await p.until(lambda: p.n >= start2 + 5 * FRAME)  # the newer epoch plays
    agent.send(F.Clear(call_id=p.call_id, epoch=1, sent_ns=time.monotonic_ns(), lazy=True))
    cleared = await reply(agent, F.Cleared, p.call_id)
    assert await p.until(lambda: p.n >= len(first) + len(second))
    assert cleared.epoch == 1 and not cleared.marks
    assert not p.clears  # the peer was not told to drop the new response
    assert np.array_equal(p.samples()[:len(first) + len(second)], np.concatenate([first, second]))
    assert (await stats(p.gw))["clears_after_newer"] == before + 1


async def case_pause(p: Peer, agent: FakeAgent) -> None:
    audio = tagged(60)
    await p.play(audio, 1, 1, agent)
    assert await p.until(lambda: p.n >= 10 * FRAME)
    t_pause = time.monotonic()
    agent.send(F.Pause(call_id=p.call_id, epoch=1, sent_ns=time.monotonic_ns()))
    await asyncio.sleep(0.1)
    held = p.n
    await asyncio.sleep(0.3)
    t_resume = time.monotonic()
    assert p.n == held and p.between(t_pause, t_resume) <= 2 * FRAME
    agent.send(F.Resume(call_id=p.call_id, epoch=1, sent_ns=time.monotonic_ns()))
    assert await p.until(lambda: p.n >= len(audio))
    await asyncio.sleep(0.1)
    assert np.array_equal(p.samples(), audio)  # nothing lost, nothing repeated


async def case_marks(p: Peer, agent: FakeAgent) -> None:
    await p.play(tagged(20), 1, 1, agent)
    agent.send(F.Mark(call_id=p.call_id, name="m1", position=10 * FRAME))
    played = await reply(agent, F.MarkPlayed, p.call_id)
    assert (played.name, played.position) == ("m1", 10 * FRAME)
    # A mark is reported once its audio was sent: the peer reads that audio on another
    # socket than the one the report takes, so the last frame may still be in flight.
    assert await p.until(lambda: p.n >= 10 * FRAME, timeout=0.2), p.n


async def case_dtmf_in(p: Peer, agent: FakeAgent) -> None:
    await p.t.send_dtmf("5")
    got = await reply(agent, F.Dtmf, p.call_id)
    assert got.digit == "5"


async def case_dtmf_out(p: Peer, agent: FakeAgent) -> None:
    agent.send(F.SendDtmf(call_id=p.call_id, digits="7"))
    if p.kind in ("twilio", "telnyx", "vonage", "exotel", "asterisk_ws", "freeswitch", "audiosocket"):  # in-band
        assert await p.until(lambda: p.n >= 800)
        x = p.samples()[:800].astype(np.float64)
        spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
        freqs = np.fft.rfftfreq(len(x), 1 / RATE)

        def power(f: float) -> float:
            return float(spec[np.abs(freqs - f) < 15].max())

        assert min(power(852), power(1209)) > 10 * max(power(697), power(1477))
    else:
        assert await p.until(lambda: p.dtmf == ["7"]), p.dtmf
    calls = await asyncio.to_thread(p.gw.command, "calls")
    assert calls[p.call_id]["dtmf_out"] == 1


async def case_transfer(p: Peer, agent: FakeAgent) -> None:
    await asyncio.sleep(0.2)  # SIP: the dialog is confirmed by the ACK
    agent.send(F.Transfer(call_id=p.call_id, target="sip:operator@127.0.0.1"))
    res = await reply(agent, F.TransferResult, p.call_id)
    if p.kind == "native":
        assert res.ok and res.detail == "delegated to the client"
    elif p.kind == "twilio":  # the REST API's calls update (the loopback stand-in answers 200)
        assert res.ok and res.detail == "Twilio API 200", res
    else:  # the client's SIP stack answers REFER 405: the REFER reached it, its answer came back
        assert not res.ok and res.detail.startswith("405"), res


async def case_hangup(p: Peer, agent: FakeAgent) -> None:
    agent.send(F.Hangup(call_id=p.call_id, reason="agent done"))
    assert await p.until(lambda: bool(p.ended)), "the peer did not see the end"
    other = await Peer(p.kind, p.gw).open(agent)
    await other.close()
    end = await reply(agent, F.CallEnd, other.call_id)
    assert end.reason


async def still_live(p: Peer) -> None:
    await asyncio.sleep(0.2)
    assert not p.ended
    calls = await asyncio.to_thread(p.gw.command, "calls")
    assert calls[p.call_id]["state"] == "active"


def udp(port: int, data: bytes, timeout: float = 0.5) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(timeout)
        s.sendto(data, ("127.0.0.1", port))
        try:
            return s.recv(65535)
        except TimeoutError:
            return None


def signed(url: str) -> dict[str, str]:
    """The X-Twilio-Signature of a Twilio route's upgrade to ``url`` (no header for another route)."""
    if not url.endswith("/twilio"):
        return {}
    return {"X-Twilio-Signature": twilio.signature(TOKEN, "wss://" + url.split("://", 1)[1])}


async def ws_closed_with(url: str, *msgs: str | bytes) -> int | None:
    async with connect(url, max_size=None, additional_headers=signed(url)) as ws:
        for m in msgs:
            await ws.send(m)
        try:
            async with asyncio.timeout(3):
                async for _ in ws:
                    pass
        except Exception:  # noqa: BLE001 - closed by the server: its code says why
            pass
        return ws.close_code


async def case_oversize(p: Peer, agent: FakeAgent) -> None:
    before = await stats(p.gw)
    if p.kind == "sip":
        body = b"x" * (SIP_MAX + 100)
        head = (f"OPTIONS sip:x@127.0.0.1:{p.gw.sip_port} SIP/2.0\r\n"
                "Via: SIP/2.0/UDP 127.0.0.1:5098;branch=z9hG4bKbig;rport\r\n"
                "From: <sip:t@127.0.0.1>;tag=a\r\nTo: <sip:x@127.0.0.1>\r\nCall-ID: big@t\r\n"
                f"CSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: {len(body)}\r\n\r\n").encode()
        udp(p.gw.sip_port, head + body)
        after = await stats(p.gw)
        assert after["sip_malformed_oversized"] == before.get("sip_malformed_oversized", 0) + 1
    elif p.kind == "audiosocket":  # a 64 KiB length on another call's connection: refused at its header
        q = AudioSocketPeer("127.0.0.1", p.gw.audiosocket_port)
        await q.open()
        try:
            await q.send_raw(b"\x10\xff\xff")
            assert await q.closed_by_server(), "not closed"
            assert q.kinds[-1:] == [0x00]  # told to hang up first
        finally:
            await q.close()
        after = await stats(p.gw)
        assert after["audiosocket_malformed_oversized"] == before.get("audiosocket_malformed_oversized", 0) + 1
    else:
        code = await ws_closed_with(f"ws://127.0.0.1:{p.gw.ws_port}{PATHS[p.kind]}", "x" * (WS_MAX + 100))
        assert code == 1009
    await still_live(p)


async def case_malformed(p: Peer, agent: FakeAgent) -> None:
    before = await stats(p.gw)
    if p.kind == "sip":
        assert udp(p.gw.sip_port, b"\x00\xffgarbage\r\n\r\n", 0.3) is None
        assert p.t.remote_rtp is not None
        p.t.rtp.transport.sendto(b"\x80", p.t.remote_rtp)  # shorter than an RTP header, from the latched source
        await asyncio.sleep(0.1)
        after = await stats(p.gw)
        malformed = {k: v - before.get(k, 0) for k, v in after.items() if k.startswith("sip_malformed_")}
        assert sum(malformed.values()) == 1, malformed
        assert after["rtp_malformed"] == before.get("rtp_malformed", 0) + 1
    elif p.kind == "audiosocket":  # an unknown kind byte, then a UUID of the wrong size: each ends its connection
        for bad, kind in ((as_message(0x42, b"x"), "unknown_kind"), (as_message(0x01, b"short"), "bad_uuid")):
            q = AudioSocketPeer("127.0.0.1", p.gw.audiosocket_port, send_uuid=False)
            await q.open()
            try:
                await q.send_raw(bad)
                assert await q.closed_by_server(), kind
            finally:
                await q.close()
            counter = f"audiosocket_malformed_{kind}"
            assert (await stats(p.gw))[counter] == before.get(counter, 0) + 1, counter
    elif p.kind in ("twilio", "plivo", "telnyx", "vonage", "exotel", "asterisk_ws", "freeswitch"):  # closes first
        code = await ws_closed_with(f"ws://127.0.0.1:{p.gw.ws_port}{PATHS[p.kind]}", "{not json")
        assert code == 1007
        assert (await stats(p.gw))["ws_malformed_bad_json"] == before.get("ws_malformed_bad_json", 0) + 1
    else:  # the native protocol answers an error and the call goes on
        await p.t.ws.send("{not json")
        await p.t.ws.send(b"\x01")  # odd-length PCM16
        assert await p.until(lambda: p.t.errors[-2:] == ["bad_json", "odd_frame"]), p.t.errors
    await still_live(p)


def malformed_messages(p: Peer) -> list[str | bytes]:
    """``FAULT_MAX - 1`` different malformed messages of ``p``'s protocol (within the budget)."""
    if p.kind == "twilio":
        sid = p.t.stream.stream_sid
        msgs: list[str | bytes] = [
            "{not json",
            f'{{"event":"media","streamSid":"{sid}","media":{{"payload":"@@@not base64"}}}}',
            f'{{"event":"mark","streamSid":"{sid}","mark":{{}}}}',
            b"\x00\x01",  # a binary frame
        ]
    elif p.kind == "telnyx":
        sid = p.t.stream.stream_id
        msgs = [
            "{not json",
            f'{{"event":"media","stream_id":"{sid}","media":{{"payload":"@@@not base64"}}}}',
            f'{{"event":"mark","stream_id":"{sid}","mark":{{}}}}',
            b"\x00\x01",  # a binary frame
        ]
    elif p.kind == "plivo":
        sid = p.t.stream.stream_id
        msgs = [
            "{not json",
            f'{{"event":"media","streamId":"{sid}","media":{{"payload":"@@@not base64"}}}}',
            f'{{"event":"playedStream","streamId":"{sid}"}}',  # Plivo's mark echo without a name
            b"\x00\x01",  # a binary frame
        ]
    elif p.kind == "exotel":
        sid = p.t.stream.stream_sid
        msgs = [
            "{not json",
            f'{{"event":"media","stream_sid":"{sid}","media":{{"payload":"@@@not base64"}}}}',
            f'{{"event":"mark","stream_sid":"{sid}","mark":{{}}}}',
            b"\x00\x01",  # a binary frame
        ]
    elif p.kind == "vonage":
        msgs = [
            "{not json",
            b"\x01",  # a binary frame that is not whole samples
            '{"event":"websocket:notify","payload":{}}',  # Vonage's answer to a notify without the mark
            '{"event":"websocket:dtmf","digit":"Z","duration":100}',
        ]
    elif p.kind == "asterisk_ws":
        msgs = [
            "{not json",
            "DTMF_END digit:Z",
            "DTMF_END digit",  # a word the plain-text grammar refuses
            b"\x00" * (RATE + 1),  # over 1 s of ulaw
        ]
    elif p.kind == "freeswitch":
        msgs = [
            "{not json",
            b"\x01",  # a binary frame that is not whole samples
            '{"type":"dtmf","digit":"Z"}',
            '["not", "an", "object"]',
        ]
    else:
        msgs = ["{bad", b"\x01", NativeStream.dtmf("Z"), '{"event":"nope"}']
    assert len(msgs) == FAULT_MAX - 1
    return msgs


async def case_fault_budget(p: Peer, agent: FakeAgent) -> None:
    before = await stats(p.gw)
    calls = await asyncio.to_thread(p.gw.command, "calls")
    in_before = calls[p.call_id]["in_pos"]
    for m in malformed_messages(p):
        await p.t.ws.send(m)
    await p.play(tagged(10), 1, 1, agent)  # the bot's audio still reaches the caller
    assert await p.until(lambda: p.n >= 10 * FRAME)
    await still_live(p)
    calls = await asyncio.to_thread(p.gw.command, "calls")
    assert calls[p.call_id]["malformed"] == FAULT_MAX - 1
    assert calls[p.call_id]["in_pos"] > in_before  # the caller's audio still reaches the in ring
    after = await stats(p.gw)
    kinds = (("bad_json", "bad_base64", "bad_mark", "binary_frame") if p.kind in ("twilio", "plivo", "telnyx", "exotel")
             else ("bad_json", "bad_media", "bad_mark", "bad_dtmf") if p.kind == "vonage"
             else ("bad_json", "bad_dtmf", "bad_message", "media_too_large") if p.kind == "asterisk_ws"
             else ("bad_json", "bad_media", "bad_dtmf", "bad_message") if p.kind == "freeswitch"
             else ("bad_json", "odd_frame", "bad_dtmf", "unknown_event"))
    for kind in kinds:
        assert after[f"ws_malformed_{kind}"] == before.get(f"ws_malformed_{kind}", 0) + 1, kind
    if p.kind == "native":
        assert await p.until(lambda: p.t.errors[-4:] == list(kinds)), p.t.errors
    # one more than the budget on another call ends that call, and only it
    q = await Peer(p.kind, p.gw).open(agent)
    try:
        for _ in range(FAULT_MAX + 1):
            await q.t.ws.send("{not json")
        assert await q.until(lambda: q.t.ws.close_code is not None), "not closed"
        reason = f"fault budget exceeded: {FAULT_MAX + 1} malformed messages in 10 s"
        assert (q.t.ws.close_code, q.t.ws.close_reason) == (1007, reason)
        end = await reply(agent, F.CallEnd, q.call_id)
        assert end.reason == reason
    finally:
        await q.close()
    await still_live(p)


CASES = {
    "clear": case_clear,
    "lazy_clear": case_lazy_clear,
    "pause": case_pause,
    "marks_release": case_marks,
    "marks_echo": case_marks,
    "dtmf_in": case_dtmf_in,
    "dtmf_out": case_dtmf_out,
    "transfer": case_transfer,
    "hangup": case_hangup,
    "oversize": case_oversize,
    "malformed": case_malformed,
    "fault_budget": case_fault_budget,
}


def test_every_capability_has_a_case_and_every_lack_a_reason():
    assert set(CASES) == set(CAPABILITIES)
    for t in TRANSPORTS.values():
        assert all(isinstance(why, str) and why for why in t.lacks.values()), t.name


@pytest.mark.parametrize(("transport", "capability"), list(cases()))
def test_transport_conformance(env, transport: str, capability: str) -> None:
    gw, agent = env

    async def go() -> None:
        p = await Peer(transport, gw, echo_marks=capability == "marks_echo").open(agent)
        try:
            await CASES[capability](p, agent)
        finally:
            await p.close()

    run(go())
