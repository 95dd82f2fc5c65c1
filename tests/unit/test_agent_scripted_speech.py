"""The scripted STT/TTS of the load benchmark (``brisvox/providers/scripted_speech.py``), on virtual time.

* Their built-in timing is bench/workload.toml's, and a workload file is read
  through the ``timing_file`` option ($VARS expanded; an unset one falls back).
* The answer tone is the workload's bot audio, sample for sample.
* STT: exactly one final per finalize, ``final_ms`` later, text only after
  speech; interims every ``interim_ms`` of speech, ``interim_delay_ms`` later.
* TTS: first audio ``first_audio_ms`` after the first text, ``answer_ms`` of
  audio in ``chunk_ms`` chunks at real time kept ``lead_ms`` ahead, words
  spread over the answer, Flushed after the last chunk; cancel is immediate
  and nothing of a cancelled context follows.
* The registry builds the bench agent's three legs from its agent file.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from bench import workload
from brisvox.agent.definition import load_agent
from brisvox.providers import scripted_speech as ss
from brisvox.providers.base import (
    SttConfig,
    Transcript,
    TtsAudio,
    TtsCancelled,
    TtsConfig,
    TtsFlushed,
    TtsWord,
)
from brisvox.providers.registry import CallEnv, build_call
from brisvox.providers.scripted_llm import ScriptedLlm
from brisvox.sim.vloop import run_virtual

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_are_the_workload_and_a_timing_file_is_read(tmp_path, monkeypatch):
    wl = workload.load()
    want = ss.ScriptedTiming(final_ms=wl.stt.final_after_finalize_ms, first_token_ms=wl.llm.first_token_ms,
                             answer_text=wl.llm.answer_text, first_audio_ms=wl.tts.first_audio_ms,
                             answer_ms=wl.tts.answer_ms, chunk_ms=wl.tts.chunk_ms, lead_ms=wl.tts.lead_ms)
    assert ss.DEFAULTS == want
    f = tmp_path / "w.toml"
    f.write_text((ROOT / "bench" / "workload.toml").read_text().replace("first_audio_ms = 80", "first_audio_ms = 55"))
    monkeypatch.setenv("BV_TEST_WL", str(f))
    assert ss.timing({"timing_file": "$BV_TEST_WL"}).first_audio_ms == 55
    monkeypatch.delenv("BV_TEST_WL")
    assert ss.timing({"timing_file": "$BV_TEST_WL", "answer_ms": 1000}) == ss.DEFAULTS.__class__(answer_ms=1000)


def test_answer_tone_is_the_workload_bot_audio():
    for rate in (8000, 16000, 22050):
        assert np.array_equal(ss.answer_tone(rate, 2000), workload.bot_audio(rate, 2000))


async def _stt_run(lag: int = 0) -> list[tuple[float, Transcript]]:
    loop = asyncio.get_running_loop()
    prov = ss.ScriptedStt(final_ms=150, interim_ms=100, interim_delay_ms=100, interim_lag_words=lag)
    s = await prov.connect(SttConfig(), 1.0)
    got: list[tuple[float, Transcript]] = []

    async def rx() -> None:
        async for ev in s.events():
            if isinstance(ev, Transcript):
                got.append((round(loop.time(), 3), ev))

    task = asyncio.create_task(rx())
    speech = (np.ones(320, np.int16) * 3000).tobytes()  # 20 ms of loud audio
    quiet = np.zeros(320, np.int16).tobytes()
    t0 = loop.time()
    for _ in range(25):  # 0.5 s of speech
        await s.send_audio(speech, 1.0)
        await asyncio.sleep(0.02)
    await s.finalize(1.0)  # at t0 + 0.5
    for _ in range(10):
        await s.send_audio(quiet, 1.0)
        await asyncio.sleep(0.02)
    await s.finalize(1.0)  # silence only: an empty final
    await asyncio.sleep(0.5)
    await s.close(1.0)
    await task
    return [(round(t - t0, 3), ev) for t, ev in got]


def test_stt_interims_while_speaking_and_one_final_per_finalize():
    got = run_virtual(_stt_run)
    finals = [(t, ev.text) for t, ev in got if ev.is_final]
    assert finals == [(0.65, "caller turn 1"), (0.85, "")]
    assert all(ev.from_finalize and ev.speech_final for _, ev in got if ev.is_final)
    interims = [t for t, ev in got if not ev.is_final]
    # every 100 ms of speech (the 5th 20 ms chunk goes out at 0.08), delivered 100 ms late
    assert interims == [0.18, 0.28, 0.38, 0.48, 0.58]
    assert all(ev.text == "caller turn 1" for _, ev in got if not ev.is_final)


def test_stt_interims_can_lag_the_final_by_a_word():
    got = run_virtual(lambda: _stt_run(lag=1))
    assert [ev.text for _, ev in got if ev.is_final] == ["caller turn 1", ""]
    interims = [ev.text for _, ev in got if not ev.is_final]
    assert len(interims) == 5 and set(interims) == {"caller turn"}
    assert ss.ScriptedStt(interim_lag_words=5).interim_text(1) == ""
    with pytest.raises(ss.ProviderError):
        ss.ScriptedStt(interim_lag_words=-1)


async def _tts_run() -> tuple[list[tuple[float, object]], float]:
    loop = asyncio.get_running_loop()
    prov = ss.ScriptedTts(first_audio_ms=80, answer_ms=2000, chunk_ms=20, lead_ms=100)
    s = await prov.connect(TtsConfig(sample_rate=8000), 1.0)
    got: list[tuple[float, object]] = []

    async def rx() -> None:
        async for ev in s.events():
            got.append((round(loop.time() - t0, 4), ev))

    t0 = loop.time()
    task = asyncio.create_task(rx())
    await s.send_text(1, "Sure, I can help", continue_=False, timeout=1.0)
    await s.send_text(1, " with that.", continue_=True, timeout=1.0)
    await s.flush(1, 1.0)
    await asyncio.sleep(3.0)
    await s.send_text(2, "Cut me off.", continue_=False, timeout=1.0)
    await asyncio.sleep(0.5)
    s.cancel(2)
    await asyncio.sleep(1.0)
    await s.close(1.0)
    await task
    return got, s.sample_rate


def test_tts_timing_words_flush_and_cancel():
    got, rate = run_virtual(_tts_run)
    assert rate == 8000
    audio1 = [(t, ev) for t, ev in got if isinstance(ev, TtsAudio) and ev.context == 1]
    assert len(audio1) == 100 and all(len(ev.pcm) == 320 for _, ev in audio1)  # 2 s in 20 ms chunks
    assert audio1[0][0] == 0.08  # first audio after first_audio_ms
    # real time, lead_ms ahead: chunk i at 0.08 + max(0, 0.02 * i - 0.1)
    assert all(abs(t - (0.08 + max(0.0, 0.02 * i - 0.1))) < 1e-3 for i, (t, _) in enumerate(audio1))
    words = [ev for _, ev in got if isinstance(ev, TtsWord) and ev.context == 1]
    assert [w.word for w in words] == ["Sure,", "I", "can", "help", "with", "that."]
    assert words[0].start == 0.0 and abs(words[-1].end - 2.0) < 1e-9
    flushed = [t for t, ev in got if isinstance(ev, TtsFlushed) and ev.context == 1]
    assert flushed == [audio1[-1][0]]
    cancel_t = next(t for t, ev in got if isinstance(ev, TtsCancelled) and ev.context == 2)
    assert not [t for t, ev in got if isinstance(ev, TtsAudio) and ev.context == 2 and t > cancel_t]
    assert [ev for _, ev in got if isinstance(ev, TtsAudio) and ev.context == 2]  # it did start speaking


def test_registry_builds_the_bench_agent(monkeypatch):
    monkeypatch.setenv("BRISVOX_BENCH_WORKLOAD", str(ROOT / "bench" / "workload.toml"))
    agent = load_agent(ROOT / "configs" / "agents" / "bench.toml")
    from brisvox.providers.resilience import ResilientLlm, ResilientStt, ResilientTts, unwrap

    c = build_call(agent, CallEnv("c1"))  # every stage behind the resilience layer
    assert isinstance(c.stt, ResilientStt) and isinstance(c.llm, ResilientLlm) and isinstance(c.tts, ResilientTts)
    assert c.stt.audio_batch == unwrap(c.stt).audio_batch  # the actor batches as for the bare provider
    p = type(c)(unwrap(c.stt), unwrap(c.llm), unwrap(c.tts))
    assert isinstance(p.stt, ss.ScriptedStt) and isinstance(p.tts, ss.ScriptedTts)
    assert isinstance(p.llm, ScriptedLlm)
    wl = workload.load()
    assert p.llm.fallback == wl.llm.answer_text and p.llm.first_token == wl.llm.first_token_ms / 1000
    assert p.stt.final_delay == wl.stt.final_after_finalize_ms / 1000
    assert p.tts.answer_ms == wl.tts.answer_ms and p.tts.first_audio == wl.tts.first_audio_ms / 1000
