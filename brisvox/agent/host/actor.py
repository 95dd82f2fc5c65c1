"""CallActor: one call's pipeline, assembled, started, fed and ended.

Owns the life of one call's pipeline on the ring architecture:

    pump -> SttStage -> TurnDriver -> LlmRunner -> SegmenterStage -> TtsStage -> TtsRingWriter

* The chain is declared once, as data (:data:`brisvox.agent.pipeline.chain.CHAIN`:
  names, classes, config selectors, inbox shapes, upstream routes); the actor
  assembles it (``chain=``: another declaration, e.g. a test's with one class
  replaced) over ONE :class:`~brisvox.agent.pipeline.stage.call_context.CallContext` built
  per call: clock, epoch watch, task owner, the PlayoutBook (shared by the
  TTS stage, TtsRingWriter, the runner, the inbound path and the clear hook),
  the LedgerLink (the epoch ledger, shared by the clear hook and TtsRingWriter), the timeline,
  the gateway and worker links and the upstream router.
* The clear hook (the barge-in fast path, :meth:`CallContext.clear`):
  ``book.note_clear`` first, then Clear to the gateway and TtsCut to the
  worker, synchronously inside the driver's decision step. The pause hook,
  the same way: ``book.note_pause`` / ``note_resume`` and Pause / Resume to
  the gateway (a barge-in candidate holds the bot's audio until it is
  confirmed or vetoed).
* The pump is not a task: the host calls ``on_worker`` (a worker tick for
  this call: in16 position and its typed events, ``ipc/tick_events.py``), ``on_out_utterance``,
  ``on_playback``, ``on_cleared``, ``on_mark_played``, ``on_dtmf``. Each
  tick's in16 position goes straight to the turn driver (``note_audio_end``:
  it needs no audio, so no frame hop). Audio is read from the in16 ring and
  offered to the STT inbox without waiting: every tick, or, for an STT
  provider with ``audio_batch`` (seconds), once that much is pending, and
  always before a VAD event, so a stop never overtakes speech left in the
  pump. VAD events (start, stop, falling) take the system lane with times
  backdated from their positions.
  DTMF goes into the turn driver's inbox in order and is never dropped: while
  its lane is full (or digits wait already) through a FIFO of ``queues.dtmf``
  digits that one task drains as room frees; a digit beyond that bound (a
  flood) is refused, counted (``dtmf_refused``) and logged.
  After a hang-up audio and DTMF are discarded; marks and positions still
  reach the book.
* The call's media state (``media`` at construction: ``CallStart.media``; then
  ``on_media``: each ``CallMedia``): its log (:mod:`~brisvox.agent.host.call_media`,
  the record's ``media`` section) and a CallMediaChanged into the chain, ahead of
  the greeting when the call starts unanswered. While the call is not answered the
  pump keeps the caller's audio and VAD events from the chain (``media_muted_*``):
  the VAD still runs on them (``vad_starts`` counts them) but nothing of them reaches
  the STT or a turn, except the audio and the stop of a speech start delivered
  before (a started utterance is finished, so the STT and the driver stay paired).
* ``hangup(reason)`` sends Stop through the chain (into every running stage
  whose predecessor no longer runs, so a chain with a failed stage stops
  too), waits (bounded) for every stage to finish, ends every remaining task
  and returns the call record. ``live_tasks()`` is 0 afterwards (tested). Each turn
  feeds the process's latency histograms (:mod:`~brisvox.agent.host.call_metrics`) once,
  when it ends (``observe_turns``, which the host calls at every report; the hang-up
  counts the turns not counted yet and the end reason); with ``[tracing]`` on, the
  hang-up emits the call's spans (:mod:`~brisvox.agent.host.tracing`).
* Stage supervision (:mod:`brisvox.agent.host.supervision`): a task of the
  call that dies of an unexpected exception ends the call on purpose (the
  apology through the TTS stage when the output path works, then
  ``hangup("stage_failed:<stage>")``); the host hears of it through
  ``on_stage_failure(stage)`` and ``on_hangup(reason)`` (without the latter
  the actor sends Hangup to the gateway itself). From the failure on, caller
  audio and DTMF are discarded as after a hang-up.
* ``stats()``: one entry per stage of the chain (by its name), then the
  pump, the book, the clears sent, the speculation counters and the tool engine.
* ``call_info`` (caller, called, transport ids, parameters: the host builds it
  from CallStart) reaches every tool of the call through its ToolEngine, and
  the record's ``call`` section.
* ``events`` (a send to the gateway, only when CallStart asked for the call's
  events): the transcript lines, turn latencies and tool calls go out as
  CallEvent frames (:mod:`~brisvox.agent.host.call_events`: the runner's observer
  tapped at ``start``, the latencies looked up by a task of the call every 200 ms);
  without it nothing of that runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from brisvox.agent.conversation.context import Context, SystemMessage
from brisvox.agent.conversation.playout_book import PlayoutConfig
from brisvox.agent.flows.manager import FlowManager
from brisvox.agent.host import tracing
from brisvox.agent.host.amd_screen import AmdConfig
from brisvox.agent.host.call_amd import CallAmd, dialled
from brisvox.agent.host.call_events import CallEvents
from brisvox.agent.host.call_media import MediaLog
from brisvox.agent.host.call_metrics import METRICS, TurnMeter
from brisvox.agent.host.call_record import build_record
from brisvox.agent.host.supervision import StageFailure, StageSupervisor, SupervisionConfig
from brisvox.agent.pipeline.call_config import QueueConfig
from brisvox.agent.pipeline.cascade.segmenter import SegmenterConfig, SegmenterStage
from brisvox.agent.pipeline.cascade.stt_stage import SttStage, SttStageConfig
from brisvox.agent.pipeline.cascade.tts_ring_writer import TtsRingWriter, TtsRingWriterConfig
from brisvox.agent.pipeline.cascade.tts_stage import TtsStage, TtsStageConfig
from brisvox.agent.pipeline.cascade.turn_driver import TurnDriver, TurnDriverConfig
from brisvox.agent.pipeline.cascade.turn_machine import Phase
from brisvox.agent.pipeline.chain import CHAIN, CallParts, StageSpec, assemble
from brisvox.agent.pipeline.llm.policy import LlmRunnerConfig
from brisvox.agent.pipeline.llm.runner import LlmRunner
from brisvox.agent.pipeline.s2s.stage import S2sStageConfig
from brisvox.agent.pipeline.speculation.policy import snapshot as spec_snapshot
from brisvox.agent.pipeline.stage.base import Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.call_io import AudioSink, AudioSource, CallLink
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    CallMediaChanged,
    DtmfFrame,
    Greet,
    Start,
    Stop,
    UserSpeechFalling,
    UserStartedSpeaking,
    UserStoppedSpeaking,
)
from brisvox.agent.tool_engine.call_info import CallInfo
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.clock import CLOCK, Clock
from brisvox.providers.base import LlmProvider, SttProvider, TtsProvider
from brisvox.providers.s2s.base import S2sProvider
from ipc.frames import MEDIA_ANSWERED, MEDIA_EARLY, Hangup
from ipc.tick_events import (
    AmdBeepEvent,
    AmdGreetingEndEvent,
    AmdVerdictEvent,
    InputGap,
    SpeechFalling,
    SpeechStart,
    SpeechStop,
    TickEvent,
    VadFailed,
    VadRecovered,
)

log = logging.getLogger("brisvox.agent.actor")

IN16_RATE = 16000


@dataclass(frozen=True, slots=True)
class ActorConfig:
    """One call actor's configuration: a :class:`~brisvox.agent.pipeline.call_config.ChainConfig`
    (the inboxes and every stage's config) plus what the actor itself uses (the playout
    book, stage supervision, the hang-up bound)."""

    queues: QueueConfig = field(default_factory=QueueConfig)
    stt: SttStageConfig = field(default_factory=SttStageConfig)
    turn: TurnDriverConfig = field(default_factory=TurnDriverConfig)
    llm: LlmRunnerConfig = field(default_factory=LlmRunnerConfig)
    segmenter: SegmenterConfig = field(default_factory=SegmenterConfig)
    tts: TtsStageConfig = field(default_factory=TtsStageConfig)
    out: TtsRingWriterConfig = field(default_factory=TtsRingWriterConfig)
    playout: PlayoutConfig = field(default_factory=PlayoutConfig)
    supervision: SupervisionConfig = field(default_factory=SupervisionConfig)
    s2s: S2sStageConfig = field(default_factory=S2sStageConfig)
    stop_timeout: float = 3.0


@dataclass(slots=True)
class PumpStats:
    frames: int = 0
    samples: int = 0
    lost: int = 0
    gaps: int = 0
    vad_starts: int = 0
    vad_stops: int = 0
    vad_fallings: int = 0
    vad_failures: int = 0
    vad_recoveries: int = 0
    discarded_after_hangup: int = 0
    media_muted_samples: int = 0  # in16 samples kept from the chain while the call was not answered
    media_muted_events: int = 0  # VAD events kept from the chain while the call was not answered
    dtmf: int = 0
    dtmf_queued: int = 0  # digits that waited in the FIFO for room
    dtmf_max_queued: int = 0
    dtmf_refused: int = 0  # the FIFO was full (a flood)
    positions: int = 0
    cleared: int = 0
    marks: int = 0


class CallActor:
    def __init__(
        self,
        call_id: str,
        cfg: ActorConfig,
        *,
        stt: SttProvider | None,
        llm: LlmProvider | None,
        tts: TtsProvider | None,
        source: AudioSource,
        sink: AudioSink,
        link: CallLink,
        call_rate: int,
        tts_rate: int,
        clock: Clock = CLOCK,
        registry: ToolRegistry | None = None,
        transport: str = "",
        transport_ids: dict[str, str] | None = None,
        agent: str = "",
        context: Context | None = None,
        greeting: str = "",
        chain: Sequence[StageSpec] = CHAIN,
        on_stage_failure: Callable[[str], None] | None = None,
        on_hangup: Callable[[str], None] | None = None,
        s2s: S2sProvider | None = None,
        flow: FlowManager | None = None,
        call_info: CallInfo | None = None,
        events: Callable[[Any], None] | None = None,
        media: str = "answered",
        amd: AmdConfig | None = None,
        hangup_later: Callable[[str], None] | None = None,
    ) -> None:
        self.call_id = call_id
        self.greeting = greeting
        self.cfg = cfg
        self.clock = clock
        self.source = source
        self.sink = sink
        self.link = link
        self.call_rate = call_rate
        self.tts_rate = tts_rate
        # the call's metadata for its tools and its record (caller, called, ids, parameters)
        self.call_info = call_info or CallInfo.of(transport=transport, transport_ids=transport_ids)
        self.transport = transport or self.call_info.transport
        self.transport_ids = dict(transport_ids if transport_ids is not None else self.call_info.transport_ids)
        self.agent = agent
        self.started_wall = time.time()
        self.started_at = clock.now()  # call-clock time the actor was made (the trace's start)
        self.ended_wall: float | None = None
        self.ended_at: float | None = None  # call-clock time the hang-up finished
        self.end_reason = ""
        self.on_stage_failure = on_stage_failure
        self.on_hangup = on_hangup
        self.call = CallContext.create(call_id, gateway=link, worker=link, sink=sink, call_rate=call_rate,
                                       tts_rate=tts_rate, clock=clock, playout=cfg.playout)
        self.tasks = self.call.tasks
        self.watch = self.call.watch
        self.timeline = self.call.timeline
        self.book = self.call.book
        self.ledger = self.call.ledger
        self.pump = PumpStats()
        self.media = MediaLog(media, self.started_at)  # the call's media state (CallMedia)
        self._speaking = False  # a VAD start was delivered and its stop not yet
        self._start_muted = False  # a VAD start was kept from the chain: so are its falling and stop
        self.engine = (ToolEngine(registry, call_id, clock, call_info=self.call_info)
                       if registry is not None and len(registry) else None)
        parts = CallParts(stt, llm, tts, self.engine, context, s2s, flow)
        self.stages: list[Stage] = assemble(chain, self.call, cfg, parts)
        self.speaker: TtsStage | None = None  # the stage the supervisor's apology is spoken through
        self._bind({s.name: s for s in self.stages})
        self._in_pos: int | None = None  # in16 position of the first sample not yet given to the STT stage
        self._gap = False
        # audio held in the pump before it is offered to the STT stage (0: every tick)
        self._batch_samples = max(0, int(float(getattr(stt, "audio_batch", 0.0) or 0.0) * IN16_RATE))
        self._started = False
        self._hung_up = False
        self._input_closed = False  # caller audio and DTMF are discarded (hang-up, stage failure)
        self._dtmf: deque[DtmfFrame] = deque()  # digits waiting for room in the driver's inbox
        self._dtmf_drain: asyncio.Task[None] | None = None
        self._done = asyncio.Event()
        self.record: dict[str, Any] | None = None
        self.meter = TurnMeter(self.timeline)  # each turn into the process's histograms as it ends
        self.supervisor = StageSupervisor(self, cfg.supervision)
        self.events = CallEvents(call_id, events, self) if events is not None else None
        self.hangup_later = hangup_later  # the host's hang-up once the bot is idle (None: the actor's own)
        self.on_amd: Callable[[dict[str, Any]], None] | None = None  # the verdict, for the host (webhooks)
        # answering-machine screening of a dialled call ([amd]): no word before its verdict
        self.amd = (CallAmd(_AmdSeam(self), amd, clock) if amd is not None and amd.enabled
                    and dialled(self.call_info.transport_ids, self.call_info.params) else None)
        self.warm: Any = None  # the call's warm transfer (host/call_warm.py attach): the caller on hold is muted
        self.consult: Any = None  # a consult leg's screening (host/call_consult.py): its DTMF goes there

    def _bind(self, named: dict[str, Stage]) -> None:
        """The stages the host and the pump reach directly (plain attributes: no lookup per tick)."""
        self.stt = _stage(named, "stt", SttStage)
        self.driver = _stage(named, "turn", TurnDriver)
        self.runner = _stage(named, "llm", LlmRunner)
        self.segmenter = _stage(named, "segmenter", SegmenterStage)
        self.tts = self.speaker = _stage(named, "tts", TtsStage)
        self.out = _stage(named, "out", TtsRingWriter)
        self.entry = self.stt.inbox  # where the pump delivers audio and VAD events
        self._audio_end: Callable[[int], None] | None = self.driver.note_audio_end

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        if self.events is not None:
            self.events.install(self)  # after an agent link bound itself: the tap passes it all on
        for s in self.stages:
            s.start()
        self.entry.put_nowait(Start())
        if self.amd is not None:  # screened: the chain converses (and greets) after the verdict only
            self.entry.put_nowait(CallMediaChanged(MEDIA_EARLY, self.clock.now()))
            if self.media.converses:
                self.amd.answered()
            return
        if not self.media.converses:  # a dialled call in early media: before the greeting
            self.entry.put_nowait(CallMediaChanged(self.media.state, self.clock.now()))
        if self.greeting.strip():
            self.entry.put_nowait(Greet(self.greeting))  # the bot speaks first

    async def hangup(self, reason: str = "hangup") -> dict[str, Any]:
        """End the call: Stop through the chain, bounded wait, end every task, record."""
        if self._hung_up:
            await self._done.wait()
            assert self.record is not None
            return self.record
        self._hung_up = True
        self._input_closed = True
        self.end_reason = reason
        if self.amd is not None:
            self.amd.close()
        if self.consult is not None:
            self.consult.close()
        await self.supervisor.aclose()  # a supervised end in progress gives way (not from inside it)
        prev_running = False
        for s in self.stages:  # Stop enters where the chain runs again after a stage that ended
            running = s.task is not None and not s.task.done()
            if running and not prev_running:
                s.inbox.put_nowait(Stop(reason))
            prev_running = running
        stage_tasks = [s.task for s in self.stages if s.task is not None]
        if stage_tasks:
            done, pending = await asyncio.wait(stage_tasks, timeout=self.cfg.stop_timeout)
            if pending:
                log.warning("call %s: %d stages did not stop in time", self.call_id, len(pending))
        if self.engine is not None:  # a tool body that ignores its cancellation cannot hold the hang-up
            left = await self.engine.aclose(self.cfg.stop_timeout)
            if left:
                log.warning("call %s: %d tool run(s) ignored their cancellation for %.1f s; left running",
                            self.call_id, left, self.cfg.stop_timeout)
        await self.tasks.close()
        self.ended_wall = time.time()
        self.ended_at = self.clock.now()
        self.record = build_record(self)
        if self.amd is not None:
            self.record["amd"] = self.amd.record()
        if self.warm is not None and (warm := self.warm.record()) is not None:
            self.record["warm_transfer"] = warm  # every leg of the transfer and its times
        if self.consult is not None:
            self.record["consult"] = self.consult.record()
        try:  # telemetry never holds up nor fails a hang-up
            METRICS.observe_end(reason)
            self.meter.poll(idle=True, final=True)  # the turns not counted yet (each turn once)
            tracing.emit_call(self)
        except Exception:  # noqa: BLE001
            log.exception("call %s: telemetry failed", self.call_id)
        self._done.set()
        return self.record

    async def wait(self) -> dict[str, Any]:
        await self._done.wait()
        assert self.record is not None
        return self.record

    def live_tasks(self) -> int:
        return self.tasks.live()

    @property
    def hung_up(self) -> bool:
        """The hang-up began (it may still be stopping the stages)."""
        return self._hung_up

    @property
    def ended(self) -> bool:
        """The hang-up finished: the record is built."""
        return self._done.is_set()

    @property
    def failure(self) -> StageFailure | None:
        """The stage failure that ended (or is ending) the call, if any."""
        return self.supervisor.failure

    def say_line(self, text: str) -> None:
        """A fixed line spoken as the bot's own turn (a consult leg's reply to a key press)."""
        if not self._hung_up and text.strip():
            self.entry.put_nowait(Greet(text))

    def close_input(self) -> None:
        """Discard caller audio and DTMF from now on (marks and positions still count)."""
        self._input_closed = True

    @property
    def context(self) -> Context:
        return self.runner.ctx

    # -- inbound (the pump) -----------------------------------------------------------
    def on_worker(self, in16_pos: int, events: Sequence[TickEvent] = ()) -> None:
        """A worker tick for this call: the newest in16 position, then the VAD events.

        The position goes to the turn driver at once (it needs nothing else of the
        audio). The audio itself is read from in16 and offered to the STT stage as one
        AudioFrame per tick, or, when the STT provider takes batches
        (``audio_batch``), once at least that much is pending and always before a
        VAD event is delivered (so a stop never leaves its speech behind in the pump).
        """
        if self._input_closed:
            self.pump.discarded_after_hangup += 1
            return
        in_pos = self._in_pos
        if in_pos is None:
            in_pos = in16_pos if not events else min(in16_pos, *(e.pos for e in events))
            self._in_pos = in_pos
        if in16_pos > in_pos:
            if self._audio_end is not None:
                self._audio_end(in16_pos)
            if not self.converses and not self._speaking:  # early media, music on hold, AMD screening
                self.pump.media_muted_samples += in16_pos - in_pos
                self._in_pos = in16_pos
                self._gap = True
            elif events or in16_pos - in_pos >= self._batch_samples:
                self._read_audio(in_pos, in16_pos)
        if events:
            self._events(in16_pos, events)

    def _read_audio(self, start: int, end: int) -> None:
        r = self.source.read_range(start, end)
        if r.lost:
            self.pump.lost += r.lost
            self._gap = True
        n = len(r.samples)
        if n:
            self.pump.frames += 1
            self.pump.samples += n
            self.entry.put_nowait(AudioFrame(r.start, r.samples, self._gap))
            self._gap = False
            self._in_pos = r.start + n
        else:
            self._in_pos = end

    def _events(self, in16_pos: int, events: Sequence[TickEvent]) -> None:
        now = self.clock.now()
        for ev in events:
            pos = ev.pos
            at = now - max(0, in16_pos - pos) / IN16_RATE
            match ev:
                case SpeechStart():
                    self.pump.vad_starts += 1
                    self._start_muted = not self.converses
                    if self._start_muted:
                        self.pump.media_muted_events += 1
                        continue
                    self._speaking = True
                    self.entry.put_nowait(UserStartedSpeaking(at, pos))
                case SpeechStop():
                    self.pump.vad_stops += 1
                    self._speaking = False
                    if self._start_muted:
                        self._start_muted = False
                        self.pump.media_muted_events += 1
                        continue
                    self.entry.put_nowait(UserStoppedSpeaking(at, pos, decided_pos=ev.at))
                case SpeechFalling():  # the turn driver's early Smart Turn (when its machine wants it)
                    self.pump.vad_fallings += 1
                    if self._start_muted or not self.converses:
                        self.pump.media_muted_events += 1
                        continue
                    self.entry.put_nowait(UserSpeechFalling(at, pos, decided_pos=ev.at))
                case InputGap():
                    self.pump.gaps += 1
                    self._gap = True
                case VadFailed():
                    self.pump.vad_failures += 1
                case VadRecovered():
                    self.pump.vad_recoveries += 1
                case AmdVerdictEvent() | AmdBeepEvent() | AmdGreetingEndEvent():
                    if self.amd is not None and not self._hung_up:
                        self.amd.on_event(ev, at)

    def on_media(self, state: str, dial: dict[str, Any] | None = None) -> None:
        """The call's media state (a ``CallMedia``): logged, and passed to the chain when it
        changed (the pump keeps the caller's audio from it at once, see the module docstring)."""
        now = self.clock.now()
        changed = self.media.note(state, now, dial)
        if self.amd is not None and self.amd.screening:  # the chain hears of the answer from the verdict
            if state == MEDIA_ANSWERED and not self._hung_up:
                self.amd.answered()
            return
        if changed and not self._hung_up:
            self.entry.put_nowait(CallMediaChanged(state, now))

    @property
    def converses(self) -> bool:
        """The caller's audio may open turns: the call is answered, not being screened, and the
        caller is not on hold for a warm transfer (their speech then is ignored)."""
        return (self.media.converses and (self.amd is None or not self.amd.screening)
                and (self.warm is None or not self.warm.holding))

    def on_out_utterance(self, utterance: int, epoch: int, out_pos: int) -> None:
        self.timeline.out_utterance(epoch, self.clock.now())
        self.book.utterance_out_start(utterance, out_pos)
        self.out.on_out_utterance(utterance, out_pos)

    def on_playback(self, position: int, lead: float | None = None) -> None:
        self.pump.positions += 1
        if self.ledger.machine.release(position) is not None:  # the floor never goes backwards
            self.book.note_release(position, lead)

    def on_cleared(self, epoch: int, position: int, marks: list[str] | None = None) -> None:
        """The gateway applied Clear(epoch): epochs <= ``epoch`` are dead; ``position``
        is the last out position released; ``marks`` the end marks the cut discarded."""
        self.pump.cleared += 1
        self.meter.clear_applied(self.clock.now())
        if self.ledger.machine.cleared(epoch, position):  # the first answer per epoch is final
            self.book.note_cleared(epoch + 1, position, marks or ())

    def on_mark_played(self, name: str) -> None:
        self.pump.marks += 1
        self.out.on_mark_played(name)

    def on_dtmf(self, digit: str) -> None:
        """A caller's key into the turn driver's inbox, in order (see the module docstring)."""
        if self._input_closed:
            self.pump.discarded_after_hangup += 1
            return
        p, q, inbox = self.pump, self._dtmf, self.driver.inbox
        p.dtmf += 1
        if self.consult is not None:  # a consult leg: the person's answer, never a turn
            self.consult.dtmf(digit)
            return
        if self.warm is not None and self.warm.holding:  # the caller on hold: no turn
            p.media_muted_events += 1
            return
        if not q and inbox.data_room():
            inbox.put_nowait(DtmfFrame(digit))
            return
        if len(q) >= self.cfg.queues.dtmf:
            p.dtmf_refused += 1
            if p.dtmf_refused & (p.dtmf_refused - 1) == 0:  # the 1st, 2nd, 4th, ...: bounded lines
                log.warning("call %s: DTMF %r refused: %d digits wait already (%d refused so far)",
                            self.call_id, digit[:8], len(q), p.dtmf_refused)
            return
        q.append(DtmfFrame(digit))
        p.dtmf_queued += 1
        p.dtmf_max_queued = max(p.dtmf_max_queued, len(q))
        if self._dtmf_drain is None or self._dtmf_drain.done():
            self._dtmf_drain = self.tasks.spawn(self._drain_dtmf(), "dtmf-fifo", stage=self.driver.name)

    async def _drain_dtmf(self) -> None:
        q, inbox = self._dtmf, self.driver.inbox
        while q and not self._input_closed:
            await inbox.put(q[0])  # waits for room; the digit leaves the FIFO once it is in
            q.popleft()

    # -- introspection -------------------------------------------------------------------
    def observe_turns(self) -> int:
        """The turns that ended since the last look, into the process's histograms (the host
        calls it at every report; the hang-up counts the rest): how many were counted."""
        if self._hung_up:
            return 0
        return self.meter.poll(self.idle())

    def idle(self) -> bool:
        """Nobody is talking and no answer is owed (the drain's test)."""
        return self.driver.machine.phase in (Phase.IDLE, Phase.CLOSED)

    def interrupts(self) -> int:
        return self.driver.st.interrupts

    def decided_epoch(self) -> int:
        """The newest epoch the call's epoch authority decided."""
        return self.driver.machine.epoch

    def tool_records(self) -> list[Any]:
        return list(self.runner.tool_records)

    def speculation_stats(self) -> dict[str, float]:
        """The runner's speculation counters and the driver's offers (speculation.py)."""
        return spec_snapshot(self.runner.spec.st, self.driver.offers.st)

    def stats(self) -> dict[str, Any]:
        d: dict[str, Any] = {s.name: s.stats() for s in self.stages}
        d["pump"] = {k: getattr(self.pump, k) for k in self.pump.__slots__}
        d["book"] = self.book.stats()
        d["clears_sent"] = self.ledger.sent
        d["ledger"] = asdict(self.ledger.machine.st)
        d["speculation"] = self.speculation_stats()
        if self.events is not None:
            d["events"] = self.events.stats()
        if self.engine is not None:
            snap = self.engine.stats()
            d["tools"] = {k: getattr(snap, k) for k in getattr(snap, "__dataclass_fields__", {})}
        return d


S = TypeVar("S", bound=Stage)


def _stage(named: dict[str, Stage], name: str, cls: type[S]) -> S:
    st = named.get(name)
    if not isinstance(st, cls):
        raise TypeError(f"the chain's stage {name!r} must be a {cls.__name__}, not {type(st).__name__}")
    return st


class _AmdSeam:
    """The actor as its AMD screening sees it (:class:`~brisvox.agent.host.call_amd.AmdHost`)."""

    __slots__ = ("a", "call_id", "_later")

    def __init__(self, actor: CallActor) -> None:
        self.a = actor
        self.call_id = actor.call_id
        self._later: asyncio.Task[None] | None = None

    def in16_pos(self) -> int:
        return self.a.source.write_pos

    def to_worker(self, frame: Any) -> None:
        self.a.link.to_worker(frame)

    def spawn(self, coro: Any, name: str) -> Any:
        return self.a.tasks.spawn(coro, name)

    def converse(self, note: str, node: str) -> None:
        a = self.a
        if note:
            a.context.push(SystemMessage(note))
        if node:
            a.runner.flow_hook.enter_next(node)
        a.entry.put_nowait(CallMediaChanged(MEDIA_ANSWERED, a.clock.now()))
        if a.greeting.strip():
            a.entry.put_nowait(Greet(a.greeting))  # the bot speaks first, now

    def speak(self, text: str) -> None:
        a = self.a
        a.entry.put_nowait(CallMediaChanged(MEDIA_ANSWERED, a.clock.now()))
        a.entry.put_nowait(Greet(text))

    def hang_up_after_playout(self, reason: str) -> None:
        a = self.a
        if a.hangup_later is not None:
            a.hangup_later(reason)
        elif self._later is None:
            self._later = asyncio.get_running_loop().create_task(self._hang_up(reason), name=f"amd-end-{a.call_id}")

    async def _hang_up(self, reason: str, limit: float = 30.0) -> None:
        """Without a host hook: the bot idle (bounded), then Hangup to the gateway and the end."""
        a = self.a
        await a.clock.sleep(0.2)
        deadline = a.clock.now() + limit
        while not a.hung_up and not a.idle() and a.clock.now() < deadline:
            await a.clock.sleep(0.1)
        if not a.hung_up:
            a.link.to_gateway(Hangup(call_id=a.call_id, reason=reason))
            await a.hangup(reason)

    def amd_event(self, data: Mapping[str, Any]) -> None:
        if self.a.events is not None:
            self.a.events.emit("amd", **data)
        if self.a.on_amd is not None:
            self.a.on_amd(dict(data))
