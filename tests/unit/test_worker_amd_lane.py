"""Answering-machine detection in the worker: AmdRequest -> the realtime lane's windows -> AmdResult frames.

The worker core in one process with real rings and a real ROUTER inbox (the rig of
test_worker_core.py: its speech model is a deterministic energy model with the
Silero runner's interface), driven tick by tick, with the 8 kHz call's VAD in
Silero's native 8 kHz mode and on in16. The detector itself is tested on
synthetic signals in test_worker_amd.py; these tests prove the wiring: the
request's answers, the windows reaching the detector with their probabilities,
the results streamed keyed by (call_id, job) and ending with exactly one done
frame, expiry when audio stalls, the end at detach, and the typed errors.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from ipc.codec import decode
from ipc.frames import (
    AmdRequest,
    AmdResult,
    AmdTranscript,
    Attached,
    DetachCall,
    Detached,
    ErrorReply,
    JobAccepted,
)
from tests.unit.test_worker_core import FRAME, SR, Rig
from workers.amd_lane import STALL_MS


@pytest.fixture(params=[True, False], ids=["vad8k", "vad16k"])
def rig(request, short_tmp, shm_clean):
    r = Rig(short_tmp, shm_clean, native_8k=request.param)
    r.call("a")
    assert isinstance(r.attach("a"), Attached)
    yield r
    r.close()


def _play(rig: Rig, x: np.ndarray) -> list[AmdResult]:
    """Write ``x`` (8 kHz) into the call's ``in`` ring one 20 ms frame per tick; the AmdResult
    frames the subscriber got."""
    got: list[AmdResult] = []
    pcm = np.clip(np.round(x), -32768, 32767).astype(np.int16)
    for k in range(len(pcm) // FRAME):
        rig.rings["a"]["in"].write(pcm[k * FRAME : (k + 1) * FRAME])
        rig.w.realtime.tick()
        while rig.sub.poll(0):
            f = decode(rig.sub.recv())
            if isinstance(f, AmdResult):
                got.append(f)
    return got


def _noise(rig: Rig, s: float, level: float) -> np.ndarray:
    return rig.rng.normal(0.0, level, int(s * SR))


def _tone(hz: float, s: float) -> np.ndarray:
    return 8000.0 * np.sin(2 * np.pi * hz * np.arange(int(s * SR)) / SR)


def test_a_short_hello_is_answered_human_once_with_done(rig):
    assert rig.request(AmdRequest(call_id="a", job=7)) == JobAccepted(call_id="a", job=7)
    got = _play(rig, np.concatenate([_noise(rig, 0.3, 8.0), _noise(rig, 0.5, 3000.0), _noise(rig, 1.6, 8.0)]))
    assert len(got) == 1
    v = got[0]
    assert (v.event, v.verdict, v.reason, v.job, v.done) == ("verdict", "human", "short_reply", 7, True)
    assert 800 + 420 - 64 <= v.took_ms <= 800 + 420 + 100  # the reply's end + human_silence_ms
    assert v.pos > 0 and v.pos % 32 == 24  # the end of the deciding VAD window (in16, on the grid)
    assert "a" not in rig.w.amd.runs and rig.w.stats.amd_runs == 1 and rig.w.stats.amd_ns > 0
    assert rig.w.report_stats()["amd_runs"] == 1


def test_leave_message_reports_machine_then_the_beep(rig):
    rig.request(AmdRequest(call_id="a", job=1, leave_message=True))
    onset_s = 0.2 + 2.4 + 0.5
    got = _play(rig, np.concatenate([_noise(rig, 0.2, 8.0), _noise(rig, 2.4, 3000.0), _noise(rig, 0.5, 8.0),
                                     _tone(1000.0, 0.4), _noise(rig, 0.5, 8.0)]))
    assert [(f.event, f.done) for f in got] == [("verdict", False), ("beep", True)]
    assert got[0].verdict == "machine"
    beep = got[1]
    assert abs(beep.pos - onset_s * 16000) <= 2 * 512 and abs(beep.freq_hz - 1000.0) < 20.0
    assert "a" not in rig.w.amd.runs


def test_a_transcript_cue_decides(rig):
    rig.request(AmdRequest(call_id="a", job=2, transcripts=True))
    assert _play(rig, _noise(rig, 0.6, 3000.0)) == []
    rig.send(AmdTranscript(call_id="a", job=99, text="please leave a message"))  # another job: ignored
    assert "a" in rig.w.amd.runs
    rig.send(AmdTranscript(call_id="a", job=2, text="Hi, you've reached Sam, please leave a message"))
    f = rig.recv(lambda f: isinstance(f, AmdResult))
    assert (f.verdict, f.reason, f.done) == ("machine", "cue", True)


def test_stalled_audio_is_expired_on_the_wall_clock(rig):
    t0 = time.monotonic_ns()
    rig.request(AmdRequest(call_id="a", job=3, max_wait_ms=1000))
    t1 = time.monotonic_ns()
    assert _play(rig, _noise(rig, 0.2, 8.0)) == []
    run = rig.w.amd.runs["a"]
    assert t0 + (1000 + STALL_MS) * 1_000_000 <= run.verdict_ns <= t1 + (1000 + STALL_MS) * 1_000_000
    rig.w.amd.poll(run.verdict_ns - 1)  # before max_wait_ms + STALL_MS of wall time: nothing
    assert "a" in rig.w.amd.runs
    run.verdict_ns = time.monotonic_ns()  # the wall clock got there with no more audio
    rig.w.realtime.tick()  # every tick polls
    f = rig.recv(lambda f: isinstance(f, AmdResult))
    assert (f.verdict, f.reason, f.done) == ("uncertain", "deadline", True) and f.took_ms < 1000
    assert "a" not in rig.w.amd.runs


def test_detach_ends_the_detection_with_an_error_frame(rig):
    rig.request(AmdRequest(call_id="a", job=4))
    f = rig.request(DetachCall(call_id="a"))  # the detection's end goes out first, then the reply
    assert isinstance(f, AmdResult) and (f.event, f.error, f.done, f.job) == ("end", "detached", True, 4)
    assert isinstance(rig.recv(), Detached)
    assert not rig.w.amd.runs


def test_typed_errors(rig):
    assert rig.request(AmdRequest(call_id="a", job=5)) == JobAccepted(call_id="a", job=5)
    busy = rig.request(AmdRequest(call_id="a", job=6))
    assert isinstance(busy, ErrorReply) and busy.kind == "busy"
    unknown = rig.request(AmdRequest(call_id="nope", job=1))
    assert isinstance(unknown, ErrorReply) and unknown.kind == "unknown_call"
    rig.call("b")
    rig.attach("b")
    bad = rig.request(AmdRequest(call_id="b", job=1, max_wait_ms=50))
    assert isinstance(bad, ErrorReply) and bad.kind == "bad_params" and "max_wait_ms" in bad.detail
    assert rig.w.stats.errors["busy"] == 1 and rig.w.stats.errors["bad_params"] == 1
