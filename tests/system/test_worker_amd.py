"""Answering-machine detection in a real worker process, with the real Silero, audio in real time.

``python -m workers.process`` serves two 8 kHz calls fed from another process
on the wall clock (20 ms frames): a person ("Hello?" from espeak-ng, then
silence) and a voicemail (the espeak-ng dialog fixture: a long first sentence,
then a 1 kHz beep after it). Each gets an AmdRequest (the voicemail with
``leave_message``); the answers arrive as AmdResult frames keyed by (call_id,
job): human for the person, then machine and the beep at its onset for the
voicemail, each stream ending with one ``done``. Wall-clock sensitive (the
detector's audio clock follows the feeder), so serial.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from bench.amd_set import Voices
from ipc.bus import endpoint
from ipc.codec import decode
from ipc.frames import AmdRequest, AmdResult, AttachCall, Attached, JobAccepted
from tests.system.test_worker_process import Sub, _fixture
from workers.harness import Feeder, WorkerProc, close_rings, create_call_rings

pytestmark = [pytest.mark.system, pytest.mark.serial]
RATE = 8000


def _collect(sub: Sub, seconds: float) -> list[AmdResult]:
    got: list[AmdResult] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if sub.sock.poll(50):
            f = decode(sub.sock.recv())
            if isinstance(f, AmdResult):
                got.append(f)
    return got


def test_a_person_and_a_voicemail_over_a_real_worker(short_tmp: Path, shm_clean: str) -> None:
    inst = shm_clean
    rng = np.random.default_rng(1)
    hello = Voices(short_tmp / "tts", None).say("espeak:en-us@170", "Hello?").astype(np.float64)
    person = np.concatenate([np.zeros(int(0.3 * RATE)), hello, np.zeros(int(2.5 * RATE))])
    dialog, entry = _fixture("vad_dialog", RATE)
    first_end = entry["segments16"][0][1] // 2  # the first sentence's end, 8 kHz
    beep_at = first_end + int(0.5 * RATE)
    t = np.arange(int(0.5 * RATE)) / RATE
    machine = np.concatenate([dialog[:first_end].astype(np.float64), np.zeros(beep_at - first_end),
                              6000 * np.sin(2 * np.pi * 1000 * t), np.zeros(int(1.0 * RATE))])
    audio = {c: np.clip(np.round(x + rng.normal(0, 8, len(x))), -32768, 32767).astype(np.int16)
             for c, x in (("person", person), ("machine", machine))}
    ep = endpoint(short_tmp, "w0")
    proc = WorkerProc(0, ep, max_calls=4)
    rings: dict[str, dict] = {}
    feeders: list[Feeder] = []
    sub = None
    try:
        proc.start()
        sub = Sub(ep)
        for c in audio:
            rings[c] = create_call_rings(inst, c, RATE, 16000, seconds=8.0)
            assert isinstance(sub.request(AttachCall(call_id=c, subscriber="agent-7", instance=inst,
                                                     call_rate=RATE, tts_rate=16000)), Attached)
        assert sub.request(AmdRequest(call_id="person", job=1)) == JobAccepted(call_id="person", job=1)
        assert sub.request(AmdRequest(call_id="machine", job=2, leave_message=True)) == JobAccepted(
            call_id="machine", job=2)
        for c, x in audio.items():
            f = Feeder([rings[c]["in"].name], x, RATE, seconds=len(x) / RATE, workdir=short_tmp)
            f.start()
            feeders.append(f)
        got = _collect(sub, max(len(x) for x in audio.values()) / RATE + 0.5)
        person_r = [f for f in got if f.call_id == "person"]
        machine_r = [f for f in got if f.call_id == "machine"]
        assert [(f.event, f.verdict, f.job, f.done) for f in person_r] == [("verdict", "human", 1, True)]
        assert person_r[0].took_ms < (0.3 * RATE + len(hello)) * 1000 / RATE + 1000
        assert [(f.event, f.verdict, f.job, f.done) for f in machine_r] == [
            ("verdict", "machine", 2, False), ("beep", "", 2, True)]
        beep = machine_r[1]
        assert abs(beep.pos - beep_at * 2) <= 2 * 512  # in16 positions (the calls start at 0)
        assert abs(beep.freq_hz - 1000.0) < 20.0
    finally:
        if sub is not None:
            sub.close()
        for f in feeders:
            f.stop()
        proc.stop()
        for r in rings.values():
            close_rings(r)
