"""One model round of the LLM runner: the stream, its timeouts and retries (a mixin of :class:`LlmRunner`).

Owns :class:`_Turn` (the state the runner and the round task of one turn share) and
:class:`_ModelRound`: ``_model_round`` streams one response through the assembler with the
first-token and idle timeouts on the call clock, records every text delta raw BEFORE it is
sent, retries (``retries``, only while nothing of the response was sent, never a request
error, after a ``Retry-After`` of at most ``retry_after_max``) and, after the last failure,
keeps the partial text as the round's message; ``_open`` gives the round its stream (a
committed speculation's buffer, else a fresh request built by the request builder) and
stamps the request on the timeline. The runner's module docstring states the turn's rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brisvox.agent.conversation.assemble import AssembleError, Response, ResponseAssembler
from brisvox.agent.conversation.context import AssistantMessage
from brisvox.agent.pipeline.llm_policy import retry_wait
from brisvox.agent.pipeline.speculation_helper import Helper
from brisvox.agent.pipeline.stage import Stage
from brisvox.agent.tool_engine.registry import CancelToken
from brisvox.providers.base import (
    Done,
    LlmError,
    ProviderData,
    ProviderError,
    TextDelta,
    ToolCallDelta,
    Usage,
)

if TYPE_CHECKING:
    from brisvox.agent.conversation.context import Context
    from brisvox.agent.conversation.playout import PlayoutBook
    from brisvox.agent.conversation.timeline import Timeline
    from brisvox.agent.pipeline.llm_policy import LlmRunnerConfig, RunnerStats, ToolRecord
    from brisvox.agent.pipeline.observer import CallObserver
    from brisvox.agent.pipeline.summarizer import Summarizer
    from brisvox.agent.tool_engine.engine import ToolEngine
    from brisvox.agent.tool_engine.filler import FillerPolicy
    from brisvox.agent.tool_engine.registry import ToolSpec
    from brisvox.providers.base import LlmProvider


@dataclass(slots=True)
class _Turn:
    """State shared between the runner and the round task of one turn."""

    epoch: int
    token: CancelToken
    ordinal: int = 0  # LlmResponseStarted frames sent in this epoch
    cur_round: int = -1
    raw: str = ""  # text of the current model round so far (raw deltas)
    streaming: bool = False  # a model round is streaming and its message is not pushed
    spoke: bool = False
    unflushed: bool = False
    filler: tuple[int, str] | None = None  # a spoken filler not yet in the context
    started_at: float = 0.0
    claimed: Helper | None = None  # a committed speculation: round 0's stream
    tools_from: Helper | None = None  # ... and the tool phase of that round



class _RunnerParts(Stage):
    """What the runner's mixins use of it (set in :meth:`LlmRunner.__init__`)."""

    cfg: LlmRunnerConfig
    st: RunnerStats
    ctx: Context
    timeline: Timeline
    book: PlayoutBook
    provider: LlmProvider
    engine: ToolEngine | None
    tools: list[ToolSpec]
    filler: FillerPolicy
    tool_records: list[ToolRecord]
    summarizer: Summarizer  # builds every request (the window, the summary at hand)
    observer: CallObserver | None = None  # the agent link's seam (pipeline/observer.py)

    def _push_assistant(self, turn: _Turn, rnd: int, msg: AssistantMessage) -> int:
        raise NotImplementedError

    async def _say(self, turn: _Turn, rnd: int, text: str) -> None:
        raise NotImplementedError

    async def _flush(self, turn: _Turn, rnd: int) -> None:
        raise NotImplementedError

    async def _speak_line(self, turn: _Turn, text: str, into_context: bool, clip: bool = False) -> int:
        raise NotImplementedError

    def _check(self) -> None:
        raise NotImplementedError

    def _round_tools(self) -> list[ToolSpec]:
        return self.tools


