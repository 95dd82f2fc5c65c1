"""Whisper tiny.en transcribing while the caller speaks: the final at the stop equals the batch transcription.

The actor asks for the utterance as soon as its audio went quiet, then again at the VAD stop
with a longer span (the quiet tail). :class:`workers.local_stt.WhisperRunner` remembers a call's
last transcription by the ring span of its voiced part:

* the stop's request, whose tail after the early one stayed quiet, is answered from the early
  one (no model run) and its text is exactly the batch transcription of the whole span;
* a request whose span gained speech (the early one came in a pause) runs the model again and
  equals the batch transcription too;
* a forgotten call (detach) is transcribed again.

Needs the Whisper model files and the generated speech fixtures.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_worker_models import FIX
from workers.local_stt import FRAME, PAD, WhisperRunner
from workers.models import ModelError, locate


@pytest.fixture(scope="module")
def runner() -> WhisperRunner:
    try:
        d = locate("whisper_tiny_en").parent
    except ModelError as e:
        pytest.skip(str(e))
    r = WhisperRunner(d)
    r.load()
    return r


def test_the_final_after_a_quiet_tail_is_the_early_text_and_equals_the_batch_transcription(runner) -> None:
    x, entry = FIX.load("turn_complete", 16000)
    speech_end = entry["segments16"][-1][1]
    assert len(x) - speech_end > PAD + 4 * FRAME  # the fixture has a quiet tail to test on
    batch = runner.transcribe(x)  # no call: never remembered, the model runs
    early = runner.transcribe(x[: speech_end + PAD + 2 * FRAME], call_id="c", at=1000)
    final = runner.transcribe(x, call_id="c", at=1000)
    assert not early.cached and final.cached
    assert final.text == early.text == batch.text
    assert "close tonight" in batch.text.lower()
    runner.forget("c")
    again = runner.transcribe(x, call_id="c", at=1000)
    assert not again.cached and again.text == batch.text


def test_speech_after_the_early_request_is_transcribed_again(runner) -> None:
    x, entry = FIX.load("turn_complete", 16000)
    lo, hi = entry["segments16"][-1]
    runner.transcribe(x[: (lo + hi) // 2], call_id="d", at=0)  # asked in mid-speech
    final = runner.transcribe(x, call_id="d", at=0)
    assert not final.cached
    assert final.text == runner.transcribe(x).text
    other = runner.transcribe(x, call_id="d", at=FRAME)  # the same samples at another ring position
    assert not other.cached  # positions are the key: another span is never answered from this one
    runner.forget("d")
