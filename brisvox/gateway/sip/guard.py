"""The SIP user agent's admission of requests: the allow-list, per-source rate limits, stateless answers, table shares.

Owns :class:`SipGuard`: the source allow-list (``[sip] allow``, for SIP and
RTP alike), the per-source-address moving-window rate limits of every
request kind (:func:`rate_kind`: new INVITEs, OPTIONS and every other
request, ``[sip] invite_rate``, ``options_rate``, ``other_rate``; the
``limits`` package), the Retry-After a refused request is given, and the
budget of refusals answered per source (``[sip] refusal_rate``: a source
past it is plainly flooding, its refusals are dropped unanswered). Also
:func:`stateless_refusal`, the RFC 3261 rule that answers a request
without any transaction state (:class:`Refusal`), and
:class:`TransactionShares`, who holds the server transaction table. The
transaction layer (:class:`~brisvox.gateway.sip.transactions.SipTransactions`)
applies them in the order its docstring gives; the bounded log is the user
agent's :class:`~brisvox.gateway.sip.counters.SipCounters`.

Invariants:

* :meth:`SipGuard.allowed` is true only for an IP address inside one of the
  allowed networks (a name, or anything that is no address, is refused); its
  answers are cached for at most 4096 sources.
* The rate-limit storage is one per process
  (:func:`brisvox.gateway.rate_limits.process_storage`): every
  listener of the gateway that limits by source address shares it, each in
  its own namespace (``sip_invite``, ``sip_options``, ``sip_other``,
  ``sip_refusal``), so the windows of a source are counted once however
  many user agents a test or a process builds.
* A request over any of its limits is refused before it creates a
  transaction or a call; the limits of one method are checked in order and
  the first one refused stops the check (later windows are not charged).
* The key is an IP address only (the port is the attacker's choice): the
  packet's source, or the caller a trusted proxy's Vias name (the transaction
  layer chooses it: :meth:`~brisvox.gateway.sip.transactions.SipTransactions.caller_host`).
* Memory is bounded by the storage's expiry: a window's entries live at
  most the window's length; :class:`TransactionShares` holds one entry per
  live server transaction and one count per source holding any.
* :func:`stateless_refusal` is pure (RFC 3261 8.2.1, 8.2.7, 9.2, 12.2.2,
  15.1.2, 16.3; RFC 6665 4.1.3 for NOTIFY): what it refuses needs no
  transaction, so a retransmission of it is answered the same way again.
"""

from __future__ import annotations

import ipaddress
import math
import time
from dataclasses import dataclass

from limits import RateLimitItem, strategies

from brisvox.gateway.rate_limits import parse_rates, process_storage
from brisvox.wire.sip_dialog import ALLOW

