"""LlmRunner: the call's Context, one round task per user turn, the tool loop.

The model round (stream, timeouts, retries) is :mod:`.llm_round`'s mixin, the tool
phase (execute, filler, records) :mod:`.llm_tool_phase`'s; the rules below are the
runner's as a whole.

Owns (the tool loop and its UX: docs/TOOLS.md):

* The Context (the probe surface of the sim). Only two writers exist and
  never at once: the runner's ``process`` (turn start, barge-in, hang-up),
  which mutates it only after the round task was cancelled AND joined, and
  the round task, which checks its token before every mutation.
* At UserTurnEnded(epoch), in this order: halt a live round task (a new turn
  while streaming), the played-text cut from the playout book (settle wait
  bounded), late SideEffect notes (only while no call is open), the user
  message, then ONE round task for the turn.
* Per round: register (epoch, ordinal) in the book BEFORE LlmResponseStarted;
  request via the RequestBuilder; first-token and idle timeouts on the call
  clock; every text delta is recorded (raw) and then sent as LlmText (the
  first delta of a round left-stripped once, whitespace-only deltas skipped
  until there is text), tool-call deltas go to the assembler; at Done the
  assistant message is pushed ONCE, before any tool runs, and its index
  recorded in the book.
* Tools: Flush first (only if text was sent since the last flush), then the
  ToolEngine's execute raced against the filler delay; a filler is its own
  round (a clip round: the TTS stage plays its pre-rendered audio), entering
  the context once no call is open: right before the next assistant message,
  or when the turn is settled (turn end, halt), never right after the results,
  so no request ends on an assistant message (a prefill Anthropic rejects).
  Results in issue order (Execution.append_to), late notes only after them.
  At most ``max_tool_rounds`` rounds execute tools; the next response's calls
  are answered ``tool_round_limit`` unrun and a fixed fallback line is
  spoken (also when the retry budget is exhausted).
* Errors: ``retries`` bounded retries, only while nothing of the response was
  sent, never of a request error (``retryable`` False: 400/401/403/404/413/422),
  after a ``Retry-After`` of at most ``retry_after_max``; after the last failure the partial text is kept and the turn ends
  without invented speech. A turn that produced no speech sends BotEnded
  upstream itself (non-blocking). A crash in the round task is contained:
  the turn is closed like a failed one.
* Speculation (default off; :mod:`brisvox.agent.pipeline.speculation_helper`): a
  SpeculationCandidate settles as the turn end would (minus the user message) and starts
  a helper on a copy; a hit at UserTurnEnded hands its buffer to round 0 (``_Turn.claimed``:
  replayed through the same code as a fresh stream; its tool phase commits the helper's
  ToolEngine speculation). UserTurnStarted, Interrupt, Greeting, Stop, a newer epoch drop it.
* Greeting(epoch, text): the bot turn of the agent's greeting is one fixed
  round (no model request) that enters the context as the first assistant
  message; a barge-in cuts it to what was heard like any answer.
* Barge-in (Interrupt) and hang-up (Stop): cancel the token, cancel and join
  the task (bounded; a task that does not end is a zombie that never touches
  the context again), then the partial assistant message (raw text so far:
  a superset of what was sent), ``interrupt_pending_tool_calls``, a spoken
  filler not yet in the context, and the Interrupt goes on downstream.
"""

from __future__ import annotations

import asyncio
import logging

from brisvox.agent.conversation.assemble import (
    InvalidCall,
)
from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    SystemMessage,
    UserMessage,
)
from brisvox.agent.flows.manager import FlowManager
from brisvox.agent.pipeline.call_context import CallContext
from brisvox.agent.pipeline.frames import (
    BotEnded,
    DtmfFrame,
    Flush,
    Greeting,
    Interrupt,
    KeypadEntry,
    LlmResponseEnded,
    LlmResponseStarted,
    LlmText,
    PipelineFrame,
    SpeculationCandidate,
    Start,
    Stop,
    UserTranscript,
    UserTurnEnded,
    UserTurnStarted,
)
from brisvox.agent.pipeline.llm_flow import _FlowHook
from brisvox.agent.pipeline.llm_policy import (
    TOOL_ROUND_LIMIT,
    LlmRunnerConfig,
    RunnerStats,
    ToolRecord,
)
from brisvox.agent.pipeline.llm_round import _ModelRound, _Turn
from brisvox.agent.pipeline.llm_tool_phase import _ToolPhase
from brisvox.agent.pipeline.speculation_helper import Helper, Speculator
from brisvox.agent.pipeline.stage import Inbox, Stage
from brisvox.agent.pipeline.summarizer import Summarizer
from brisvox.agent.tool_engine import errors as te
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.filler import FillerPolicy
from brisvox.agent.tool_engine.registry import CancelToken, ToolSpec
from brisvox.providers.base import (
    LlmProvider,
    ProviderError,
)

