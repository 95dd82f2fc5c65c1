"""The handshake signature: ``X-Brisvox-Signature: t=<unix seconds>,v1=<hex>``.

``v1 = HMAC-SHA256(secret, "<t>.<session>")``; the session is ``X-Brisvox-Session``.
A signature is accepted when it matches and ``t`` is at most ``window`` seconds away
from this clock (either side).
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "X-Brisvox-Signature"
SESSION_HEADER = "X-Brisvox-Session"
CLOCK_WINDOW_S = 300


def _key(secret: str | bytes) -> bytes:
    return secret.encode() if isinstance(secret, str) else secret


def signature(secret: str | bytes, session: str, t: int) -> str:
    """The hex ``v1`` of a session at time ``t``."""
    return hmac.new(_key(secret), f"{t}.{session}".encode(), hashlib.sha256).hexdigest()


def sign(secret: str | bytes, session: str, t: int | None = None) -> str:
    """The value of ``X-Brisvox-Signature`` (what brisvox sends; tests and tools use it)."""
    t = int(time.time()) if t is None else t
    return f"t={t},v1={signature(secret, session, t)}"


def verify(secret: str | bytes, session: str | None, header: str | None, *,
           now: float | None = None, window: float = CLOCK_WINDOW_S) -> str | None:
    """None when the header signs ``session`` within the clock window, else why not."""
    if not session:
        return "missing session"
    if not header:
        return "missing signature"
    fields: dict[str, str] = {}
    for part in header.split(","):
        k, sep, v = part.strip().partition("=")
        if sep:
            fields.setdefault(k, v)
    t_text, v1 = fields.get("t"), fields.get("v1")
    if not t_text or not v1 or not t_text.isdigit() or len(t_text) > 12:
        return "malformed signature"
    t = int(t_text)
    now = time.time() if now is None else now
    if abs(now - t) > window:
        return "stale signature"
    if not hmac.compare_digest(signature(secret, session, t), v1.lower()):
        return "bad signature"
    return None
