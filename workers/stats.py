"""The inference worker's counters: one :class:`TickStats` per worker, shared by its parts.

Owns :class:`TickStats`, the counters the worker exports with each report (and
that the bench reads). :class:`workers.core.Worker` creates ONE instance and
passes it explicitly to each collaborator that counts
(:class:`workers.call_table.AttachedCalls`, :class:`workers.realtime.RealtimeLane`,
:class:`workers.dispatch.RequestDispatch`).

Invariants:

* Counters only ever grow (``tick_max_ns`` is a maximum); ``errors`` maps a
  typed error's kind to how many times it was answered or met.
* Written only by the thread that runs :meth:`workers.core.Worker.run`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ipc.frames import ErrorReply


@dataclass
class TickStats:
    """Counters of the worker: the realtime lane's, the call table's and the typed errors."""

    ticks: int = 0
    overruns: int = 0  # ticks that started more than one interval late
    vad_runs: int = 0
    vad_rows: int = 0
    vad_failures: int = 0
    failed_open: int = 0
    recoveries: int = 0
    gaps: int = 0
    pend_overflows: int = 0
    events: int = 0
    send_failed: int = 0
    orphan_detaches: int = 0
    retired_calls: int = 0  # calls detached because their subscriber came back as a new process
    retirements: int = 0  # how many times that happened (one log line each)
    tick_ns: int = 0  # wall time inside ticks
    tick_cpu_ns: int = 0  # CPU time of the tick thread inside ticks, and per phase:
    input_ns: int = 0
    vad_ns: int = 0
    output_ns: int = 0
    send_ns: int = 0
    tick_max_ns: int = 0
    out_nudges: int = 0  # utterance starts converted and announced outside a tick
    nudge_ns: int = 0  # CPU time of those conversions
    end_hints: int = 0  # stop windows counted from the signal's end of speech (VadStream.speech_ended_at)
    end_hints_moved: int = 0  # of those, the ones that moved the end before Silero's last speech window
    vad_prompt: int = 0  # windows of due calls (in a silence) scored outside the tick, as their audio came
    prompt_ns: int = 0  # CPU time of those runs (conversion, VAD, publish)
    amd_started: int = 0  # answering-machine detections asked for (AmdStart)
    amd_verdicts: int = 0  # their verdicts sent
    amd_heard: int = 0  # transcripts of screened openings given to a detector (AmdHear)
    amd_ns: int = 0  # CPU time of the tick thread inside the detectors
    amd_tones_lost: int = 0  # denoised calls' AMD windows whose pre-denoise span was gone (tones read denoised)
    denoised_calls: int = 0  # calls attached with `[audio] denoise` on
    denoise_failures: int = 0  # calls whose denoiser failed open (raw audio from then on)
    denoise_late: int = 0  # calls whose model was still loading at attach (raw audio until it was there)
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, kind: str, detail: str, call_id: str = "") -> ErrorReply:
        """A typed error reply, counted in ``errors``."""
        self.errors[kind] = self.errors.get(kind, 0) + 1
        return ErrorReply(kind=kind, detail=detail, call_id=call_id)
