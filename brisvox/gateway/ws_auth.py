"""Who may open a media stream: the native shared secret and the Twilio request signature.

Owns the handshake checks each WebSocket protocol declares in its registry
row (:mod:`brisvox.gateway.transports`, ``Transport.auth``). Each check takes
the WebSocket config, the request path and headers, and returns None (let
in) or a :class:`Refusal` (HTTP status, body, the counter to bump).

Invariants:

* A check that is not configured lets everyone in (no ``native_secret``, no
  ``twilio_auth_token``); a configured one never lets in a request without
  its credential.
* Secrets and signatures are compared in constant time (``hmac.compare_digest``).
* Native: ``Authorization: Bearer <secret>`` or ``?token=<secret>``; refused
  with 401. Twilio: ``X-Twilio-Signature`` = HMAC-SHA1 of ``public_url`` (or
  ``wss://<Host>``) + path, keyed with the auth token; refused with 403.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from brisvox.wire import twilio


@dataclass(frozen=True, slots=True)
class Refusal:
    status: int
    text: str
    counter: str


BAD_TOKEN = Refusal(401, "bad or missing token\n", "ws_refused_auth")
BAD_SIGNATURE = Refusal(403, "bad X-Twilio-Signature\n", "ws_refused_signature")


def native_auth(cfg: Any, path: str, headers: Mapping[str, str]) -> Refusal | None:
    if not cfg.native_secret:
        return None
    secret = cfg.native_secret.encode()
    auth = headers.get("Authorization", "")
    if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].strip().encode(), secret):
        return None
    tok = (parse_qs(urlsplit(path).query).get("token") or [""])[0]
    if tok and hmac.compare_digest(tok.encode(), secret):
        return None
    return BAD_TOKEN


def twilio_auth(cfg: Any, path: str, headers: Mapping[str, str]) -> Refusal | None:
    if not cfg.twilio_auth_token:
        return None
    sig = headers.get("X-Twilio-Signature", "")
    if not sig:
        return BAD_SIGNATURE
    base = cfg.public_url or f"wss://{headers.get('Host', '')}"
    expect = twilio.signature(cfg.twilio_auth_token, base + path)
    return None if hmac.compare_digest(sig.encode(), expect.encode()) else BAD_SIGNATURE
