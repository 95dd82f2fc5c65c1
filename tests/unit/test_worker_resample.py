"""Ring-to-ring rate conversion: in16 positions stay aligned to the caller's time, through gaps and
re-attaches; tts -> out keeps utterance starts exact."""

from __future__ import annotations

import numpy as np
import pytest

from ipc.ring import Ring, ring_name
from workers.resample import InputChain, OutputChain, in16_pos_for, resume_in_pos


@pytest.fixture
def rings(shm_clean):
    made: list[Ring] = []

    def make(kind: str, rate: int, cap: int = 1 << 15) -> Ring:
        r = Ring.create(ring_name(shm_clean, "rs", kind), cap, rate)
        made.append(r)
        return r

    yield make
    for r in made:
        r.unlink()
        r.close()


def tone(n: int, rate: int, start: int = 0, f: float = 300.0) -> np.ndarray:
    t = np.arange(start, start + n) / rate
    return (8000 * np.sin(2 * np.pi * f * t)).astype(np.int16)


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 44100, 48000])
def test_position_map_round_trips(rate):
    for p16 in (0, 1, 319, 320, 16000, 123_457):
        p = resume_in_pos(p16, rate)
        assert in16_pos_for(p, rate) >= p16
        assert p == 0 or in16_pos_for(p - 1, rate) < p16


@pytest.mark.parametrize("rate", [8000, 16000, 48000])
def test_in16_tracks_the_caller_time_frame_by_frame(rings, rate):
    src, dst = rings("in", rate), rings("in16", 16000)
    chain = InputChain(src, dst, rate)
    step = rate // 50
    produced = 0
    for k in range(100):
        src.write(tone(step, rate, k * step))
        produced += chain.step()
        # QQ output is never ahead of the caller and trails by at most a few samples
        expected = in16_pos_for((k + 1) * step, rate)
        assert expected - 8 <= dst.write_pos <= expected
    assert dst.write_pos == produced
    # the waveform is in the right place: a zero-delay conversion of the tone
    got = dst.read_range(16000, 16320).samples.astype(float)
    want = tone(320, 16000, 16000).astype(float)
    assert np.corrcoef(got, want)[0, 1] > 0.99


def test_a_gap_writes_zeros_for_the_lost_span_and_keeps_alignment(rings):
    src, dst = rings("in", 8000, cap=1024), rings("in16", 16000)
    chain = InputChain(src, dst, 8000)
    src.write(tone(160, 8000))
    chain.step()
    src.write(tone(4000, 8000, 160))  # more than the ring holds: the reader is overrun
    assert chain.step() == 0
    assert chain.gap >= 0 and chain.gap_lost > 0
    assert chain.gap <= 320  # the gap starts where in16 had got to
    assert len(chain.fresh) == 0
    # in16 continues where the caller's time is now
    assert dst.write_pos == in16_pos_for(chain.in_pos, 8000)
    chain.step()  # what survived in the ring is converted after the gap
    assert chain.gap == -1
    src.write(tone(160, 8000, 4160))
    chain.step()
    assert chain.gap == -1
    assert in16_pos_for(chain.in_pos, 8000) - 8 <= dst.write_pos <= in16_pos_for(chain.in_pos, 8000)


def test_a_new_chain_resumes_where_in16_left_off(rings):
    """The re-attach path: a second worker continues in16 without a seam."""
    src, dst = rings("in", 8000), rings("in16", 16000)
    a = InputChain(src, dst, 8000)
    for k in range(10):
        src.write(tone(160, 8000, k * 160))
        a.step()
    w16 = dst.write_pos
    src.write(tone(800, 8000, 1600))  # arrives while no worker serves the call
    b = InputChain(src, dst, 8000)
    assert b.in_pos == resume_in_pos(w16, 8000)
    b.step()
    assert dst.write_pos == pytest.approx(in16_pos_for(src.write_pos, 8000), abs=8)
    x = dst.read_range(0, dst.write_pos).samples.astype(float)
    want = tone(len(x), 16000).astype(float)
    assert np.corrcoef(x[200:], want[200:])[0, 1] > 0.99  # one continuous tone


