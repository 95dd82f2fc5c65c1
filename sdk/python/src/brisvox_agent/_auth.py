"""The handshake signature: ``X-Brisvox-Signature: t=<unix seconds>,n=<nonce>,v2=<hex>``.

``v2 = HMAC-SHA256(secret, "v2.<t>.<n>.<session>")``; the session is ``X-Brisvox-Session``,
the nonce 16 to 64 lowercase hex digits, fresh for every dial. A handshake is accepted
when the signature matches, ``t`` is at most ``window`` seconds away from this clock
(either side), and (with a :class:`NonceCache`, as :class:`~brisvox_agent.Agent` has)
its nonce was not accepted before within the window: a captured handshake replayed
is refused. The older ``v1`` (no nonce, replayable) is refused with its own reason.

Invariants of :class:`NonceCache`: a nonce is remembered from its acceptance until its
``t`` leaves the window (``t + window``), so every replay a clock check would let
through is caught; it holds at most ``capacity`` nonces, and when that many live ones
are held a new handshake is refused (fail closed: never forget a live nonce to make
room); only handshakes whose signature matched are recorded, so no one without the
secret can fill it.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import re
import secrets
import time

SIGNATURE_HEADER = "X-Brisvox-Signature"
SESSION_HEADER = "X-Brisvox-Session"
CLOCK_WINDOW_S = 30
NONCE_CAPACITY = 65_536  # live nonces held (a window's worth of handshakes)
_NONCE = re.compile(r"^[0-9a-f]{16,64}$")

# why a handshake is refused (HTTP 401, or 503 for NONCE_FULL); Agent.handshakes_refused counts each
MISSING_SESSION = "missing session"
MISSING_SIGNATURE = "missing signature"
MALFORMED = "malformed signature"
OLD_SCHEME = "unsigned nonce (a v1 signature): upgrade brisvox"
STALE = "stale signature"
BAD = "bad signature"
REPLAYED = "replayed handshake"
NONCE_FULL = "too many handshakes in the clock window"


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def signature(secret: str | bytes, session: str, t: int, nonce: str) -> str:
    """The hex ``v2`` of a session's handshake at time ``t`` with ``nonce``."""
    return hmac.new(_key(secret), f"v2.{t}.{nonce}.{session}".encode(), hashlib.sha256).hexdigest()


def sign(secret: str | bytes, session: str, t: int | None = None, nonce: str | None = None) -> str:
    """The value of ``X-Brisvox-Signature`` (what brisvox sends; tests and tools use it):
    a fresh random nonce unless one is given."""
    t = int(time.time()) if t is None else t
    nonce = secrets.token_hex(16) if nonce is None else nonce
    return f"t={t},n={nonce},v2={signature(secret, session, t, nonce)}"


class NonceCache:
    """The nonces of the handshakes accepted within the clock window (see the module invariants)."""

    __slots__ = ("window", "capacity", "_until", "_heap")

    def __init__(self, window: float = CLOCK_WINDOW_S, capacity: int = NONCE_CAPACITY) -> None:
        self.window = window
        self.capacity = capacity
        self._until: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []

    def __len__(self) -> int:
        return len(self._until)

    def admit(self, nonce: str, t: int, now: float) -> str | None:
        """Record ``nonce`` (of a handshake signed at ``t``): None, or why the handshake is refused."""
        while self._heap and self._heap[0][0] < now:
            _, old = heapq.heappop(self._heap)
            self._until.pop(old, None)
        if nonce in self._until:
            return REPLAYED
        if len(self._until) >= self.capacity:
            return NONCE_FULL
        until = t + self.window
        self._until[nonce] = until
        heapq.heappush(self._heap, (until, nonce))
        return None


def verify(secret: str | bytes, session: str | None, header: str | None, *,
           now: float | None = None, window: float = CLOCK_WINDOW_S,
           nonces: NonceCache | None = None) -> str | None:
    """None when the header signs ``session`` within the clock window (and, with ``nonces``,
    its nonce is new: it is then remembered), else why not (one of the reasons above)."""
    if not session:
        return MISSING_SESSION
    if not header:
        return MISSING_SIGNATURE
    fields: dict[str, str] = {}
    for part in header.split(","):
        k, sep, v = part.strip().partition("=")
        if sep:
            fields.setdefault(k, v)
    t_text, nonce, v2 = fields.get("t"), fields.get("n"), fields.get("v2")
    if v2 is None and nonce is None and "v1" in fields:
        return OLD_SCHEME
    if not t_text or not v2 or not nonce or not t_text.isdigit() or len(t_text) > 12 or not _NONCE.match(nonce):
        return MALFORMED
    t = int(t_text)
    now = time.time() if now is None else now
    if abs(now - t) > window:
        return STALE
    if not hmac.compare_digest(signature(secret, session, t, nonce), v2.lower()):
        return BAD
    return None if nonces is None else nonces.admit(nonce, t, now)
