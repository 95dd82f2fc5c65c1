"""Answering-machine detection on an inference worker: the detections its calls run.

Owns :class:`AmdRuns`, held by :class:`workers.core.Worker` and handed to the
realtime lane (:class:`workers.realtime.RealtimeLane` feeds it every VAD window
of a call that runs a detection, with the window's Silero probability: the
detector never runs a model of its own) and to the request dispatch
(:class:`workers.dispatch.RequestDispatch`: AmdRequest starts a detection,
AmdTranscript feeds it the call's transcript). Each detection is one
:class:`workers.amd.AmdDetector` bound to its job id and to the identity that
asked; its answers go out as AmdResult frames (no correlation id, keyed by
``(call_id, job)``, like a local job's stream) through the worker's
non-blocking send.

Invariants:

* At most one detection per call: a request while one runs is answered
  ``busy``; a finished detection is forgotten at once.
* Every detection's stream ends with exactly one ``done`` frame: its last
  answer, or ``error`` "detached" when the call goes first.
* The detector keeps audio time (one 32 ms VAD window at a time); when the
  call's audio stalls, :meth:`AmdRuns.poll` (every tick) expires it on the
  wall clock ``STALL_MS`` after its audio deadline (``max_wait_ms``, then
  ``listen_max_ms``), so an answer always comes.
* Windows of a call whose VAD failed open (no probability) are fed too: the
  detector falls back on energy.
* Owned by the thread that runs :meth:`workers.core.Worker.run`; the CPU of
  every fed window is counted in ``amd_ns``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np

from ipc.codec import Frame, encode
from ipc.frames import AmdRequest, AmdResult, AmdTranscript, JobAccepted
from workers.amd import AmdBeep, AmdDetector, AmdEvent, AmdGreetingEnd, AmdParams, AmdVerdict
from workers.call_table import AttachedCall
from workers.stats import TickStats

log = logging.getLogger("brisvox.workers.amd")

STALL_MS = 500  # wall-clock slack past a detection's audio deadline before it is expired
MAX_TEXT = 4000  # characters of transcript a detection reads (the cues are in the first words)


class _Run:
    __slots__ = ("det", "job", "ident", "verdict_ns", "listen_ns")

    def __init__(self, det: AmdDetector, job: int, ident: bytes, now_ns: int) -> None:
        self.det = det
        self.job = job
        self.ident = ident
        p = det.p
        self.verdict_ns = now_ns + (p.max_wait_ms + STALL_MS) * 1_000_000
        self.listen_ns = now_ns + (p.listen_max_ms + STALL_MS) * 1_000_000


class AmdRuns:
    """The detections of worker ``index``'s calls (see the module's invariants)."""

    def __init__(self, stats: TickStats, send: Callable[[bytes, bytes], bool]) -> None:
        self.stats = stats
        self._send = send
        self.runs: dict[str, _Run] = {}

    def start(self, c: AttachedCall | None, ident: bytes, f: AmdRequest) -> Frame:
        """An AmdRequest for ``c`` (None: not attached here) -> JobAccepted or a typed error."""
        if c is None:
            return self.stats.error("unknown_call", "amd_request for a call not attached here", f.call_id)
        run = self.runs.get(f.call_id)
        if run is not None:
            return self.stats.error("busy", f"detection {run.job} already runs for the call", f.call_id)
        try:
            params = AmdParams(max_wait_ms=f.max_wait_ms, leave_message=f.leave_message, transcripts=f.transcripts)
        except ValueError as e:
            return self.stats.error("bad_params", str(e), f.call_id)
        det = AmdDetector(params, rate=8000 if c.native8 else 16000, start_pos=c.vad_pos)
        self.runs[f.call_id] = _Run(det, f.job, ident, time.monotonic_ns())
        self.stats.amd_runs += 1
        return JobAccepted(call_id=f.call_id, job=f.job)

    def hear(self, f: AmdTranscript) -> None:
        """The call's transcript so far, for its detection ``f.job`` (other jobs: ignored)."""
        run = self.runs.get(f.call_id)
        if run is not None and run.job == f.job:
            self._answer(f.call_id, run, run.det.hear(f.text[:MAX_TEXT]))

    def feed(self, c: AttachedCall, window: np.ndarray, prob: float | None) -> None:
        """One VAD window of ``c`` (which runs a detection) and its probability (None or NaN:
        no usable probability)."""
        run = self.runs.get(c.call_id)
        if run is None:
            return
        t0 = time.thread_time_ns()
        try:
            events = run.det.feed(window, prob)
        except ValueError as e:  # a window of another width: the call's VAD rate changed under it
            log.warning("call %s: amd stopped: %s", c.call_id, e)
            self.stats.errors["amd"] = self.stats.errors.get("amd", 0) + 1
            self._end(c.call_id, run, "bad_window")
            return
        self.stats.amd_ns += time.thread_time_ns() - t0
        if events:
            self._answer(c.call_id, run, events)

    def poll(self, now_ns: int) -> None:
        """Expire the detections whose audio stalled past their deadline (every tick)."""
        for call_id, run in list(self.runs.items()):
            det = run.det
            if (det.verdict is None and now_ns >= run.verdict_ns) or now_ns >= run.listen_ns:
                self._answer(call_id, run, det.expire())

    def drop(self, call_id: str) -> None:
        """The call was detached: its detection ends with an error frame."""
        run = self.runs.get(call_id)
        if run is not None:
            self._end(call_id, run, "detached")

    def _answer(self, call_id: str, run: _Run, events: list[AmdEvent]) -> None:
        last = len(events) - 1
        for i, ev in enumerate(events):
            done = run.det.done and i == last
            self._send(run.ident, encode(_frame(call_id, run.job, ev, done)))
        if run.det.done:
            self.runs.pop(call_id, None)

    def _end(self, call_id: str, run: _Run, error: str) -> None:
        self.runs.pop(call_id, None)
        self._send(run.ident, encode(AmdResult(call_id=call_id, job=run.job, event="end", took_ms=run.det.t_ms,
                                               done=True, error=error)))


def _frame(call_id: str, job: int, ev: AmdEvent, done: bool) -> AmdResult:
    if isinstance(ev, AmdVerdict):
        return AmdResult(call_id=call_id, job=job, event="verdict", pos=ev.pos, took_ms=ev.at_ms, verdict=ev.kind,
                         confidence=ev.confidence, reason=ev.reason, done=done)
    if isinstance(ev, AmdBeep):
        return AmdResult(call_id=call_id, job=job, event="beep", pos=ev.onset_pos, took_ms=ev.at_ms,
                         freq_hz=ev.freq_hz, done=done)
    assert isinstance(ev, AmdGreetingEnd)
    return AmdResult(call_id=call_id, job=job, event="greeting_end", pos=ev.end_pos, took_ms=ev.at_ms,
                     reason=ev.reason, done=done)
