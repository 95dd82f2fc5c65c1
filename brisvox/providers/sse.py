"""The one Server-Sent Events parser of the HTTP adapters (WHATWG "event stream" format).

Owns the incremental byte -> event step: :meth:`SseParser.feed` takes any
slice of the body (a chunk may end inside a line, inside a UTF-8 sequence,
or between the CR and LF of a line break) and returns the events completed
so far. Lines end in LF, CRLF or CR; ``data`` lines of one event join with
LF; ``:`` lines are comments (keep-alives) and are counted, not returned;
``event``, ``id`` and ``retry`` are kept; an event is dispatched at a blank
line. :meth:`finish` dispatches nothing that was not terminated (a stream cut
mid-event loses that event: the adapter reports it as truncated).

Bounds: a pending line or event larger than ``max_event`` bytes raises
:class:`SseError` ("oversized"), so a hostile or broken server cannot make
the process buffer without limit.

:class:`SseBody` is the same step over a whole response body (an async
iterator of byte chunks), with the second bound: more than ``max_bytes`` in
total raises ProviderError("oversized"). :func:`json_object` decodes an
event's data as the JSON object the vendors send (anything else is a
non-retryable ``protocol`` error).
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.providers.base import ProviderError


class SseError(Exception):
    """The stream broke the format or a bound; ``kind`` is a stable label."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class SseEvent:
    data: str
    event: str = "message"
    id: str = ""


class SseParser:
    __slots__ = ("max_event", "_buf", "_data", "_event", "_id", "_size", "_cr", "comments", "events")

    def __init__(self, max_event: int = 1 << 20) -> None:
        self.max_event = max_event
        self._buf = bytearray()
        self._data: list[str] = []
        self._event = ""
        self._id = ""
        self._size = 0
        self._cr = False  # the previous chunk ended with CR: a leading LF belongs to it
        self.comments = 0
        self.events = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        if not chunk:
            return out
        if self._cr and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._cr = False
        buf = self._buf
        buf += chunk
        start = 0
        n = len(buf)
        while start < n:
            lf = buf.find(b"\n", start)
            cr = buf.find(b"\r", start)
            if lf < 0 and cr < 0:
                break
            if cr >= 0 and (lf < 0 or cr < lf):
                end = cr
                if cr + 1 < n:
                    nxt = cr + 2 if buf[cr + 1] == 10 else cr + 1
                else:
                    nxt = cr + 1
                    self._cr = True
            else:
                end = lf
                nxt = lf + 1
            line = bytes(buf[start:end])
            start = nxt
            ev = self._line(line)
            if ev is not None:
                out.append(ev)
        del buf[:start]
        if len(buf) + self._size > self.max_event:
            raise SseError("oversized", f"event larger than {self.max_event} bytes")
        return out

    def _line(self, raw: bytes) -> SseEvent | None:
        if not raw:
            return self._dispatch()
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            line = raw.decode("utf-8", "replace")
        if line[0] == ":":
            self.comments += 1
            return None
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._size += len(raw)
            if self._size > self.max_event:
                raise SseError("oversized", f"event larger than {self.max_event} bytes")
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._id = value
        # "retry" and unknown fields are ignored (the adapters do not reconnect a stream)
        return None

    def _dispatch(self) -> SseEvent | None:
        if not self._data:
            self._event = ""
            return None
        ev = SseEvent("\n".join(self._data), self._event or "message", self._id)
        self._data = []
        self._event = ""
        self._size = 0
        self.events += 1
        return ev

    def pending(self) -> bool:
        """Bytes or fields of an event that was not terminated yet."""
        return bool(self._buf) or bool(self._data)


class SseBody:
    """The events of one streamed body, in order; ``max_bytes`` bounds the whole body."""

    __slots__ = ("_chunks", "_parser", "_ready", "max_bytes", "total")

    def __init__(self, chunks: AsyncIterator[bytes], *, max_bytes: int, max_event: int) -> None:
        self._chunks = chunks
        self._parser = SseParser(max_event)
        self._ready: deque[SseEvent] = deque()
        self.max_bytes = max_bytes
        self.total = 0

    def __aiter__(self) -> SseBody:
        return self

    async def __anext__(self) -> SseEvent:
        while not self._ready:
            chunk = await self._chunks.__anext__()  # StopAsyncIteration: the body ended
            self.total += len(chunk)
            if self.total > self.max_bytes:
                raise ProviderError("oversized", f"response over {self.max_bytes} bytes", retryable=False)
            self._ready.extend(self._parser.feed(chunk))
        return self._ready.popleft()

    def pending(self) -> bool:
        """The body ended inside an event."""
        return self._parser.pending()

    @property
    def rest(self) -> AsyncIterator[bytes]:
        """The chunks not read yet (drained after the last event so the connection is reused)."""
        return self._chunks


def json_object(ev: SseEvent, what: str = "an event") -> dict[str, Any]:
    """``ev.data`` as a JSON object; ``what`` names the unit in the error detail."""
    try:
        obj = orjson.loads(ev.data)
    except orjson.JSONDecodeError:
        raise ProviderError("protocol", f"{what} is not JSON", retryable=False) from None
    if not isinstance(obj, dict):
        raise ProviderError("protocol", f"{what} is not an object", retryable=False)
    return obj
