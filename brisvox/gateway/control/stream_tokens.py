"""Twilio streams bound to the call the gateway's webhook answered: one-time stream tokens.

Owns :class:`StreamTokens`, the tokens the TwiML webhook (:mod:`brisvox.gateway.control.twiml`)
issues, one per answered call, each bound to that call (:class:`Binding`: the webhook form's
``CallSid`` and ``AccountSid``, signed by Twilio, and the agent the TwiML names), and
:func:`bind_stream`, the check a Twilio stream's ``start`` passes before its call is admitted
(:mod:`brisvox.gateway.carriers.twilio`). The webhook puts the token in the TwiML as
``<Parameter name="brisvox_stream_token" value="..."/>`` (:data:`brisvox.wire.twilio.TOKEN_PARAM`);
Twilio passes it back in ``start.customParameters``.

Why: Twilio's upgrade signature is an HMAC of the stream URL alone, the same for every call
and valid forever, and the ``start`` message names whatever callSid and accountSid its sender
likes. A token makes a stream prove it is the one Twilio opened for a call this gateway
answered a moment ago, and the REST actions (hang-up, transfer) act on the callSid bound at
the webhook, never on the one the stream claims.

Invariants:

* A token is 32 random bytes (``secrets.token_urlsafe``), redeemed at most once: a second
  ``start`` with it is ``replayed_stream_token``; one unknown or older than ``ttl_s`` is
  ``bad_stream_token`` (a used token is remembered until it expires, so a replay is named).
* Memory is bounded: at most ``max_tokens`` entries, used or not, none older than ``ttl_s``
  (expired ones are pruned, oldest first, on every issue and redeem); a CallSid holds at most
  one unused token (a repeated webhook for the same call replaces it), so a replayed signed
  webhook POST cannot fill the table. Beyond ``max_tokens`` :meth:`StreamTokens.issue`
  returns None (the webhook answers 503) rather than evicting a live call's token.
* :func:`bind_stream` refuses with :class:`~brisvox.wire.mediastream.StreamError` (1008,
  counted ``ws_malformed_<kind>`` by the session): no token when one is required
  (``no_stream_token``), a bad or replayed one, a token bound to another agent
  (``bad_stream_token``), a callSid other than the bound one (``foreign_call``), an
  accountSid other than ``twilio_account_sid`` or, when that is unset, other than the
  webhook form's (``foreign_account``). Without a token (not required) the stream's own
  accountSid is still checked against ``twilio_account_sid`` when that is set.
* Times come from ``clock`` (monotonic seconds).
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from brisvox.wire.mediastream import StreamError
from brisvox.wire.twilio import TOKEN_PARAM, Start


@dataclass(frozen=True, slots=True)
class Binding:
    """The call a token was issued for (the webhook form's ids, the TwiML's agent)."""

    call_sid: str
    account_sid: str
    agent: str


class _Entry:
    __slots__ = ("binding", "expires", "used")

    def __init__(self, binding: Binding, expires: float) -> None:
        self.binding = binding
        self.expires = expires
        self.used = False


class StreamTokens:
    """The tokens one webhook issued (see the module invariants)."""

    def __init__(self, ttl_s: float, max_tokens: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_tokens = max_tokens
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # token -> entry, oldest first
        self._unused: dict[str, str] = {}  # CallSid -> its unused token

    def __len__(self) -> int:
        return len(self._entries)

    def _prune(self, now: float) -> None:
        entries = self._entries
        while entries:
            token, e = next(iter(entries.items()))
            if e.expires > now:
                return
            del entries[token]
            if self._unused.get(e.binding.call_sid) == token:
                del self._unused[e.binding.call_sid]

    def issue(self, binding: Binding) -> str | None:
        """A new token for ``binding`` (replacing the call's unused one); None when full."""
        now = self.clock()
        self._prune(now)
        old = self._unused.pop(binding.call_sid, None)
        if old is not None:
            self._entries.pop(old, None)
        if len(self._entries) >= self.max_tokens:
            return None
        token = secrets.token_urlsafe(32)
        self._entries[token] = _Entry(binding, now + self.ttl_s)
        self._unused[binding.call_sid] = token
        return token

    def redeem(self, token: str) -> Binding | str:
        """The binding of ``token``, now used; else the refusal's kind (``bad_stream_token``,
        ``replayed_stream_token``)."""
        self._prune(self.clock())
        e = self._entries.get(token) if type(token) is str else None
        if e is None:
            return "bad_stream_token"
        if e.used:
            return "replayed_stream_token"
        e.used = True
        if self._unused.get(e.binding.call_sid) == token:
            del self._unused[e.binding.call_sid]
        return e.binding


def _same(a: str | None, b: str) -> bool:
    return a is not None and hmac.compare_digest(a.encode(), b.encode())


def bind_stream(start: Start, tokens: StreamTokens | None, cfg: Any, agent: str) -> Binding | None:
    """The binding of a Twilio stream's ``start`` for ``agent`` (the route's), None for a
    stream let in without a token; raises :class:`StreamError` (module invariants)."""
    token = (start.params or {}).get(TOKEN_PARAM)
    account = cfg.twilio_account_sid
    if account and not _same(start.account_sid, account):
        raise StreamError("foreign_account", "accountSid is not this gateway's Twilio account")
    if token is None:
        if cfg.stream_token_required:
            raise StreamError("no_stream_token", "no stream token: the stream must come from this gateway's TwiML")
        return None
    found = tokens.redeem(token) if tokens is not None else "bad_stream_token"
    if isinstance(found, str):
        raise StreamError(found, "stream token used before" if found == "replayed_stream_token"
                          else "stream token unknown or expired")
    if not _same(agent, found.agent):
        raise StreamError("bad_stream_token", "stream token not for this agent")
    if not _same(start.call_sid, found.call_sid):
        raise StreamError("foreign_call", "callSid is not the call the webhook answered")
    if not _same(start.account_sid, found.account_sid):
        raise StreamError("foreign_account", "accountSid is not the webhook's")
    return found