MAX_CACHED = 4096
# the methods the user agent serves (its Allow header), and those it knows but does not serve
SERVED = frozenset(m.strip() for m in ALLOW.split(","))
NOT_SERVED = frozenset({"REGISTER", "SUBSCRIBE", "PUBLISH", "MESSAGE", "PRACK", "REFER"})
# served only inside one of our dialogs (NOTIFY: for the REFER we sent; UPDATE: RFC 3311, a session refresh)
IN_DIALOG = frozenset({"BYE", "INFO", "NOTIFY", "UPDATE"})
RATE_KINDS = ("INVITE", "OPTIONS", "OTHER")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A new request answered without a transaction (a stateless UAS, RFC 3261 8.2.7):
    ``status`` with ``phrase`` (default: the status's own) and ``extra`` headers, counted
    ``sip_refused_<reason>``."""

    status: int
    reason: str
    phrase: str = ""
    extra: tuple[tuple[str, str], ...] = ()


def rate_kind(method: str, to_tag: str) -> str:
    """The rate limit a request counts in: ``INVITE`` (a new one, no To tag), ``OPTIONS``, or ``OTHER``."""
    if method == "INVITE" and not to_tag:
        return "INVITE"
    return "OPTIONS" if method == "OPTIONS" else "OTHER"


def stateless_refusal(method: str, to_tag: str, in_dialog: bool, invite_live: bool,
                      max_forwards_zero: bool) -> Refusal | None:
    """The answer a new request (not ACK) gets without a transaction, or None: it gets one.

    ``in_dialog``: a dialog of ours matches its Call-ID and To tag; ``invite_live``: (a
    CANCEL) the INVITE server transaction it names is live. In order: a method we do not
    know 501 (8.2.1), Max-Forwards 0 483 (16.3; OPTIONS is answered), a CANCEL that names no
    live INVITE 481 (9.2), a To tag naming no dialog of ours 481 (12.2.2), a method we know
    but do not serve 405 (8.2.1; brisvox is no registrar, presence server nor transferee),
    BYE, INFO, NOTIFY or UPDATE outside a dialog 481 (15.1.2; RFC 6665 4.1.3; RFC 3311 5.1)."""
    if method not in SERVED and method not in NOT_SERVED:
        return Refusal(501, "unknown_method", extra=(("allow", ALLOW),))
    if max_forwards_zero and method != "OPTIONS":
        return Refusal(483, "too_many_hops")
    if method == "CANCEL":
        return None if invite_live else Refusal(481, "no_transaction")
    if to_tag and not in_dialog:
        return Refusal(481, "no_dialog")
    if method in NOT_SERVED:
        return Refusal(405, "method")  # make_response adds the Allow header to a 405
    if method in IN_DIALOG and not to_tag:
        return Refusal(481, "no_dialog")
    return None


class TransactionShares:
    """Who holds the server transaction table: each live server transaction's source (the
    caller's address, as the rate limits key it) and how many each source holds.

    Invariants: ``held(s)`` is the number of taken keys owned by ``s``, at most ``limit``;
    a source holding none is forgotten, so both tables are bounded by the live server
    transactions; releasing a key never taken (or twice) changes nothing."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._owner: dict[tuple, str] = {}
        self._held: dict[str, int] = {}

    def held(self, source: str) -> int:
        return self._held.get(source, 0)

    def full(self, source: str) -> bool:
        """Whether ``source`` holds its whole share (a new transaction of its is refused)."""
        return self._held.get(source, 0) >= self.limit

    def take(self, key: tuple, source: str) -> None:
        """Record the new transaction ``key`` as ``source``'s (the caller checked :meth:`full`)."""
        if key in self._owner:
            self.release(key)
        self._owner[key] = source
        self._held[source] = self._held.get(source, 0) + 1

    def release(self, key: tuple) -> None:
        source = self._owner.pop(key, None)
        if source is None:
            return
        n = self._held.get(source, 0) - 1
        if n > 0:
            self._held[source] = n
        else:
            self._held.pop(source, None)

    def sources(self) -> int:
        return len(self._held)


class SipGuard:
    """Allow-list and rate limits of one SIP user agent (see the module docstring)."""

    def __init__(self, allow: tuple[str, ...], invite_rate: tuple[str, ...], options_rate: tuple[str, ...],
                 other_rate: tuple[str, ...] = (), refusal_rate: tuple[str, ...] = ()) -> None:
        self.nets = [ipaddress.ip_network(n, strict=False) for n in allow]
        self._allowed_cache: dict[str, bool] = {}
        self.limiter = strategies.MovingWindowRateLimiter(process_storage())
        self.rates: dict[str, tuple[RateLimitItem, ...]] = {
            "INVITE": parse_rates(invite_rate),
            "OPTIONS": parse_rates(options_rate),
            "OTHER": parse_rates(other_rate),
        }
        self.refusals = parse_rates(refusal_rate)

    def allowed(self, host: str) -> bool:
        """Whether SIP or RTP from ``host`` (an IP address) is taken at all."""
        ok = self._allowed_cache.get(host)
        if ok is None:
            try:
                ip = ipaddress.ip_address(host)
                ok = any(ip in n for n in self.nets)
            except ValueError:
                ok = False
            if len(self._allowed_cache) < MAX_CACHED:
                self._allowed_cache[host] = ok
        return ok

    def answer_refusal(self, source: str) -> bool:
        """Whether a refusal (503) to ``source`` is answered now: False past ``refusal_rate``
        (the source is plainly flooding: its refusals are dropped, unanswered)."""
        return all(self.limiter.hit(item, "sip_refusal", source) for item in self.refusals)

    def admit(self, kind: str, source: str) -> int:
        """0 when ``source`` may send a request of this kind (:func:`rate_kind`) now; else the
        Retry-After (s) to answer."""
        items = self.rates.get(kind)
        if not items:
            return 0
        ns = f"sip_{kind.lower()}"
        for item in items:
            if not self.limiter.hit(item, ns, source):
                try:
                    reset = self.limiter.get_window_stats(item, ns, source).reset_time
                    return max(1, min(3600, math.ceil(reset - time.time())))
                except Exception:  # noqa: BLE001 - the refusal stands without an exact time
                    return 1
        return 0