def test_utterance_starts_are_exact_and_each_starts_a_fresh_stream(rings):
    tts, out = rings("tts", 22050), rings("out", 8000)
    chain = OutputChain(tts, out, 22050, 8000)
    # utterance 1 at tts 0, utterance 2 at tts 5000, both announced before their audio
    assert chain.announce(1, 1, 0) is None
    assert chain.announce(2, 1, 5000) is None
    assert chain.next_start() == 0
    tts.write(tone(4000, 22050))
    placed = chain.step()  # utterance 1's first audio is here: placed at the ring's start
    assert [(p.utterance, p.out_pos) for p in placed] == [(1, 0)] and out.write_pos > 0
    assert chain.next_start() == 5000
    tts.write(tone(1000, 22050, 4000))
    assert chain.step() == []  # utterance 2 starts exactly where the audio ends: not yet
    tts.write(tone(3000, 22050, 5000, f=500))
    placed = chain.step()  # its own audio arrived: utterance 1's tail flushed, a fresh stream
    assert len(placed) == 1 and placed[0].utterance == 2 and chain.next_start() == -1
    assert out.write_pos > placed[0].out_pos  # the out ring holds its first samples when it is reported
    # utterance 1 was flushed completely before utterance 2 began
    assert placed[0].out_pos == pytest.approx(5000 * 8000 / 22050, abs=1)
    # a boundary learnt late is placed by the same linear map
    late = chain.announce(3, 1, 6000)
    assert late is not None and late.out_pos == placed[0].out_pos + (1000 * 8000) // 22050


def test_a_start_at_the_converted_position_waits_for_its_own_audio(rings):
    """The common case: the previous utterance was converted completely when the next one is
    announced. The start is reported with the first audio, never before it."""
    tts, out = rings("tts", 24000), rings("out", 8000)
    chain = OutputChain(tts, out, 24000, 8000)
    tts.write(tone(2400, 24000))
    assert chain.announce(1, 1, 0) is None
    assert [p.utterance for p in chain.step()] == [1]
    assert chain.announce(2, 1, 2400) is None  # == the converted position
    assert chain.step() == []  # no audio of it yet
    tts.write(tone(480, 24000, 2400))
    placed = chain.step()
    assert [(p.utterance, p.out_pos) for p in placed] == [(2, 800)]
    assert out.write_pos - 800 == pytest.approx(160, abs=4)


def test_a_cut_drops_audio_before_the_position_and_stale_boundaries(rings):
    tts, out = rings("tts", 24000), rings("out", 8000)
    chain = OutputChain(tts, out, 24000, 8000)
    chain.announce(1, 1, 0)
    chain.announce(2, 1, 9000)
    tts.write(tone(6000, 24000))
    chain.step()
    before = out.write_pos
    tts.write(tone(6000, 24000, 6000))
    chain.cut(epoch=1, tts_pos=12_000)  # barge-in: everything so far is discarded
    assert chain.step() == []
    assert out.write_pos == before  # nothing of the cut epoch was converted
    assert chain.announce(3, 1, 13_000) is None  # epoch 1 is over
    assert chain.next_start() == -1
    assert chain.announce(4, 2, 12_000) is None  # placed with its first audio
    tts.write(tone(2400, 24000, 12_000))
    placed = chain.step()
    assert [(p.utterance, p.out_pos) for p in placed] == [(4, before)]
    assert out.write_pos - before == pytest.approx(800, abs=4)


def test_a_cut_read_after_the_newer_epochs_audio_was_converted_keeps_that_audio(rings):
    """The agent process's frames can reach the worker after the audio they announce: a tick
    may convert the new epoch's first audio before the TtsCut and TtsUtterance arrive. The
    audio after the cut position is the newer epoch's: its start maps where it really is."""
    tts, out = rings("tts", 24000), rings("out", 8000)
    chain = OutputChain(tts, out, 24000, 8000)
    tts.write(tone(2400, 24000))  # epoch 1 (its start was announced and placed)
    assert chain.announce(1, 1, 0) is None and [p.utterance for p in chain.step()] == [1]
    tts.write(tone(4800, 24000, 2400, f=500))  # epoch 2's first 200 ms, written at 2400
    chain.step()  # a tick converts it before the frames arrive
    conv = out.write_pos
    chain.cut(epoch=1, tts_pos=2400)
    placed = chain.announce(2, 2, 2400)
    assert placed is not None and placed.out_pos == 800  # where its audio is, not after it
    tts.write(tone(2400, 24000, 7200, f=500))
    assert chain.step() == [] and out.write_pos - conv == pytest.approx(800, abs=4)


def test_equal_rates_copy_samples_unchanged(rings):
    tts, out = rings("tts", 8000), rings("out", 8000)
    chain = OutputChain(tts, out, 8000, 8000)
    x = tone(1000, 8000)
    tts.write(x)
    chain.step()
    assert np.array_equal(out.read_range(0, 1000).samples, x)
