"""ResilientLlm: an LlmProvider over a primary and an optional secondary leg.

Invariants:

* A response that fails BEFORE any content (an LlmError or a ProviderError
  as its first event, a stream that ends empty, or, when the other leg could
  take over, no event within ``llm_attempt_timeout``) is re-issued: to the
  secondary when there is one, else to the primary again, within the
  budget (:mod:`.core`). After the first event nothing is retried: the
  caller may already have spoken the content.
* ``Retry-After`` (a 429/503 that says when to come back): with another leg
  to go to, the wrapper fails over at once (the other vendor did not ask us
  to wait); on the same leg it waits ``Retry-After`` when that is at most
  ``retry_after_max`` (2 s) and then retries, and gives up at once when it is
  longer (the error goes to the caller, whose own rules apply). It never
  retries earlier than the server asked (:attr:`ResilienceConfig.retry`).
* Request errors (``bad_request``) end the response at once, uncounted; a
  cancelled or closed-early probe releases its breaker permit.
* The breaker hears a verdict at the first event (success; probation for a
  probe) or the failure; a Done proves the leg healthy.
* A leg that cannot call tools (its adapter's ``calls_tools`` is False: the local
  LLM) is never asked a request that offers tools after a failover: the request
  is answered by the wrapper itself with :data:`NO_TOOLS_LINE` (a Done, no tool
  call), so the caller hears that the action cannot be done now and no action is
  invented by a model that could not perform it. The leg is not contacted (no
  breaker verdict, no token); each answer is counted (``no_tools_answers``) and
  the first of the call logged. A request without tools goes to the leg as
  before. The primary is asked whatever it can do (a tool-less primary is the
  agent file's choice: ``brisvoxd check`` warns).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

from brisvox.providers.base import (
    Done,
    LlmError,
    LlmEvent,
    LlmProvider,
    LlmRequest,
    ProviderError,
    TextDelta,
)
from brisvox.providers.resilience.core import (
    DEFAULT,
    NOT_COUNTED,
    PROBE,
    SKIP,
    STOP,
    Legs,
    Resilience,
    ResilienceConfig,
    VendorLeg,
)

log = logging.getLogger("brisvox.providers.resilience")

NO_TOOLS_LINE = "Sorry, I can't do that right now. Please try again in a little while."


def calls_tools(provider: Any) -> bool:
    """False for an adapter that offers its model no tools (``calls_tools = False``)."""
    return bool(getattr(provider, "calls_tools", True))


class ResilientLlm:
    """One call's LLM (its budget and counters); ``stats()`` reads the counters."""

    def __init__(self, primary: LlmProvider, secondary: LlmProvider | None = None, pkey: str = "",
                 skey: str = "", *, resilience: Resilience | None = None,
                 config: ResilienceConfig | None = None,
                 own: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})) -> None:
        res = resilience or DEFAULT
        self.cfg = config or res.config
        self.legs: Legs[LlmProvider] = Legs("llm", primary, secondary, pkey or primary.name,
                                            skey or (secondary.name if secondary else ""), res, self.cfg,
                                            own)
        self.name = primary.name if secondary is None else f"{primary.name}+{secondary.name}"
        self.primary = primary
        self.secondary = secondary
        self.logged_no_tools = False

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.legs.warm(timeout)

    def stream(self, request: LlmRequest) -> ResilientStream:
        return ResilientStream(self, request)

    def reissues_silent(self) -> bool:
        """A request with no first event within ``llm_attempt_timeout`` is re-issued here
        (to the other leg): only with a secondary. Without one the LLM runner's round
        re-issues a request its first-token timeout ended, once."""
        return self.secondary is not None

    def stats(self) -> dict[str, int]:
        return self.legs.st.as_dict()


