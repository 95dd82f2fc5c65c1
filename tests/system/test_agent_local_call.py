"""The daemon with the DEFAULT configuration answers a Twilio WebSocket call with the local agent.

brisvoxd starts with no ``[agents]`` section at all (only runtime paths and
loopback ports are set), so every call to ``/twilio`` runs the default agent,
``configs/agents/local.toml``: Whisper tiny.en, the local LLM and Piper as jobs on
the inference worker, no key. The client speaks two questions (a generated
fixture and an espeak-ng line) in Twilio Media Streams messages at real time
and listens. Checks:

* ``brisvoxd start --foreground`` printed where to call: the bound
  ``ws://.../twilio`` URL and how to stop;
* each question is answered with speech: more than 0.5 s of loud mu-law
  frames reach the client after the caller stopped, for BOTH turns;
* the call record (written at hang-up) holds two non-empty user turns (the
  local Whisper transcripts of the two questions) and two
  non-empty assistant answers (the local LLM), and no refusal.

About 20 s (model loading on the first call included).
"""

from __future__ import annotations

import asyncio
import base64
import io
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import soundfile as sf
import soxr

from bench.harness.daemon import Daemon, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.wire import twilio
from brisvox.wire.g711 import ULAW_SILENCE, ulaw_decode, ulaw_encode

pytestmark = [pytest.mark.system, pytest.mark.e2e]

ROOT = Path(__file__).resolve().parents[2]
QUESTION = ROOT / "tests" / "fixtures" / "generated" / "turn_complete.8k.wav"  # "Can you tell me what time you close tonight?"
SECOND = "What is the weather like today?"
RATE = 8000
FRAME = 160
ANSWER_WAIT_S = 15.0


def _models_ok() -> bool:
    try:
        from workers import models
        from workers.local_llm import DEFAULT_LLM

        d = models.default_models_dir()
        names = ("silero_vad", "smart_turn", "whisper_tiny_en", "piper_joe", DEFAULT_LLM)
        return all((d / models.CATALOGUE[n].filename).is_file() for n in names)
    except Exception:  # noqa: BLE001 - any failure means "not installed"
        return False


def _espeak(text: str) -> np.ndarray:
    raw = subprocess.run(["espeak-ng", "-v", "en-us", "-s", "160", "--stdout", text], capture_output=True,
                         check=True, timeout=20).stdout
    x, rate = sf.read(io.BytesIO(raw), dtype="float32")
    y = soxr.resample(x, rate, RATE)
    return np.clip(y * 0.7 * 32767, -32768, 32767).astype(np.int16)


def _loud_seconds(frames: list[tuple[float, bytes]], after: float) -> float:
    """Seconds of received bot audio after ``after`` whose frame is mostly louder than -40 dBFS."""
    n = 0
    for t, payload in frames:
        if t < after:
            continue
        x = np.abs(ulaw_decode(payload).astype(np.int32))
        if len(x) and np.count_nonzero(x > 330) >= len(x) // 4:
            n += len(x)
    return n / RATE


async def _call(port: int, questions: list[np.ndarray]) -> dict:
    from websockets.asyncio.client import connect

    got: list[tuple[float, bytes]] = []
    ends: list[float] = []
    stream = twilio.TwilioStream(stream_sid="MZbrisvoxlocal0001", call_sid="CAbrisvoxlocal0001",
                                 account_sid="ACtest")
    async with connect(f"ws://127.0.0.1:{port}/twilio", max_size=2**20) as ws:
        await ws.send(stream.connected())
        await ws.send(stream.start())
        t0 = time.monotonic()

        async def rx() -> None:
            async for m in ws:
                msg = twilio.bot_message(orjson.loads(m))
                if msg.event == "media":
                    got.append((time.monotonic() - t0, msg.payload))
                elif msg.event == "mark":  # echo marks as Twilio does when the audio played
                    await ws.send(stream.mark(msg.name))

        task = asyncio.create_task(rx())
        silence = base64.b64encode(bytes([ULAW_SILENCE]) * FRAME).decode()
        nxt = time.monotonic()

        async def send(payload: str) -> None:
            nonlocal nxt
            await ws.send(stream.media(payload))
            nxt += FRAME / RATE
            await asyncio.sleep(max(0.0, nxt - time.monotonic()))

        for _ in range(40):  # 0.8 s of silence: the caller listens first
            await send(silence)
        for q in questions:
            pad = (-len(q)) % FRAME
            data = ulaw_encode(np.concatenate([q, np.zeros(pad, np.int16)]))
            for i in range(0, len(data), FRAME):
                await send(base64.b64encode(data[i:i + FRAME]).decode())
            end = time.monotonic() - t0
            ends.append(end)
            # listen until the answer played out: audio came and then 1.2 s of nothing loud
            deadline = time.monotonic() + ANSWER_WAIT_S
            while time.monotonic() < deadline:
                await send(silence)
                heard = [t for t, p in got if t > end and _loud_seconds([(t, p)], 0) > 0]
                if heard and time.monotonic() - t0 - heard[-1] > 1.2:
                    break
        await ws.send(stream.stop())
        await asyncio.sleep(0.3)
        task.cancel()
    return {"frames": got, "ends": ends}


@pytest.mark.serial  # real-time audio into local Whisper: starved of CPU it mishears the question
def test_default_config_answers_a_twilio_call_with_the_local_agent(short_tmp):
    if not _models_ok():
        pytest.skip("local models are not installed (brisvox models install)")
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (scripts/install-apt.sh)")
    extra = f"""
[sip]
port = 0
rtp_port_min = 47000
rtp_port_max = 47100

[websocket]
port = 0
trust_loopback = true

[calls]
path = "{short_tmp / 'records'}"
"""
    d = Daemon(short_tmp, config=write_config(short_tmp, workers=1, agents=1, extra=extra), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(120)
        ws = d.child(snap, "gateway-0")["endpoints"]["websocket"]
        port = int(ws.rsplit(":", 1)[1])
        # the banner: where to call (the bound port) and how to stop
        d.wait_for(lambda s: f"ws://{ws}/twilio" in d.log_path.read_text(errors="replace"), 10, "the banner")
        banner = d.log_path.read_text(errors="replace")
        assert "agent local" in banner and "brisvoxd stop" in banner and "sip:agent@" in banner

        q1, rate = sf.read(QUESTION, dtype="int16")
        assert rate == RATE
        res = asyncio.run(_call(port, [q1, _espeak(SECOND)]))
        e1, e2 = res["ends"]
        first = _loud_seconds([f for f in res["frames"] if f[0] < e2], e1)
        second = _loud_seconds(res["frames"], e2)
        assert first > 0.5, f"no spoken answer to the first question ({first:.2f} s of speech)"
        assert second > 0.5, f"no spoken answer to the second question ({second:.2f} s of speech)"

        d.wait_for(lambda s: bool(read_records(short_tmp / "records")), 30, "the call record")
        rec = read_records(short_tmp / "records")[0]
        assert rec["agent"] in ("default", "local")
        users = [m["content"] for m in rec["conversation"] if m["role"] == "user"]
        answers = [m["text"] for m in rec["conversation"] if m["role"] == "assistant"]
        assert len(users) >= 2 and all(u.strip() for u in users), users
        assert "tell me" in users[0].lower() and "weather" in users[1].lower(), users
        assert len(answers) >= 2 and all(a.strip() for a in answers), answers
        assert "refused" not in d.log_path.read_text(errors="replace")
    finally:
        d.close()
