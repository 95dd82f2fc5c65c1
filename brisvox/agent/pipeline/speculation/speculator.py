"""The runner's side of speculative generation: the helper task, its buffer, the commit.

Owns :class:`Speculator` (one per :class:`~brisvox.agent.pipeline.llm.runner.LlmRunner`:
the one live speculation, the hit rule at the turn end, the counters) and
:class:`Helper` (one task per speculation). The rule and the config are in
:mod:`brisvox.agent.pipeline.speculation.policy`.

* Start. The runner has settled the context as the turn end would, minus the user
  message (halt, played-text cut, open calls closed, late notes in). The helper builds
  the request from a COPY of the context plus the candidate (the real context is
  untouched until the commit) and runs the first round with the round task's
  first-token and idle timeouts. The provider's events go, unchanged and in order, into
  a bounded buffer (``max_buffered_events``): a full buffer back-pressures the provider
  stream, nothing is dropped. A failure is put into the buffer as the stream's end
  (the error itself, a timeout, or a stream cut before Done). Nothing reaches the
  pipeline, the PlayoutBook, the context or the timeline from the helper.
* Age. The helper runs under ``max_age`` until the turn claims it: an unclaimed helper
  ends by itself then (the buffer bound and the age bound stop a provider that streams
  forever). A claimed one keeps running while the turn settles.
* Claim and commit (the hit rule). At UserTurnEnded, before the settle:
  :meth:`Speculator.claim` (same epoch, equal :func:`normalize`-d text, younger than
  ``max_age``), then after the settle :meth:`Speculator.commit` (the context's
  :func:`fingerprint` equals the one the request was built from: a late tool note that
  arrived meanwhile is a miss). The runner's round 0 then reads :meth:`Helper.replay`
  instead of a fresh stream: the buffered events at once, then the live ones, through
  the very code an ordinary round runs (so LlmResponseStarted, the PlayoutBook
  registration and every frame are those of an ordinary round); the timeline gets the
  instants things really happened at (:attr:`Helper.started_at`, :attr:`Helper.first_at`).
* Tools. At Done, with a tool engine, the helper calls ``ToolEngine.speculate``
  (ReadOnly calls run now, SideEffect calls are held). The committed round's tool phase
  is :meth:`Helper.execute`: ``ToolEngine.commit`` runs the held calls once, under the
  engine's idempotency key. A discarded speculation drops them unrun; a ReadOnly call in
  flight is cancelled with the helper. No idle timeout applies while the helper runs
  the ReadOnly tools (they have their own).
* Drop. A new candidate supersedes, a withdrawal, UserTurnStarted, Interrupt, Stop, a
  Greeting and a newer epoch drop the live speculation (its token and task cancelled,
  its held calls discarded, its tokens counted as wasted); a barge-in after the commit
  ends the committed helper too.

Invariants: at most one live (unclaimed) speculation; a helper never touches shared
state but its own buffer and counters; every helper task is a task of the call
(TaskOwner) and ends at a drop, at its age, or at the end of its stream.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from brisvox.agent.conversation.assemble import AssembleError, InvalidCall, ResponseAssembler
from brisvox.agent.conversation.context import Context, ToolCall, UserMessage
from brisvox.agent.conversation.request import RequestConfig, build_request
from brisvox.agent.pipeline.speculation.policy import (
    MAX_BUFFERED_EVENTS_LIMIT,
    SpeculationConfig,
    SpeculationStats,
    fingerprint,
    normalize,
)
from brisvox.agent.pipeline.stage.pipeline_frames import SpeculationCandidate, UserTurnEnded
from brisvox.agent.tool_engine.delivery import Execution
from brisvox.agent.tool_engine.planning import Speculation
from brisvox.agent.tool_engine.registry import CancelToken, ToolSpec
from brisvox.providers.base import (
    Done,
    LlmError,
    LlmProvider,
    ProviderTimeouts,
    TextDelta,
    ToolCallDelta,
    Usage,
)

if TYPE_CHECKING:
    from brisvox.agent.pipeline.stage.base import TaskOwner
    from brisvox.agent.tool_engine.engine import ToolEngine
    from brisvox.clock import Clock


class _End:
    """The end of a speculative stream that did not reach Done: ``exc`` is raised to the
    round (None: the stream was cut, read as a truncated response)."""

    __slots__ = ("exc",)

    def __init__(self, exc: BaseException | None) -> None:
        self.exc = exc


class Helper:
    """One speculation: its request, its task and its bounded buffer."""

    def __init__(self, owner: Speculator, epoch: int, text: str, ctx: Context) -> None:
        self.owner = owner
        self.epoch = epoch
        self.norm = normalize(text)
        self.fp = fingerprint(ctx)
        copy = ctx.copy()
        copy.push(UserMessage(text))
        self.ctx = copy
        self.request = build_request(copy, owner.tools, owner.request_cfg)
        self.started_at = owner.clock.now()
        self.first_at: float | None = None
        self.token = CancelToken()
        size = min(max(1, owner.cfg.max_buffered_events), MAX_BUFFERED_EVENTS_LIMIT)
        self.buffer: asyncio.Queue[object] = asyncio.Queue(size)
        self.task: asyncio.Task[None] | None = None
        self.age: asyncio.Timeout | None = None
        self.claimed = False
        self.committed = False
        self.done_sent = False  # Done is in the buffer: the tool phase may follow
        self.calls: list[ToolCall | InvalidCall] = []
        self.tools: asyncio.Future[Speculation] | None = None
        self.speculation: Speculation | None = None
        self.in_tokens = 0
        self.out_tokens = 0
        self.out_bytes = 0
        self.usage = False

    # -- the task ---------------------------------------------------------------------
    async def run(self) -> None:
        stream: Any = None
        try:
            async with self.owner.clock.timeout(self.owner.cfg.max_age) as age:
                self.age = age
                if self.claimed:  # claimed before its first step (hold() found no age yet)
                    age.reschedule(None)
                try:
                    stream = self.owner.provider.stream(self.request)
                except Exception as e:  # noqa: BLE001 - an adapter bug fails the round, not the call
                    self.owner.st.failures += 1
                    await self.buffer.put(_End(e))
                    return
                await self._pump(stream)
        except TimeoutError:
            pass  # max_age, unclaimed: the claim refuses it as expired
        finally:
            if stream is not None:
                with contextlib.suppress(Exception):
                    await stream.aclose()

    async def _pump(self, stream: Any) -> None:
        st = self.owner.st
        to = self.owner.timeouts
        assembler = ResponseAssembler() if self.owner.engine is not None else None
        it = stream.__aiter__()
        first = True
        while True:
            try:
                async with self.owner.clock.timeout(to.llm_first_token if first else to.llm_idle):
                    ev = await it.__anext__()
            except StopAsyncIteration:
                st.failures += 1
                await self.buffer.put(_End(None))
                return
            except TimeoutError as e:
                st.failures += 1
                await self.buffer.put(_End(e))
                return
            except Exception as e:  # noqa: BLE001 - handed to the round exactly as raised
                st.failures += 1
                await self.buffer.put(_End(e))
                return
            if first:
                first = False
                self.first_at = self.owner.clock.now()
            self._account(ev, assembler)
            if isinstance(ev, Done):
                self.done_sent = True
            await self.buffer.put(ev)
            if isinstance(ev, LlmError):
                st.failures += 1
                return
            if isinstance(ev, Done):
                await self._tool_phase(assembler)
                return

    def _account(self, ev: object, assembler: ResponseAssembler | None) -> None:
        if isinstance(ev, Usage):
            self.usage = True
            self.in_tokens += ev.input_tokens
            self.out_tokens += ev.output_tokens
        elif isinstance(ev, TextDelta):
            self.out_bytes += len(ev.text.encode())
        if assembler is None:
            return
        try:
            if isinstance(ev, TextDelta):
                assembler.push_text(ev.text)
            elif isinstance(ev, ToolCallDelta):
                assembler.push_tool_call(ev.index, ev.id, ev.name, ev.arguments, ev.provider_data)
        except AssembleError:
            pass  # the round's own assembler counts it

    async def _tool_phase(self, assembler: ResponseAssembler | None) -> None:
        engine = self.owner.engine
        if engine is None or assembler is None:
            return
        try:
            calls = list(assembler.finish(self.epoch, self.ctx).calls)
        except AssembleError:
            return
        if not calls:
            return
        self.calls = calls
        self.owner.st.tool_phases += 1
        fut: asyncio.Future[Speculation] = asyncio.get_running_loop().create_future()
        self.tools = fut
        try:
            spec = await engine.speculate(calls, self.epoch, self.token)
        except BaseException:
            fut.cancel()
            raise
        self.speculation = spec
        self.owner.st.held_side_effects += len(spec.held_calls())
        if not fut.done():
            fut.set_result(spec)

    # -- the commit -------------------------------------------------------------------
    def hold(self) -> bool:
        """The turn claims it: no age limit from now on. False if it already expired."""
        self.claimed = True
        age = self.age
        if age is not None and age.expired():
            return False
        t = self.task
        if age is None or t is None or t.done():
            return True
        try:
            age.reschedule(None)
        except RuntimeError:
            return False
        return True

    def replay(self) -> _Replay:
        """The round's stream: the buffered events, then the live ones."""
        return _Replay(self)

    async def execute(self, engine: ToolEngine, calls: Sequence[ToolCall | InvalidCall], epoch: int,
                      token: CancelToken) -> Execution:
        """The committed round's tool phase: commit the speculation (its ReadOnly results,
        the held calls run now), or execute as usual when the helper has none for these calls."""
        spec: Speculation | None = None
        fut = self.tools
        if fut is not None:
            try:
                await asyncio.wait([fut])  # the ReadOnly calls still running (raises only our own cancel)
            except asyncio.CancelledError:
                self.cancel()  # the round was halted: its helper ends with it
                raise
            if not fut.cancelled() and fut.exception() is None:
                spec = fut.result()
        if spec is not None and [c.id for c in calls] == [c.id for c in self.calls]:
            self.committed = True
            return await engine.commit(spec, token)
        if spec is not None:
            spec.discard()
        return await engine.execute(calls, epoch, token)

    def cancel(self) -> None:
        self.token.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.tools is not None and not self.tools.done():
            self.tools.cancel()
        if self.speculation is not None and not self.committed:
            self.speculation.discard()

    def wasted_output(self) -> int:
        return self.out_tokens if self.usage else (self.out_bytes + 3) // 4


