"""One model round of the LLM runner: one request, its stream, its timeouts.

Owns :class:`ModelRound`, which the runner holds (one per runner). :meth:`ModelRound.run`
streams ONE response through the assembler and returns it whole (a
:class:`~brisvox.agent.conversation.assemble.Response`) or None when it failed.

Invariants:

* One request per round, and one re-issue only of a request that got NO event within
  the first-token timeout. The retries of a failed request are the resilience layer's
  (:mod:`brisvox.providers.resilience.llm`, around the provider of every call), which
  re-issues a request that failed before its first event; a silent request it re-issues
  only when another leg could take over (``provider.reissues_silent()`` True). Otherwise
  nobody would: the round's first-token timeout ends the stream from outside the layer,
  and the turn would be one the caller hears nothing for. So when the provider does not
  re-issue a silent request itself, a fresh request that timed out before its first event
  is closed and issued once more, under a first-token timeout of its own
  (``first_token_retries``; the one bounded retry before any text). A second timeout fails
  the round. Contacts of one vendor per model request stay within the layer's bound
  (docs/PROVIDERS.md, "How often one vendor is contacted"): a silent single vendor is
  contacted twice, as for any other failure. The round's stream is a committed
  speculation's buffer (:meth:`Helper.replay`, whose provider is the same wrapped one;
  never re-issued here) or a fresh request (the ``request`` thunk).
* The first-token and idle timeouts run on the call clock (none while a committed
  speculation's helper applies its own); the timeline gets, keyed by the round's number,
  the request mark when the request left, the first-token mark when the first event came
  and the ``llm_done`` mark when the stream ended (Done, a failure, a timeout or a halt).
* Every text delta is recorded in ``turn.raw`` BEFORE it is handed to the
  :class:`RoundOutput` (the first delta of a round left-stripped once, whitespace-only
  deltas skipped until there is text); tool-call deltas and provider data go to the
  assembler; usage is counted.
* A failure (an error event or a raised ProviderError, a timeout, a stream that ends
  before Done, an assembler error) returns None with ``turn.raw`` holding what was
  received: the runner keeps it as the partial message and ends the turn (no invented
  speech). A cancelled turn returns None and leaves ``turn.streaming`` set (the halt keeps
  the partial text). The stream is always closed; a broken adapter's close is ignored.
* Counts into the runner's :class:`~brisvox.agent.pipeline.llm.policy.RunnerStats`:
  ``requests``, ``errors``, ``first_token_timeouts``, ``first_token_retries``, ``idle_timeouts``,
  ``assemble_errors``, ``input_tokens``, ``output_tokens``, ``provider_data_oversized``.
* A response's provider data (a ``ProviderData`` event or ``Done.provider_data``) over
  ``provider_data_limit`` bytes of JSON (:func:`~brisvox.agent.conversation.request.provider_data_limit`)
  is dropped and counted (``provider_data_oversized``): the response goes on without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from brisvox.agent.conversation.assemble import AssembleError, Response, ResponseAssembler
from brisvox.agent.conversation.context import Context
from brisvox.agent.conversation.request import PROVIDER_DATA_MAX_BYTES, provider_data_fits
from brisvox.agent.conversation.timeline import Timeline
from brisvox.agent.pipeline.llm.policy import RunnerStats
from brisvox.agent.pipeline.llm.turn import Turn
from brisvox.agent.pipeline.speculation.speculator import Helper
from brisvox.clock import Clock
from brisvox.providers.base import (
    Done,
    LlmError,
    LlmProvider,
    LlmRequest,
    ProviderData,
    ProviderError,
    ProviderTimeouts,
    TextDelta,
    ToolCallDelta,
    Usage,
)


class RoundOutput(Protocol):
    """Where a round's text goes as it streams (the runner: an LlmText frame downstream)."""

    async def say(self, turn: Turn, rnd: int, text: str) -> None: ...