class ResilientStream:
    def __init__(self, owner: ResilientLlm, request: LlmRequest) -> None:
        self.owner = owner
        self.request = request
        self._order = owner.legs.order(None)
        self._pos = -1
        self._tried = 0
        self._cur: Any = None
        self._leg: VendorLeg[LlmProvider] | None = None
        self._i = -1
        self._probe = False  # this stream holds its breaker's half-open permit, no verdict yet
        self._content = False
        self._closed = False
        self._last: LlmError | None = None

    def __aiter__(self) -> AsyncIterator[LlmEvent]:
        return self

    def _different_leg_follows(self) -> bool:
        return any(j != self._i for j in self._order[self._pos + 1:])

    async def _open_next(self) -> bool:
        legs = self.owner.legs
        cfg = self.owner.cfg
        while self._pos + 1 < len(self._order):
            self._pos += 1
            i = self._order[self._pos]
            asked = self._last.retry_after if self._last is not None else None
            if asked is not None and i == self._i:  # the same leg asked us to come back later
                wait = cfg.retry.honour_retry_after(asked)
                if wait is None:
                    legs.count("retry_after_giveups")
                    return False
                legs.count("retry_after_waits")
                await legs.clock.sleep(wait)
            if i > 0 and self.request.tools and not calls_tools(legs.legs[i].provider):
                self._answer_without(legs.legs[i])
                return True
            adm = await legs.admit_waiting(i, paid=self._tried > 0)
            if adm == STOP:
                return False
            if adm == SKIP:
                continue
            self._tried += 1
            if self._tried > 1:
                legs.count("failovers")
            self._i = i
            self._leg = legs.legs[i]
            self._probe = adm == PROBE
            try:
                self._cur = self._leg.provider.stream(self.request)
            except ProviderError as e:
                self._cur = _Failed(LlmError(e.kind, e.detail, e.retryable, e.retry_after))
            return True
        return False

    def _answer_without(self, leg: VendorLeg[LlmProvider]) -> None:
        """The failover went to a leg that cannot call tools: answer that the action cannot be done now."""
        owner = self.owner
        owner.legs.count("failovers")
        owner.legs.count("no_tools_answers")
        if not owner.logged_no_tools:
            owner.logged_no_tools = True
            log.warning("llm failover to %s, which cannot call tools: a request offering %d tool(s) is "
                        "answered that it cannot be done now (no tool runs) until %s is back",
                        leg.key.split("|", 1)[0], len(self.request.tools), owner.legs.legs[0].key.split("|", 1)[0])
        self._leg, self._i, self._probe = None, -1, False
        self._content = True
        self._cur = _Failed(TextDelta(NO_TOOLS_LINE), Done("stop"))

    async def __anext__(self) -> LlmEvent:
        if self._closed:
            raise StopAsyncIteration
        if self._content:
            ev: LlmEvent = await self._cur.__anext__()
            if isinstance(ev, Done) and self._leg is not None:
                self._leg.breaker.healthy()
            return ev
        legs = self.owner.legs
        while True:
            if self._cur is None:
                try:
                    opened = await self._open_next()
                except asyncio.CancelledError:
                    self._release_probe()
                    raise
                if not opened:
                    self._closed = True
                    if self._last is not None:
                        return self._last
                    return LlmError("unavailable", "no LLM leg may be tried now")
                if self._content:  # the wrapper's own answer (a tool-less leg): no verdict to hear
                    ev = await self._cur.__anext__()
                    return ev
            limit = self.owner.cfg.llm_attempt_timeout if self._different_leg_follows() else None
            try:
                async with legs.clock.timeout(limit):
                    ev = await self._cur.__anext__()
            except StopAsyncIteration:
                ev = LlmError("truncated", "empty stream")
            except TimeoutError:
                ev = LlmError("timeout", "no first event in time")
            except ProviderError as e:
                ev = LlmError(e.kind, e.detail, e.retryable, e.retry_after)
            except asyncio.CancelledError:
                self._release_probe()
                raise
            assert self._leg is not None
            probe, self._probe = self._probe, False  # a verdict follows, but for a request error
            if isinstance(ev, LlmError):
                await self._close_cur()
                if ev.kind in NOT_COUNTED:
                    if probe:  # a bad request says nothing of the leg: the next caller probes
                        self._leg.breaker.release()
                    legs.count_leg(self._leg, "request_errors")
                    self._closed = True
                    return ev
                self._leg.breaker.failure()
                legs.count_leg(self._leg, "failures")
                self._last = ev
                continue
            self._leg.breaker.success() if probe else self._leg.breaker.healthy()
            self._content = True
            if isinstance(ev, Done):
                self._leg.breaker.healthy()
            return ev

    async def _close_cur(self) -> None:
        cur, self._cur = self._cur, None
        if cur is not None:
            with contextlib.suppress(Exception):
                await cur.aclose()

    def _release_probe(self) -> None:
        if self._probe and self._leg is not None:
            self._leg.breaker.release()
        self._probe = False

    async def aclose(self) -> None:
        self._release_probe()  # closed before the first event: the probe gave no verdict
        self._closed = True
        await self._close_cur()


class _Failed:
    """A stream the wrapper answers itself: a request that could not even start (its
    error), or a fixed answer."""

    def __init__(self, *events: LlmEvent) -> None:
        self._evs: list[LlmEvent] = list(events)

    def __aiter__(self) -> _Failed:
        return self

    async def __anext__(self) -> LlmEvent:
        if not self._evs:
            raise StopAsyncIteration
        return self._evs.pop(0)

    async def aclose(self) -> None:
        self._evs = []
