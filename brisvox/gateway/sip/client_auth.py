"""Answering a digest challenge to a request we sent (RFC 3261 section 22.2), once per challenge.

Owns :class:`ClientAuth`: the credentials of one trunk as one dialog, dial or
registration uses them. Given the request we sent and its 401/407,
:meth:`ClientAuth.retry` returns the request to send instead (or why not),
without I/O: the same Call-ID, From tag and To, a new branch, the CSeq
advanced by one (a new request, section 22.2 and 8.1.3.5), and an
``Authorization`` (401) or ``Proxy-Authorization`` (407) answering the best
challenge (:func:`~brisvox.wire.sip_digest.pick_challenge`: SHA-256 before MD5).

Invariants:

* A realm's challenge is answered once: a second challenge for a realm
  already answered, unless it says ``stale=true`` (a fresh nonce for the
  same, right, credentials), ends the attempt "auth failed: wrong credentials
  (realm R)"; a stale answer is allowed once more per request. So a wrong
  password or a challenging loop costs at most :data:`MAX_RETRIES` resends.
* No credentials, or credentials for another realm: "auth required: no
  credentials for realm R" at once.
* The nonce count grows per nonce across the requests that answer it (a
  later BYE answering the same nonce sends nc=2).
* CANCEL is never re-sent with credentials: it must match its INVITE (the
  same CSeq and branch, section 9.1), so a challenged CANCEL is left to the
  INVITE's final response (and a BYE after a 2xx). :meth:`retry` refuses it.
* Nothing here logs or formats the secret.
"""

from __future__ import annotations

import secrets

from brisvox.gateway.config import SipTrunk
from brisvox.wire.sip_digest import DigestCredentials, authorization, pick_challenge
from brisvox.wire.sip_message import SipMessage, new_branch

__all__ = ["MAX_RETRIES", "ClientAuth", "trunk_credentials"]

MAX_RETRIES = 3  # resends of one request for challenges, whatever they say
HEADERS = {401: ("www-authenticate", "authorization"), 407: ("proxy-authenticate", "proxy-authorization")}


def trunk_credentials(t: SipTrunk) -> DigestCredentials | None:
    """What answers a trunk's challenges (None for an IP trunk without a secret)."""
    return DigestCredentials(t.auth_user or t.username, t.secret, t.realm) if t.secret else None


class ClientAuth:
    """One trunk's credentials as one dialog or registration answers challenges (see the module docstring)."""

    def __init__(self, creds: DigestCredentials | None) -> None:
        self.creds = creds
        self.answered: set[str] = set()  # realms whose challenge we answered in this request
        self.stale_answers = 0
        self.retries = 0
        self._nc: dict[str, int] = {}

    def reset(self) -> None:
        """A new request (a new REGISTER refresh, another in-dialog request): answer afresh."""
        self.answered.clear()
        self.stale_answers = 0
        self.retries = 0

    def retry(self, req: SipMessage, resp: SipMessage) -> tuple[SipMessage | None, str]:
        """``(request to send, "")`` answering ``resp`` (401/407) to ``req``, or ``(None, why)``."""
        if resp.status not in HEADERS:
            return None, f"{resp.status} is no challenge"
        if req.method == "CANCEL":
            return None, "a CANCEL cannot be re-sent with credentials"
        want, give = HEADERS[resp.status]
        ch = pick_challenge(resp.get_all(want))
        if ch is None:
            return None, f"auth failed: no usable digest challenge in the {resp.status}"
        creds = self.creds
        if creds is None or (creds.realm and creds.realm != ch.realm):
            return None, f"auth required: no credentials for realm {ch.realm[:64]!r}"
        if self.retries >= MAX_RETRIES:
            return None, f"auth failed: challenged {self.retries + 1} times (realm {ch.realm[:64]!r})"
        if ch.realm in self.answered:
            if not ch.stale or self.stale_answers >= 1:
                return None, f"auth failed: wrong credentials (realm {ch.realm[:64]!r})"
            self.stale_answers += 1
        self.answered.add(ch.realm)
        self.retries += 1
        nc = self._nc.get(ch.nonce, 0) + 1
        if len(self._nc) > 64:
            self._nc.clear()
        self._nc[ch.nonce] = nc
        value = authorization(ch, creds, req.method, req.uri, nc, secrets.token_hex(8))
        return resend(req, give, value), ""


def resend(req: SipMessage, header: str, value: str) -> SipMessage:
    """``req`` as a new request: a new branch in the top Via, CSeq + 1, ``header`` (replacing an
    earlier one of ours for that realm: all of that kind, since we answer one realm at a time)."""
    out = SipMessage(method=req.method, uri=req.uri, body=req.body)
    num, method = req.cseq
    top_done = False
    for k, v in req.headers:
        if k == header:
            continue
        if k == "via" and not top_done:
            top_done = True
            head, sep, params = v.partition(";")
            kept = [p for p in params.split(";") if p and not p.lower().startswith("branch=")] if sep else []
            v = ";".join([head, f"branch={new_branch()}", *kept])
        elif k == "cseq":
            v = f"{num + 1} {method}"
        out.headers.append((k, v))
    out.headers.append((header, value))
    return out
