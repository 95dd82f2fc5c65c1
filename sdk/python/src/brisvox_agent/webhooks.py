"""Verify a brisvox webhook (docs/PROTOCOL.md "Webhooks").

Every POST brisvox makes to a ``[[webhooks]]`` URL carries ``Brisvox-Signature:
t=<unix seconds>,v1=<hex>``: the HMAC-SHA256, keyed with the webhook's secret, of the
ASCII ``t``, a ``.`` and the raw request body. :func:`verify_webhook` checks it against the
body exactly as received (before any JSON parsing) and returns the parsed event.

```python
from brisvox_agent import WebhookError, verify_webhook

try:
    event = verify_webhook(secret, request.headers["Brisvox-Signature"], raw_body)
except WebhookError:
    return 400
if seen(event["id"]):          # delivery is at least once: deduplicate on the id
    return 200
```
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

WEBHOOK_SIGNATURE_HEADER = "Brisvox-Signature"


class WebhookError(ValueError):
    """The signature header does not sign this body with this secret, or is too old."""


def _parse(header: str) -> tuple[int | None, list[str]]:
    t: int | None = None
    sigs: list[str] = []
    for item in header.split(","):
        k, _, v = item.strip().partition("=")
        if k == "t" and v.isdigit() and len(v) <= 12:
            t = int(v)
        elif k == "v1" and v:
            sigs.append(v)
    return t, sigs


def verify_webhook(secret: str | bytes, header: str | None, body: bytes | str, tolerance_s: float = 300,
                   now: float | None = None) -> dict[str, Any]:
    """The event (``{"id", "type", "created", "data"}``) when ``header`` signs ``body`` with
    ``secret`` and its timestamp is within ``tolerance_s`` of ``now`` (default: the clock);
    else :class:`WebhookError`. Any one of several ``v1=`` entries may match (secret rotation)."""
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    raw = body.encode() if isinstance(body, str) else bytes(body)
    t, sigs = _parse(header or "")
    if t is None or not sigs:
        raise WebhookError("malformed Brisvox-Signature header")
    current = time.time() if now is None else now
    if abs(current - t) > tolerance_s:
        raise WebhookError(f"timestamp {t} is outside the tolerance of {tolerance_s:g} s")
    want = hmac.new(key, str(t).encode() + b"." + raw, hashlib.sha256).hexdigest()
    if not any(hmac.compare_digest(want, s) for s in sigs):
        raise WebhookError("no signature matches this body and secret")
    try:
        event = json.loads(raw)
    except ValueError as e:
        raise WebhookError(f"the body is not JSON: {e}") from None
    if not isinstance(event, dict):
        raise WebhookError("the body is not a JSON object")
    return event
