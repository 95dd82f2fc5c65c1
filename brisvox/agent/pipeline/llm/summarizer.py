"""The runner's request window and its background summarizer (docs/TOOLS.md, "The request window").

Owns :class:`Summarizer`: the LLM runner builds every request through it
(:meth:`Summarizer.build`: the budgeted window of
:mod:`brisvox.agent.conversation.request` with the summary at hand, counted) and
starts ONE refresh after each turn's end (:meth:`Summarizer.after_turn`).

Rules:

* ENTIRELY off the request path: a request never waits for a summary; it goes
  out with the summary at hand (or none). A request whose dropped turns the
  summary does not cover is counted (``uncovered_requests``).
* The refresh runs as a task of the call's TaskOwner, attributed to the runner's
  stage (cancelled with it and with the call), at most one at a time, each model
  request bounded by ``timeout`` (8 s) on the call clock.
* It refreshes AHEAD: it summarizes up to where the window of the next request
  will start once the next user message is in (a placeholder the size of the
  last one, :func:`~brisvox.agent.conversation.request.summary_target`), so in
  steady state the summary is ready when the next turn needs it. It never
  covers the turn that has just finished: that turn's last assistant message
  is final only after the played-text cut of the next turn start, and late
  notes and interrupted-call results are still appended to it. Trade-off: when
  that turn ALONE is too large for the window, the next request goes without
  it (uncovered) and the next refresh covers it.
* Incremental: the previous summary plus the newly dropped turns (each message
  cut to ``message_bytes``, a chunk bounded by ``input_tokens``; at most
  ``max_chunks`` chunks per refresh).
* A summary over ``max_tokens`` is clipped on a word boundary when it is at most
  twice that (``summary_clipped``), else refused (``summary_too_large``); a
  refused, failed (``summary_failures``) or timed-out (``summary_timeouts``)
  summary never replaces the current one. After ``breaker_failures`` (3)
  consecutive failures the breaker backs off: no attempt for ``timeout``
  doubled per failure past the second (16 s, 32 s, then ``backoff_max`` 60 s:
  :attr:`SummaryConfig.backoff`; ``summary_backoffs`` counts the skipped
  refreshes); a success closes it.
* A summary is valid only while the context still holds the messages it was
  made against (identity at both ends; a flow reset that replaces them voids it;
  :meth:`Summarizer.reset` drops it and any refresh in flight).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brisvox.agent.conversation.context import (
    AssistantMessage,
    Message,
    SystemMessage,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.conversation.request import (
    SUMMARY_PREFIX,
    WINDOW_ESTIMATOR,
    RequestConfig,
    WindowSummary,
    build_window,
    request_of,
    summary_target,
    utf8_prefix,
)
from brisvox.providers.base import Done, LlmError, LlmMessage, LlmRequest, ProviderError, TextDelta
from brisvox.runtime.retry import RetryPolicy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from brisvox.agent.conversation.context import Context
    from brisvox.agent.pipeline.llm.policy import RunnerStats
    from brisvox.agent.pipeline.stage.base import TaskOwner
    from brisvox.agent.tool_engine.registry import ToolSpec
    from brisvox.clock import Clock
    from brisvox.providers.base import LlmProvider

log = logging.getLogger("brisvox.agent.llm")

SUMMARY_PROMPT = (
    "You keep the running summary of a phone call between a caller and a voice assistant. "
    "Merge the summary so far with the new part of the conversation into ONE updated summary: "
    "the caller's name and details, what they asked for, what was decided, booked or done "
    "(with numbers, dates and references exactly as given), and what is still open. "
    "Plain text, no preamble, at most {words} words."
)


@dataclass(frozen=True, slots=True)
class SummaryConfig:
    """``provider``: "" no summarizer (unless the runner is given one), "agent" the
    agent's own LLM; a cheaper LLM is handed to the runner (``summary_llm``)."""

    provider: str = ""
    timeout: float = 8.0
    max_tokens: int = 400  # of the summary message; the response cap of the summary request
    input_tokens: int = 6000  # bound of one summary request's new conversation text
    message_bytes: int = 2000  # each message of it cut to this
    max_chunks: int = 4
    breaker_failures: int = 3
    backoff_max: float = 60.0

    @property
    def backoff(self) -> RetryPolicy:
        """The open breaker's wait after its n-th failure past the second: ``timeout`` x 2^n
        (16 s, 32 s), capped at ``backoff_max``; no jitter."""
        return RetryPolicy(base=2.0 * self.timeout, multiplier=2.0, cap=self.backoff_max)


