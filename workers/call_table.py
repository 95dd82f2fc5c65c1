"""The inference worker's attached calls: per-call state, attach, detach and retirement.

Owns :class:`AttachedCall` (one attached call: its four rings, the converters, the
VAD state and its window grid) and :class:`AttachedCalls`, the calls attached
to this worker (held by :class:`workers.core.Worker`; the realtime lane and
the request dispatch are handed the same object). Named for what it is:
the calls AttachCall gave this worker, with their Silero slots and their
subscribers; the gateway's call table (``brisvox/gateway/core/calls.py``) admits
the calls and owns their rings.

* AttachCall maps a call's four rings (in, in16, tts, out) and gives it a
  Silero state slot; DetachCall unmaps them. The rings belong to the gateway;
  a worker only ever writes ``in16`` and ``out``, and only while the call is
  attached to it (one writer at a time).
* VAD windows sit on a fixed grid (``GRID_PHASE``) so a window never waits for
  the next 20 ms frame because of the resampler's 4-sample hold-back.

Invariants:

* An attach is idempotent: a retried attach (or a new owner taking over)
  answers the current in16 position and only moves the call to the new
  subscriber; it never maps the rings twice.
* A call is attached only with all four rings mapped at their expected rates
  and a free Silero slot; otherwise nothing is kept (rings closed) and the
  request gets a typed error (``bad_rate``, ``bad_params``, ``bad_ring``,
  ``full``). Nothing attaches before :meth:`AttachedCalls.load` (no slots).
* ``[audio] denoise`` (AttachCall ``denoise``): a call with it on gets its own
  :class:`workers.denoise.Denoiser` inside its InputChain (in16 and the VAD see
  denoised audio, ``in`` stays raw; native 8 kHz VAD is off for it, the VAD
  reads in16; answering-machine detection's tone tests read the InputChain's
  ``pre``, the in16 stream before the denoiser, at the same positions) and
  waits ``max_hold`` in16 samples longer for each VAD window; an unknown value
  refuses the attach (``bad_params``). The attach never waits for a model to load: :class:`workers.denoise.ModelLoader` builds it on its own
  thread (DeepFilterNet: 0.3-2.4 s) and the call's audio passes through raw
  until it is there (``denoise_late``); a model that cannot load, or fails
  later, fails open (counted in ``denoise_failures``).
* A re-attach after a worker died during speech starts with a synthesized
  stop (``reason`` ``worker_lost``) where the in16 ring ends.
* Detach closes the call's rings, frees its slot and then calls ``on_detach``
  with the call id (the worker runs :data:`workers.jobs.DETACH_HOOKS`); a call
  is in ``calls`` and in exactly one subscriber's ``by_sub`` list, or in
  neither.
* ``calls`` and ``by_sub`` are created once and never rebound (others hold
  them: the realtime lane reads them every tick); ``free_slots`` holds every
  slot no attached call has.
* Each call remembers the incarnation of the subscriber process that
  attached it. A SubscriberHello (or an AttachCall) naming a non-empty
  incarnation retires, at once, every call of that subscriber identity
  attached by another incarnation (:meth:`AttachedCalls.retire`: detached and
  unmapped, counted in ``retired_calls``, logged once per retirement): a
  restarted agent keeps its identity, so the orphan timeout alone never
  fires for its dead predecessor's calls. The worker never unlinks a
  call's rings (the gateway owns them). The same incarnation again keeps
  its calls; so does an empty one (a subscriber that does not say).
* Owned by the thread that runs :meth:`workers.core.Worker.run`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from ipc.codec import Frame
from ipc.frames import AttachCall, Attached
from ipc.ring import Ring, RingError, ring_name
from ipc.tick_events import SpeechStop, TickEvent
from workers.amd import AmdDetector, AmdParams
from workers.config import VadConfig, WorkersConfig
from workers.denoise import MODES, Denoiser, ModelLoader
from workers.resample import RATE16, InputChain, OutputChain, resume_in_pos
from workers.stats import TickStats
from workers.vad import RATE8, WINDOW, WINDOW8, SileroBatch, VadHealth, VadParams, VadStream

PEND_S = 2  # seconds of audio waiting for the VAD, per call, at most
HOLDBACK16 = 4  # in16 samples soxr QQ may hold back (measured: 4 from 8 kHz, <= 2 from higher rates)
# VAD windows end at in16 positions == GRID_PHASE (mod GRID): 8 samples before a multiple of 32.
# Frames of any multiple of 2 ms end on multiples of 32 in16 samples, so a window's last sample
# plus the resampler's hold-back never needs the NEXT frame (with windows ending on frame
# boundaries, every 5th window of 20 ms frames at 8 kHz waited one frame more: +20 ms).
GRID = 32
GRID_PHASE = 24
MAX_RATE = 192_000

log = logging.getLogger("brisvox.workers")


class AttachedCall:
    """One attached call: rings, converters, VAD state. Owned by the tick thread."""

    __slots__ = ("call_id", "subscriber", "incarnation", "gateway", "slot", "rings", "inp", "out", "params", "stream",
                 "health", "pend", "pend_n", "pend_off", "vad_pos", "events", "in16_name", "probe",
                 "attached_ns", "fall_ref", "need_in", "hold16", "conv_ns", "pub_pos", "native8", "win",
                 "amd", "amd_start")

    def __init__(self, call_id: str, subscriber: str, gateway: str, slot: int, rings: dict[str, Ring],
                 inp: InputChain, out: OutputChain, params: VadParams, health: VadHealth,
                 native8: bool = False, incarnation: str = "") -> None:
        self.call_id = call_id
        self.subscriber = subscriber
        self.incarnation = incarnation  # of the subscriber process that attached it
        self.gateway = gateway
        self.slot = slot
        self.rings = rings
        self.inp = inp
        self.out = out
        self.params = params
        self.stream = VadStream(params)
        self.health = health
        # the VAD reads the `in` samples of an 8 kHz call at their own rate (Silero's 8 kHz mode):
        # `pend` holds VAD-rate samples, `win` of them per 32 ms window; `vad_pos` is in16 either way
        self.native8 = native8 and inp.rate == RATE8
        self.win = WINDOW8 if self.native8 else WINDOW
        self.pend = np.zeros(PEND_S * (RATE8 if self.native8 else RATE16), dtype=np.int16)
        self.pend_n = 0
        self.pend_off = 0
        self.vad_pos = 0
        self.align()
        self.events: list[TickEvent] = []  # this tick's, sent with the next WorkerTick
        self.in16_name = rings["in16"].name
        self.probe = False
        self.attached_ns = time.monotonic_ns()
        self.fall_ref = (-1, -1)  # (raw stop pos, refined pos) announced by the last falling event
        # convert when in16 (not only `in`) covers the window: a stop's `at` is then always in
        # in16 when it is published (Smart Turn reads up to it; the actor defers until it is)
        self.hold16 = 0 if inp.rate == RATE16 else HOLDBACK16
        if inp.denoise is not None:  # what the denoiser holds (its frame, its delay)
            self.hold16 += inp.denoise.max_hold
        self.need_in = 0  # the in position that completes the next VAD window: convert then
        self.conv_ns = 0  # when the input was last converted
        self.pub_pos = -1  # the in16 position last published
        # answering-machine detection (AmdStart): the detector fed every VAD window from the
        # answer's in16 position on (`amd_start`: its params, until that window comes)
        self.amd: AmdDetector | None = None
        self.amd_start: tuple[int, AmdParams] | None = None

    def align(self) -> None:
        """Restart the VAD where the input continues, on the window grid (in16 positions):
        the stream starts up to 31 in16 samples earlier, with those samples taken from the
        ring the VAD reads (in16, or ``in`` for native 8 kHz; zeros where there are none)."""
        if self.native8:
            pos = 2 * self.inp.in_pos  # in16 sample 2k is in sample k (QQ has no delay)
        else:
            pos = self.inp.out_pos
        start = pos - ((pos - GRID_PHASE) % GRID)
        self.vad_pos = start
        self.pend_off = 0
        if self.native8:
            lo, hi, ring = start // 2, pos // 2, self.rings["in"]
        else:
            lo, hi, ring = start, pos, self.rings["in16"]
        self.pend_n = hi - lo
        self.pend[: self.pend_n] = 0
        if hi > 0 and self.pend_n:
            got = ring.read_range(max(0, lo), hi)
            self.pend[self.pend_n - len(got.samples) : self.pend_n] = got.samples

    def schedule(self) -> None:
        """Set ``need_in`` from the VAD position: the input is converted when the
        next window is complete (or after ``fresh_ms`` at the latest)."""
        inp = self.inp
        have = self.pend_n - self.pend_off
        if have >= self.win:
            self.need_in = 0  # a full window is already waiting (VAD rounds ran out)
        else:
            needed = self.vad_pos + WINDOW  # in16
            self.need_in = resume_in_pos(needed + self.hold16, inp.rate)

    def close(self) -> None:
        for r in self.rings.values():
            r.close()
        if self.inp.denoise is not None:
            self.inp.denoise.close()


class _RateMismatch(Exception):
    pass


class AttachedCalls:
    """The calls attached to worker ``index`` (see the module's invariants)."""

    def __init__(self, index: int, cfg: WorkersConfig, vad: VadConfig, stats: TickStats,
                 on_detach: Callable[[str], None]) -> None:
        self.index = index
        self.cfg = cfg
        self.vad_cfg = vad
        self.params = vad.params()
        self.stats = stats
        self._on_detach = on_detach
        self.silero: SileroBatch | None = None
        self.calls: dict[str, AttachedCall] = {}
        self.by_sub: dict[str, list[AttachedCall]] = {}
        self.free_slots: list[int] = []
        # the calls' denoise models, built off the tick thread (tests may replace it before an attach)
        self.denoise_models = ModelLoader(capacity=cfg.max_calls)

    def load(self, silero: SileroBatch, capacity: int) -> None:
        """The loaded VAD model: its ``capacity`` state slots are free (before any attach)."""
        self.silero = silero
        self.free_slots = list(range(capacity - 1, -1, -1))

    def retire(self, subscriber: str, incarnation: str) -> int:
        """Detach every call of ``subscriber`` attached by an incarnation other than
        ``incarnation`` (its process was replaced); returns how many. An empty
        ``incarnation`` retires nothing."""
        if not incarnation:
            return 0
        stale = [c for c in self.by_sub.get(subscriber, ()) if c.incarnation != incarnation]
        if not stale:
            return 0
        for c in stale:
            self.detach(c.call_id)
        self.stats.retired_calls += len(stale)
        self.stats.retirements += 1
        log.warning("worker-%d: subscriber %s is a new process (incarnation %s): detached the %d calls "
                    "of its previous incarnation", self.index, subscriber, incarnation, len(stale))
        return len(stale)

    def attach(self, f: AttachCall) -> Frame:
        self.retire(f.subscriber, f.incarnation)
        existing = self.calls.get(f.call_id)
        if existing is not None:  # idempotent: a retried attach, or a new owner taking over
            if f.incarnation:
                existing.incarnation = f.incarnation
            if existing.subscriber != f.subscriber:
                self._unindex(existing)
                existing.subscriber = f.subscriber
                self.by_sub.setdefault(f.subscriber, []).append(existing)
            return Attached(call_id=f.call_id, worker=self.index, in16_pos=existing.inp.out_pos)
        for name, rate in (("call_rate", f.call_rate), ("tts_rate", f.tts_rate)):
            if not 1000 <= rate <= MAX_RATE:
                return self.stats.error("bad_rate", f"{name} {rate} out of range", f.call_id)
        try:
            params = self.params.merged(f.vad)
        except ValueError as e:
            return self.stats.error("bad_params", str(e), f.call_id)
        if f.denoise not in MODES:
            return self.stats.error("bad_params", f"denoise {f.denoise!r}: expected one of {', '.join(MODES)}",
                                    f.call_id)
        if not self.free_slots:
            return self.stats.error("full", f"worker-{self.index} serves {len(self.calls)} calls (max_calls)", f.call_id)
        rings: dict[str, Ring] = {}
        try:
            for kind, rate in (("in", f.call_rate), ("in16", RATE16), ("tts", f.tts_rate), ("out", f.call_rate)):
                r = Ring.attach(ring_name(f.instance, f.call_id, kind, f.ring_key))
                rings[kind] = r
                if r.rate != rate:
                    raise _RateMismatch(f"ring {r.name}: rate {r.rate}, expected {rate}")
        except (RingError, _RateMismatch) as e:
            for r in rings.values():
                r.close()
            return self.stats.error("bad_rate" if isinstance(e, _RateMismatch) else "bad_ring", str(e), f.call_id)
        denoiser = None
        if f.denoise != "off":  # never waits for a load: a model still loading passes the audio raw
            denoiser = Denoiser(self.denoise_models.request(f.denoise), f.call_id, on_fail=self._denoise_failed)
            self.stats.denoised_calls += 1
            if denoiser.pending is not None and denoiser.pending.loading:
                self.stats.denoise_late += 1
        slot = self.free_slots.pop()
        assert self.silero is not None
        self.silero.reset(slot)
        inp = InputChain(rings["in"], rings["in16"], f.call_rate, self.cfg.max_read_ms / 1000.0, denoiser)
        out = OutputChain(rings["tts"], rings["out"], f.tts_rate, f.call_rate, self.cfg.max_read_ms / 1000.0)
        health = VadHealth(self.vad_cfg.max_consecutive_failures, self.vad_cfg.failure_window,
                           self.vad_cfg.recovery_interval)
        # the VAD reads what the STT reads: with denoise on, the denoised in16 (never raw `in`)
        c = AttachedCall(f.call_id, f.subscriber, f.gateway, slot, rings, inp, out, params, health,
                 native8=self.vad_cfg.native_8k and denoiser is None, incarnation=f.incarnation)
        if f.speaking_since >= 0:
            # the previous worker died during speech: close it where its in16 ended
            at = inp.out_pos
            c.events.append(SpeechStop(call_id=c.call_id, pos=max(f.speaking_since, at), at=at,
                                       ns=time.monotonic_ns(), reason="worker_lost"))
        self.calls[f.call_id] = c
        self.by_sub.setdefault(f.subscriber, []).append(c)
        return Attached(call_id=f.call_id, worker=self.index, in16_pos=inp.out_pos)

    def _denoise_failed(self, e: Exception) -> None:
        self.stats.denoise_failures += 1

    def _unindex(self, c: AttachedCall) -> None:
        lst = self.by_sub.get(c.subscriber)
        if lst is not None:
            try:
                lst.remove(c)
            except ValueError:
                pass
            if not lst:
                del self.by_sub[c.subscriber]

    def detach(self, call_id: str) -> bool:
        c = self.calls.pop(call_id, None)
        if c is None:
            return False
        self._unindex(c)
        self.free_slots.append(c.slot)
        c.close()
        self._on_detach(call_id)
        return True

    def close(self) -> None:
        """Unmap every call's rings and forget them (worker shutdown: no detach hooks)."""
        for c in list(self.calls.values()):
            c.close()
        self.calls.clear()
        self.by_sub.clear()
        self.denoise_models.close()
