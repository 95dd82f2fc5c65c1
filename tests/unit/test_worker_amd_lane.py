"""Answering-machine detection in the worker's realtime lane: an AmdStart makes the worker feed
the call's detector every VAD window from the answer on, and its verdict, beep and greeting end
reach the subscriber as tick events (real rings, a real ROUTER inbox, the core tests' energy
speech model in both VAD modes). With denoise on, a stand-in suppressor that smears every tone
into noise: the beep is still found, in the audio from before the denoiser."""

from __future__ import annotations

import numpy as np
import pytest

from ipc.codec import encode
from ipc.frames import AmdHear, AmdStart, ErrorReply
from ipc.tick_events import AmdBeepEvent, AmdGreetingEndEvent, AmdVerdictEvent, SpeechStart
from tests.unit.test_worker_core import FRAME, SR, Rig


@pytest.fixture(params=[True, False], ids=["vad8k", "vad16k"])
def rig(request, short_tmp, shm_clean):
    r = Rig(short_tmp, shm_clean, native_8k=request.param)
    yield r
    r.close()


def tone(rig: Rig, call_id: str, hz: float, frames: int) -> None:
    t = np.arange(FRAME * frames) / SR
    rig.rings[call_id]["in"].write((8000 * np.sin(2 * np.pi * hz * t)).astype(np.int16))


def play(rig: Rig, call_id: str, pattern: list[object]) -> list[tuple[int, object]]:
    """Feed one 20 ms frame per tick: True loud speech, False quiet line, a float a tone of that
    many Hz. Returns (tick index, event) of every AMD event."""
    out = []
    for k, what in enumerate(pattern):
        if isinstance(what, bool):
            rig.feed(call_id, what)
        else:
            tone(rig, call_id, float(what), 1)
        out += [(k, e) for e in rig.tick().events if isinstance(e, AmdVerdictEvent | AmdBeepEvent | AmdGreetingEndEvent)]
    return out


def start(rig: Rig, call_id: str, **kw) -> None:
    in16 = rig.rings[call_id]["in16"].write_pos
    rig.send(AmdStart(call_id=call_id, in16_pos=in16, max_wait_ms=kw.pop("max_wait_ms", 3000), **kw))


def test_a_short_hello_then_silence_is_a_person(rig):
    rig.call("a")
    rig.attach("a")
    rig.run({"a": [False] * 5})
    start(rig, "a")
    evs = play(rig, "a", [True] * 25 + [False] * 60)  # "hello?" (0.5 s), then waiting
    (k, v), = evs
    assert isinstance(v, AmdVerdictEvent) and v.verdict == "human" and v.call_id == "a"
    assert k * 20 <= 1500 and v.ms <= 1500 and 0 < v.confidence <= 1
    assert rig.w.stats.amd_started == 1 and rig.w.stats.amd_verdicts == 1 and rig.w.stats.amd_ns > 0


def test_a_long_greeting_is_a_machine_and_its_beep_follows_with_leave_message(rig):
    rig.call("a")
    rig.attach("a")
    start(rig, "a", leave_message=True)
    evs = play(rig, "a", [True] * 200 + [1000.0] * 25 + [False] * 50)  # 4 s greeting, 0.5 s beep
    kinds = [type(e) for _, e in evs]
    assert kinds == [AmdVerdictEvent, AmdBeepEvent], evs
    (_, v), (kb, b) = evs
    assert v.verdict == "machine"
    assert 200 <= kb <= 200 + 15 and abs(b.hz - 1000.0) < 50  # within 300 ms of the beep's start
    assert rig.w.calls["a"].amd is None  # done: nothing more fed


def test_no_beep_ends_the_listening_with_the_greetings_end(rig):
    rig.call("a")
    rig.attach("a")
    start(rig, "a", leave_message=True)
    evs = play(rig, "a", [True] * 150 + [False] * 250)
    assert [type(e) for _, e in evs] == [AmdVerdictEvent, AmdGreetingEndEvent], evs


def test_audio_before_the_answer_is_not_the_detectors(rig):
    rig.call("a")
    rig.attach("a")
    rig.run({"a": [True] * 150})  # early media: a long announcement before the answer
    rig.run({"a": [False] * 30})
    start(rig, "a")
    evs = play(rig, "a", [True] * 20 + [False] * 60)
    assert [e.verdict for _, e in evs] == ["human"]


def test_the_deadline_gives_a_verdict_on_a_silent_line_and_the_vad_goes_on(rig):
    rig.call("a")
    rig.attach("a")
    start(rig, "a", max_wait_ms=1000)
    evs = play(rig, "a", [False] * 70)
    (k, v), = evs
    assert v.verdict == "uncertain" and 48 <= k <= 53
    events = rig.run({"a": [True] * 20 + [False] * 20})
    assert any(isinstance(e, SpeechStart) for e in events)  # the VAD is unaffected


