"""The SIP user agent's guard against hostile sources: the allow-list and per-source rate limits.

Owns :class:`SipGuard`: the source allow-list (``[sip] allow``, for SIP and
RTP alike), the per-source-address moving-window rate limits of new INVITEs
and OPTIONS (``[sip] invite_rate``, ``options_rate``; the ``limits``
package) and the Retry-After a refused request is given. Its bounded log is
the user agent's :class:`~brisvox.gateway.sip.counters.SipCounters`.

Invariants:

* :meth:`SipGuard.allowed` is true only for an IP address inside one of the
  allowed networks (a name, or anything that is no address, is refused); its
  answers are cached for at most 4096 sources.
* The rate-limit storage is one per process
  (:func:`brisvox.gateway.rate_limits.process_storage`): every
  listener of the gateway that limits by source address shares it, each in
  its own namespace (``sip_invite``, ``sip_options``), so the windows of a
  source are counted once however many user agents a test or a process
  builds.
* A request over any of its limits is refused before it creates a
  transaction or a call; the limits of one method are checked in order and
  the first one refused stops the check (later windows are not charged).
* The key is an IP address only (the port is the attacker's choice): the
  packet's source, or the caller a trusted proxy's Vias name (the transaction
  layer chooses it: :meth:`~brisvox.gateway.sip.transactions.SipTransactions.caller_host`).
* Memory is bounded by the storage's expiry: a window's entries live at
  most the window's length.
"""

from __future__ import annotations

import ipaddress
import math
import time

from limits import RateLimitItem, strategies

from brisvox.gateway.rate_limits import parse_rates, process_storage

MAX_CACHED = 4096


class SipGuard:
    """Allow-list and rate limits of one SIP user agent (see the module docstring)."""

    def __init__(self, allow: tuple[str, ...], invite_rate: tuple[str, ...], options_rate: tuple[str, ...]) -> None:
        self.nets = [ipaddress.ip_network(n, strict=False) for n in allow]
        self._allowed_cache: dict[str, bool] = {}
        self.limiter = strategies.MovingWindowRateLimiter(process_storage())
        self.rates: dict[str, tuple[RateLimitItem, ...]] = {
            "INVITE": parse_rates(invite_rate),
            "OPTIONS": parse_rates(options_rate),
        }

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

    def admit(self, method: str, source: str) -> int:
        """0 when ``source`` may send this ``method`` now; else the Retry-After (s) to answer."""
        items = self.rates.get(method)
        if not items:
            return 0
        ns = f"sip_{method.lower()}"
        for item in items:
            if not self.limiter.hit(item, ns, source):
                try:
                    reset = self.limiter.get_window_stats(item, ns, source).reset_time
                    return max(1, min(3600, math.ceil(reset - time.time())))
                except Exception:  # noqa: BLE001 - the refusal stands without an exact time
                    return 1
        return 0
