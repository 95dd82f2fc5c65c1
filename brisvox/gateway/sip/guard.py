"""The SIP user agent's guard against hostile sources: per-source rate limits and bounded logs.

Owns :class:`SipGuard`: the per-source-address moving-window rate limits of
new INVITEs and OPTIONS (``[sip] invite_rate``, ``options_rate``; the
``limits`` package), the Retry-After a refused request is given, and the
user agent's :class:`~brisvox.runtime.log_limit.LogLimiter` (one line per
site per minute for bad datagrams, never a traceback per datagram).

Invariants:

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
  packet's source, or the caller a trusted proxy's Vias name (the user
  agent chooses it: :meth:`~brisvox.gateway.sip.transactions.SipTransactions.caller_host`).
* Memory is bounded by the storage's expiry: a window's entries live at
  most the window's length.
"""

from __future__ import annotations

import logging
import math
import time

from limits import RateLimitItem, strategies

from brisvox.gateway.rate_limits import parse_rates, process_storage
from brisvox.runtime.log_limit import LogLimiter


class SipGuard:
    """Rate limits and bounded logging of one SIP user agent (see the module docstring)."""

    def __init__(self, invite_rate: tuple[str, ...], options_rate: tuple[str, ...],
                 log: logging.Logger) -> None:
        self.limiter = strategies.MovingWindowRateLimiter(process_storage())
        self.rates: dict[str, tuple[RateLimitItem, ...]] = {
            "INVITE": parse_rates(invite_rate),
            "OPTIONS": parse_rates(options_rate),
        }
        self.log_limit = LogLimiter(log)

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

    def suppressed(self) -> dict[str, int]:
        """Log lines not written, by site (exported as ``log_suppressed_<site>``)."""
        return dict(self.log_limit.suppressed)
