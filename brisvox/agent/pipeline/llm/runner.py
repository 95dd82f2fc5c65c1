"""LlmRunner: the call's Context, one round task per user turn, the tool loop.

One object owning the runner's state (the context, the turn and its round task, the
zombies, the counters) that HOLDS its collaborators, each in its own module with its
invariants: the model round (:class:`~brisvox.agent.pipeline.llm.round.ModelRound`: one
request, its stream and timeouts), the tool phase
(:class:`~brisvox.agent.pipeline.llm.tool_phase.ToolPhase`: execute, filler, records; only
with a tool engine), the flow hook (:class:`~brisvox.agent.pipeline.llm.flow.FlowHook`: the
offer of tools, a flow's transitions and actions), the policy
(:mod:`~brisvox.agent.pipeline.llm.policy`: the config, the counters, the tool-round bound
:class:`~brisvox.agent.pipeline.llm.policy.ToolRounds` of each turn), the speculator and the
summarizer (the request builder). The collaborators get what they need per call; where
they must call back they see the runner through a small Protocol (``RoundOutput.say``,
``FillerVoice.speak_filler``, ``FlowHost``: ``ctx``, ``speak``, ``swap_context``). The
rules below are the runner's as a whole.

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
  spoken (also when the tool engine's retry budget is exhausted).
* Errors: the runner never retries a failed model request (one request per round; the
  resilience layer around every call's LLM re-issues a request that failed before its
  first event: docs/PROVIDERS.md, "How often one vendor is contacted"); a request that got
  no event within the first-token timeout is re-issued once by the round when the layer
  would not (:mod:`~brisvox.agent.pipeline.llm.round`). After a failed
  round the partial text is kept and the turn ends without invented speech. A turn
  that produced no speech sends BotEnded upstream itself (non-blocking). A crash in
  the round task is contained: the turn is closed like a failed one.
* Speculation (default off; :mod:`brisvox.agent.pipeline.speculation.speculator`): a
  SpeculationCandidate settles as the turn end would (minus the user message) and starts
  a helper on a copy; a hit at UserTurnEnded hands its buffer to round 0 (``Turn.claimed``:
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
from typing import Any

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.assemble import InvalidCall
from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    SystemMessage,
    UserMessage,
)
from brisvox.agent.conversation.request import provider_data_limit
from brisvox.agent.flows.manager import FlowManager
from brisvox.agent.pipeline.llm.flow import FlowHook
from brisvox.agent.pipeline.llm.observer import CallObserver
from brisvox.agent.pipeline.llm.policy import (
    TOOL_ROUND_LIMIT,
    LlmRunnerConfig,
    RunnerStats,
    ToolAction,
    ToolRecord,
    ToolRounds,
)
from brisvox.agent.pipeline.llm.round import ModelRound
from brisvox.agent.pipeline.llm.summarizer import Summarizer
from brisvox.agent.pipeline.llm.tool_phase import ToolPhase, unrun_answers
from brisvox.agent.pipeline.llm.turn import Turn
from brisvox.agent.pipeline.speculation.speculator import Helper, Speculator
from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
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
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.filler import FillerPolicy
from brisvox.agent.tool_engine.registry import CancelToken, ToolSpec
from brisvox.providers.base import LlmProvider, LlmRequest, ProviderError

log = logging.getLogger("brisvox.agent.llm")


class LlmRunner(Stage):
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
        self.observer: CallObserver | None = None  # the agent link's seam (pipeline/observer.py), set after construction
        self.flow_hook = FlowHook(flow, engine, self.ctx)  # the start node's pre-actions are said at the first turn
        self.st = RunnerStats()
        # the request window and its background summarizer ("agent": the agent's own LLM)
        self.summarizer = Summarizer(cfg.summary, cfg.request, self.st, self.clock, summary_llm or (
            provider if cfg.summary.provider == "agent" else None))
        self.model_round = ModelRound(provider, cfg.timeouts, clock=self.clock, timeline=self.timeline, st=self.st,
                                      provider_data_limit=provider_data_limit(cfg.request.window))
        self.tool_phase: ToolPhase | None = None
        if engine is not None:
            filler = FillerPolicy.from_config(cfg.filler)
            if cfg.filler_phrases:
                filler.with_phrases(list(cfg.filler_phrases))
            self.tool_phase = ToolPhase(engine, filler, clips=cfg.filler.clips, clock=self.clock, st=self.st)
        self._turn: Turn | None = None
        self._round_task: asyncio.Task[None] | None = None  # the turn's round task (the stage's own: ``task``)
        self._zombies: list[asyncio.Task[None]] = []
        self.spec = Speculator(cfg.speculation, clock=self.clock, tasks=self.tasks, provider=provider,
                               engine=engine, tools=self.tools, request_cfg=cfg.request, timeouts=cfg.timeouts,
                               join_timeout=cfg.join_timeout)

    @property
    def tool_records(self) -> list[ToolRecord]:
        """Every tool call's outcome (the call record's ``tools``)."""
        return self.tool_phase.records if self.tool_phase is not None else []

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
            turn = Turn(frame.epoch, CancelToken(), started_at=self.clock.now())
            self._turn = turn
            self._round_task = self.tasks.spawn(self._run_greeting(turn, frame.text), f"llm-greeting-{frame.epoch}")
            return
        if isinstance(frame, DtmfFrame):
            self.st.dtmf += 1
            return
        if isinstance(frame, KeypadEntry):  # the caller's keypad entry: a user turn like a spoken one
            self.spec.drop()
            await self._halt()
            await self._settle()
            self.flow_hook.keypad(frame.digits)  # a flow node's on_keypad, entered when the turn starts
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
        if self._turn is not None and self._round_task is not None and not self._round_task.done():
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
        turn = Turn(f.epoch, CancelToken(), started_at=self.clock.now(), claimed=claimed)
        self._turn = turn
        self._round_task = self.tasks.spawn(self._run_turn(turn), f"llm-turn-{f.epoch}")

    def _check(self) -> None:
        self.ctx.validate()

    # -- the offer ----------------------------------------------------------------------
    def _round_tools(self) -> list[ToolSpec]:
        return self.flow_hook.tools(self.tools, self.observer)

    def _request(self) -> LlmRequest:
        """The next round's request: the window of the context, the tools offered now."""
        return self.summarizer.build(self.ctx, self._round_tools())

    # -- halting and settling -----------------------------------------------------------
    async def _halt(self) -> None:
        turn = self._turn
        task = self._round_task
        # zombies of earlier halts are joined again before the context is touched
        for z in list(self._zombies):
            z.cancel()
            done, _ = await asyncio.wait([z], timeout=self.cfg.join_timeout)
            if done:
                self._zombies.remove(z)
        if turn is None:
            return
        self._turn = None
        self._round_task = None
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
        if turn.streaming:
            self._keep_partial(turn, turn.cur_round)
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
            self.flow_hook.late(self.engine.late_outcomes)

    # -- the context --------------------------------------------------------------------
    def _push_assistant(self, turn: Turn, rnd: int, msg: AssistantMessage) -> int:
        self._enter_filler(turn)  # a spoken filler goes in before the next assistant message
        self.ctx.push(msg)
        idx = len(self.ctx) - 1
        self.book.set_msg_index(turn.epoch, rnd, idx)
        return idx

    def _keep_partial(self, turn: Turn, rnd: int) -> None:
        """The text a failed or halted model round received so far becomes its message."""
        if turn.raw.strip():
            self._push_assistant(turn, rnd, AssistantMessage(turn.raw))
            self.st.partial_messages += 1

    def _enter_filler(self, turn: Turn) -> None:
        """A spoken filler enters the context once no call is open, and only right before the
        next assistant message (``_push_assistant``) or when the turn is settled (its end, a
        halt): never right after the tool results, where the next request would end on it
        (an assistant prefill, which Anthropic rejects). Its ``msg_index`` is set then, so
        the played-text cut reaches it like any round."""
        if turn.filler is None or self.ctx.has_open_tool_calls():
            return
        rnd, text = turn.filler
        turn.filler = None
        self._push_assistant(turn, rnd, AssistantMessage(text))

    def _answer_unrun(self, calls: list[Any], kind: str) -> None:
        for m in unrun_answers(calls, kind):
            self.ctx.push(m)
        self._check()

    def swap_context(self, ctx: Context, reset: bool) -> None:
        """A flow transition's new context (:class:`FlowHost`): nothing cuts the old one any
        more; ``reset``: the summary was of the conversation it replaced."""
        self.ctx = ctx
        self.book.forget_unapplied()
        if reset:
            self.summarizer.reset()
        self._check()

    # -- speaking -----------------------------------------------------------------------
    async def _start_round(self, turn: Turn) -> int:
        rnd = turn.ordinal
        turn.ordinal += 1
        turn.cur_round = rnd
        self.book.register_round(turn.epoch, rnd)
        await self.guarded_send(LlmResponseStarted(turn.epoch, rnd))
        return rnd

    async def say(self, turn: Turn, rnd: int, text: str) -> None:
        """A model round's text (:class:`RoundOutput`)."""
        turn.spoke = True
        turn.unflushed = True
        await self.guarded_send(LlmText(turn.epoch, rnd, text))

    async def _flush(self, turn: Turn, rnd: int) -> None:
        if turn.unflushed:
            turn.unflushed = False
            await self.guarded_send(Flush(turn.epoch, rnd))

    async def speak(self, turn: Turn, text: str, clip: bool) -> None:
        """A fixed line into the context (:class:`FlowHost`: a flow's ``say``, its fallback)."""
        await self._speak_line(turn, text, into_context=True, clip=clip)

    async def speak_filler(self, turn: Turn, text: str, clip: bool) -> None:
        """The tool phase's filler (:class:`FillerVoice`), pending until it may enter the context."""
        await self._speak_line(turn, text, into_context=False, clip=clip)

    async def _speak_line(self, turn: Turn, text: str, into_context: bool, clip: bool = False) -> int:
        """A fixed line (filler, fallback) as its own round. ``into_context`` False: the
        turn's filler, pending until it may enter the context (``_enter_filler``: once no
        call is open, before the next assistant message or when the turn is settled),
        recorded BEFORE it is sent so a barge-in mid-send still keeps what was heard.
        ``clip``: the TTS stage may play it from its pre-rendered clip."""
        await self._flush(turn, turn.cur_round)
        rnd = await self._start_round(turn)
        if not into_context:
            turn.filler = (rnd, text)
        await self._line(turn, rnd, text, clip)
        if into_context and not turn.token.cancelled:
            self._push_assistant(turn, rnd, AssistantMessage(text))
        return rnd

    async def announce(self, text: str, clip: bool = False) -> tuple[int, int] | None:
        """A fixed line said while a tool of the running turn waits (a warm transfer's hold and
        outcome messages, its hold audio as clip rounds): its own round of that turn, kept OUT
        of the context (a tool call is open there; the tool's result tells the model what the
        caller heard). ``(epoch, round)`` for the playout book, None when no turn is running."""
        turn = self._turn
        if turn is None or turn.token.cancelled or self._round_task is None or self._round_task.done():
            return None
        await self._flush(turn, turn.cur_round)
        rnd = await self._start_round(turn)
        await self._line(turn, rnd, text, clip)
        return turn.epoch, rnd

    async def _line(self, turn: Turn, rnd: int, text: str, clip: bool) -> None:
        """A fixed line's text into round ``rnd`` (``clip``: played from its clip), flushed."""
        if clip:
            turn.spoke = True
            turn.unflushed = True
            await self.guarded_send(LlmText(turn.epoch, rnd, text, clip=True))
        else:
            await self.say(turn, rnd, text)
        await self._flush(turn, rnd)

    async def _fallback(self, turn: Turn) -> None:
        self.st.fallbacks += 1
        await self._speak_line(turn, self.cfg.fallback_line, into_context=True)

    # -- the round task -----------------------------------------------------------------
    async def _run_turn(self, turn: Turn) -> None:
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
        self.timeline.answered(turn.epoch, self.clock.now())
        await self.guarded_send(LlmResponseEnded(turn.epoch))
        self.summarizer.after_turn(self.ctx, self.tasks, self.name)  # off the request path
        if not turn.spoke:
            self.st.silent_turns += 1
            self.upstream.send(BotEnded(turn.epoch, "silent"))

    async def _run_greeting(self, turn: Turn, text: str) -> None:
        if text.strip():
            await self._speak_line(turn, text.strip(), into_context=True)
        if self.flow is not None and not turn.token.cancelled:
            await self.flow_hook.start_turn(turn, self)
        if turn.token.cancelled:
            return
        self.timeline.answered(turn.epoch, self.clock.now())
        await self.guarded_send(LlmResponseEnded(turn.epoch))
        if not turn.spoke:
            self.upstream.send(BotEnded(turn.epoch, "silent"))

    async def _turn_rounds(self, turn: Turn) -> None:
        bound = ToolRounds(self.cfg.max_tool_rounds, can_run=self.tool_phase is not None)
        if self.flow is not None and await self.flow_hook.start_turn(turn, self):
            return
        while True:
            rnd = await self._start_round(turn)
            response = await self.model_round.run(turn, rnd, self.ctx, self._request, self)
            if turn.token.cancelled:
                return
            turn.streaming = False
            if response is None:  # failed: the text so far is kept, the turn ends (no retry here)
                self._keep_partial(turn, rnd)
                return
            calls = list(response.calls)
            msg = response.assistant_message()
            if msg is not None:
                self._push_assistant(turn, rnd, msg)
            self._check()
            if not calls:
                await self.flow_hook.final(turn, self)
                return
            calls = self.flow_hook.screen(calls, self.observer)
            action = bound.next()
            if action is not ToolAction.RUN:
                self._answer_unrun(calls, TOOL_ROUND_LIMIT if action is ToolAction.LIMIT else te.UNKNOWN_TOOL)
                if action is ToolAction.LIMIT:
                    self.st.round_limits += 1
                    await self._fallback(turn)
                    return
                continue  # no tools offered: the refused round still counts toward the limit
            assert self.tool_phase is not None
            self.st.tool_rounds += 1
            await self._flush(turn, rnd)
            execution = await self.tool_phase.execute(turn, calls, self, self.observer)
            if turn.token.cancelled:
                execution.discard()
                return
            execution.append_to(self.ctx)  # a filler waits for the next assistant message: no prefill
            self._take_late_notes()
            self._check()
            if await self.flow_hook.after(turn, calls, execution.results, self):
                return  # the flow ended the call
            if execution.budget_exhausted:
                await self._fallback(turn)
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
