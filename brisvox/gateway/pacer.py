"""Output pacing: ONE timer for all calls releases 20 ms frames from each ``out`` ring.

Owns when bot audio leaves the gateway, the release (playback) position of
every call, the epoch gate after a Clear, mark release, and the periodic
position reports.

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
* ``release_pos`` (the out-ring position after the last released sample) is
  the call's playback position. It only moves forward. After a Clear the
  reader holds (the gate is closed: nothing is released, nothing skipped,
  since audio past the reader may already be the newer epoch's) until an
  utterance of a newer epoch starts; then it skips to that start
  (``Call.gate_pos``), counting the skipped samples as stale. Nothing below
  the epoch gate or before the first utterance of a newer epoch is ever
  released.
* Marks (SIP, native): reported played once ``release_pos`` passes their
  position. Marks for a peer that echoes them (Twilio): the ``mark`` message
  is sent right after the frame that reaches their position.
* A partial frame (less than 20 ms left in the ring) waits one tick for more
  audio, then goes out as it is (padding would move the playback position
  past the words).
* Pause (a barge-in candidate, :meth:`Pacer.pause`): a paused call releases
  nothing and keeps its position (nothing cut, skipped or read; the
  talkspurt ends, which is neither an underrun nor counted as one: RTP
  simply sends no packets, the next one carries the marker bit, as after
  any talkspurt; Twilio and native peers get no media). :meth:`Pacer.resume`
  releases from the held position at once. A pause never outlives
  ``pause_max_s``: the tick that finds it older resumes it (counted
  ``pauses_expired``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from brisvox.gateway.calls import Call, PendingMark
from brisvox.gateway.metrics import GatewayMetrics, Histogram

log = logging.getLogger("brisvox.gateway.pacer")

FRAME_S = 0.020
MAX_BURST = 3
UNDERRUN_WINDOW_S = 0.2


class Pacer:
    """The one timer of the gateway (see module invariants)."""

    def __init__(
        self,
        metrics: GatewayMetrics,
        *,
        report_every: int = 5,
        on_mark_played: Callable[[Call, PendingMark], None],
        on_report: Callable[[list[Call]], None],
        on_tick: Callable[[float, int], None] | None = None,
        pause_max_s: float = 2.5,
    ) -> None:
        self.metrics = metrics
        self.calls: dict[str, Call] = {}
        self.report_every = max(1, report_every)
        self.on_mark_played = on_mark_played
        self.on_report = on_report
        self.on_tick = on_tick
        self.ticks = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._scheduled = 0.0
        self.busy_s = 0.0  # CPU-ish time spent inside ticks (wall time of the tick body)
        # an utterance announced while the call was silent: call_id -> loop time of the announcement
        self._announced: dict[str, float] = {}
        self.first_frame = Histogram(0.05, 50.0)  # announcement -> first frame released (ms)
        self.pause_max_s = pause_max_s
        self.paused: dict[str, tuple[int, float]] = {}  # call_id -> (held epoch, loop time of the pause)

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
        self.paused.pop(call.call_id, None)

    # -- pause ----------------------------------------------------------------

    def pause(self, call: Call, epoch: int, now: float | None = None) -> None:
        """Hold ``call``'s release at its position from ``now`` on (see module invariants)."""
        if now is None:
            assert self._loop is not None
            now = self._loop.time()
        if call.call_id not in self.paused:
            self.paused[call.call_id] = (epoch, now)
        if call.playing:  # the talkspurt ends here: not starved, so not an underrun later
            call.playing = False
            call.starved_at = -1.0
            call.held_spurt = True
            if call.leg is not None:
                call.leg.end_spurt()
        call.partial_wait = False

    def unpause(self, call: Call) -> int | None:
        """End ``call``'s hold (Resume, Clear, a newer epoch); returns the held epoch (None: none)."""
        held = self.paused.pop(call.call_id, None)
        return None if held is None else held[0]

    def resume(self, call: Call) -> None:
        """Release from the held position at once (the talkspurt restarts now)."""
        if self.unpause(call) is not None:
            self.kick(call)

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
        for call in list(self.calls.values()):
            try:
                self.service(call, now, grid)
            except Exception:  # one call's failure must not stop the pacing of the others
                log.exception("pacer: call %s failed", call.call_id)
                self.metrics.inc("pacer_errors")
                self.calls.pop(call.call_id, None)
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
        if not call.playing:
            self._announced[call.call_id] = self._loop.time()
        self.kick(call)

    def forget_announcement(self, call: Call) -> None:
        """A Clear closed the gate: the announced utterance will not play."""
        self._announced.pop(call.call_id, None)

    def kick(self, call: Call) -> None:
        """Release what is due for ``call`` now (the first frame of a response goes out at once)."""
        if self._loop is None or call.call_id not in self.calls:
            return
        now = self._loop.time()
        self.service(call, now, now, on_grid=False)

    # -- one call -----------------------------------------------------------

    def service(self, call: Call, now: float, grid: float | None = None, on_grid: bool = True) -> None:
        """Release what is due for ``call``. ``grid`` is the tick's scheduled time: due times are
        compared with it, not with ``now``, so a tick's lateness never makes a frame go early
        or wait a tick (one frame per tick in steady state, more only after missed ticks)."""
        if grid is None:
            grid = now
        leg = call.leg
        if leg is None or call.state != "active":
            return
        leg.poll(now)
        if call.builtin is not None:
            call.builtin.tick(now)
        if leg.tick_dtmf(now):
            call.next_due = now + FRAME_S
            return
        if not leg.can_send:
            return
        if self.paused:
            held = self.paused.get(call.call_id)
            if held is not None:
                if now - held[1] < self.pause_max_s:
                    return  # held: nothing released, the position stays
                del self.paused[call.call_id]
                self.metrics.inc("pauses_expired")
        ring = call.out_ring
        reader = call.out_reader
        frame = call.frame
        if not call.playing:
            call.next_due = grid  # a new talkspurt starts now
        sent = 0
        horizon = grid + FRAME_S * 0.999
        while call.next_due <= horizon and sent < MAX_BURST:
            w = ring.write_pos
            pos = reader.position
            floor = ring.floor
            if pos < floor:
                pos = floor
            if not call.gate_open:
                # after a Clear: nothing plays until an utterance of a newer epoch starts
                break
            if pos < call.gate_pos:
                skip = min(call.gate_pos, w) - pos
                if skip > 0:
                    call.stats.stale_samples += skip
                    reader.seek(pos + skip)
                    pos += skip
                if pos < call.gate_pos:
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
                if not call.playing:
                    call.playing = True
                    call.spurt_ns = time.monotonic_ns()
                    call.spurt_from_dry = not call.held_spurt
                    call.held_spurt = False
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
                else:
                    call.stats.send_dropped += 1
                call.last_send = now
                call.last_on_grid = on_grid
                call.release_pos = reader.position
                call.released_since_report = True
                call.next_due += FRAME_S
                sent += 1
                if call.marks:
                    self._release_marks(call)
                continue
            if avail > 0 and sent == 0:
                call.partial_wait = True  # less than a frame: give the writer one more tick
                break
            # nothing (more) to send: the talkspurt ends
            if call.playing:
                call.playing = False
                call.starved_at = now
                leg.end_spurt()
            break
        if sent == 0 and call.marks and not call.playing:
            self._release_marks(call)

    def _release_marks(self, call: Call) -> None:
        pos = call.release_pos
        marks = call.marks
        leg = call.leg
        assert leg is not None
        while marks and marks[0].position <= pos:
            m = marks.popleft()
            if leg.marks_by_echo:
                leg.send_mark(m.name)
                call.marks_sent.append(m)
            else:
                call.stats.marks_played += 1
                self.on_mark_played(call, m)
