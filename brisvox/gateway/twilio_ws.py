"""Twilio Media Streams (bidirectional) over the gateway's WebSocket server.

Owns the Twilio message grammar on one connection and the call leg it
becomes: inbound ``connected``, ``start`` (streamSid, callSid, mediaFormat,
customParameters), ``media`` (base64 mu-law, 8 kHz), ``mark`` (echo of our
marks), ``dtmf``, ``stop``; outbound ``media``, ``mark``, ``clear``.

Invariants:

* Malformed input closes THIS connection with a reason and is counted:
  bad JSON or a non-object (1007), a bad base64 payload (1007), media before
  ``start`` (1008), a media format other than mu-law 8 kHz mono (1003), a
  binary frame (1003); an oversized frame is closed by the server (1009).
  An unknown event name is counted and ignored (Twilio adds events over
  time; a new one must not hang up live calls).
* A call beyond ``max_calls`` (or while draining) is closed with 1013.
* Outbound media messages are built from a per-call prefix and a reused
  encode buffer (no JSON encoder, no dict per frame); a ``mark`` is sent
  right after the frame that reaches its position and its echo is forwarded
  to the agent as MarkPlayed. After a ``clear``, echoes of marks Twilio
  flushes are swallowed (reported in Cleared instead).
* Twilio has no outbound DTMF event: SendDtmf is played in-band as tones
  through the media channel (paced like audio, pausing the out ring).
"""

from __future__ import annotations

import asyncio
import binascii
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from brisvox.gateway import dtmf
from brisvox.gateway.calls import AdmissionError, Call
from brisvox.gateway.config import WsRoute
from brisvox.gateway.g711 import PCMU

if TYPE_CHECKING:
    from brisvox.gateway.core import GatewayCore
    from brisvox.gateway.ws_server import WsConnection

log = logging.getLogger("brisvox.gateway.twilio")

RATE = 8000
MAX_MEDIA_BYTES = 8000  # 1 s of mu-law per message is far beyond what Twilio sends


