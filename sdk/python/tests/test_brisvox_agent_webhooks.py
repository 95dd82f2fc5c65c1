"""verify_webhook: the receiver's check of a brisvox webhook signature.

The header is made here the way the daemon makes it (brisvox.outbound.webhooks.signing, kept
in step by tests/unit/test_webhooks.py, which checks the daemon's header with this function)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from brisvox_agent import WebhookError, verify_webhook

SECRET = "whsec_test"
BODY = json.dumps({"id": "evt_1", "type": "call.ended", "created": 1767139200.0, "data": {"call_id": "c1"}}).encode()
T = 1767139200


def header(secret: str = SECRET, body: bytes = BODY, t: int = T) -> str:
    sig = hmac.new(secret.encode(), f"{t}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={t},v1={sig}"


def test_a_signed_body_verifies_and_returns_the_event() -> None:
    ev = verify_webhook(SECRET, header(), BODY, now=T + 10)
    assert ev["id"] == "evt_1" and ev["data"] == {"call_id": "c1"}
    assert verify_webhook(SECRET.encode(), header(), BODY.decode(), now=T)["type"] == "call.ended"


def test_a_tampered_body_is_refused() -> None:
    with pytest.raises(WebhookError, match="no signature matches"):
        verify_webhook(SECRET, header(), BODY.replace(b"c1", b"c2"), now=T)


def test_an_old_timestamp_is_refused_and_the_tolerance_is_the_callers() -> None:
    with pytest.raises(WebhookError, match="tolerance"):
        verify_webhook(SECRET, header(), BODY, now=T + 301)
    with pytest.raises(WebhookError, match="tolerance"):
        verify_webhook(SECRET, header(), BODY, now=T - 301)  # from the future too
    assert verify_webhook(SECRET, header(), BODY, tolerance_s=3600, now=T + 3000)["id"] == "evt_1"


def test_a_wrong_secret_is_refused() -> None:
    with pytest.raises(WebhookError, match="no signature matches"):
        verify_webhook("another", header(), BODY, now=T)


def test_malformed_headers_are_refused_and_any_v1_may_match() -> None:
    for bad in (None, "", "v1=abc", f"t={T}", "t=x,v1=abc", f"t={T},v0=abc"):
        with pytest.raises(WebhookError, match="malformed"):
            verify_webhook(SECRET, bad, BODY, now=T)
    rotated = header("old") + "," + header().split(",")[1]  # t=..,v1=<old>,v1=<new>
    assert verify_webhook(SECRET, rotated, BODY, now=T)["id"] == "evt_1"


def test_a_signed_body_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(WebhookError, match="not a JSON object"):
        verify_webhook(SECRET, header(body=b"[1]"), b"[1]", now=T)
