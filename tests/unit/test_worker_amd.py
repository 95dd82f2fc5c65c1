"""The AMD detector (workers/amd.py) on synthetic signals: each rule decides what it should, when it should.

"Speech" here is band-limited noise fed with a high VAD probability (the detector
reads cadence from the worker's probabilities, not from the samples), silence is
low-level noise with a low probability; tones are exact sines. Windows are the
worker's 32 ms VAD windows at 8 kHz (256 samples). A hypothesis test feeds
arbitrary audio and probabilities and checks the invariants: one verdict, by the
deadline, never an exception, and for leave_message exactly one beep or greeting
end by ``listen_max_ms``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.amd import AmdBeep, AmdDetector, AmdGreetingEnd, AmdParams, AmdVerdict, cue_of

RATE = 8000
WIN = 256


def _speech(rng: np.random.Generator, s: float, level: float = 3000.0) -> np.ndarray:
    n = int(s * RATE)
    x = rng.normal(0.0, 1.0, n)
    x = np.convolve(x, np.ones(4) / 4, mode="same")  # a little low-pass: not white, not tonal
    return x / x.std() * level


def _sil(rng: np.random.Generator, s: float) -> np.ndarray:
    return rng.normal(0.0, 20.0, int(s * RATE))


def _tone(hz: float, s: float, level: float = 8000.0) -> np.ndarray:
    t = np.arange(int(s * RATE)) / RATE
    return level * np.sin(2 * np.pi * hz * t)


class Feed:
    """Plays ``parts`` (samples, VAD probability) into a detector window by window."""

    def __init__(self, params: AmdParams | None = None) -> None:
        self.d = AmdDetector(params or AmdParams(), rate=RATE)
        self.events: list[object] = []

    def play(self, *parts: tuple[np.ndarray, float | None]) -> Feed:
        x = np.concatenate([p[0] for p in parts])
        probs = np.concatenate([np.full(len(p[0]), np.nan if p[1] is None else p[1]) for p in parts])
        pcm = np.clip(np.round(x), -32768, 32767).astype(np.int16)
        for k in range(len(pcm) // WIN):
            pr = float(probs[k * WIN : (k + 1) * WIN].mean())
            self.events += self.d.feed(pcm[k * WIN : (k + 1) * WIN], None if math.isnan(pr) else pr)
            if self.d.done:
                break
        return self

    def verdict(self) -> AmdVerdict:
        got = [e for e in self.events if isinstance(e, AmdVerdict)]
        assert len(got) == 1, self.events
        return got[0]


def test_short_hello_then_silence_is_human_soon_after_the_reply() -> None:
    rng = np.random.default_rng(1)
    f = Feed().play((_sil(rng, 0.3), 0.02), (_speech(rng, 0.5), 0.95), (_sil(rng, 2.0), 0.02))
    v = f.verdict()
    assert (v.kind, v.reason) == ("human", "short_reply")
    # the reply ends at 800 ms; the verdict comes after human_silence_ms (420) of silence
    assert 800 + 420 <= v.at_ms <= 800 + 420 + 64
    assert v.pos == v.at_ms * 16 and v.confidence > 0.9


def test_long_greeting_is_machine_while_it_still_talks() -> None:
    rng = np.random.default_rng(2)
    parts: list[tuple[np.ndarray, float | None]] = [(_sil(rng, 0.2), 0.02)]
    for _ in range(4):  # sentences with 250 ms pauses: one turn
        parts += [(_speech(rng, 0.8), 0.95), (_sil(rng, 0.25), 0.05)]
    f = Feed().play(*parts)
    v = f.verdict()
    assert (v.kind, v.reason) == ("machine", "long_greeting")
    assert 200 + 2000 - 32 <= v.at_ms <= 200 + 2000 + 300  # machine_speech_ms of one turn (32 ms grid)
    assert f.d.done  # no leave_message: nothing more to do


def test_a_quick_hello_then_silence_is_a_person_within_1500_ms_of_the_answer() -> None:
    rng = np.random.default_rng(21)
    # "hello?" 0.2-0.6 s after the answer, 0.45 s long, Silero's probability lingering 0.1 s after it
    f = Feed().play((_sil(rng, 0.2), 0.02), (_speech(rng, 0.45), 0.95), (_sil(rng, 0.1), 0.6),
                    (_sil(rng, 2.0), 0.02))
    v = f.verdict()
    assert (v.kind, v.reason) == ("human", "short_reply") and v.at_ms <= 1500
    assert 650 + 100 + 420 - 32 <= v.at_ms <= 650 + 100 + 420 + 64  # the probability's tail + 420 ms


def test_a_slow_long_reply_is_a_person_soon_after_it_ends() -> None:
    # "Hello, who is calling?" at 140 wpm: 1.75 s of VAD speech (commas: 100 ms dips), then waiting
    rng = np.random.default_rng(22)
    parts: list[tuple[np.ndarray, float | None]] = [(_sil(rng, 0.3), 0.02)]
    for s in (0.5, 0.55, 0.5):
        parts += [(_speech(rng, s), 0.95), (_sil(rng, 0.1), 0.1)]
    f = Feed().play(*parts[:-1], (_sil(rng, 2.5), 0.02))
    v = f.verdict()
    end = 300 + 1550 + 200  # the reply's end (speech and its two dips)
    assert (v.kind, v.reason) == ("human", "long_reply") and end + 560 - 32 <= v.at_ms <= end + 560 + 64


def test_a_10_s_greeting_is_never_a_person() -> None:
    rng = np.random.default_rng(23)
    for pause in (0.15, 0.3, 0.45, 0.55):  # the pauses between a greeting's sentences
        parts: list[tuple[np.ndarray, float | None]] = [(_sil(rng, 0.3), 0.02)]
        t = 0.3
        while t < 10.3:  # sentences of 0.9-2.4 s, Silero's tail 0.14 s into each pause
            s = float(rng.uniform(0.9, 2.4))
            parts += [(_speech(rng, s), 0.95), (_sil(rng, 0.14), 0.6), (_sil(rng, pause - 0.14), 0.05)]
            t += s + pause
        for transcripts in (False, True):
            v = Feed(AmdParams(transcripts=transcripts, max_wait_ms=10_000)).play(*parts).verdict()
            assert v.kind == "machine", (pause, transcripts, v)


def test_beep_after_the_greeting_is_found_with_its_onset() -> None:
    rng = np.random.default_rng(3)
    onset_ms = 2300 + 450 + 13  # off the 32 ms grid on purpose
    f = Feed(AmdParams(leave_message=True)).play(
        (_sil(rng, 0.3), 0.02), (_speech(rng, 2.0), 0.95), (_sil(rng, 0.463), 0.03),
        (_tone(1400.0, 0.4), 0.1), (_sil(rng, 3.0), 0.02))
    assert f.verdict().kind == "machine"
    beeps = [e for e in f.events if isinstance(e, AmdBeep)]
    assert len(beeps) == 1
    b = beeps[0]
    assert abs(b.onset_ms - onset_ms) <= 32
    assert abs(b.freq_hz - 1400.0) < 10.0
    assert b.onset_pos == b.onset_ms * 16
    assert b.at_ms - b.onset_ms < 200  # confirmed within the beep (400 ms long)
    assert f.d.done and not [e for e in f.events if isinstance(e, AmdGreetingEnd)]


def test_a_beep_right_after_short_speech_decides_machine() -> None:
    rng = np.random.default_rng(4)
    f = Feed(AmdParams(leave_message=True)).play(
        (_sil(rng, 0.2), 0.02), (_speech(rng, 0.9), 0.95), (_tone(1000.0, 0.5), 0.1), (_sil(rng, 1.0), 0.02))
    v = f.verdict()
    assert (v.kind, v.reason) == ("machine", "beep")
    assert [e for e in f.events if isinstance(e, AmdBeep)]


def test_no_beep_reports_the_end_of_the_greeting() -> None:
    rng = np.random.default_rng(5)
    f = Feed(AmdParams(leave_message=True, beep_wait_ms=2000)).play(
        (_sil(rng, 0.2), 0.02), (_speech(rng, 3.0), 0.95), (_sil(rng, 4.0), 0.02))
    ends = [e for e in f.events if isinstance(e, AmdGreetingEnd)]
    assert len(ends) == 1 and ends[0].reason == "no_beep"
    assert abs(ends[0].end_ms - 3200) <= 32
    assert ends[0].at_ms - ends[0].end_ms >= 2000


@pytest.mark.parametrize("cng", [True, False])
def test_fax_tones_are_fax(cng: bool) -> None:
    rng = np.random.default_rng(6)
    if cng:  # 1100 Hz, 0.5 s on, 3 s off
        parts = [(_sil(rng, 0.4), 0.02), (_tone(1100.0, 0.5, 3000.0), 0.3), (_sil(rng, 3.0), 0.02)]
    else:  # the answer tone, 2100 Hz
        parts = [(_sil(rng, 0.2), 0.02), (_tone(2100.0, 3.0, 3000.0), 0.3)]
    f = Feed().play(*parts)
    v = f.verdict()
    assert (v.kind, v.reason) == ("fax", "fax_tone")
    assert v.at_ms <= (400 if cng else 200) + 320 + 64


def test_a_1100_hz_beep_after_speech_is_not_a_fax() -> None:
    rng = np.random.default_rng(7)
    f = Feed(AmdParams(leave_message=True)).play(
        (_sil(rng, 0.2), 0.02), (_speech(rng, 2.0), 0.95), (_sil(rng, 0.4), 0.03), (_tone(1100.0, 0.6), 0.1))
    assert f.verdict().kind == "machine"
    assert [e for e in f.events if isinstance(e, AmdBeep)]


def test_silence_until_the_deadline_is_uncertain_at_the_deadline() -> None:
    rng = np.random.default_rng(8)
    f = Feed(AmdParams(max_wait_ms=2500)).play((_sil(rng, 5.0), 0.02))
    v = f.verdict()
    assert (v.kind, v.reason, v.confidence) == ("uncertain", "deadline", 0.0)
    assert 2500 <= v.at_ms < 2500 + 32


def test_expire_gives_the_verdict_when_audio_stalls() -> None:
    d = AmdDetector(rate=RATE)
    assert d.expire()[0].kind == "uncertain"  # type: ignore[union-attr]
    assert d.done and d.expire() == [] and d.feed(np.zeros(WIN, dtype=np.int16), 0.9) == []


def test_energy_fallback_without_probabilities() -> None:
    rng = np.random.default_rng(9)
    f = Feed().play((_sil(rng, 0.5), None), (_speech(rng, 0.5), None), (_sil(rng, 2.0), None))
    assert f.verdict().kind == "human"
    g = Feed().play((_sil(rng, 0.5), None), (_speech(rng, 2.5), None))
    assert g.verdict().kind == "machine"


def test_transcript_cues() -> None:
    assert cue_of("Hi, you've reached Sam. Please leave a message after the tone.") == "machine"
    assert cue_of("Thank you for calling Acme. For sales, press 1.") == "ivr"
    assert cue_of("Hello? Who is this?") is None
    assert cue_of("and you for calling the county clerk") == "ivr"  # the local Whisper's "thank you for calling"
    assert cue_of("Thanks for calling Dana.") is None  # a voicemail's opener: its cadence decides
    d = AmdDetector(AmdParams(transcripts=True), rate=RATE)
    d.feed(np.zeros(WIN, dtype=np.int16), 0.9)
    v = d.hear("you've reached the voicemail of Sam")[0]
    assert isinstance(v, AmdVerdict) and (v.kind, v.reason) == ("machine", "cue")


def test_with_transcripts_a_cadence_machine_waits_for_a_menu_cue() -> None:
    rng = np.random.default_rng(10)
    f = Feed(AmdParams(transcripts=True)).play((_sil(rng, 0.2), 0.02), (_speech(rng, 2.5), 0.95))
    assert not f.events  # a greeting by cadence, held: a menu cue may come before the deadline
    ev = f.d.hear("Thank you for calling Acme. For support, press two.")
    assert isinstance(ev[0], AmdVerdict) and ev[0].kind == "ivr" and 2500 <= ev[0].at_ms < 3000
    g = Feed(AmdParams(transcripts=True)).play((_sil(rng, 0.2), 0.02), (_speech(rng, 3.5), 0.95))
    v = g.verdict()
    assert (v.kind, v.reason) == ("machine", "long_greeting") and 3000 <= v.at_ms < 3032


def test_the_tone_tests_read_the_tones_samples_when_given() -> None:
    """With denoise on, the window is denoised (a suppressor smears a beep into noise) and
    ``tones`` carries the same span as the line had it: the beep is found there, at its onset;
    a tone only in the window (``tones`` without it) is no beep."""
    rng = np.random.default_rng(9)
    line = np.concatenate([_sil(rng, 0.3), _speech(rng, 2.4), _sil(rng, 0.5), _tone(900.0, 0.5), _sil(rng, 3.0)])
    probs = np.concatenate([np.full(n, p) for n, p in ((0.3, 0.02), (2.4, 0.95), (0.5, 0.03), (0.5, 0.9),
                                                        (3.0, 0.02)) for n in [int(n * RATE)]])
    smeared = line * rng.choice([-1.0, 1.0], len(line))  # the same energy, no tone left
    onset_ms = 3200

    def run(window_src: np.ndarray, tones_src: np.ndarray | None) -> list[object]:
        d = AmdDetector(AmdParams(leave_message=True), rate=RATE)
        w16 = np.clip(np.round(window_src), -32768, 32767).astype(np.int16)
        t16 = None if tones_src is None else np.clip(np.round(tones_src), -32768, 32767).astype(np.int16)
        out: list[object] = []
        for k in range(len(w16) // WIN):
            sl = slice(k * WIN, (k + 1) * WIN)
            out += d.feed(w16[sl], float(probs[sl].mean()), None if t16 is None else t16[sl])
            if d.done:
                break
        return out

    beeps = [e for e in run(smeared, line) if isinstance(e, AmdBeep)]
    assert len(beeps) == 1 and abs(beeps[0].onset_ms - onset_ms) <= 32 and abs(beeps[0].freq_hz - 900) < 10
    assert not [e for e in run(smeared, None) if isinstance(e, AmdBeep)]  # the smeared window alone: no beep
    no_tone = line.copy()
    no_tone[onset_ms * RATE // 1000 : (onset_ms + 500) * RATE // 1000] = _speech(rng, 0.5)
    assert not [e for e in run(line, no_tone) if isinstance(e, AmdBeep)]  # tones decide, not the window


def test_bad_windows_and_params_are_caller_errors() -> None:
    d = AmdDetector(rate=RATE)
    with pytest.raises(ValueError, match="256 samples"):
        d.feed(np.zeros(160, dtype=np.int16), 0.5)
    with pytest.raises(ValueError, match="256 samples"):
        d.feed(np.zeros(WIN, dtype=np.int16), 0.5, np.zeros(512, dtype=np.int16))
    with pytest.raises(ValueError, match="8000 or 16000"):
        AmdDetector(rate=44100)
    with pytest.raises(ValueError, match="machine_speech_ms"):
        AmdParams(human_max_speech_ms=2000, machine_speech_ms=1800)
    assert AmdDetector(rate=16000).window == 512


_WINDOWS = st.one_of(
    st.builds(lambda v: np.full(WIN, v, dtype=np.int16), st.integers(-32768, 32767)),
    st.builds(lambda s, a: np.clip(np.random.default_rng(s).normal(0, a, WIN), -32768, 32767).astype(np.int16),
              st.integers(0, 2**32 - 1), st.floats(0, 40000)),
    st.builds(lambda hz, a: (a * np.sin(2 * np.pi * hz * np.arange(WIN) / RATE)).astype(np.int16),
              st.floats(50, 3950), st.floats(0, 32767)),
)
_PROBS = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.floats(0, 1))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(_WINDOWS, _PROBS), min_size=1, max_size=40), st.booleans(), st.booleans())
def test_any_audio_gives_one_verdict_by_the_deadline_and_never_raises(
        chunks: list[tuple[np.ndarray, float | None]], leave: bool, heard: bool) -> None:
    p = AmdParams(max_wait_ms=1000, leave_message=leave, transcripts=heard, listen_max_ms=2000)
    d = AmdDetector(p, rate=RATE)
    events: list[object] = []
    n = 0
    while not d.done and n < 200:  # cycle the drawn windows for up to 6.4 s of audio
        w, pr = chunks[n % len(chunks)]
        events += d.feed(w, pr)
        n += 1
        if heard and n == 10:
            events += d.hear("hello? " * (n % 3))
        verdicts = [e for e in events if isinstance(e, AmdVerdict)]
        if d.t_ms >= p.max_wait_ms:
            assert len(verdicts) == 1
    verdicts = [e for e in events if isinstance(e, AmdVerdict)]
    assert len(verdicts) == 1 and verdicts[0].at_ms <= p.max_wait_ms + 32
    v = verdicts[0]
    assert v.kind in ("human", "machine", "ivr", "fax", "uncertain") and 0.0 <= v.confidence <= 1.0
    assert d.done and d.t_ms <= p.listen_max_ms + 32
    answers = [e for e in events if isinstance(e, AmdBeep | AmdGreetingEnd)]
    if leave and v.kind == "machine":
        assert len(answers) == 1
