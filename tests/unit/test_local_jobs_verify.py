"""Where a local job's model file is verified (workers/local_jobs.py): the handler, on the
worker's main loop, checks presence and size only (a stat, never a read of the file); the lane
thread that runs the job verifies the hash before the model is used, ends the job
``unsupported`` when it does not match, and the handler refuses the model from then on."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ipc.frames import ErrorReply, JobAccepted, LlmJob
from workers import local_jobs, models
from workers.jobs import Job
from workers.local_llm import DEFAULT_LLM
from workers.model_catalogue import CATALOGUE, ModelSpec

GOOD = b"gguf model bytes " * 64


class Lane:
    def __init__(self) -> None:
        self.jobs: list[Job] = []

    def submit(self, job: Job) -> bool:
        self.jobs.append(job)
        return True

    def emit(self, job: Job, frame: Any) -> None:
        raise AssertionError("a job whose model failed its hash must not run")


@pytest.fixture
def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    spec = CATALOGUE[DEFAULT_LLM]
    monkeypatch.setitem(CATALOGUE, DEFAULT_LLM, ModelSpec(**{
        **{f: getattr(spec, f) for f in spec.__slots__}, "sha256": hashlib.sha256(GOOD).hexdigest(),
        "size": len(GOOD)}))
    (tmp_path / spec.filename).write_bytes(b"x" * len(GOOD))  # the right size, the wrong bytes
    (tmp_path / "silero.onnx").write_bytes(b"")
    lane = Lane()
    w = SimpleNamespace(calls={"c1": object()}, models=SimpleNamespace(silero=tmp_path / "silero.onnx"),
                        extra_lanes={"llm": lane}, cfg=SimpleNamespace(job_nice=0, llm_threads=1),
                        stats=SimpleNamespace(error=lambda kind, detail, call_id: ErrorReply(
                            kind=kind, call_id=call_id, detail=detail)))
    yield w, lane
    local_jobs._STATE.pop(id(w), None)  # noqa: SLF001 - the per-worker state this test made


def _job(n: int) -> LlmJob:
    return LlmJob(call_id="c1", job=n, messages=[{"role": "user", "content": "hi"}],
                  deadline_ns=time.monotonic_ns() + int(5e9))


def test_the_handler_stats_the_lane_hashes_and_a_bad_file_is_refused_from_then_on(worker, monkeypatch):
    w, lane = worker
    hashed: list[Path] = []
    real = models.sha256_file
    monkeypatch.setattr(models, "sha256_file", lambda p: hashed.append(p) or real(p))
    monkeypatch.setattr(local_jobs, "_lane", lambda worker, kind: lane)
    assert isinstance(local_jobs.handle_llm(w, b"agent", None, _job(1)), JobAccepted)
    assert hashed == []  # the main loop read nothing of the file
    done = local_jobs.run_llm(w, lane.jobs[0])  # the lane thread: the hash does not match
    assert done.done and done.error.startswith("unsupported: ") and "corrupt" in done.error
    assert len(hashed) == 1
    refused = local_jobs.handle_llm(w, b"agent", None, _job(2))
    assert isinstance(refused, ErrorReply) and refused.kind == "unsupported" and "corrupt" in refused.detail
    assert len(lane.jobs) == 1 and len(hashed) == 1  # refused at the handler, nothing read again
