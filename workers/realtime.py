"""The inference worker's realtime lane: the tick loop with batched VAD, and hot output.

Owns :class:`RealtimeLane` (held by :class:`workers.core.Worker`): the
tick's own state (the hot set, the VAD batch scratch, the tick sequence, when
each subscriber last heard from the worker). It is handed what it works on
explicitly: the attached calls (:class:`workers.call_table.AttachedCalls`:
their ``calls`` and ``by_sub``, read every tick, and ``detach`` for orphans),
the worker's counters (:class:`workers.stats.TickStats`), the worker's
non-blocking ``send`` and, at :meth:`RealtimeLane.load`, the Silero model.
It runs:

* the **tick**, one every ``tick_ms`` on the main thread: convert ``in`` ->
  ``in16`` (:class:`workers.resample.InputChain`) for every call whose next
  32 ms VAD window is complete (or whose in16 is older than ``fresh_ms``), run
  ONE batched Silero over every call that has a full window (more runs only
  when a call catches up after a stall or a re-attach; one run per VAD rate:
  8 kHz calls use Silero's native 8 kHz mode on the ``in`` samples themselves
  when ``[vad] native_8k`` is on, the others the 16 kHz model on ``in16``;
  positions are in16 positions either way), feed each call's
  :class:`workers.vad.VadStream`, convert ``tts`` -> ``out``, then send one
  :class:`WorkerTick` to each subscriber with news (the in16 positions that
  advanced, the VAD events of the tick).
* the **first audio of an utterance** does not wait for a tick: a
  TtsUtterance makes the call "hot"; as soon as the utterance's first 20 ms
  of tts audio is in the ring (usually already when the frame arrives: the
  actor writes right after announcing) the worker converts that one call's
  ``tts`` -> ``out`` on its loop, outside the tick, and sends OutUtterance at
  once, so the gateway can release the first frame without waiting for its
  own tick. While a call is hot the loop polls every millisecond (at most
  one tick long); the conversion costs the realtime lane what it would have
  cost in the next tick.

* the **stop window ends on time**: a call that is speaking and in a silence
  is "due" (:attr:`RealtimeLane.due`): the worker's loop sleeps until less than
  a frame of its next window is missing from the ``in`` ring (real-time pacing
  from the write position), polls every millisecond from then on, then converts
  and scores that window outside the tick (a batch of its own) and publishes
  its events at once (:meth:`RealtimeLane.serve_due`),
  so a stop leaves with the frame that completes its window instead of at the
  next tick (up to ``tick_ms`` later). At the second silent window the stream
  gets the signal's own end of speech (:func:`workers.vad.refine_stop` over up
  to :data:`workers.vad.HINT_REACH`; with ``[vad] refine_boundaries``) and counts
  its stop window from there, not from Silero's lingering last speech window.

Invariants (failure behaviour):

* One call's failure never stops the tick for the others: a broken input
  ring resets that call's stream; a failed batched Silero run is retried row
  by row so one bad call cannot fail the rest.
* Per-call VAD fail-open with recovery probes (:class:`workers.vad.VadHealth`):
  a failed window closes speech and rebuilds the stream; after too many
  failures the call fails open (audio flows, no VAD) and is probed again.
* Gaps (and a VAD that fell ``PEND_S`` behind) close speech with a stop dated
  to the last speech, and the VAD restarts on the window grid.
* A stop's ``at`` is in in16 when it is published (the prompt path converts
  the input before it scores, under the same ``need_in`` as the tick).
* A call is due for at most ``DUE_NS`` (100 ms) after its last scored window:
  audio that stopped coming waits for the tick again, the loop never spins.
* Every subscriber hears from the worker at least every 100 ms (an empty tick
  as a keepalive); one that stays unreachable for ``orphan_timeout_s`` has its
  calls detached.
* No tick before :meth:`RealtimeLane.load` (the batch scratch is sized for
  ``max_calls`` there, once: the tick allocates no batch buffers).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ipc.codec import encode
from ipc.frames import OutUtterance, WorkerTick
from ipc.tick_events import (
    AmdBeepEvent,
    AmdGreetingEndEvent,
    AmdVerdictEvent,
    InputGap,
    SpeechFalling,
    SpeechStart,
    SpeechStop,
    VadFailed,
    VadRecovered,
    to_wire,
)
from workers.amd import AmdBeep, AmdDetector, AmdEvent, AmdVerdict
from workers.call_table import AttachedCall, AttachedCalls
from workers.config import VadConfig, WorkersConfig
from workers.stats import TickStats
from workers.vad import (
    HINT_REACH,
    RATE,
    RATE8,
    SPEAKING,
    WINDOW,
    WINDOW8,
    SileroBatch,
    VadEvent,
    VadStream,
    refine_start,
    refine_stop,
)

log = logging.getLogger("brisvox.workers")

SCALE = np.float32(1.0 / 32768.0)
DUE_NS = 100 * 1_000_000  # a due call waits this long at most for its next window's audio
FRAME_MS = 20  # the caller's audio lands in the in ring a frame at a time


class RealtimeLane:
    """The tick and the hot-output path of worker ``index`` (see the module's invariants)."""

    def __init__(self, index: int, cfg: WorkersConfig, vad: VadConfig, attached: AttachedCalls,
                 stats: TickStats, send: Callable[[bytes, bytes], bool]) -> None:
        self.index = index
        self.cfg = cfg
        self.vad_cfg = vad
        self.calls = attached.calls  # the same dicts as the attached calls' (never rebound)
        self.by_sub = attached.by_sub
        self._detach = attached.detach
        self.stats = stats
        self._send = send
        self.silero: SileroBatch | None = None
        self.seq = 0
        self.tick_s = cfg.tick_ms / 1000.0
        self.fresh_ns = cfg.fresh_ms * 1_000_000
        self.keepalive_ns = 100 * 1_000_000
        self._last_pub: dict[str, int] = {}
        self._unroutable: dict[str, int] = {}
        # call_id -> deadline (monotonic ns): an announced utterance waits for its first audio
        # (read by the worker's loop: while any, it polls every millisecond)
        self.hot: dict[str, int] = {}
        # call_id -> (call, until ns): speaking and in a silence, so its next VAD window may decide
        # the stop; the worker's loop runs that window as soon as its audio is in the ring
        # (serve_due), for at most DUE_NS (audio that stopped coming waits for the tick again)
        self.due: dict[str, tuple[AttachedCall, int]] = {}
        # batch scratch per VAD window width (16 kHz, native 8 kHz), sized for max_calls at load()
        self._scratch: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def load(self, silero: SileroBatch, capacity: int) -> None:
        """The loaded VAD model, and batch scratch for ``capacity`` calls."""
        self.silero = silero
        self._scratch = {w: (np.zeros(capacity, dtype=np.intp), np.zeros((capacity, w), dtype=np.int16),
                             np.zeros((capacity, w), dtype=np.float32)) for w in (WINDOW, WINDOW8)}

    def tick(self) -> None:
        st = self.stats
        t0 = time.perf_counter_ns()
        cpu = time.thread_time_ns
        c0 = cpu()
        calls = list(self.calls.values())
        now = time.monotonic_ns()
        fresh = self.fresh_ns
        active: list[AttachedCall] = []
        for c in calls:  # convert a call's input when its next VAD window is complete
            w = c.inp.src.write_pos
            if w > c.inp.in_pos and (w >= c.need_in or now - c.conv_ns >= fresh):
                c.conv_ns = now
                self._input(c)
                active.append(c)
            elif c.pend_n - c.pend_off >= c.win:  # windows left over from a catch-up
                active.append(c)
        c1 = cpu()
        self._vad(active)
        for c in active:
            c.schedule()
        c2 = cpu()
        for c in calls:
            out = c.out
            if out.src.write_pos > out.tts_pos:  # new tts audio (most calls are silent most ticks)
                for u in out.step():
                    self._send_out_utterance(c, u.utterance, u.epoch, u.out_pos)
        if self.hot:
            self.hot = {k: v for k, v in self.hot.items() if k in self.calls and self.calls[k].out.next_start() >= 0}
        c3 = cpu()
        self._publish()
        c4 = cpu()
        t4 = time.perf_counter_ns()
        st.ticks += 1
        st.input_ns += c1 - c0
        st.vad_ns += c2 - c1
        st.output_ns += c3 - c2
        st.send_ns += c4 - c3
        st.tick_cpu_ns += c4 - c0
        st.tick_ns += t4 - t0
        if t4 - t0 > st.tick_max_ns:
            st.tick_max_ns = t4 - t0

    def _input(self, c: AttachedCall) -> None:
        inp = c.inp
        try:
            n = inp.step()
        except Exception as e:  # a broken ring must not stop the tick for everyone
            self.stats.errors["input"] = self.stats.errors.get("input", 0) + 1
            log.warning("call %s: input conversion failed: %s", c.call_id, e)
            inp.reset_stream()
            return
        if inp.gap >= 0:
            self.stats.gaps += 1
            self._close_stream(c, inp.gap, "gap")
            c.events.append(InputGap(call_id=c.call_id, pos=inp.gap, lost=inp.gap_lost, ns=time.monotonic_ns()))
            c.align()
            return
        fresh = inp.raw if c.native8 else inp.fresh
        n = len(fresh)
        if n == 0:
            return
        m = c.pend_n
        pend = c.pend
        cap = len(pend)
        if m + n > cap:
            off = c.pend_off
            if m - off + n > cap:  # the VAD fell 2 s behind: shed the backlog like a gap
                self.stats.pend_overflows += 1
                self._close_stream(c, c.vad_pos, "overflow")
                c.align()
                return
            # compact: the unconsumed tail moves to the front (once per ~2 s of audio)
            pend[: m - off] = pend[off:m]
            m -= off
            c.pend_off = 0
        pend[m : m + n] = fresh
        c.pend_n = m + n

    def _close_stream(self, c: AttachedCall, at: int, reason: str) -> None:
        """End the call's VAD stream (gap, failure): stop dated to the last speech, fresh state."""
        ev = c.stream.finish(at)
        if ev is not None:
            self._emit(c, ev, reason)
        c.pend_n = c.pend_off = 0
        assert self.silero is not None
        self.silero.reset(c.slot)

    def _emit(self, c: AttachedCall, ev: VadEvent, reason: str = "") -> None:
        pos = ev.pos
        if ev.kind == "start":
            c.fall_ref = (-1, -1)
        if self.vad_cfg.refine_boundaries and not reason:
            if ev.refined:  # an end hint: already the signal's end of speech
                if ev.kind == "falling":
                    c.fall_ref = (ev.pos, ev.pos)
            elif ev.kind == "stop" and c.fall_ref[0] == ev.pos:
                pos = c.fall_ref[1]  # the stop carries exactly what its falling event announced
            else:
                pos = self._refine(c, ev)
                if ev.kind == "falling":
                    c.fall_ref = (ev.pos, pos)
        pos = max(0, pos)
        ns = time.monotonic_ns()
        if ev.kind == "stop":
            c.events.append(SpeechStop(call_id=c.call_id, pos=pos, at=ev.at, ns=ns, reason=reason))
        elif ev.kind == "start":
            c.events.append(SpeechStart(call_id=c.call_id, pos=pos, at=ev.at, ns=ns))
        else:
            c.events.append(SpeechFalling(call_id=c.call_id, pos=pos, at=ev.at, ns=ns))
        self.stats.events += 1

    def _refine(self, c: AttachedCall, ev: VadEvent) -> int:
        ring = c.rings["in16"]
        try:
            if ev.kind == "start":
                base = max(0, ev.pos - 3 * WINDOW - 3200)
                got = ring.read_range(base, ev.pos + WINDOW)
                return refine_start(got.samples, got.start, ev.pos) if got.start <= base + 3200 else ev.pos
            base = max(0, ev.pos - 3 * WINDOW)
            got = ring.read_range(base, ev.at)
            if got.start > base:
                return ev.pos
            return refine_stop(got.samples, got.start, ev.pos, ev.at)
        except Exception:  # refinement is an improvement, never a reason to lose an event
            return ev.pos

    def _end_hint(self, c: AttachedCall, end: int) -> None:
        """Give the call's stream the signal's own end of speech (:func:`refine_stop` over the
        silence so far, up to ``HINT_REACH`` back), so its stop window counts the caller's
        silence and not Silero's hangover. A fall already announced keeps the position its
        falling event carried (the stop must carry the same)."""
        s = c.stream
        last = s.last_speech
        if s.fell and c.fall_ref[0] == last:
            pos = c.fall_ref[1]
        else:
            pos = last
            try:
                base = max(0, last - HINT_REACH)
                got = c.rings["in16"].read_range(base, end)
                if got.start <= base:
                    pos = refine_stop(got.samples, got.start, last, end, HINT_REACH)
            except Exception:  # the hint is an improvement, never a reason to lose the stop
                pos = last
        s.speech_ended_at(pos)
        self.stats.end_hints += 1
        if s.last_speech < last:
            self.stats.end_hints_moved += 1

    def due_in_ms(self) -> int:
        """Milliseconds the loop may sleep before it looks for the earliest due call's next
        window again (0: its audio is in the ring now; -1: no call is due). Audio comes in
        whole frames (20 ms on every transport), so the frame that completes the window may
        land any time once less than ``FRAME_MS`` of it is missing: then 1 ms polls; before
        that, sleep until it is that close (real-time pacing from the write position).
        Drops the calls that are gone or were due for longer than ``DUE_NS``."""
        best = -1
        now = time.monotonic_ns()
        for call_id, (c, until) in list(self.due.items()):
            if now > until or self.calls.get(call_id) is not c:
                del self.due[call_id]
                continue
            src = c.inp.src
            miss = c.need_in - src.write_pos
            ms = 0 if miss <= 0 else max(1, -(-miss * 1000 // src.rate) - FRAME_MS)
            if best < 0 or ms < best:
                best = ms
        return best

    def serve_due(self) -> None:
        """Outside the tick: every due call whose next window's audio is in the ring gets it
        converted and scored now (a batch of its own) and its events published at once, so a
        stop goes out when the stop window ends, not at the next tick."""
        cpu0 = time.thread_time_ns()
        ready: list[AttachedCall] = []
        for call_id, (c, _) in list(self.due.items()):
            if self.calls.get(call_id) is not c:
                del self.due[call_id]
            elif c.inp.src.write_pos >= c.need_in:
                del self.due[call_id]
                ready.append(c)
        if not ready:
            return
        now = time.monotonic_ns()
        before = sum(c.vad_pos for c in ready)
        for c in ready:
            c.conv_ns = now
            self._input(c)
        self._vad(ready)
        for c in ready:
            c.schedule()
        self.stats.vad_prompt += max(0, sum(c.vad_pos for c in ready) - before) // WINDOW
        self.seq += 1
        for sub in {c.subscriber for c in ready}:
            self._publish_to(sub, [c for c in ready if c.subscriber == sub], now)
        self.stats.prompt_ns += time.thread_time_ns() - cpu0

    def _vad(self, calls: list[AttachedCall]) -> None:
        """One batched Silero run per VAD rate over every call with a full window; more
        runs only for calls that are more than one window behind (a stall, a re-attach)."""
        silero = self.silero
        assert silero is not None
        todo = calls
        for _ in range(self.cfg.max_vad_rounds):
            batches: dict[int, list[AttachedCall]] = {}
            behind: list[AttachedCall] = []
            for c in todo:
                off = c.pend_off
                have = c.pend_n - off
                w = c.win
                if have < w or (c.native8 and c.vad_pos + WINDOW > c.inp.out_pos):
                    continue  # no full window (native 8 kHz: or in16 does not cover it yet)
                if have >= 2 * w:
                    behind.append(c)
                h = c.health
                if h.failed_open:
                    end = c.vad_pos + WINDOW
                    if h.probe_due(end):
                        c.probe = True
                        silero.reset(c.slot)
                        c.stream = VadStream(c.params)
                    else:  # failed open: audio flows, no VAD
                        if c.amd is not None or c.amd_start is not None:  # AMD on energy alone
                            self._amd(c, c.pend[off : off + w], None, c.vad_pos)
                        c.pend_off = off + w
                        c.vad_pos = end
                        continue
                batch = batches.get(w)
                if batch is None:
                    batch = batches[w] = []
                slots, win16, _ = self._scratch[w]
                i = len(batch)
                slots[i] = c.slot
                win16[i] = c.pend[off : off + w]
                batch.append(c)
            for w, batch in batches.items():
                self._vad_run(w, batch)
            if not behind:
                break
            todo = behind

    def _vad_run(self, w: int, batch: list[AttachedCall]) -> None:
        """Score the windows gathered in the ``w``-wide scratch rows and feed each call's stream."""
        silero = self.silero
        assert silero is not None
        st = self.stats
        n = len(batch)
        slots, win16, winf = self._scratch[w]
        win = winf[:n]
        np.multiply(win16[:n], SCALE, out=win)
        try:
            probs = silero.run(slots[:n], win).tolist()
        except Exception as e:
            probs = self._isolate(batch, win, e)
        st.vad_runs += 1
        st.vad_rows += n
        hint = self.vad_cfg.refine_boundaries
        due = self.due
        until = time.monotonic_ns() + DUE_NS
        for i in range(n):
            c = batch[i]
            end = c.vad_pos + WINDOW
            c.vad_pos = end
            c.pend_off += w
            p = probs[i]
            if c.amd is not None or c.amd_start is not None:
                self._amd(c, win16[i], p if 0.0 <= p <= 1.0 else None, end - WINDOW)
            if p != p or p < 0.0 or p > 1.0:  # NaN or nonsense: a failed window
                self._vad_failure(c, end)
                continue
            h = c.health
            if h.streak or h.failed_open:
                if h.on_success(end) == "recovered":
                    st.recoveries += 1
                    log.warning("call %s: VAD recovered", c.call_id)
                    c.events.append(VadRecovered(call_id=c.call_id, pos=end, ns=time.monotonic_ns()))
                c.probe = False
            s = c.stream
            if hint and p < s.neg and s.hint_due(end):
                self._end_hint(c, end)
            ev = s.push(p, end)
            if ev is not None:
                self._emit(c, ev)
            if s.state == SPEAKING and end - s.last_speech >= WINDOW:
                due[c.call_id] = (c, until)  # in a silence: the next window may decide the stop
            elif due:
                due.pop(c.call_id, None)

    def _amd(self, c: AttachedCall, window: np.ndarray, prob: float | None, start: int) -> None:
        """Feed the call's answering-machine detector the VAD window that starts at ``start``
        (in16) and its speech probability; its verdict, beep and greeting end go out with the
        call's tick events. Windows before the answer are not its. With denoise on, the
        detector's tone tests get the same span before the denoiser (``inp.pre``): a
        suppressor takes out the beep and the fax tones; the VAD window (denoised, as the
        probability was) stays what its cadence and energy read."""
        if c.amd is None:
            assert c.amd_start is not None
            first, params = c.amd_start
            if start + WINDOW <= first:
                return
            c.amd, c.amd_start = AmdDetector(params, RATE8 if c.native8 else RATE, start_pos=start), None
        t0 = time.thread_time_ns()
        pre = c.inp.pre
        tones = None
        if pre is not None and not c.native8:
            tones = pre.read(start, start + WINDOW)
            if tones is None:  # older than PRE_S (cannot happen while the VAD keeps up): the window's own
                self.stats.amd_tones_lost += 1
        try:
            out = c.amd.feed(window, prob, tones)
        except ValueError:  # a window of the wrong shape: a bug, never the audio's fault
            log.exception("call %s: AMD window refused; detection stopped", c.call_id)
            c.amd, out = None, []
        ns = time.monotonic_ns()
        for ev in out:
            c.events.append(self._amd_event(c.call_id, ev, ns))
        if c.amd is not None and c.amd.done:
            c.amd = None
        self.stats.amd_ns += time.thread_time_ns() - t0

    def amd_hear(self, c: AttachedCall, text: str) -> None:
        """The transcript of the call's screened opening (an ``AmdHear``; the tick's thread):
        its detector's verdict, if a cue decides, goes out with the call's tick events."""
        if c.amd is None:
            return
        self.stats.amd_heard += 1
        ns = time.monotonic_ns()
        for ev in c.amd.hear(text):
            c.events.append(self._amd_event(c.call_id, ev, ns))
        if c.amd.done:
            c.amd = None

    def _amd_event(self, call_id: str, ev: AmdEvent, ns: int) -> AmdVerdictEvent | AmdBeepEvent | AmdGreetingEndEvent:
        if isinstance(ev, AmdVerdict):
            self.stats.amd_verdicts += 1
            return AmdVerdictEvent(call_id=call_id, pos=ev.pos, ns=ns, verdict=ev.kind, confidence=ev.confidence,
                                   ms=ev.at_ms, rule=ev.reason)
        if isinstance(ev, AmdBeep):
            return AmdBeepEvent(call_id=call_id, pos=ev.onset_pos, ns=ns, hz=ev.freq_hz)
        return AmdGreetingEndEvent(call_id=call_id, pos=ev.end_pos, ns=ns)

    def _isolate(self, batch: list[AttachedCall], win: np.ndarray, err: Exception) -> list[float]:
        """The batched run failed: run each row alone so one bad call cannot fail the rest."""
        silero = self.silero
        assert silero is not None
        self.stats.errors["vad_batch"] = self.stats.errors.get("vad_batch", 0) + 1
        probs = [float("nan")] * len(batch)
        for i, c in enumerate(batch):
            try:
                probs[i] = float(silero.run(np.array([c.slot], dtype=np.intp), win[i : i + 1])[0])
            except Exception:
                pass
        return probs

    def _vad_failure(self, c: AttachedCall, end: int) -> None:
        st = self.stats
        st.vad_failures += 1
        was_probe = c.probe
        c.probe = False
        ev = c.stream.finish(end)  # the stream is lost: close speech, rebuild it
        if ev is not None:
            self._emit(c, ev, "vad_error")
        c.stream = VadStream(c.params)
        assert self.silero is not None
        self.silero.reset(c.slot)
        if c.health.on_failure(end) == "failed_open":
            st.failed_open += 1
            log.error("call %s: VAD failed open after %d failures", c.call_id, c.health.streak)
            c.events.append(VadFailed(call_id=c.call_id, pos=end, failures=c.health.streak,
                                      ns=time.monotonic_ns()))
        elif was_probe:
            log.info("call %s: VAD recovery probe failed", c.call_id)

    def announce(self, c: AttachedCall, utterance: int, epoch: int, tts_pos: int) -> None:
        """A TtsUtterance for ``c``: announced at once when its audio was already converted,
        else the call turns hot until its first audio lands (at most one tick)."""
        placed = c.out.announce(utterance, epoch, tts_pos)
        if placed is not None:  # its audio was already converted
            self._send_out_utterance(c, placed.utterance, placed.epoch, placed.out_pos)
        elif c.out.next_start() >= 0:
            self.hot[c.call_id] = time.monotonic_ns() + int(self.tick_s * 1e9)
            self.serve_hot()

    def serve_hot(self) -> None:
        """Convert the output of calls whose announced utterance got its first audio, now
        (outside the tick), and announce it. A call leaves the hot set once its start is
        placed, when it is gone, or after one tick (the tick converts it anyway)."""
        now = time.monotonic_ns()
        cpu0 = time.thread_time_ns()
        done: list[str] = []
        for call_id, deadline in self.hot.items():
            c = self.calls.get(call_id)
            b = c.out.next_start() if c is not None else -1
            if c is None or b < 0:
                done.append(call_id)
                continue
            have = c.out.src.write_pos - b
            if have >= c.out.src_rate // 50 or (have > 0 and now >= deadline):
                for u in c.out.step():
                    self._send_out_utterance(c, u.utterance, u.epoch, u.out_pos)
                self.stats.out_nudges += 1
                if c.out.next_start() < 0:
                    done.append(call_id)
            elif now >= deadline:
                done.append(call_id)
        for call_id in done:
            self.hot.pop(call_id, None)
        self.stats.nudge_ns += time.thread_time_ns() - cpu0

    def _send_out_utterance(self, c: AttachedCall, utterance: int, epoch: int, out_pos: int) -> None:
        payload = encode(OutUtterance(call_id=c.call_id, utterance=utterance, epoch=epoch, out_pos=out_pos))
        self._send(c.subscriber.encode(), payload)
        if c.gateway:
            self._send(c.gateway.encode(), payload)

    def _publish(self) -> None:
        """One WorkerTick per subscriber that has news: the in16 positions that advanced
        and the tick's events (an empty tick every 100 ms at least, as a keepalive)."""
        self.seq += 1
        now = time.monotonic_ns()
        orphaned: list[str] = []
        for sub, calls in self.by_sub.items():
            if not self._publish_to(sub, calls, now):
                first = self._unroutable.setdefault(sub, now)
                if now - first > self.cfg.orphan_timeout_s * 1e9:
                    orphaned.append(sub)
        for sub in orphaned:
            for c in list(self.by_sub.get(sub, [])):
                log.warning("detaching call %s: subscriber %s unreachable", c.call_id, sub)
                self.stats.orphan_detaches += 1
                self._detach(c.call_id)
            self._unroutable.pop(sub, None)

    def _publish_to(self, sub: str, calls: list[AttachedCall], now: int) -> bool:
        """Send ``sub`` the news of ``calls`` (its calls) as one WorkerTick of the current
        ``seq``: nothing when there is none and a keepalive is not due. False: not routable."""
        positions: dict[str, int] = {}
        events: list[dict[str, Any]] = []
        for c in calls:
            pos = c.inp.out_pos
            if pos != c.pub_pos:
                positions[c.call_id] = pos
                c.pub_pos = pos
            if c.events:
                events.extend([to_wire(e) for e in c.events])
                c.events.clear()
        if not positions and not events and now - self._last_pub.get(sub, 0) < self.keepalive_ns:
            return True
        self._last_pub[sub] = now
        payload = encode(WorkerTick(worker=self.index, seq=self.seq, positions=positions, events=events,
                                    sent_ns=now))
        if self._send(sub.encode(), payload):
            self._unroutable.pop(sub, None)
            return True
        return False