class _ModelRound(_RunnerParts):
    async def _model_round(self, turn: _Turn, rnd: int) -> Response | None:
        """Stream one model response (with retries before anything was sent)."""
        cfg = self.cfg
        attempts = 0
        claimed, turn.claimed = turn.claimed, None  # a committed speculation is the first attempt
        while True:
            turn.raw = ""
            turn.streaming = True
            self.st.requests += 1
            assembler = ResponseAssembler()
            failed: str | None = None
            wait: float | None = 0.0  # before a retry (a Retry-After); None: not worth retrying
            sent = False
            first_event = True
            first_text = True
            stream = self._open(turn, claimed)
            try:
                it = stream.__aiter__()
                while True:
                    limit: float | None = cfg.timeouts.llm_first_token if first_event else cfg.timeouts.llm_idle
                    if claimed is not None:
                        limit = None  # the helper applies them (none while it runs ReadOnly tools)
                    try:
                        async with self.clock.timeout(limit):
                            ev = await it.__anext__()
                    except StopAsyncIteration:
                        failed = "truncated"
                        break
                    except TimeoutError:
                        if first_event:
                            self.st.first_token_timeouts += 1
                        else:
                            self.st.idle_timeouts += 1
                        failed = "timeout"
                        break
                    if first_event:
                        first_event = False
                        at = claimed.first_at if claimed is not None else None
                        self.timeline.llm_first_token(turn.epoch, self.clock.now() if at is None else at)
                    if isinstance(ev, TextDelta):
                        text = ev.text
                        if first_text:
                            text = text.lstrip()
                            if not text:
                                continue
                            first_text = False
                        turn.raw += text  # recorded BEFORE it is sent
                        assembler.push_text(text)
                        sent = True
                        await self._say(turn, rnd, text)
                    elif isinstance(ev, ToolCallDelta):
                        try:
                            assembler.push_tool_call(ev.index, ev.id, ev.name, ev.arguments, ev.provider_data)
                        except AssembleError:
                            self.st.assemble_errors += 1
                    elif isinstance(ev, ProviderData):
                        try:
                            assembler.push_provider_data(ev.value)
                        except AssembleError:
                            self.st.assemble_errors += 1
                    elif isinstance(ev, Usage):
                        self.st.input_tokens += ev.input_tokens
                        self.st.output_tokens += ev.output_tokens
                    elif isinstance(ev, Done):
                        if ev.provider_data is not None:
                            try:
                                assembler.push_provider_data(ev.provider_data)
                            except AssembleError:
                                self.st.assemble_errors += 1
                        break
                    elif isinstance(ev, LlmError):
                        failed, wait = ev.kind, retry_wait(ev.retryable, ev.retry_after, cfg)
                        break
            except ProviderError as e:
                failed, wait = e.kind, retry_wait(e.retryable, e.retry_after, cfg)
            except AssembleError:
                self.st.assemble_errors += 1
                failed = "assemble"
            finally:
                try:
                    await stream.aclose()
                except Exception:  # noqa: BLE001 - a broken adapter must not break the turn
                    pass
            if turn.token.cancelled:
                return None
            if failed is None:
                turn.tools_from = claimed
                return assembler.finish(turn.epoch, self.ctx)
            self.st.errors += 1
            if not sent and attempts < cfg.retries and wait is not None:
                attempts += 1
                claimed = None  # a retry is a fresh request
                self.st.retries += 1
                await self.clock.sleep(wait)
                continue
            assembler.cancel()
            if turn.raw.strip():
                self._push_assistant(turn, rnd, AssistantMessage(turn.raw))
                self.st.partial_messages += 1
            turn.streaming = False
            return None

    def _open(self, turn: _Turn, claimed: Helper | None) -> Any:
        """The round's stream: a committed speculation's buffer, else a fresh request;
        the timeline's request mark is when the request really left."""
        if claimed is not None:
            self.timeline.llm_request(turn.epoch, claimed.started_at)
            return claimed.replay()
        self.timeline.llm_request(turn.epoch, self.clock.now())
        return self.provider.stream(self.summarizer.build(self.ctx, self._round_tools()))

