"""The webhook signature: HMAC-SHA256 over ``"<t>.<body>"``, sent as ``Brisvox-Signature: t=<t>,v1=<hex>``.

Owns the header format (the style of Stripe's ``Stripe-Signature``), which every receiver
checks (the SDKs' ``verify_webhook``, docs/PROTOCOL.md "Webhooks"):

* ``t`` is the Unix time in whole seconds when the attempt was signed: every retry is
  signed afresh, so a receiver's tolerance (300 s by default) bounds the replay window,
  not the delivery delay;
* ``v1`` is the lowercase hex HMAC-SHA256, keyed with the webhook's secret (UTF-8), of the
  ASCII ``t``, a ``.``, and the raw body bytes as sent;
* a header may carry several ``v1=`` (a receiver accepts any one that matches: the way
  to rotate a secret); brisvox sends one.

Invariants: pure (time passed in); :func:`verify` compares in constant time
(``hmac.compare_digest``) and never raises on a malformed header (it returns why).
"""

from __future__ import annotations

import hashlib
import hmac

HEADER = "Brisvox-Signature"
SCHEME = "v1"


def signature(secret: str, t: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of ``"<t>.<body>"`` keyed with ``secret``."""
    return hmac.new(secret.encode(), str(int(t)).encode() + b"." + body, hashlib.sha256).hexdigest()


def sign(secret: str, body: bytes, t: int) -> str:
    """The ``Brisvox-Signature`` header value for ``body`` signed at ``t``."""
    return f"t={int(t)},{SCHEME}={signature(secret, t, body)}"


def parse(header: str) -> tuple[int | None, list[str]]:
    """(t, every v1 signature) of a header; t None when absent or not an integer."""
    t: int | None = None
    sigs: list[str] = []
    for item in header.split(","):
        k, _, v = item.strip().partition("=")
        if k == "t" and v.isdigit() and len(v) <= 12:
            t = int(v)
        elif k == SCHEME and v:
            sigs.append(v)
    return t, sigs


def verify(secret: str, header: str, body: bytes, now: float, tolerance_s: float = 300.0) -> str | None:
    """None when ``header`` signs ``body`` with ``secret`` within ``tolerance_s`` of ``now``; else why not."""
    t, sigs = parse(header or "")
    if t is None or not sigs:
        return "malformed signature header"
    if abs(now - t) > tolerance_s:
        return "timestamp outside the tolerance"
    want = signature(secret, t, body)
    if not any(hmac.compare_digest(want, s) for s in sigs):
        return "no signature matches"
    return None