class _Replay:
    """The claimed helper's buffer as an LlmStream (``__anext__`` / ``aclose``)."""

    __slots__ = ("h",)

    def __init__(self, h: Helper) -> None:
        self.h = h

    def __aiter__(self) -> _Replay:
        return self

    async def __anext__(self) -> object:
        item = await self.h.buffer.get()
        if isinstance(item, _End):
            if item.exc is None:
                raise StopAsyncIteration
            raise item.exc
        return item

    async def aclose(self) -> None:
        if not self.h.done_sent:  # the round is done with it (failure, barge-in): end the helper
            self.h.cancel()


class Speculator:
    """The runner's speculation state (see the module docstring)."""

    def __init__(self, cfg: SpeculationConfig, *, clock: Clock, tasks: TaskOwner, provider: LlmProvider,
                 engine: ToolEngine | None, tools: list[ToolSpec], request_cfg: RequestConfig,
                 timeouts: ProviderTimeouts, join_timeout: float = 1.0) -> None:
        self.cfg = cfg
        self.clock = clock
        self.tasks = tasks
        self.provider = provider
        self.engine = engine
        self.tools = tools
        self.request_cfg = request_cfg
        self.timeouts = timeouts
        self.join_timeout = join_timeout
        self.st = SpeculationStats()
        self.live: Helper | None = None  # started, not yet decided
        self.claimed: Helper | None = None  # committed to the current turn

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    def wants(self, f: SpeculationCandidate) -> bool:
        """Whether the runner should settle and :meth:`start` for this candidate; a
        withdrawal (empty text) is handled here."""
        if not self.cfg.enabled:
            return False
        h = self.live
        if not f.text.strip():
            if h is not None and h.epoch == f.epoch:
                self._drop_live("withdrawn")
            return False
        if h is not None and h.epoch == f.epoch and h.norm == normalize(f.text):
            self.st.kept += 1  # the live speculation already answers this text
            return False
        return True

    def skip(self, why: str) -> None:
        setattr(self.st, f"skipped_{why}", getattr(self.st, f"skipped_{why}") + 1)

    def start(self, epoch: int, text: str, ctx: Context) -> None:
        if self.live is not None:
            self._drop_live("superseded")
        h = Helper(self, epoch, text, ctx)
        self.live = h
        self.st.started += 1
        h.task = self.tasks.spawn(h.run(), f"llm-spec-{epoch}")

    def claim(self, f: UserTurnEnded) -> Helper | None:
        """The text half of the hit rule, before the turn end's settle."""
        h = self.live
        if h is None:
            return None
        if h.epoch != f.epoch:
            self._drop_live("abandoned")
            return None
        if normalize(f.text) != h.norm:
            self._drop_live("misses")
            return None
        if self.clock.now() - h.started_at >= self.cfg.max_age or not h.hold():
            self._drop_live("expired")
            return None
        return h

    def commit(self, h: Helper | None, ctx: Context) -> Helper | None:
        """The context half, after the settle: the claimed helper for round 0, or None."""
        if h is None or h is not self.live:
            return None
        if fingerprint(ctx) != h.fp:
            self._drop_live("context_changes")
            return None
        self.live = None
        self.claimed = h
        self.st.hits += 1
        self.st.head_start_ms += int(round((self.clock.now() - h.started_at) * 1000.0))
        return h

    def drop(self, committed: bool = True) -> None:
        """UserTurnStarted, Interrupt, Greeting, Stop: the live speculation is abandoned.
        A committed helper still running ends with its turn: here for the frames that halt
        the round (``committed``); a UserTurnStarted without a barge-in leaves the round
        running (it is halted at the next turn end), and the helper ends with the round
        (:meth:`_Replay.aclose`, or a cancelled :meth:`Helper.execute`)."""
        if self.live is not None:
            self._drop_live("abandoned")
        if not committed:
            return
        c, self.claimed = self.claimed, None
        if c is not None:
            c.cancel()

    def drop_older(self, epoch: int) -> None:
        if self.live is not None and self.live.epoch < epoch:
            self._drop_live("abandoned")

    async def close(self) -> None:
        """Stop: drop everything and join the helper tasks (bounded)."""
        hs = [h for h in (self.live, self.claimed) if h is not None]
        self.drop()
        tasks = [h.task for h in hs if h.task is not None and not h.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.join_timeout)

    def _drop_live(self, counter: str) -> None:
        h = self.live
        assert h is not None
        self.live = None
        setattr(self.st, counter, getattr(self.st, counter) + 1)
        h.cancel()
        self.st.wasted_output_tokens += h.wasted_output()
        self.st.wasted_input_tokens += h.in_tokens
