"""Call recording through the whole daemon: an agent file with ``[recording] enabled = true``.

brisvoxd runs one gateway, one worker and one agent process serving an agent file of scripted
stand-ins (no model, no key) that records its calls. One native WebSocket call
(:func:`brisvox.sim.ws_caller.one_call`) speaks a recorded question, hears the bot's long
answer, talks over it (a barge-in: the gateway cuts the answer and sends a clear), hears the
second answer and hangs up. Checks, from the WAV the gateway wrote:

* one file, named by the call id, mode 0600, 8 kHz stereo;
* the left channel is the caller's audio: the recorded question is found in it twice (the
  question and the barge-in), each correlated above 0.9;
* the right channel is exactly the bot audio the client received, in order (nothing the
  gateway did not release: the cut answer's rest never appears), and the first answer stops
  at the cut: silence follows it, and the cut falls within 1.5 s after the barge-in speech
  began on the left channel (one timeline for both sides);
* the gateway's counters (``recordings_started``, ``recordings_written``).

And ``brisvoxd check`` rejects an agent file with a bad ``[recording]`` key, naming it.
"""

from __future__ import annotations

import asyncio
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from bench.harness.call_daemon import SPEECH
from bench.harness.daemon import Daemon, agents_config, cli, write_config, ws_port
from brisvox.sim.ws_caller import ANSWER, FRAME, RATE, one_call
from tests.system.gateway_harness import correlate

pytestmark = pytest.mark.system
ANSWER_MS = 8000  # every answer is this long (scripted_tts): the barge-in cuts the first one

AGENT = f"""name = "recorded"
system_prompt = "Scripted agent that records its calls (no language model)."

[stt]
provider = "scripted_stt"
[stt.options]
text = "what time do you close"

[llm]
provider = "scripted"
[llm.options]
fallback = "{ANSWER}"
first_token_ms = 100

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = ANSWER_MS

[recording]
enabled = true
path = "RECDIR"
""".replace("ANSWER_MS", str(ANSWER_MS))


def _daemon(tmp: Path) -> Daemon:
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "recorded.toml").write_text(AGENT.replace("RECDIR", str(tmp / "rec")))
    extra = agents_config(agents, tmp / "records", default_agent="recorded", agents="lead_margin_ms = 0")
    return Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)


@pytest.mark.serial_light  # maps the caller's send times onto the recording's samples
def test_a_recorded_call_holds_the_caller_left_and_the_released_bot_audio_right(short_tmp):
    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == RATE
    d = _daemon(short_tmp)
    try:
        d.start()
        snap = d.wait_ready(90)
        gw = d.child(snap, "gateway-0")
        port = ws_port(gw)
        res = asyncio.run(one_call(port, speech, seed=3))
        call_id = res["call_id"]
        snap = d.wait_for(lambda s: (d.child(s, "gateway-0").get("stats") or {}).get("recordings_written", 0) >= 1,
                          20, "the recording written")
        stats = d.child(snap, "gateway-0")["stats"]
    finally:
        d.close()
    assert stats["recordings_started"] == 1 and stats["recording_write_errors"] == 0
    assert stats["recording_frames_dropped"] == 0
    files = list((short_tmp / "rec").glob("*.wav"))
    assert len(files) == 1 and files[0].name.endswith(f"-{call_id}.wav"), files
    assert files[0].stat().st_mode & 0o777 == 0o600
    with wave.open(str(files[0]), "rb") as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (2, 2, RATE)
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    left, right = x[0::2], x[1::2]

    # the caller: the question, then the barge-in, both found on the left (each in its half)
    split = int((res["barge_sent"] - 0.3) * RATE)
    lag1_ms, c1 = correlate(speech, left[:split])
    lag2_ms, c2 = correlate(speech, left[split:])
    barge = split + int(lag2_ms * RATE / 1000)
    assert c1 > 0.9 and c2 > 0.9, (c1, c2)
    assert lag1_ms > 0

    # the bot: exactly what the client received, in order
    assert res["clear_at"] is not None, "no barge-in clear"
    frames = [f for _, f in res["frames"]]
    got = np.concatenate(frames) if frames else np.zeros(0, np.int16)
    got_nz = got[got != 0]
    rec_nz = right[right != 0]
    assert len(rec_nz) >= len(got_nz) and np.array_equal(rec_nz[:len(got_nz)], got_nz)
    assert len(rec_nz) - len(got_nz) <= 5 * FRAME  # released as the caller hung up, never received
    # the first answer, cut: what arrived before the clear, then silence on the right
    _, clear_idx = res["clear_at"]
    before = np.concatenate(frames[:clear_idx])
    n_cut = int(np.count_nonzero(before))
    assert 0 < n_cut < 0.6 * ANSWER_MS / 1000 * RATE  # cut well before its end
    cut_at = int(np.flatnonzero(right)[n_cut - 1]) + 1
    assert not right[cut_at:cut_at + RATE // 2].any(), "bot audio right after the cut"
    assert 0 < cut_at - barge < int(1.5 * RATE), (cut_at, barge)


def test_check_rejects_a_bad_recording_key_naming_it(short_tmp):
    bad = short_tmp / "bad.toml"
    bad.write_text(AGENT.replace("enabled = true", "enable = true").replace("RECDIR", "relative/dir"))
    r = cli("check", str(bad))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "recording.enable" in r.stdout and "unknown key" in r.stdout
    assert "recording.path" in r.stdout
    good = short_tmp / "good.toml"
    good.write_text(AGENT.replace("RECDIR", str(short_tmp / "rec")))
    r = cli("check", str(good))
    assert r.returncode == 0, r.stdout + r.stderr
