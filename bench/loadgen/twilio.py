"""Client side of the Twilio Media Streams protocol, as Twilio itself speaks it.

Owns the text of the messages a Twilio call sends to a bot's WebSocket
(``connected``, ``start``, ``media``, ``mark`` echoes, ``stop``) and the parsing
of what a bot sends back (``media``, ``mark``, ``clear``). Media payloads are
base64 mu-law 8 kHz mono, 20 ms (160 bytes) per message.

Invariants: ``sequenceNumber`` counts up from 1 over every message after
``connected``; ``media.chunk`` counts up from 1 and ``media.timestamp`` is
milliseconds since the stream started, both as strings, as Twilio sends them.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

try:  # orjson in the project venv; json anywhere else
    import orjson

    def _loads(data: str | bytes) -> Any:
        return orjson.loads(data)
except ImportError:  # pragma: no cover
    def _loads(data: str | bytes) -> Any:
        return json.loads(data)


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
