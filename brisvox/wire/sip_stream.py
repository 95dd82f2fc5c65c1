"""SIP message framing on a stream transport (TCP, TLS: RFC 3261 section 18.3), pure.

Owns :class:`StreamFramer`: bytes in as they arrive, whole messages out. A
message ends where its header block (ended by an empty line) plus its
``Content-Length`` end; on a stream ``Content-Length`` is required. CRLFs
between messages are skipped; a double CRLF there is an RFC 5626 section
4.4.1 keepalive ping (:data:`PING`: answer one CRLF); every CRLF between
messages is counted (:attr:`StreamFramer.crlfs_seen`), so the pong to a ping
we sent (one CRLF) is seen.

Invariants:

* At most ``max_bytes`` of one message is ever buffered: a header block
  without its end within ``max_bytes`` is :class:`FramingError`
  ``"head_too_long"``; a ``Content-Length`` that makes the message longer
  is ``"oversized"`` before a byte of the body is waited for, and carries
  the head (so a 513 can be answered); a missing or malformed
  ``Content-Length`` is ``"no_length"`` (400), also with the head.
* After a :class:`FramingError` the stream is out of step: the caller closes it.
* Split anywhere (one byte at a time) or pipelined (several in one read),
  the same messages come out in the same order.
"""

from __future__ import annotations

import re

__all__ = ["PING", "FramingError", "StreamFramer"]

PING = b"\r\n\r\n"  # what feed() yields for a keepalive ping
_CL = re.compile(rb"\r\n(?:content-length|l)[ \t]*:[ \t]*([^\r\n]*)", re.IGNORECASE)


class FramingError(ValueError):
    """The stream cannot be read further (``kind``); ``head``: the header block when one was read."""

    def __init__(self, kind: str, detail: str, head: bytes = b"") -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.head = head


class StreamFramer:
    """Whole SIP messages out of a byte stream (see the module docstring)."""

    __slots__ = ("max_bytes", "_buf", "_need", "_crlfs", "crlfs_seen")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._buf = bytearray()
        self._need = -1  # the whole message's length once its head was read, else -1
        self._crlfs = 0  # CRLFs seen since the last message (two: a ping)
        self.crlfs_seen = 0  # every CRLF between messages so far: a pong to our ping is one

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        """The messages (and :data:`PING` markers) ``data`` completes; FramingError when the stream is bad."""
        buf = self._buf
        buf += data
        out: list[bytes] = []
        while buf:
            if self._need < 0:
                if buf[:2] == b"\r\n":
                    del buf[:2]
                    self._crlfs += 1
                    self.crlfs_seen += 1
                    if self._crlfs == 2:
                        out.append(PING)
                        self._crlfs = 0
                    continue
                if buf[:1] == b"\r" and len(buf) == 1:
                    break  # half a CRLF: wait
                self._crlfs = 0
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > self.max_bytes:
                        raise FramingError("head_too_long", f"no end of headers in {self.max_bytes} bytes")
                    break
                head = bytes(buf[:end + 2])
                m = _CL.search(b"\r\n" + head)
                if m is None:
                    raise FramingError("no_length", "a message on a stream needs Content-Length", head)
                raw = m.group(1).strip()
                if not raw.isdigit() or len(raw) > 9:
                    raise FramingError("no_length", f"Content-Length {raw[:20]!r}", head)
                total = end + 4 + int(raw)
                if total > self.max_bytes:
                    raise FramingError("oversized", f"{total} bytes > {self.max_bytes}", head)
                self._need = total
            if len(buf) < self._need:
                break
            out.append(bytes(buf[:self._need]))
            del buf[:self._need]
            self._need = -1
        return out