class TwilioSession:
    """One Twilio media stream: protocol handler and call leg."""

    transport = "twilio"
    marks_by_echo = True

    def __init__(self, core: GatewayCore, conn: WsConnection, route: WsRoute) -> None:
        self.core = core
        self.conn = conn
        self.route = route
        self.call: Call | None = None
        self.stream_sid = ""
        self._prefix = b""
        self._clear_msg = b""
        self._enc = np.empty(4096, dtype=np.uint8)
        self._tones: np.ndarray | None = None
        self._tone_pos = 0
        loop = core.loop or asyncio.get_event_loop()
        self._start_timer: asyncio.TimerHandle | None = loop.call_later(
            core.settings.websocket.start_timeout_s, self._no_start)

    # -- protocol in --------------------------------------------------------------

    def _fail(self, kind: str, code: int, reason: str) -> None:
        self.core.metrics.inc(f"ws_malformed_{kind}")
        if self.call is not None:
            self.call.stats.malformed += 1
        log.info("twilio stream %s: closing (%s)", self.stream_sid or "-", kind)
        self.conn.close(code, reason)
        self._ended(f"protocol error: {kind}")

    def _no_start(self) -> None:
        self._start_timer = None
        if self.call is None and not self.conn.closed:
            self._fail("no_start", 1008, "no start message")

    def on_binary(self, data: bytes) -> None:
        self._fail("binary_frame", 1003, "Twilio media streams use text messages")

    def on_text(self, data: bytes) -> None:
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError:
            self._fail("bad_json", 1007, "invalid JSON")
            return
        if type(msg) is not dict:
            self._fail("bad_message", 1007, "expected a JSON object")
            return
        ev = msg.get("event")
        if ev == "media":
            self._media(msg)
        elif ev == "mark":
            m = msg.get("mark")
            name = m.get("name") if type(m) is dict else None
            if type(name) is not str:
                self._fail("bad_mark", 1007, "mark without a name")
            elif self.call is not None:
                self.core.mark_echo(self.call, name)
        elif ev == "start":
            self._start(msg)
        elif ev == "dtmf":
            d = msg.get("dtmf")
            digit = d.get("digit") if type(d) is dict else None
            if type(digit) is not str or len(digit) != 1 or digit.upper() not in dtmf.DIGITS:
                self._fail("bad_dtmf", 1007, "dtmf without a valid digit")
            elif self.call is not None:
                self.core.dtmf_in(self.call, digit.upper(), 0)
        elif ev == "stop":
            self._ended("stop")
            self.conn.close(1000, "stop")
        elif ev == "connected":
            pass
        else:
            self.core.metrics.inc("ws_malformed_unknown_event")
            if self.call is not None:
                self.call.stats.malformed += 1

    def _media(self, msg: dict[str, Any]) -> None:
        call = self.call
        if call is None:
            self._fail("media_before_start", 1008, "media before start")
            return
        media = msg.get("media")
        payload = media.get("payload") if type(media) is dict else None
        if type(payload) is not str:
            self._fail("bad_media", 1007, "media without a payload")
            return
        track = media.get("track")  # type: ignore[union-attr]
        if track is not None and track not in ("inbound", "inbound_track"):
            return  # an outbound track copy: not caller audio
        try:
            raw = binascii.a2b_base64(payload, strict_mode=True)
        except (binascii.Error, ValueError):
            self._fail("bad_base64", 1007, "invalid base64 payload")
            return
        if len(raw) > MAX_MEDIA_BYTES:
            self._fail("media_too_large", 1009, "media payload too large")
            return
        st = call.stats
        st.packets_in += 1
        st.bytes_in += len(raw)
        if raw and not call.transport_done:
            call.in_ring.write(PCMU.decode(raw))
            st.samples_in += len(raw)

    def _start(self, msg: dict[str, Any]) -> None:
        if self.call is not None:
            self.core.metrics.inc("ws_malformed_duplicate_start")
            return
        start = msg.get("start")
        if type(start) is not dict:
            self._fail("bad_start", 1007, "start without a start object")
            return
        sid = start.get("streamSid") or msg.get("streamSid")
        if type(sid) is not str or not sid or len(sid) > 128 or '"' in sid or "\\" in sid:
            self._fail("bad_start", 1007, "start without a valid streamSid")
            return
        fmt = start.get("mediaFormat") or {}
        if type(fmt) is not dict or fmt.get("encoding", "audio/x-mulaw") != "audio/x-mulaw" \
                or fmt.get("sampleRate", RATE) != RATE or fmt.get("channels", 1) != 1:
            self._fail("bad_media_format", 1003, "only audio/x-mulaw 8000 Hz mono is supported")
            return
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        self.stream_sid = sid
        try:
            call = self.core.admit("twilio", self.route.agent, RATE)
        except AdmissionError as e:
            self.conn.close(1013 if e.reason in ("full", "draining") else 1011,
                            "try again later" if e.reason in ("full", "draining") else "cannot serve the call")
            return
        ids = {"streamSid": sid}
        for k in ("callSid", "accountSid"):
            v = start.get(k)
            if type(v) is str:
                ids[k] = v[:128]
        call.transport_ids = ids
        custom = start.get("customParameters")
        if type(custom) is dict:
            call.params = {str(k)[:64]: str(v)[:1024] for k, v in list(custom.items())[:32]}
        self.call = call
        esid = sid.encode()
        self._prefix = b'{"event":"media","streamSid":"' + esid + b'","media":{"payload":"'
        self._clear_msg = b'{"event":"clear","streamSid":"' + esid + b'"}'
        self.core.start_call(call, self, self._on_ready)

    def _on_ready(self, ok: bool, why: str) -> None:
        if not ok:
            self.conn.close(1011, f"agent unavailable: {why}"[:120])
            self._ended("agent unavailable")

    def on_closed(self, code: int, reason: str) -> None:
        if self._start_timer is not None:
            self._start_timer.cancel()
            self._start_timer = None
        self._ended(f"closed {code}")

    def _ended(self, reason: str) -> None:
        if self.call is not None and not self.call.transport_done:
            self.core.transport_ended(self.call, reason)

    # -- leg: out --------------------------------------------------------------------

    @property
    def can_send(self) -> bool:
        return not self.conn.closed

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        n = len(samples)
        enc = self._enc[:n] if n <= len(self._enc) else np.empty(n, dtype=np.uint8)
        PCMU.encode(samples, out=enc)
        msg = self._prefix + binascii.b2a_base64(enc.data, newline=False) + b'"}}'
        ok = self.conn.send_text(msg)
        if ok and self.call is not None:
            self.call.stats.packets_out += 1
        return ok

    def end_spurt(self) -> None:
        pass

    def send_clear(self) -> None:
        self._tones = None
        self.conn.send_text(self._clear_msg)

    def send_mark(self, name: str) -> None:
        self.conn.send_text(orjson.dumps({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}}))

    def send_dtmf(self, digits: str) -> int:
        valid = "".join(d for d in digits if d.upper() in dtmf.DIGITS)
        tones = dtmf.tone_sequence(valid, RATE)
        if self._tones is not None:
            tones = np.concatenate([self._tones[self._tone_pos:], tones])
        self._tones, self._tone_pos = tones, 0
        return len(digits) - len(valid)

    def tick_dtmf(self, now: float) -> bool:
        t = self._tones
        if t is None:
            return False
        chunk = t[self._tone_pos:self._tone_pos + 160]
        self._tone_pos += 160
        if self._tone_pos >= len(t):
            self._tones = None
        if len(chunk):
            self.send_audio(chunk, now)
        return True

    def hangup(self, reason: str) -> None:
        self.conn.close(1000, reason[:120])
        self._ended(reason)

    def transfer(self, target: str, done: Callable[[bool, str], None]) -> None:
        done(False, "a Twilio media stream cannot transfer; use the Twilio REST API (calls update)")

    def poll(self, now: float) -> None:
        pass
