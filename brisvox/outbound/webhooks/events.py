"""A webhook event: its id, type, time and data, and the JSON body every receiver gets.

Owns the envelope (docs/PROTOCOL.md "Webhooks")::

    {"id": "evt_<32 hex>", "type": "call.ended", "created": 1767139200.123, "data": {...}}

Invariants: frozen; the id is a uuid4 (``evt_`` + 32 hex digits), made once when the event
is made: every endpoint and every retry of one event carry the same id, which is what a
receiver deduplicates on (delivery is at least once); the body is the exact bytes signed and
sent, at most :data:`MAX_BODY` (a larger ``data`` is refused by :func:`make_event` with
ValueError: the caller counts it).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.outbound.webhooks.config import EVENTS

MAX_BODY = 1 << 20  # 1 MiB: a long call's record fits; a larger event is refused, never cut


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    type: str
    created: float
    body: bytes  # the JSON envelope, as signed and sent


def new_id() -> str:
    return f"evt_{uuid.uuid4().hex}"


def make_event(type_: str, data: dict[str, Any], created: float | None = None, event_id: str | None = None) -> Event:
    """The event ``type_`` with ``data`` (JSON-serialisable); ValueError for an unknown type or a body over MAX_BODY."""
    if type_ not in EVENTS:
        raise ValueError(f"unknown webhook event {type_!r}")
    eid = event_id or new_id()
    ts = round(time.time() if created is None else created, 3)
    body = orjson.dumps({"id": eid, "type": type_, "created": ts, "data": data},
                        option=orjson.OPT_NON_STR_KEYS)
    if len(body) > MAX_BODY:
        raise ValueError(f"{type_} event of {len(body)} bytes is over {MAX_BODY}")
    return Event(eid, type_, ts, body)
