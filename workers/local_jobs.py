"""Local STT/TTS/LLM jobs on an inference worker: request handling, lanes, runners.

Owns the worker side of the no-key stack (the local models a call uses when no
provider key is configured; docs/PROVIDERS.md, "The local stack"). It registers
with :mod:`workers.jobs` (FRAME_HANDLERS, DETACH_HOOKS, CLOSE_HOOKS), so the
worker core serves SttJob, TtsJob, LlmJob and JobCancel without knowing the
models. Nothing heavy is imported here: each model loads on its lane thread at
its first job (or at a warm-up job).

* One JobLane per kind ("stt", "tts", "llm"; one thread each, created on the
  first job), kept in ``worker.extra_lanes``: a 1 s LLM generation never
  delays a transcription, a Smart Turn analysis or a VAD tick.
* SttJob reads the utterance ``[start_pos, end_pos)`` straight from the
  call's in16 ring and answers SttJobResult (correlation id); the empty span
  ``[0, 0)`` is a warm-up (the model loads, nothing is transcribed).
* TtsJob / LlmJob are answered JobAccepted at once; their output streams
  without correlation id: TtsJobAudio names positions in the call's
  job-output ring ``ttsjob<worker>`` (created by this worker, written only by
  its TTS lane thread, unlinked at detach by that thread), LlmJobDelta carries
  text. A streaming job ALWAYS ends with a ``done`` frame (error, expiry and
  cancellation included), so the actor never waits on a job that died.
* JobCancel flags the call's job on every lane; runners stop at their next
  sentence / token.
* Model files are located by :func:`workers.models.locate` in the worker's
  models directory; a missing model answers ``unsupported`` naming the fix.
  The handlers run on the worker's main loop, so there a job's models are
  checked for presence and size only (a ``stat``); the lane thread that runs
  the job verifies their hash before the model is used (once per process:
  ``workers.models.check`` remembers a verified file's stat), and a file that
  fails it ends that job with ``unsupported`` and is refused at the handler
  from then on. Before, every job's handler hashed its model file on the main
  loop: about 400 ms per LLM job for the default GGUF, while every call's VAD
  ticks waited.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ipc.codec import Frame
from ipc.frames import (
    ErrorReply,
    JobAccepted,
    JobCancel,
    LlmJob,
    LlmJobDelta,
    SttJob,
    SttJobResult,
    TtsJob,
    TtsJobAudio,
)
from workers.jobs import CLOSE_HOOKS, DETACH_HOOKS, FRAME_HANDLERS, Job, JobLane

log = logging.getLogger("brisvox.workers.local")

TTS_RATE = 22_050
TTS_RING_SAMPLES = 1 << 20  # 47 s at 22,050 Hz: the actor reads far faster than that
STT_TIMEOUT_NS = 20_000_000_000
LANE_CAPACITY = 64
FAR = 1 << 62
MAX_TEXT = 4000
MAX_MESSAGES_BYTES = 192 * 1024


@dataclass
class _Local:
    """Per-worker state of the local stack (created on first use)."""

    models_dir: Path
    whisper: Any = None
    piper: Any = None
    llama: dict[str, Any] = field(default_factory=dict)  # LLM catalogue name -> LlamaRunner
    rings: dict[str, Any] = field(default_factory=dict)  # call_id -> job-output Ring (TTS lane thread)
    lock: threading.Lock = field(default_factory=threading.Lock)
    missing: dict[str, str] = field(default_factory=dict)
    spare: Any = None  # workers.local_llm.SpareCores: the LLM's threads per generation (run_llm)


_STATE: dict[int, _Local] = {}


def _local(worker: Any) -> _Local:
    st = _STATE.get(id(worker))
    if st is None:
        silero = getattr(getattr(worker, "models", None), "silero", None)
        d = Path(silero).parent if silero else None
        from workers.models import models_dir

        st = _Local(models_dir=d or models_dir(None))
        _STATE[id(worker)] = st
    return st


def _lane(worker: Any, kind: str) -> JobLane:
    lane: JobLane | None = worker.extra_lanes.get(kind)
    if lane is None:
        lane = JobLane(kind, lambda job: _RUNNERS[job.kind](worker, job), worker.notify, threads=1,
                       capacity=LANE_CAPACITY, nice=worker.cfg.job_nice)
        lane.start()
        worker.extra_lanes[kind] = lane
    return lane


def _model_paths(st: _Local, kind: str, llm: str = "", verify: bool = True) -> dict[str, Path] | str:
    """Verified model paths for a kind (``llm``: which LLM), or the error text (an error is
    remembered per worker; a verified file is hashed once per process: ``workers.models.check``).
    ``verify=False`` (the handlers, on the main loop): present and of the right size only."""
    from workers.local_llm import DEFAULT_LLM
    from workers.models import ModelError, locate

    names = {"stt": ["whisper_tiny_en", "whisper_tiny_en_config", "whisper_tiny_en_tokenizer",
                     "whisper_tiny_en_vocabulary"],
             "tts": ["piper_joe", "piper_joe_config"], "llm": [llm or DEFAULT_LLM]}[kind]
    key = f"llm:{names[0]}" if kind == "llm" else kind
    if key in st.missing:
        return st.missing[key]
    try:
        return {n: locate(n, st.models_dir, verify) for n in names}
    except ModelError as e:
        st.missing[key] = str(e)
        return str(e)


def _err(worker: Any, kind: str, detail: str, call_id: str) -> ErrorReply:
    return worker.stats.error(kind, detail, call_id)


# -- request handlers (worker main thread) ------------------------------------------------------


def handle_stt(worker: Any, ident: bytes, cid: Any, f: SttJob) -> Frame | None:
    c = worker.calls.get(f.call_id)
    if c is None:
        return _err(worker, "unknown_call", "stt_job for a call not attached here", f.call_id)
    w = c.inp.out_pos
    cap = c.rings["in16"].capacity
    warm = f.start_pos == f.end_pos == 0  # a warm-up: load the model, transcribe nothing
    if not warm and (not (0 <= f.start_pos < f.end_pos <= w) or f.start_pos < w - cap):
        return _err(worker, "bad_range", f"[{f.start_pos}, {f.end_pos}) outside the in16 ring's "
                    f"[{max(0, w - cap)}, {w}]", f.call_id)
    if f.deadline_ns <= time.monotonic_ns():
        return _err(worker, "expired", "deadline already passed", f.call_id)
    got = _model_paths(_local(worker), "stt", verify=False)
    if isinstance(got, str):
        return _err(worker, "unsupported", got, f.call_id)
    job = Job("stt", f.call_id, (ident, cid), f.deadline_ns, STT_TIMEOUT_NS,
              {"ring": c.in16_name, "start": f.start_pos, "end": f.end_pos, "language": f.language,
               "max_tokens": f.max_tokens, "dir": got["whisper_tiny_en"].parent, "warm": warm},
              received_ns=time.monotonic_ns())
    if not _lane(worker, "stt").submit(job):
        return _err(worker, "busy", "stt job queue full", f.call_id)
    return None


def handle_tts(worker: Any, ident: bytes, cid: Any, f: TtsJob) -> Frame | None:
    c = worker.calls.get(f.call_id)
    if c is None:
        return _err(worker, "unknown_call", "tts_job for a call not attached here", f.call_id)
    got = _model_paths(_local(worker), "tts", verify=False)
    if isinstance(got, str):
        return _err(worker, "unsupported", got, f.call_id)
    if len(f.text) > MAX_TEXT:
        return _err(worker, "bad_params", f"text over {MAX_TEXT} characters", f.call_id)
    from ipc.ring import sibling_name

    ring = sibling_name(c.in16_name, f"ttsjob{worker.index}")  # the call's ring key is in the name
    job = Job("tts", f.call_id, (ident, None), FAR, 0,
              {"job": f.job, "text": f.text, "speed": f.speed, "deadline": f.deadline_ns, "ring_name": ring,
               "model": got["piper_joe"], "config": got["piper_joe_config"]},
              received_ns=time.monotonic_ns())
    if not _lane(worker, "tts").submit(job):
        return _err(worker, "busy", "tts job queue full", f.call_id)
    return JobAccepted(call_id=f.call_id, job=f.job)


def handle_llm(worker: Any, ident: bytes, cid: Any, f: LlmJob) -> Frame | None:
    if f.call_id not in worker.calls:
        return _err(worker, "unknown_call", "llm_job for a call not attached here", f.call_id)
    from workers.local_llm import DEFAULT_LLM, LLM_MODELS

    name = f.model or DEFAULT_LLM
    if name not in LLM_MODELS:
        return _err(worker, "bad_params", f"unknown local model {name!r} (known: {', '.join(LLM_MODELS)})",
                    f.call_id)
    if not (0.0 <= f.temperature <= 2.0 and 0.5 <= f.repeat_penalty <= 2.0):
        return _err(worker, "bad_params", "temperature must be in [0, 2] and repeat_penalty in [0.5, 2]",
                    f.call_id)
    got = _model_paths(_local(worker), "llm", name, verify=False)
    if isinstance(got, str):
        return _err(worker, "unsupported", got, f.call_id)
    job = Job("llm", f.call_id, (ident, None), FAR, 0,
              {"job": f.job, "messages": f.messages, "max_tokens": max(1, min(f.max_tokens, 1024)),
               "temperature": f.temperature, "deadline": f.deadline_ns, "name": name, "model": got[name],
               "repeat_penalty": f.repeat_penalty, "seed": f.seed},
              received_ns=time.monotonic_ns())
    if not _lane(worker, "llm").submit(job):
        return _err(worker, "busy", "llm job queue full", f.call_id)
    return JobAccepted(call_id=f.call_id, job=f.job)


def handle_cancel(worker: Any, ident: bytes, cid: Any, f: JobCancel) -> Frame | None:
    for name in ("tts", "llm"):
        lane = worker.extra_lanes.get(name)
        if lane is not None:
            lane.cancel(lambda j: j.call_id == f.call_id and j.args.get("job") == f.job)
    return None


def on_detach(worker: Any, call_id: str) -> None:
    for lane in worker.extra_lanes.values():
        lane.cancel(lambda j: j.call_id == call_id)
    st = _STATE.get(id(worker))
    if st is None:
        return
    if st.whisper is not None:
        st.whisper.forget(call_id)
    with st.lock:
        runners = list(st.llama.values())
    for runner in runners:  # the LLM lane may hold the context: the cache and owner are its own, see forget
        runner.forget(call_id)
    with st.lock:  # writes hold the lock too: a running job finds the ring closed and ends
        ring = st.rings.pop(call_id, None)
        if ring is not None:
            ring.unlink()
            ring.close()


def on_close(worker: Any) -> None:
    st = _STATE.pop(id(worker), None)
    if st is None:
        return
    with st.lock:
        for ring in st.rings.values():
            ring.unlink()
            ring.close()
        st.rings.clear()
    if st.piper is not None:
        st.piper.close()


FRAME_HANDLERS.update({SttJob: handle_stt, TtsJob: handle_tts, LlmJob: handle_llm, JobCancel: handle_cancel})
DETACH_HOOKS.append(on_detach)
CLOSE_HOOKS.append(on_close)


# -- runners (lane threads) ------------------------------------------------------------------------


def run_stt(worker: Any, job: Job) -> Frame:
    from ipc.ring import Ring
    from workers.local_stt import WhisperRunner

    st = _local(worker)
    bad = _model_paths(st, "stt")  # the hash, on this thread (once per process)
    if isinstance(bad, str):
        return ErrorReply(kind="unsupported", call_id=job.call_id, detail=bad[:500])
    if st.whisper is None:
        st.whisper = WhisperRunner(job.args["dir"])
    a = job.args
    if a.get("warm"):
        st.whisper.load()
        return SttJobResult(call_id=job.call_id, text="", start_pos=0, end_pos=0,
                            queued_us=(job.started_ns - job.received_ns) // 1000, took_us=0)
    ring = Ring.attach(a["ring"])
    try:
        got = ring.read_range(int(a["start"]), int(a["end"]))
    finally:
        ring.close()
    out = st.whisper.transcribe(np.asarray(got.samples), a["language"], int(a["max_tokens"]), call_id=job.call_id,
                                at=got.start)
    return SttJobResult(call_id=job.call_id, text=out.text, start_pos=got.start, end_pos=got.start + len(got.samples),
                        queued_us=(job.started_ns - job.received_ns) // 1000, took_us=int(out.took_s * 1e6))


def _tts_ring(st: _Local, worker: Any, job: Job) -> Any:
    from ipc.ring import Ring

    with st.lock:
        ring = st.rings.get(job.call_id)
    if ring is not None:
        return ring
    if job.call_id not in worker.calls:
        raise RuntimeError("the call was detached")
    name = str(job.args["ring_name"])
    try:
        ring = Ring.create(name, TTS_RING_SAMPLES, TTS_RATE)
    except FileExistsError:  # left by a crashed run of this worker index: take the name over
        from ipc.ring import SHM_DIR

        (SHM_DIR / name).unlink(missing_ok=True)
        ring = Ring.create(name, TTS_RING_SAMPLES, TTS_RATE)
    with st.lock:
        st.rings[job.call_id] = ring
    return ring


def run_tts(worker: Any, job: Job) -> Frame:
    st = _local(worker)
    a = job.args
    jid = int(a["job"])
    ring_label = ""

    def done(start: int, end: int, error: str = "") -> TtsJobAudio:
        return TtsJobAudio(call_id=job.call_id, job=jid, ring=ring_label, rate=TTS_RATE, start_pos=start,
                           end_pos=end, done=True, error=error)

    if time.monotonic_ns() > int(a["deadline"]):
        return done(0, 0, "expired")
    if job.cancelled:
        return done(0, 0, "cancelled")
    bad = _model_paths(st, "tts")  # the hash, on this thread (once per process)
    if isinstance(bad, str):
        return done(0, 0, f"unsupported: {bad[:300]}")
    try:
        from workers.local_tts import PiperRunner

        if st.piper is None:
            st.piper = PiperRunner(a["model"], a["config"])
        ring = _tts_ring(st, worker, job)
        ring_label = ring.name
        start = pos = ring.write_pos
        lane = worker.extra_lanes["tts"]
        for pcm in st.piper.synthesize(a["text"], float(a["speed"]), cancelled=lambda: job.cancelled):
            if job.cancelled:
                continue
            s0 = pos
            with st.lock:
                pos = ring.write(pcm)
            lane.emit(job, TtsJobAudio(call_id=job.call_id, job=jid, ring=ring.name, rate=TTS_RATE,
                                       start_pos=s0, end_pos=pos))
        return done(start, pos, "cancelled" if job.cancelled else "")
    except Exception as e:  # noqa: BLE001 - the stream must end with a done frame
        log.warning("tts job failed: %s", type(e).__name__)
        return done(0, 0, f"job_failed: {type(e).__name__}: {str(e)[:200]}")


def run_llm(worker: Any, job: Job) -> Frame:
    st = _local(worker)
    a = job.args
    jid = int(a["job"])
    seq = [0]

    def frame(**kw: Any) -> LlmJobDelta:
        f = LlmJobDelta(call_id=job.call_id, job=jid, seq=seq[0], **kw)
        seq[0] += 1
        return f

    if time.monotonic_ns() > int(a["deadline"]):
        return frame(done=True, error="expired")
    if job.cancelled:
        return frame(done=True, stop_reason="cancelled")
    bad = _model_paths(st, "llm", a["name"])  # the hash, on this thread (once per process)
    if isinstance(bad, str):
        return frame(done=True, error=f"unsupported: {bad[:300]}")
    try:
        from workers.local_llm import LlamaRunner

        with st.lock:
            runner = st.llama.get(a["name"])
            if runner is None:
                runner = st.llama[a["name"]] = LlamaRunner(a["model"])
        lane = worker.extra_lanes["llm"]
        if st.spare is None:
            from workers.local_llm import SpareCores

            st.spare = SpareCores()
        threads = st.spare.threads(worker.cfg.llm_threads)  # the host's idle cores since the last one ended
        try:
            out = runner.generate(a["messages"], int(a["max_tokens"]), float(a["temperature"]),
                                  cancelled=lambda: job.cancelled, emit=lambda t: lane.emit(job, frame(text=t)),
                                  repeat_penalty=float(a["repeat_penalty"]), seed=int(a["seed"]),
                                  call_id=job.call_id, threads=threads)
        finally:
            st.spare.mark()
        return frame(done=True, stop_reason=out.stop_reason, input_tokens=out.input_tokens,
                     output_tokens=out.output_tokens)
    except Exception as e:  # noqa: BLE001 - the stream must end with a done frame
        log.warning("llm job failed: %s", type(e).__name__)
        return frame(done=True, error=f"job_failed: {type(e).__name__}: {str(e)[:200]}")


_RUNNERS = {"stt": run_stt, "tts": run_tts, "llm": run_llm}


def warm(worker: Any, kinds: tuple[str, ...] = ("stt", "tts", "llm")) -> dict[str, float]:
    """Load the local models now (worker boot, the bench): seconds per model."""
    st = _local(worker)
    out: dict[str, float] = {}
    for kind in kinds:
        got = _model_paths(st, kind)
        if isinstance(got, str):
            continue
        t0 = time.perf_counter()
        if kind == "stt":
            from workers.local_stt import WhisperRunner

            st.whisper = st.whisper or WhisperRunner(got["whisper_tiny_en"].parent)
            st.whisper.load()
        elif kind == "tts":
            from workers.local_tts import PiperRunner

            st.piper = st.piper or PiperRunner(got["piper_joe"], got["piper_joe_config"])
            st.piper.load()
        else:
            from workers.local_llm import DEFAULT_LLM, LlamaRunner

            runner = st.llama.setdefault(DEFAULT_LLM, LlamaRunner(got[DEFAULT_LLM]))
            runner.load()
        out[kind] = time.perf_counter() - t0
    return out