log = logging.getLogger("brisvox.agent.llm")

class LlmRunner(_FlowHook, _ToolPhase, _ModelRound, Stage):
    DROP_STALE = True

    def __init__(
        self,
        call: CallContext,
        cfg: LlmRunnerConfig,
        inbox: Inbox,
        provider: LlmProvider,
        *,
        engine: ToolEngine | None = None,
        tools: list[ToolSpec] | None = None,
        context: Context | None = None,
        summary_llm: LlmProvider | None = None,
        flow: FlowManager | None = None,
    ) -> None:
        super().__init__(call, cfg, inbox)
        self.provider = provider
        self.cfg = cfg
        self.book = call.book
        self.timeline = call.timeline
        self.upstream = call.upstream
        self.engine = engine
        self.tools = list(tools or (engine.registry.specs() if engine is not None else []))
        self.ctx = context if context is not None else Context([SystemMessage(cfg.system_prompt)])
        self.flow = flow
        self._flow_pre = flow.start(self.ctx) if flow is not None else ()  # said at the first turn
        self._flow_keypad = None
        policy = FillerPolicy.from_config(cfg.filler)
        if cfg.filler_phrases:
            policy.with_phrases(list(cfg.filler_phrases))
        self.filler = policy
        self.st = RunnerStats()
        # the request window and its background summarizer ("agent": the agent's own LLM)
        self.summarizer = Summarizer(cfg.summary, cfg.request, self.st, self.clock, summary_llm or (
            provider if cfg.summary.provider == "agent" else None))
        self.tool_records: list[ToolRecord] = []
        self._turn: _Turn | None = None
        self._task: asyncio.Task[None] | None = None
        self._zombies: list[asyncio.Task[None]] = []
        self.spec = Speculator(cfg.speculation, clock=self.clock, tasks=self.tasks, provider=provider,
                               engine=engine, tools=self.tools, request_cfg=cfg.request, timeouts=cfg.timeouts,
                               join_timeout=cfg.join_timeout)

    # -- frames ---------------------------------------------------------------------
    async def process(self, frame: PipelineFrame) -> None:
        if isinstance(frame, UserTurnEnded):
            held = self.spec.claim(frame)  # before the settle: a claimed helper outlives max_age
            await self._halt()
            await self._settle()
            self._user_turn(frame, self.spec.commit(held, self.ctx))
            return
        if isinstance(frame, SpeculationCandidate):
            await self._speculate(frame)
            return
        if isinstance(frame, Interrupt):
            self.spec.drop()
            await self._halt()
            if self.engine is not None:
                self.engine.clear_confirmations()
            await self.send(frame)
            return
        if isinstance(frame, UserTurnStarted):
            self.spec.drop(committed=False)  # a committed round still answering goes on (no barge-in)
            if self.engine is not None:
                self.engine.note_user_speech_started()
            return
        if isinstance(frame, UserTranscript):
            return  # the text comes with UserTurnEnded
        if isinstance(frame, Greeting):
            self.spec.drop()
            await self._halt()
            self.st.greetings += 1
            turn = _Turn(frame.epoch, CancelToken(), started_at=self.clock.now())
            self._turn = turn
            self._task = self.tasks.spawn(self._run_greeting(turn, frame.text), f"llm-greeting-{frame.epoch}")
            return
        if isinstance(frame, DtmfFrame):
            self.st.dtmf += 1
            return
        if isinstance(frame, KeypadEntry):  # the caller's keypad entry: a user turn like a spoken one
            self.spec.drop()
            await self._halt()
            await self._settle()
            self.keypad_turn(frame.digits)  # a flow node's on_keypad, entered when the turn starts
            self._user_turn(UserTurnEnded(frame.epoch, frame.text or frame.digits, frame.at))
            return
        if isinstance(frame, Start):
            self.tasks.spawn(self._warm(), "llm-warm")
            await self.send(frame)
            return
        if isinstance(frame, Stop):
            await self.spec.close()
            await self._halt()
            await self._settle()
            await self.send(frame)
            return
        await self.send(frame)

    async def _warm(self) -> None:
        to = self.cfg.timeouts.connect
        self.st.warms += 1
        try:
            async with self.clock.timeout(to):
                await self.provider.warm(to)
        except (ProviderError, TimeoutError, OSError):
            self.st.warm_failures += 1

    async def on_new_epoch(self, epoch: int) -> None:
        self.spec.drop_older(epoch)

    async def _speculate(self, f: SpeculationCandidate) -> None:
        """A candidate end of turn: settle as the turn end would, minus the user message,
        then start the helper on a copy (a withdrawal or a repeat is handled by ``wants``)."""
        if not self.spec.wants(f):
            return
        if self.flow is not None:
            self.spec.skip("flow")  # a transition would change the context behind the request
            return
        if self._turn is not None and self._task is not None and not self._task.done():
            self.spec.skip("busy")  # still answering the previous turn
            return
        await self._halt()
        await self._settle()
        if self._zombies:
            self.spec.skip("unsafe")  # a round task that did not end may still touch the context
            return
        self.spec.tools = self._round_tools()  # what a round would offer now (an agent service's tools.set)
        self.spec.start(f.epoch, f.text, self.ctx)

    def _user_turn(self, f: UserTurnEnded, claimed: Helper | None = None) -> None:
        self.st.turns += 1
        self.ctx.push(UserMessage(f.text))
        if self.observer is not None:
            self.observer.on_user_turn(f.epoch, f.text)
        if self.engine is not None:
            self.engine.note_user_turn()
        self._check()
        turn = _Turn(f.epoch, CancelToken(), started_at=self.clock.now(), claimed=claimed)
        self._turn = turn
        self._task = self.tasks.spawn(self._run_turn(turn), f"llm-turn-{f.epoch}")

    def _check(self) -> None:
        self.ctx.validate()

    # -- halting and settling -----------------------------------------------------------
    async def _halt(self) -> None:
        turn = self._turn
        task = self._task
        # zombies of earlier halts are joined again before the context is touched
        for z in list(self._zombies):
            z.cancel()
            done, _ = await asyncio.wait([z], timeout=self.cfg.join_timeout)
            if done:
                self._zombies.remove(z)
        if turn is None:
            return
        self._turn = None
        self._task = None
        turn.token.cancel()
        if task is not None and not task.done():
            self.st.halts += 1
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=self.cfg.join_timeout)
            if not done:
                self.st.zombies += 1
                self._zombies.append(task)
                self.st.mutations_skipped += 1
                return
        # the task has ended: the context is ours
        if turn.streaming and turn.raw.strip():
            self._push_assistant(turn, turn.cur_round, AssistantMessage(turn.raw))
            self.st.partial_messages += 1
        n = self.ctx.interrupt_pending_tool_calls()
        self.st.interrupted_calls += n
        self._enter_filler(turn)
        self._check()

    async def _settle(self) -> None:
        """Played-text cut, then late notes: before a user message or at hang-up."""
        try:
            async with self.clock.timeout(self.cfg.analysis_job):
                await self.book.wait_settled()
        except TimeoutError:
            self.st.truncation_timeouts += 1
        self.book.apply(self.ctx)
        self._take_late_notes()
        if self.observer is not None and not self.ctx.has_open_tool_calls():
            self.ctx.extend(self.observer.on_settled(self.ctx))  # the bot turn as heard; its notes
        self._check()

    def _take_late_notes(self) -> None:
        if self.engine is None or self.ctx.has_open_tool_calls():
            return
        notes = self.engine.take_late_notes()
        if notes:
            self.st.late_notes += len(notes)
            self.ctx.extend(notes)
            self.flow_late(self.engine.late_outcomes)

    def _push_assistant(self, turn: _Turn, rnd: int, msg: AssistantMessage) -> int:
        self._enter_filler(turn)  # a spoken filler goes in before the next assistant message
        self.ctx.push(msg)
        idx = len(self.ctx) - 1
        self.book.set_msg_index(turn.epoch, rnd, idx)
        return idx

    # -- the round task -----------------------------------------------------------------
    async def _start_round(self, turn: _Turn) -> int:
        rnd = turn.ordinal
        turn.ordinal += 1
        turn.cur_round = rnd
        self.book.register_round(turn.epoch, rnd)
        await self.guarded_send(LlmResponseStarted(turn.epoch, rnd))
        return rnd

    async def _say(self, turn: _Turn, rnd: int, text: str) -> None:
        turn.spoke = True
        turn.unflushed = True
        await self.guarded_send(LlmText(turn.epoch, rnd, text))

    async def _flush(self, turn: _Turn, rnd: int) -> None:
        if turn.unflushed:
            turn.unflushed = False
            await self.guarded_send(Flush(turn.epoch, rnd))

    async def _speak_line(self, turn: _Turn, text: str, into_context: bool, clip: bool = False) -> int:
        """A fixed line (filler, fallback) as its own round. ``into_context`` False: the
        turn's filler, pending until it may enter the context (``_enter_filler``: once no
        call is open, before the next assistant message or when the turn is settled),
        recorded BEFORE it is sent so a barge-in mid-send still keeps what was heard.
        ``clip``: the TTS stage may play it from its pre-rendered clip."""
        await self._flush(turn, turn.cur_round)
        rnd = await self._start_round(turn)
        if not into_context:
            turn.filler = (rnd, text)
        if clip:
            turn.spoke = True
            turn.unflushed = True
            await self.guarded_send(LlmText(turn.epoch, rnd, text, clip=True))
        else:
            await self._say(turn, rnd, text)
        await self._flush(turn, rnd)
        if into_context and not turn.token.cancelled:
            self._push_assistant(turn, rnd, AssistantMessage(text))
        return rnd

    async def _run_turn(self, turn: _Turn) -> None:
        try:
            await self._turn_rounds(turn)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.st.round_crashes += 1
            log.exception("round task crashed")
        if turn.token.cancelled:
            return
        self._enter_filler(turn)  # the turn is settled
        await self.guarded_send(LlmResponseEnded(turn.epoch))
        self.summarizer.after_turn(self.ctx, self.tasks, self.name)  # off the request path
        if not turn.spoke:
            self.st.silent_turns += 1
            self.upstream.send(BotEnded(turn.epoch, "silent"))

    async def _run_greeting(self, turn: _Turn, text: str) -> None:
        if text.strip():
            await self._speak_line(turn, text.strip(), into_context=True)
        if self.flow is not None and not turn.token.cancelled:
            await self._flow_start_turn(turn)
        if turn.token.cancelled:
            return
        await self.guarded_send(LlmResponseEnded(turn.epoch))
        if not turn.spoke:
            self.upstream.send(BotEnded(turn.epoch, "silent"))

    async def _turn_rounds(self, turn: _Turn) -> None:
        tool_rounds = 0
        if self.flow is not None and await self._flow_start_turn(turn):
            return
        while True:
            rnd = await self._start_round(turn)
            response = await self._model_round(turn, rnd)
            if turn.token.cancelled:
                return
            turn.streaming = False
            if response is None:
                return  # failed: the partial text (if any) was pushed
            calls = list(response.calls)
            msg = response.assistant_message()
            if msg is not None:
                self._push_assistant(turn, rnd, msg)
            self._check()
            if not calls:
                await self._flow_final(turn)
                return
            calls = self._flow_screen(calls)
            if tool_rounds >= self.cfg.max_tool_rounds or self.engine is None:
                at_limit = tool_rounds >= self.cfg.max_tool_rounds
                self._answer_unrun(calls, TOOL_ROUND_LIMIT if at_limit else te.UNKNOWN_TOOL)
                if at_limit:
                    self.st.round_limits += 1
                    self.st.fallbacks += 1
                    await self._speak_line(turn, self.cfg.fallback_line, into_context=True)
                    return
                tool_rounds += 1  # no tools offered: the refused round still counts toward the limit
                continue
            tool_rounds += 1
            self.st.tool_rounds += 1
            execution = await self._execute(turn, rnd, calls)
            if turn.token.cancelled:
                if execution is not None:
                    execution.discard()
                return
            assert execution is not None
            execution.append_to(self.ctx)  # a filler waits for the next assistant message: no prefill
            self._take_late_notes()
            self._check()
            if await self._flow_after(turn, calls, execution.results):
                return  # the flow ended the call
            if execution.budget_exhausted:
                self.st.fallbacks += 1
                await self._speak_line(turn, self.cfg.fallback_line, into_context=True)
                return

    async def on_stop(self) -> None:
        if self.engine is not None:
            self.engine.close()

    def stats(self) -> dict[str, int]:
        d = super().stats()
        d.update({k: getattr(self.st, k) for k in self.st.__slots__})
        return d

    def invalid_call_count(self) -> int:
        return sum(1 for r in self.tool_records if r.outcome == te.INVALID_TOOL_CALL)


__all__ = ["LlmRunner", "InvalidCall"]
