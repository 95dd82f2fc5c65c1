"""Client side of the Twilio Media Streams protocol, as Twilio itself speaks it.

Owns the text of the messages a Twilio call sends to a bot's WebSocket
(``connected``, ``start``, ``media``, ``dtmf``, ``mark`` echoes, ``stop``),
the parsing of what a bot sends back (``media``, ``mark``, ``clear``), the
cheap loudness test of a mu-law payload, and :class:`TwilioTransport`, one
call of ``brisvox call`` over this protocol. Media payloads are base64 mu-law
8 kHz mono, 20 ms (160 bytes) per message; the codec is the gateway's
(:mod:`brisvox.gateway.g711`). The load generator (``bench/loadgen``) uses
the message layer (``TwilioStream``, ``parse_bot``, ``loud_fraction``).

Invariants: ``sequenceNumber`` counts up from 1 over every message after
``connected``; ``media.chunk`` counts up from 1 and ``media.timestamp`` is
milliseconds since the stream started, both as strings, as Twilio sends them.
The transport echoes each ``mark`` as soon as it arrives (the client plays
audio as it arrives, so the audio before the mark has been heard).
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from brisvox.client.transport import CLOSE_TIMEOUT_S, CONNECT_TIMEOUT_S, BotEvents, TransportError
from brisvox.gateway.g711 import PCMU, ULAW_DECODE, ULAW_SILENCE

try:  # orjson in the project venv; json anywhere else
    import orjson

    def _loads(data: str | bytes) -> Any:
        return orjson.loads(data)
except ImportError:  # pragma: no cover
    def _loads(data: str | bytes) -> Any:
        return json.loads(data)

RATE = 8000
FRAME = 160
SILENCE_BYTE = ULAW_SILENCE  # mu-law of 0 (0xFF)
# A mu-law byte is "loud" when it decodes to more than about -40 dBFS.
LOUD = bytes(1 if abs(int(v)) > 330 else 0 for v in ULAW_DECODE)


def encode(pcm: np.ndarray) -> bytes:
    """int16 samples -> mu-law bytes (the gateway's G.711 tables)."""
    return PCMU.encode(np.ascontiguousarray(pcm, dtype=np.int16)).tobytes()


def decode(data: bytes) -> np.ndarray:
    """mu-law bytes -> int16 samples."""
    return PCMU.decode(data)


def loud_fraction(data: bytes) -> float:
    """Fraction of mu-law samples louder than about -40 dBFS (C-speed, no decode)."""
    if not data:
        return 0.0
    return data.translate(LOUD).count(1) / len(data)


@dataclass(frozen=True, slots=True)
class BotMessage:
    """One message from the bot: ``event`` is media, mark, clear or other."""

    event: str
    payload: bytes = b""  # media: mu-law bytes
    name: str = ""  # mark: its name


class TwilioStream:
    """Builds the messages of one call (mutable counters; one per call)."""

    def __init__(self, index: int, tag: str = "bench") -> None:
        self.stream_sid = f"MZ{tag}{index:06d}"
        self.call_sid = f"CA{tag}{index:06d}"
        self.account_sid = "ACbench000000"
        self._seq = 0
        self._chunk = 0

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    @staticmethod
    def connected() -> str:
        return '{"event":"connected","protocol":"Call","version":"1.0.0"}'

    def start(self, custom: dict[str, str] | None = None) -> str:
        return json.dumps({
            "event": "start",
            "sequenceNumber": str(self._next_seq()),
            "start": {
                "accountSid": self.account_sid,
                "streamSid": self.stream_sid,
                "callSid": self.call_sid,
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                "customParameters": custom or {},
            },
            "streamSid": self.stream_sid,
        })

    def media(self, payload_b64: str) -> str:
        self._chunk += 1
        ts = (self._chunk - 1) * 20
        seq = self._next_seq()
        return (f'{{"event":"media","sequenceNumber":"{seq}","media":{{"track":"inbound",'
                f'"chunk":"{self._chunk}","timestamp":"{ts}","payload":"{payload_b64}"}},'
                f'"streamSid":"{self.stream_sid}"}}')

    def mark(self, name: str) -> str:
        return json.dumps({"event": "mark", "sequenceNumber": str(self._next_seq()),
                           "streamSid": self.stream_sid, "mark": {"name": name}})

    def dtmf(self, digit: str) -> str:
        return json.dumps({"event": "dtmf", "sequenceNumber": str(self._next_seq()),
                           "streamSid": self.stream_sid, "dtmf": {"track": "inbound_track", "digit": digit}})

    def stop(self) -> str:
        return json.dumps({"event": "stop", "sequenceNumber": str(self._next_seq()),
                           "stop": {"accountSid": self.account_sid, "callSid": self.call_sid},
                           "streamSid": self.stream_sid})


def parse_bot(data: str | bytes) -> BotMessage:
    """Parse one message from the bot; anything unparseable is event ``invalid``."""
    try:
        msg = _loads(data)
        event = msg.get("event", "")
        if event == "media":
            return BotMessage("media", payload=base64.b64decode(msg["media"]["payload"]))
        if event == "mark":
            return BotMessage("mark", name=str(msg.get("mark", {}).get("name", "")))
        if event == "clear":
            return BotMessage("clear")
        return BotMessage(str(event) or "other")
    except Exception:
        return BotMessage("invalid")


class TwilioTransport:
    """One ``brisvox call`` over Twilio Media Streams (see :class:`~brisvox.client.transport.CallTransport`)."""

    rate = RATE

    def __init__(self, url: str, params: dict[str, str] | None = None, tag: str = "cli") -> None:
        self.url = url
        self.params = params or {}
        self.stream = TwilioStream(int(time.time() * 1000) % 1_000_000, tag=tag)
        self.call_id = ""
        self.ids = {"streamSid": self.stream.stream_sid, "callSid": self.stream.call_sid}
        self.ws: Any = None
        self._rx: asyncio.Task[None] | None = None
        self._events = BotEvents()
        self._ended = False
        self._closing = False
        self.invalid = 0

    async def open(self, events: BotEvents) -> None:
        from websockets.asyncio.client import connect

        self._events = events
        try:
            self.ws = await asyncio.wait_for(
                connect(self.url, compression=None, ping_interval=None, open_timeout=CONNECT_TIMEOUT_S,
                        close_timeout=CLOSE_TIMEOUT_S, max_size=2**20),
                CONNECT_TIMEOUT_S + 1.0)
            await self.ws.send(self.stream.connected())
            await self.ws.send(self.stream.start(self.params))
        except Exception as e:  # refused, timeout, handshake rejected
            raise TransportError(f"cannot connect to {self.url}: {type(e).__name__}: {e}") from None
        self._rx = asyncio.create_task(self._receive())

    def _end(self, reason: str) -> None:
        if not self._ended:
            self._ended = True
            self._events.on_end(reason, time.monotonic())

    async def _receive(self) -> None:
        ws = self.ws
        reason = "closed by the server"
        try:
            async for message in ws:
                now = time.monotonic()
                m = parse_bot(message)
                if m.event == "media":
                    self._events.on_audio(decode(m.payload), now)
                elif m.event == "clear":
                    self._events.on_clear(now)
                elif m.event == "mark":
                    await ws.send(self.stream.mark(m.name))
                elif m.event == "invalid":
                    self.invalid += 1
        except Exception as e:  # noqa: BLE001 - a reset ends the call like a close
            reason = f"connection lost: {type(e).__name__}"
        code = getattr(ws, "close_code", None)
        if code is not None:
            why = getattr(ws, "close_reason", "") or ""
            reason = f"closed by the server ({code}{': ' + why if why else ''})"
        if not self._closing:
            self._end(reason)

    async def send_audio(self, pcm: np.ndarray) -> None:
        if self._ended or self.ws is None:
            return
        payload = base64.b64encode(encode(pcm)).decode()
        try:
            await self.ws.send(self.stream.media(payload))
        except Exception:  # noqa: BLE001 - the receive task reports the end
            return

    async def send_dtmf(self, digits: str) -> None:
        if self._ended or self.ws is None:
            return
        for d in digits:
            try:
                await self.ws.send(self.stream.dtmf(d))
            except Exception:  # noqa: BLE001
                return

    async def close(self) -> None:
        self._closing = True
        ws = self.ws
        if ws is not None:
            try:
                if not self._ended:
                    await asyncio.wait_for(ws.send(self.stream.stop()), CLOSE_TIMEOUT_S)
                await asyncio.wait_for(ws.close(), CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - best effort at hang-up
                pass
        if self._rx is not None:
            self._rx.cancel()
            await asyncio.gather(self._rx, return_exceptions=True)
        if ws is not None and ws.transport is not None:
            ws.transport.abort()
        self._ended = True
