"""A speech-to-speech call through the whole daemon: brisvoxd serving an ``[s2s]`` agent file whose
OpenAI Realtime provider is a loopback server speaking the vendor's event protocol
(``bench/harness/s2s_openai.py``).

The caller speaks a recorded question; the fake's server VAD hears it (the audio went gateway ->
worker -> agent -> S2S stage -> the session), answers with a long response; the caller talks
over it. Checks from outside the daemon: the session set-up carries the agent's prompt and voice,
the client got the model's audio, the barge-in cancelled the response, the provider was told the
heard position (``conversation.item.truncate``), nothing of the cut answer reached the client
after the clear, and the call record holds both user turns and the cut answer.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
import soundfile as sf
from websockets.exceptions import ConnectionClosed

from bench.harness.daemon import Daemon, agents_config, write_config, ws_port
from bench.harness.s2s_openai import FakeRealtime, Scripted
from brisvox.agent.host.call_record import read_records
from brisvox.wire.native import NativeStream, server_message

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
SPEECH = ROOT / "tests" / "fixtures" / "generated" / "turn_complete.8k.wav"
LONG = "thank you for calling our kitchen is open until ten tonight and the bar until midnight " * 2


class FakeInThread:
    """The loopback vendor on its own loop (the daemon and the client run beside it)."""

    def __init__(self, fake: FakeRealtime) -> None:
        self.fake = fake
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> FakeRealtime:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.fake.__aenter__(), self.loop).result(5)
        return self.fake

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.fake.__aexit__(None, None, None), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def agent_file(d: Path, port: int) -> None:
    d.mkdir()
    (d / "rt.toml").write_text(f'''name = "rt"
system_prompt = "You are the test kitchen's phone line."
[s2s]
provider = "openai_realtime"
model = "gpt-realtime"
voice = "marin"
base_url = "ws://127.0.0.1:{port}/v1/realtime"
turn_detection = "provider"
[s2s.options]
vad = {{silence_duration_ms = 400}}
[tts]
provider = "espeak"
''')


async def call(port: int, speech: np.ndarray) -> dict:
    from websockets.asyncio.client import connect

    out: dict = {"frames": [], "clear_at": None}
    async with connect(f"ws://127.0.0.1:{port}/ws/rt") as ws:
        stream = NativeStream(8000)
        await ws.send(stream.start())
        first = await ws.recv()
        started = server_message(orjson.loads(first))
        assert started.event == "started" and started.agent == "rt", first
        out["call_id"] = started.call_id
        t0 = time.monotonic()

        async def rx() -> None:
            async for m in ws:
                now = time.monotonic() - t0
                if isinstance(m, bytes):
                    out["frames"].append((now, np.frombuffer(m, dtype="<i2")))
                else:
                    ev = server_message(orjson.loads(m))
                    if ev.event == "clear" and out["frames"]:
                        out["clear_at"] = out["clear_at"] or (now, len(out["frames"]))
                    elif ev.event == "stop":
                        out["stop"] = m  # the gateway ended the call (it says why)

        task = asyncio.create_task(rx())
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # a closed socket ends it
        silence = np.zeros(160, dtype=np.int16)
        question = [speech[i: i + 160] for i in range(0, len(speech) - 159, 160)]

        async def send(frames: list[np.ndarray]) -> None:
            nxt = time.monotonic()
            for fr in frames:
                await ws.send(fr.astype("<i2").tobytes())
                nxt += 0.02
                await asyncio.sleep(max(0.0, nxt - time.monotonic()))

        try:
            await send([silence] * 25 + question + [silence] * 10)
            deadline = time.monotonic() + 10
            while not any(np.any(x) for _, x in out["frames"]) and time.monotonic() < deadline:
                await send([silence] * 5)
            out["first_audio"] = next((t for t, x in out["frames"] if np.any(x)), None)
            await send([silence] * 50)  # a second of the answer, then the caller talks over it
            out["barge_start"] = time.monotonic() - t0
            await send(question + [silence] * 150)
            await ws.send(stream.stop())
            await asyncio.sleep(0.3)
        except ConnectionClosed as e:
            pytest.fail(f"the gateway closed the call: {e} ({out.get('stop')})")
        task.cancel()
    return out


def test_an_s2s_call_through_the_daemon_with_a_barge_in(short_tmp):
    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == 8000
    script = (Scripted(audio_ms=8000, transcript=LONG, chunk_ms=200), Scripted(audio_ms=600, transcript="go ahead"))
    with FakeInThread(FakeRealtime(script=script, user_text="what time do you close", vad_threshold=300.0)) as fake:
        agents = short_tmp / "agents"
        agent_file(agents, fake.port)
        routes = 'routes = [{ path = "/ws", protocol = "native", agent = "rt", agents = ["rt"] }]'
        extra = agents_config(agents, short_tmp / "records", smart_turn=True, websocket=routes)
        d = Daemon(short_tmp, config=write_config(short_tmp, workers=1, agents=1, extra=extra), real_roles=True,
                   env={"OPENAI_API_KEY": "sk-test"})
        try:
            d.start()
            snap = d.wait_ready(60)
            port = ws_port(d.child(snap, "gateway-0"))
            res = asyncio.run(call(port, speech))
            d.wait_for(lambda s: any(r["call_id"] == res["call_id"] for r in read_records(short_tmp / "records")),
                       30, "the call record")
        finally:
            d.close()
        log = fake.log
    rec = next(r for r in read_records(short_tmp / "records") if r["call_id"] == res["call_id"])
    session = log.session
    assert session["instructions"] == "You are the test kitchen's phone line."
    assert session["audio"]["output"]["voice"] == "marin"
    assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
    assert res["first_audio"] is not None, f"the model's audio never reached the client ({res.get('stop')})"
    assert len(log.audio) > 24000 * 2, "the caller's audio never reached the provider"
    # the answer had streamed whole (the provider is faster than real time): nothing to cancel on the wire,
    # the rest of it dropped here (stale audio), the provider told what was heard
    assert not log.of("response.cancel") and rec["stats"]["s2s"]["stale_audio"] > 0
    (trunc,) = log.of("conversation.item.truncate")
    assert trunc["item_id"] == "item_1" and 500 < trunc["audio_end_ms"] < 8000
    # the client heard about as much of the answer as the provider was told (its buffer aside)
    assert res["clear_at"] is not None
    clear_t, clear_idx = res["clear_at"]
    first = next(i for i, (_, x) in enumerate(res["frames"]) if np.any(x))
    heard_ms = 1000 * sum(len(x) for _, x in res["frames"][first:clear_idx] if np.any(x)) / 8000
    assert abs(heard_ms - trunc["audio_end_ms"]) < 200, (heard_ms, trunc)
    stale = [t for t, x in res["frames"][clear_idx:] if np.any(x) and t < res["barge_start"] + 0.8]
    assert not stale, f"{len(stale)} frames of the cut answer after the clear"
    conv = rec["conversation"]
    users = [m["content"] for m in conv if m["role"] == "user"]
    answers = [m["text"] for m in conv if m["role"] == "assistant"]
    assert users == ["what time do you close", "what time do you close"]
    assert answers and LONG.startswith(answers[0]) and 0 < len(answers[0]) < len(LONG.strip())
    assert rec["stats"]["s2s"]["barge_ins"] == 1 and rec["stats"]["s2s"]["truncations"] == 1