class ModelRound:
    """Streams one model response per :meth:`run` (see the module docstring)."""

    def __init__(self, provider: LlmProvider, timeouts: ProviderTimeouts, *, clock: Clock, timeline: Timeline,
                 st: RunnerStats, provider_data_limit: int = PROVIDER_DATA_MAX_BYTES) -> None:
        self.provider = provider
        self.provider_data_limit = provider_data_limit
        self.timeouts = timeouts
        self.clock = clock
        self.timeline = timeline
        self.st = st

    async def run(self, turn: Turn, rnd: int, ctx: Context, request: Callable[[], LlmRequest],
                  out: RoundOutput) -> Response | None:
        """Stream one model response of round ``rnd``; None: it failed (or the turn was halted)."""
        to = self.timeouts
        claimed, turn.claimed = turn.claimed, None  # a committed speculation is the round's stream
        turn.raw = ""
        turn.streaming = True
        self.st.requests += 1
        assembler = ResponseAssembler()
        failed = False
        first_event = True
        first_text = True
        may_reissue = claimed is None and not self._reissues_silent()
        stream = self._open(turn, rnd, claimed, request)
        try:
            it = stream.__aiter__()
            while True:
                limit: float | None = to.llm_first_token if first_event else to.llm_idle
                if claimed is not None:
                    limit = None  # the helper applies them (none while it runs ReadOnly tools)
                try:
                    async with self.clock.timeout(limit):
                        ev = await it.__anext__()
                except StopAsyncIteration:
                    failed = True  # truncated: the stream ended before Done
                    break
                except TimeoutError:
                    if first_event:
                        self.st.first_token_timeouts += 1
                        if may_reissue and not turn.token.cancelled:
                            may_reissue = False  # once: nothing came, nothing was said
                            self.st.first_token_retries += 1
                            self.st.requests += 1
                            await self._close(stream)
                            stream = self._open(turn, rnd, None, request)
                            it = stream.__aiter__()
                            continue
                    else:
                        self.st.idle_timeouts += 1
                    failed = True
                    break
                if first_event:
                    first_event = False
                    at = claimed.first_at if claimed is not None else None
                    self.timeline.llm_first_token(turn.epoch, self.clock.now() if at is None else at, rnd)
                if isinstance(ev, TextDelta):
                    text = ev.text
                    if first_text:
                        text = text.lstrip()
                        if not text:
                            continue
                        first_text = False
                    turn.raw += text  # recorded BEFORE it is sent
                    assembler.push_text(text)
                    await out.say(turn, rnd, text)
                elif isinstance(ev, ToolCallDelta):
                    try:
                        assembler.push_tool_call(ev.index, ev.id, ev.name, ev.arguments, ev.provider_data)
                    except AssembleError:
                        self.st.assemble_errors += 1
                elif isinstance(ev, ProviderData):
                    self._provider_data(assembler, ev.value)
                elif isinstance(ev, Usage):
                    self.st.input_tokens += ev.input_tokens
                    self.st.output_tokens += ev.output_tokens
                elif isinstance(ev, Done):
                    self._provider_data(assembler, ev.provider_data)
                    break
                elif isinstance(ev, LlmError):
                    failed = True
                    break
        except ProviderError:
            failed = True
        except AssembleError:
            self.st.assemble_errors += 1
            failed = True
        finally:
            self.timeline.llm_done(turn.epoch, self.clock.now(), rnd)
            await self._close(stream)
        if turn.token.cancelled:
            return None
        if not failed:
            turn.tools_from = claimed
            return assembler.finish(turn.epoch, ctx)
        self.st.errors += 1
        assembler.cancel()
        return None

    def _provider_data(self, assembler: ResponseAssembler, value: Any) -> None:
        if value is None:
            return
        if not provider_data_fits(value, self.provider_data_limit):
            self.st.provider_data_oversized += 1
            return
        try:
            assembler.push_provider_data(value)
        except AssembleError:
            self.st.assemble_errors += 1

    def _reissues_silent(self) -> bool:
        """The provider re-issues a request that got no first event itself (a layer with a
        secondary leg): the round then never does."""
        f = getattr(self.provider, "reissues_silent", None)
        return bool(f()) if callable(f) else False

    @staticmethod
    async def _close(stream: Any) -> None:
        try:
            await stream.aclose()
        except Exception:  # noqa: BLE001 - a broken adapter must not break the turn
            pass

    def _open(self, turn: Turn, rnd: int, claimed: Helper | None, request: Callable[[], LlmRequest]) -> Any:
        """The round's stream: a committed speculation's buffer, else a fresh request;
        the timeline's request mark is when the request really left."""
        if claimed is not None:
            self.timeline.llm_request(turn.epoch, claimed.started_at, rnd)
            return claimed.replay()
        self.timeline.llm_request(turn.epoch, self.clock.now(), rnd)
        return self.provider.stream(request())