def test_amd_start_for_an_unknown_call_or_bad_params_is_a_typed_error(rig):
    rig.call("a")
    rig.attach("a")
    rig.sub.send(encode(
        AmdStart(call_id="nope", in16_pos=0, max_wait_ms=3000), cid=77))
    rig.w.sock.poll(2000)
    rig.w.dispatch.drain_inbox(rig.w.sock)
    err = rig.recv(lambda f: isinstance(f, ErrorReply))
    assert err.kind == "unknown_call"
    rig.sub.send(encode(
        AmdStart(call_id="a", in16_pos=0, max_wait_ms=10), cid=78))
    rig.w.sock.poll(2000)
    rig.w.dispatch.drain_inbox(rig.w.sock)
    assert rig.recv(lambda f: isinstance(f, ErrorReply)).kind == "bad_params"
    assert rig.w.calls["a"].amd_start is None


def test_with_transcripts_a_greeting_waits_and_a_menu_cue_heard_makes_it_ivr(rig):
    rig.call("a")
    rig.attach("a")
    start(rig, "a", transcripts=True)
    assert play(rig, "a", [True] * 125) == []  # 2.5 s of one turn: a greeting by cadence, held
    rig.send(AmdHear(call_id="a", text="Thank you for calling Acme. For sales, press one.",
                     end_pos=rig.rings["a"]["in16"].write_pos))
    evs = play(rig, "a", [True] * 5)
    (_, v), = evs
    assert isinstance(v, AmdVerdictEvent) and (v.verdict, v.rule) == ("ivr", "cue") and 2000 <= v.ms < 3000
    assert rig.w.stats.amd_heard == 1 and rig.w.calls["a"].amd is None
    rig.send(AmdHear(call_id="a", text="leave a message", end_pos=0))  # decided: ignored, no error
    assert play(rig, "a", [False] * 5) == []


def test_with_transcripts_but_no_cue_the_greeting_is_a_machine_at_the_deadline(rig):
    rig.call("a")
    rig.attach("a")
    start(rig, "a", transcripts=True)
    rig.send(AmdHear(call_id="a", text="Hi, this is Dana.", end_pos=0))
    evs = play(rig, "a", [True] * 160)
    (k, v), = evs
    assert (v.verdict, v.rule) == ("machine", "long_greeting") and 3000 <= v.ms < 3100 and k >= 149


class Smear:
    """A noise suppressor at its worst for AMD: every sample's sign flipped at random, so the
    energy (what the VAD hears) stays and every steady tone becomes noise."""

    delay48 = 0

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def process(self, frame: np.ndarray, out: np.ndarray) -> None:
        out[:] = frame * self.rng.choice(np.array([-1.0, 1.0], dtype=np.float32), len(frame))

    def close(self) -> None:
        pass


def test_with_denoise_the_beep_is_found_in_the_audio_from_before_the_denoiser(short_tmp, shm_clean):
    from workers.denoise import ModelLoader, ModelSpec

    rig = Rig(short_tmp, shm_clean)
    try:
        rig.w.attached.denoise_models.close()
        rig.w.attached.denoise_models = ModelLoader({"rnnoise": ModelSpec(0, Smear)}, spare=False)
        rig.call("a")
        rig.attach("a", denoise="rnnoise")
        inp = rig.w.calls["a"].inp
        assert inp.denoise is not None and inp.denoise.pending is not None and inp.denoise.pending.wait(10)
        rig.run({"a": [False] * 5})  # the model is adopted at the first audio
        assert inp.denoise.active and not rig.w.calls["a"].native8
        start(rig, "a", leave_message=True)
        beep_in16 = rig.rings["a"]["in"].write_pos * 2 + 200 * FRAME * 2  # in16 sample 2k is `in` sample k
        evs = play(rig, "a", [True] * 200 + [1000.0] * 25 + [False] * 50)  # 4 s greeting, 0.5 s beep
        assert [type(e) for _, e in evs] == [AmdVerdictEvent, AmdBeepEvent], evs
        (_, v), (_, b) = evs
        assert v.verdict == "machine" and abs(b.hz - 1000.0) < 50
        assert abs(b.pos - beep_in16) <= 300 * 16  # within 300 ms of the beep's start (in16 positions)
        assert rig.w.stats.amd_tones_lost == 0
        # what the VAD (and a detector fed only its windows) got: the beep smeared into noise
        a = beep_in16 + 1600
        den = rig.rings["a"]["in16"].read_range(a, a + 8 * 512).samples
        raw = inp.pre.read(a, a + 8 * 512)
        assert raw is not None and len(den) == len(raw) == 8 * 512
        assert max(peak_share(w) for w in den.reshape(-1, 512)) < 0.3
        assert min(peak_share(w) for w in raw.reshape(-1, 512)) > 0.85
    finally:
        rig.close()


def peak_share(w: np.ndarray) -> float:
    """The share of a window's energy within 2 bins of its strongest (Hann-windowed)."""
    p = np.abs(np.fft.rfft(w.astype(np.float64) * np.hanning(len(w)))) ** 2
    k = int(np.argmax(p[1:])) + 1
    return float(p[max(1, k - 2) : k + 3].sum() / p[1:].sum())
