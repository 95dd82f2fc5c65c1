"""Output pacing: ONE timer for all calls releases 20 ms frames from each ``out`` ring.

Owns when bot audio leaves the gateway: the 20 ms grid, talkspurts, late
ticks, partial frames. What may be released (the epoch gate after a Clear,
the Pause hold, marks, the release position) is each call's
:class:`~brisvox.playout.gate.PlayoutGate`; the pacer asks it every frame and
hands the actions it returns (marks passed) to ``on_actions``.

Invariants:

* One ``loop.call_at`` timer on a fixed 20 ms grid serves every call (no
  task or timer per call). A late tick catches up by at most
  ``MAX_BURST`` frames per call and counts the frames it released late.
* A call's frames are never released later than they are due and never more
  than one frame early: frame ``k`` of a talkspurt is due at ``t0 + k*20 ms``
  and goes out on the last tick at or before that time. The first frame of a
  response goes out at once, not at the next tick: :meth:`Pacer.utterance`
  (OutUtterance arrived; the worker sends it once the utterance's first audio
  is in the ``out`` ring) releases it in the callback that read the frame,
  and the talkspurt's grid starts there. ``first_frame`` measures the time
  from the announcement to that release.
* The gate's ``release_pos`` (the out-ring position after the last released
  sample) is the call's playback position. After a Clear the reader holds
  (the gate is closed: nothing is released, nothing skipped, since audio past
  the reader may already be the newer epoch's) until an utterance of a newer
  epoch starts; then it skips to the gate's floor (that start), counting the
  skipped samples as stale.
* Marks (SIP, native): reported played once ``release_pos`` passes their
  position. Marks for a peer that echoes them (Twilio): the ``mark`` message
  is sent right after the frame that reaches their position.
* A partial frame (less than 20 ms left in the ring) waits one tick for more
  audio, then goes out as it is (padding would move the playback position
  past the words).
* A recorded call's recording gets exactly the frames the leg accepted, when
  it accepted them (nothing the ring held past a Clear's cut is ever read).
* Pause (a barge-in candidate, the gate's ``Hold``, :meth:`Pacer.hold`): a paused call releases
  nothing and keeps its position (nothing cut, skipped or read; the
  talkspurt ends, which is neither an underrun nor counted as one: RTP
  simply sends no packets, the next one carries the marker bit, as after
  any talkspurt; Twilio and native peers get no media). A Resume kicks the
  call: release goes on from the held position at once. A pause never
  outlives the gate's ``pause_max_s``: the tick that finds it older resumes
  it (counted ``pauses_expired``).
* A tick never holds a control frame back for its whole length: every
  ``SLICE`` calls it runs ``between`` (the gateway's non-blocking inbox poll),
  so a Clear that arrived mid-tick is applied before the rest of the tick's
  calls are served, not after all of them (at 100 calls a tick's body is a few ms).
* A bridged call (a warm transfer, :mod:`brisvox.gateway.core.consults`) releases nothing of
  its ``out`` ring: each tick it sends one frame read from the other leg's ``in`` ring
  (``call.relay``), as written, so the audio arrives bit-exact and at most one tick after
  it was written; a backlog beyond ``RELAY_BACKLOG`` frames (the two carriers' clocks
  drift, a late tick) drops its oldest samples (counted ``bridge_samples_dropped``) so the
  delay stays bounded; the recording gets each frame sent, as for the agent's audio.
  A caller un-bridged (the person left, its kept agent takes it back: :meth:`Pacer.unbridged`)
  skips its ``out`` reader to the ring's write position: what the agent wrote during the
  bridge (the hold audio's tail, a word after the bridge) is dropped, counted as stale, and
  its marks reported passed; the agent's next utterance plays as any other.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from brisvox.gateway.core.call_machine import ACTIVE
from brisvox.gateway.core.calls import Call, Leg
from brisvox.gateway.metrics import GatewayMetrics, Histogram
from brisvox.playout.gate import HELD, Action

log = logging.getLogger("brisvox.gateway.core.pacer")

FRAME_S = 0.020
MAX_BURST = 3
SLICE = 16  # calls served between two polls of the inbox within a tick
RELAY_BACKLOG = 4  # frames of the other leg's audio a bridged call may lag before the oldest is dropped
UNDERRUN_WINDOW_S = 0.2


class Pacer:
    """The one timer of the gateway (see module invariants)."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        report_every: int = 5,
        on_actions: Callable[[Call, tuple[Action, ...] | list[Action]], None],
        on_report: Callable[[list[Call]], None],
        on_tick: Callable[[float, int], None] | None = None,
        between: Callable[[], None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.calls: dict[str, Call] = {}
        self.report_every = max(1, report_every)
        self.on_actions = on_actions
        self.on_report = on_report
        self.on_tick = on_tick
        self.between = between
        self.ticks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._scheduled = 0.0
        self.busy_s = 0.0  # CPU-ish time spent inside ticks (wall time of the tick body)
        # an utterance announced while the call was silent: call_id -> loop time of the announcement
        self._announced: dict[str, float] = {}
        self.first_frame = Histogram(0.05, 50.0)  # announcement -> first frame released (ms)

    # -- lifecycle --------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop or asyncio.get_running_loop()
        self._scheduled = self._loop.time() + FRAME_S
        self._handle = self._loop.call_at(self._scheduled, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def add(self, call: Call) -> None:
        self.calls[call.call_id] = call

    def remove(self, call: Call) -> None:
        self.calls.pop(call.call_id, None)
        self._announced.pop(call.call_id, None)

    def now(self) -> float:
        assert self._loop is not None
        return self._loop.time()

    # -- what the gate's actions ask of the pacing state ------------------------------------

    def hold(self, call: Call, ended_spurt: bool) -> None:
        """A Pause holds the call (the gate's ``Hold``): a playing talkspurt ends here, not
        starved, so it is not an underrun later."""
        if ended_spurt:
            call.starved_at = -1.0
            if call.leg is not None:
                call.leg.end_spurt()
        call.partial_wait = False

    def stop_spurt(self, call: Call) -> None:
        """A Clear cut the talkspurt (the gate's ``StopSpurt``)."""
        call.partial_wait = False
        call.starved_at = -1.0

    # -- the tick -----------------------------------------------------------

    def _tick(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        t0 = time.perf_counter()
        late = now - self._scheduled
        self.metrics.tick_late.add(late * 1000.0)
        self.ticks += 1
        if self.on_tick is not None:
            self.on_tick(now, self.ticks)
        grid = self._scheduled
        between = self.between
        for i, call in enumerate(list(self.calls.values()), 1):
            try:
                self.service(call, now, grid)
            except Exception:  # one call's failure must not stop the pacing of the others
                log.exception("pacer: call %s failed", call.call_id)
                self.metrics.inc("pacer_errors")
                self.calls.pop(call.call_id, None)
            if between is not None and i % SLICE == 0:
                between()  # frames that arrived meanwhile (a Clear) are handled now, not after the tick
        if self.ticks % self.report_every == 0:
            self.on_report(list(self.calls.values()))
        # next grid point; if we fell behind by more than a tick, re-anchor the grid
        self._scheduled += FRAME_S
        if self._scheduled < now:
            skipped = int((now - self._scheduled) / FRAME_S) + 1
            self.metrics.inc("pacer_ticks_skipped", skipped)
            self._scheduled += skipped * FRAME_S
        self.busy_s += time.perf_counter() - t0
        self._handle = loop.call_at(self._scheduled, self._tick)

    def utterance(self, call: Call) -> None:
        """An utterance of a live epoch starts (OutUtterance): release its first frame now."""
        if self._loop is None or call.call_id not in self.calls:
            return
        if not call.gate.playing:
            self._announced[call.call_id] = self._loop.time()
        self.kick(call)

    def forget_announcement(self, call: Call) -> None:
        """A Clear closed the gate: the announced utterance will not play."""
        self._announced.pop(call.call_id, None)

    def unbridged(self, call: Call) -> None:
        """``call`` left its bridge for its agent's audio (see the module docstring)."""
        ring, reader = call.out_ring, call.out_reader
        pos = max(reader.position, ring.floor)
        skip = ring.write_pos - pos
        if skip > 0:
            call.stats.stale_samples += skip
            self.metrics.inc("bridge_stale_samples", skip)
        reader.seek(ring.write_pos)
        call.partial_wait = False
        leg = call.leg
        acts = call.gate.released(reader.position, leg.marks_by_echo if leg is not None else False)
        if acts:
            self.on_actions(call, acts)

    def kick(self, call: Call) -> None:
        """Release what is due for ``call`` now (the first frame of a response goes out at once)."""
        if self._loop is None or call.call_id not in self.calls:
            return
        now = self._loop.time()
        self.service(call, now, now, on_grid=False)

    # -- one call -----------------------------------------------------------

    def _relay(self, call: Call, leg: Leg, now: float) -> None:
        """One frame of the other leg's voice to a bridged call's leg (module invariants)."""
        reader = call.relay
        assert reader is not None
        frame = call.frame
        avail = reader.available()
        if avail > RELAY_BACKLOG * frame:
            drop = avail - frame
            self.metrics.inc("bridge_samples_dropped", drop)
            reader.seek(reader.position + drop)
            avail = frame
        if avail < frame:
            if call.relay_playing:
                call.relay_playing = False
                leg.end_spurt()  # the other side is silent (no packet): the next one starts a spurt
            return
        res = reader.read(frame)
        if res.lost:
            call.stats.ring_lost += res.lost
        if leg.send_audio(res.samples, now):
            call.stats.frames_out += 1
            call.stats.samples_out += len(res.samples)
            if call.recording is not None:
                call.recording.bot(res.samples)
        else:
            call.stats.send_dropped += 1
        call.relay_playing = True
        call.last_send = now

    def service(self, call: Call, now: float, grid: float | None = None, on_grid: bool = True) -> None:
        """Release what is due for ``call``. ``grid`` is the tick's scheduled time: due times are
        compared with it, not with ``now``, so a tick's lateness never makes a frame go early
        or wait a tick (one frame per tick in steady state, more only after missed ticks)."""
        if grid is None:
            grid = now
        leg = call.leg
        if leg is None or call.machine.state != ACTIVE:
            return
        leg.poll(now)
        if call.builtin is not None:
            call.builtin.tick(now)
        if leg.tick_dtmf(now):
            call.next_due = now + FRAME_S
            return
        if not leg.can_send:
            return
        if call.bridged_with:  # a warm transfer's bridge: the other leg's voice, not the agent's
            if call.relay is not None:
                self._relay(call, leg, now)
            return
        gate = call.gate
        if gate.held is not None:
            if gate.hold(now) == HELD:
                return  # held: nothing released, the position stays
            self.metrics.inc("pauses_expired")
        ring = call.out_ring
        reader = call.out_reader
        frame = call.frame
        if not gate.playing:
            call.next_due = grid  # a new talkspurt starts now
        sent = 0
        horizon = grid + FRAME_S * 0.999
        while call.next_due <= horizon and sent < MAX_BURST:
            w = ring.write_pos
            pos = reader.position
            floor = ring.floor
            if pos < floor:
                pos = floor
            start = gate.releasable_from(pos)
            if start < 0:
                break  # after a Clear: nothing plays until an utterance of a newer epoch starts
            if start > pos:
                skip = min(start, w) - pos
                if skip > 0:
                    call.stats.stale_samples += skip
                    reader.seek(pos + skip)
                    pos += skip
                if pos < start:
                    break
            avail = w - pos
            if avail >= frame or (avail > 0 and call.partial_wait):
                res = reader.read(frame)
                call.partial_wait = False
                if res.lost:
                    call.stats.ring_lost += res.lost
                n = len(res.samples)
                if n == 0:
                    break
                if not gate.playing:
                    gate.spurt_start(time.monotonic_ns())
                    if self._announced:
                        t_ann = self._announced.pop(call.call_id, None)
                        if t_ann is not None:
                            self.first_frame.add((now - t_ann) * 1000.0)
                    if call.starved_at >= 0 and now - call.starved_at < UNDERRUN_WINDOW_S:
                        call.stats.underruns += 1
                    call.starved_at = -1.0
                elif on_grid and call.last_on_grid and sent == 0:
                    # interval between two grid releases of one talkspurt
                    dev = abs((now - call.last_send) - FRAME_S)
                    self.metrics.release_jitter.add(dev * 1000.0)
                if call.next_due < now - FRAME_S:
                    call.stats.late_frames += 1
                if leg.send_audio(res.samples, now):
                    call.stats.frames_out += 1
                    call.stats.samples_out += n
                    if call.recording is not None:
                        call.recording.bot(res.samples)  # what went to the wire, nothing past a cut
                else:
                    call.stats.send_dropped += 1
                call.last_send = now
                call.last_on_grid = on_grid
                call.next_due += FRAME_S
                sent += 1
                acts = gate.released(reader.position, leg.marks_by_echo)
                if acts:
                    self.on_actions(call, acts)
                continue
            if avail > 0 and sent == 0:
                call.partial_wait = True  # less than a frame: give the writer one more tick
                break
            # nothing (more) to send: the talkspurt ends
            if gate.playing:
                gate.spurt_end()
                call.starved_at = now
                leg.end_spurt()
            break
        if sent == 0 and gate.marks and not gate.playing:
            acts = gate.due_marks(leg.marks_by_echo)
            if acts:
                self.on_actions(call, acts)
