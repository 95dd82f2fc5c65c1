"""Who may place a SIP call: ``[sip] auth``, the server side of digest authentication.

Owns :class:`SipAuthenticator`, held by the user agent
(:class:`~brisvox.gateway.sip.ua.SipUserAgent`), which asks it about every new
INVITE (no To tag) before the dialog layer sees it. It decides and does no I/O:
:meth:`SipAuthenticator.judge` returns an :class:`AuthDecision` (pass, with the
authenticated user; challenge, with the WWW-Authenticate values; or forbid),
and the user agent performs it in the INVITE's server transaction.

* ``auth = "ip"``: every INVITE passes (the source was already inside
  ``[sip] allow``); the Request-URI user picks the agent as before.
* ``auth = "digest"``: an INVITE passes only with a valid digest answer as one of
  ``[[sip.users]]`` (:class:`~brisvox.wire.sip_digest.DigestServer`: SHA-256 and
  MD5, ``qop=auth``, nonces bound to time and source, replays refused); that
  user's agent serves the call and the call record names the user.
* ``auth = "ip_or_digest"``: sources in ``auth_networks`` pass as under "ip";
  every other source as under "digest".

Invariants:

* A challenge is one final response (401, one WWW-Authenticate per algorithm
  of ``[sip] auth_algorithms``, SHA-256 first by default) in the INVITE's server transaction: no call slot, RTP port or
  ring is taken before an INVITE passes.
* A stale nonce (older than ``auth_nonce_s``) is answered with a fresh
  challenge marked ``stale=true``, and counts as no failure; so does an
  INVITE without credentials.
* Every other refusal (wrong password, unknown user, replayed nonce count, a
  nonce for another source, a malformed header) is a failure, counted per
  source and, for a known user, per user; a source or a user past
  ``[sip] auth_failures`` gets 403 with no new challenge until its window
  has passed. The failure limits key on the caller (behind a trusted proxy,
  the caller it names); nonces bind to the packet's source (the hop the
  answer comes back through).
* In-dialog requests (BYE, re-INVITE, INFO, REFER) are not challenged: they
  must match the dialog's Call-ID and both tags, which only the party the
  authenticated INVITE created the dialog with knows.
* Nothing here logs or formats a secret; each outcome is counted
  ``sip_auth_<reason>`` (``sip_auth_ok`` for a pass).
"""

from __future__ import annotations

import ipaddress
import itertools
import secrets
from dataclasses import dataclass

from limits import strategies

from brisvox.gateway.config import SipConfig
from brisvox.gateway.rate_limits import parse_rates, process_storage
from brisvox.wire.sip_digest import DigestServer

__all__ = ["AuthDecision", "SipAuthenticator"]

# the verdicts that are protocol steps, not failures: a fresh challenge, nothing counted against anyone
NOT_FAILURES = frozenset({"no_credentials", "stale"})
_instances = itertools.count(1)  # each authenticator's own keys in the process's one rate-limit storage


@dataclass(frozen=True, slots=True)
class AuthDecision:
    """What to do with a new INVITE: ``pass`` (``user``: the authenticated user, "" by address),
    ``challenge`` (401 with ``challenges``), or ``forbid`` (403)."""

    action: str  # "pass" | "challenge" | "forbid"
    reason: str  # the counter suffix: ok, by_address, or the digest verdict's reason, or too_many_failures
    user: str = ""
    challenges: tuple[str, ...] = ()


class SipAuthenticator:
    """The ``[sip] auth`` decision for new INVITEs (see the module docstring)."""

    def __init__(self, cfg: SipConfig, key: bytes | None = None) -> None:
        self.cfg = cfg
        self.mode = cfg.auth
        self.networks = [ipaddress.ip_network(n, strict=False) for n in cfg.auth_networks]
        self.server = DigestServer(cfg.auth_realm, key or secrets.token_bytes(32), cfg.auth_nonce_s,
                                   algorithms=tuple(dict.fromkeys(cfg.auth_algorithms)))
        self.limiter = strategies.MovingWindowRateLimiter(process_storage())
        self.failure_rates = parse_rates(cfg.auth_failures)
        self._ns = f"sip_auth{next(_instances)}"
        self._agents = cfg.user_agents

    @property
    def enabled(self) -> bool:
        return self.mode != "ip"

    def by_address(self, caller: str) -> bool:
        """Whether ``caller`` is authenticated by its address alone."""
        if self.mode == "ip":
            return True
        if self.mode == "digest":
            return False
        try:
            ip = ipaddress.ip_address(caller)
        except ValueError:
            return False
        return any(ip in n for n in self.networks)

    def agent_of(self, user: str) -> str:
        """The agent of an authenticated user ("" for none)."""
        return self._agents.get(user, "")

    def _over(self, kind: str, key: str) -> bool:
        return not all(self.limiter.test(item, self._ns, kind, key) for item in self.failure_rates)

    def _fail(self, kind: str, key: str) -> bool:
        """Count one failure; False once ``key`` is past the limit."""
        return all(self.limiter.hit(item, self._ns, kind, key) for item in self.failure_rates)

    def judge(self, authorization: str | None, request_uri: str, source: str, caller: str,
              now: float) -> AuthDecision:
        """The decision for a new INVITE from ``source`` (the packet's) for ``caller`` (the limits' key)."""
        if self.by_address(caller):
            return AuthDecision("pass", "by_address")
        if self._over("source", caller):
            return AuthDecision("forbid", "too_many_failures")
        v = self.server.verify(authorization, "INVITE", request_uri, source, now, self.cfg.user_secret)
        known = bool(v.user) and v.user in self._agents
        if v.ok:
            if self._over("user", v.user):
                return AuthDecision("forbid", "too_many_failures", v.user)
            return AuthDecision("pass", "ok", v.user)
        if v.reason not in NOT_FAILURES:
            within = self._fail("source", caller)
            if known:
                within = self._fail("user", v.user) and within
            if not within:
                return AuthDecision("forbid", "too_many_failures", v.user if known else "")
        elif known and self._over("user", v.user):
            return AuthDecision("forbid", "too_many_failures", v.user)
        return AuthDecision("challenge", v.reason, v.user if known else "",
                            tuple(self.server.challenges(source, now, stale=v.reason == "stale")))