class Summarizer:
    """See the module docs. ``llm`` None: no summary (the budgeted window still applies)."""

    def __init__(self, cfg: SummaryConfig, request: RequestConfig, st: RunnerStats, clock: Clock,
                 llm: LlmProvider | None) -> None:
        self.cfg = cfg
        self.request = request
        self.st = st
        self.clock = clock
        self.llm = llm
        self.summary: WindowSummary | None = None
        self.task: asyncio.Task[Any] | None = None
        self.failures = 0  # consecutive
        self.retry_at = 0.0
        self.generation = 0

    @property
    def enabled(self) -> bool:
        return self.llm is not None

    # -- the request path ------------------------------------------------------------------
    def build(self, ctx: Context, tools: Sequence[ToolSpec]) -> LlmRequest:
        """The request of the next round: never waits for the summarizer."""
        win = build_window(ctx, self.request.window, self.summary)
        st = self.st
        if win.dropped:
            st.requests_trimmed += 1
        if win.clipped:
            st.requests_clipped += 1
            st.results_clipped += win.clipped
        if win.over_budget:
            st.requests_over_budget += 1
        if win.uncovered and self.enabled:
            st.uncovered_requests += 1
        return request_of(win, tools, self.request)

    # -- the refresh -----------------------------------------------------------------------
    def after_turn(self, ctx: Context, tasks: TaskOwner, stage: str) -> None:
        """A turn ended: start the refresh (one at a time; none while the breaker is open)."""
        if self.llm is None or (self.task is not None and not self.task.done()):
            return
        if self.clock.now() < self.retry_at:
            self.st.summary_backoffs += 1
            return
        snapshot = ctx.messages  # frozen messages: a shallow copy is a snapshot
        self.task = tasks.spawn(self._refresh(snapshot, self.generation), "llm-summary", stage=stage)

    def reset(self) -> None:
        """The conversation was replaced (a flow reset): drop the summary and any refresh in flight."""
        self.generation += 1
        self.summary = None

    async def _refresh(self, msgs: tuple[Message, ...], generation: int) -> None:
        try:
            await self._refresh_chunks(msgs, generation)
        except asyncio.CancelledError:
            raise
        except Exception:  # a summarizer bug must never reach the stage's supervision
            self.st.summary_failures += 1
            log.exception("summary refresh crashed")

    async def _refresh_chunks(self, msgs: tuple[Message, ...], generation: int) -> None:
        cfg = self.cfg
        target = summary_target(msgs, self.request.window, cfg.max_tokens)
        head = 1 if msgs and isinstance(msgs[0], SystemMessage) else 0
        for _ in range(max(1, cfg.max_chunks)):
            cur = self.summary if self.summary is not None and self.summary.valid_for(msgs) else None
            done = cur.covers_until if cur is not None else head
            if target <= done:
                return
            end = self._chunk_end(msgs, done, target)
            text = await self._summarize(cur.text if cur is not None else "", msgs[done:end])
            if text is None:
                return
            if generation != self.generation:
                self.st.summaries_discarded += 1
                return
            self.summary = WindowSummary(text, end, msgs[head], msgs[end])
            self.st.summaries += 1

    def _chunk_end(self, msgs: Sequence[Message], done: int, target: int) -> int:
        """The turn start up to which one request summarizes: the whole turns from
        ``done`` that fit ``input_tokens`` (at least one turn)."""
        budget = self.cfg.input_tokens * 4
        used = 0
        end = -1
        for j in range(done, target + 1):
            if j > done and (j == target or isinstance(msgs[j], UserMessage)):
                if used > budget:
                    return end if end > 0 else j
                end = j
            if j < target:
                used += min(self.cfg.message_bytes, _bytes_of(msgs[j])) + 16
        return target

    def _render(self, previous: str, msgs: Sequence[Message]) -> str:
        lines = [f"Summary so far: {previous}" if previous else "Summary so far: (none)", "",
                 "New part of the conversation:", *conversation_lines(msgs, self.cfg.message_bytes)]
        return "\n".join(lines)

    async def _summarize(self, previous: str, msgs: Sequence[Message]) -> str | None:
        """One summary request, bounded; None (counted) when it fails or is refused."""
        assert self.llm is not None
        cfg = self.cfg
        words = max(20, cfg.max_tokens * 3 // 5)
        req = LlmRequest(messages=(LlmMessage("system", SUMMARY_PROMPT.format(words=words)),
                                   LlmMessage("user", self._render(previous, msgs))),
                         temperature=0.0, max_tokens=cfg.max_tokens)
        self.st.summary_requests += 1
        try:
            async with self.clock.timeout(cfg.timeout):
                text = await _collect(self.llm, req)
        except TimeoutError:
            self.st.summary_timeouts += 1
            self._failed("timed out")
            return None
        except (ProviderError, _Failed, OSError) as e:
            self.st.summary_failures += 1
            self._failed(str(e) or type(e).__name__)
            return None
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a broken adapter must not break the call
            self.st.summary_failures += 1
            self._failed(f"{type(e).__name__}: {e}")
            return None
        text = " ".join(text.split())
        if not text:
            self.st.summary_failures += 1
            self._failed("empty summary")
            return None
        limit = self.max_summary_bytes()
        size = len(text.encode("utf-8", "replace"))
        if size > limit:
            if size > 2 * limit:
                self.st.summary_too_large += 1
                self._failed(f"a summary of {size} bytes, limit {limit}")
                return None
            text = _cut(text, limit - len(ELLIPSIS.encode()), word=True)
            self.st.summary_clipped += 1
        self.failures = 0
        self.retry_at = 0.0
        return text

    def max_summary_bytes(self) -> int:
        """The longest summary text whose message fits ``max_tokens`` (default estimate)."""
        base = WINDOW_ESTIMATOR.message_tokens(SystemMessage(SUMMARY_PREFIX))
        return max(0, (self.cfg.max_tokens - base) * 4)

    def _failed(self, why: str) -> None:
        self.failures += 1
        cfg = self.cfg
        if self.failures < cfg.breaker_failures:
            log.warning("summary failed (%s)", why)
            return
        if self.failures == cfg.breaker_failures:
            self.st.summary_degraded += 1
        wait = cfg.backoff.backoff(self.failures - cfg.breaker_failures + 1)
        self.retry_at = self.clock.now() + wait
        log.warning("summary failed (%s), %d in a row: next attempt in %.0f s", why, self.failures, wait)


def conversation_lines(msgs: Sequence[Message], cut: int) -> list[str]:
    """The conversation as plain lines for a summary request ("Caller: ...", "Assistant: ...",
    tool calls and results, notes), each message cut at ``cut`` bytes."""
    names: dict[str, str] = {}
    lines: list[str] = []
    for m in msgs:
        if isinstance(m, UserMessage):
            lines.append("Caller: " + _cut(m.content, cut))
        elif isinstance(m, AssistantMessage):
            for c in m.tool_calls:
                names[c.id] = c.name
            if m.text.strip():
                lines.append("Assistant: " + _cut(m.text, cut))
            if m.tool_calls:
                lines.append("Assistant called: " + ", ".join(c.name for c in m.tool_calls))
        elif isinstance(m, ToolMessage):
            what = "error" if m.is_error else "result"
            lines.append(f"Tool {what} ({names.get(m.call_id, m.call_id)}): " + _cut(m.content, cut))
        else:
            lines.append("Note: " + _cut(m.content, cut))
    return lines


class _Failed(Exception):
    pass


async def collect_text(llm: LlmProvider, req: LlmRequest) -> str:
    """The text of one request's stream (ProviderError-like ``_Failed`` on an LlmError or a
    stream without Done); the caller bounds it."""
    return await _collect(llm, req)


async def _collect(llm: LlmProvider, req: LlmRequest) -> str:
    parts: list[str] = []
    stream = llm.stream(req)
    try:
        async for ev in stream:
            if isinstance(ev, TextDelta):
                parts.append(ev.text)
            elif isinstance(ev, LlmError):
                raise _Failed(f"{ev.kind}: {ev.detail}")
            elif isinstance(ev, Done):
                return "".join(parts)
        raise _Failed("the stream ended without Done")
    finally:
        try:
            await stream.aclose()
        except Exception:  # noqa: BLE001 - closing a broken stream must not mask the result
            pass


def _bytes_of(m: Message) -> int:
    if isinstance(m, AssistantMessage):
        return len(m.text) + 32 * len(m.tool_calls)
    return len(m.content)


ELLIPSIS = " …"


def _cut(text: str, max_bytes: int, word: bool = False) -> str:
    """``text`` within ``max_bytes`` (+ the ellipsis when cut); looks at the kept prefix only."""
    if len(text) * 4 <= max_bytes or (len(text) <= max_bytes and len(text.encode("utf-8", "replace")) <= max_bytes):
        return text
    head = utf8_prefix(text, max_bytes)
    if word and " " in head:
        head = head.rsplit(" ", 1)[0]
    return head + ELLIPSIS
