"""The chaos run's loopback vendors: Deepgram (WS), an OpenAI-compatible LLM (SSE), Cartesia (WS),
ElevenLabs (WS, the secondary voice), the booking API and the fault control, all in one process
of their own.

``python -m bench.harness.chaos.vendors --ports FILE`` serves until SIGTERM
and writes ``{"stt": port, "tts": port, "tts2": port, "http": port}`` to FILE once bound;
:class:`VendorProcess` starts and stops it (by pid) and talks to its control
endpoint. Every URL starts with the call's variant (``/<variant>/...``, see
:mod:`.script`); the vendors answer that variant's script:

* STT (Deepgram ``/v1/listen``): utterances are found in the audio (loud
  stretches ``GAP_S`` apart), the Nth utterance of the connection is the
  script's Nth phrase; one interim with the words still owed as soon as a
  segment has speech, the from-finalize final at each Finalize; an
  armed ``stt_cut`` aborts the socket of a ``sttcut`` call at the Finalize of
  its last utterance (after the interim: the stage's promoted interim keeps
  the words); an armed ``stt_finalize_hang`` never answers the Finalize of
  a ``sttfin`` call's last utterance and keeps the socket open;
* LLM (``/<variant>/v1/chat/completions``): :func:`.script.llm_answer`
  streamed as OpenAI SSE; an armed ``llm_hang`` never answers one
  ``llmhang`` request, an armed ``llm_429`` answers one ``llm429`` request
  429 with ``Retry-After: 1``;
* TTS (Cartesia ``/tts/websocket``): a 440 Hz tone, 25 ms per character, in
  100 ms chunks, word timestamps, ``done`` at the flush; an armed ``tts_cut``
  aborts the socket of a ``ttscut`` call after the first chunk of a text;
  an armed ``tts_die`` kills the primary of the ``ttsdie`` calls: the
  socket of a ``ttsdie`` call is aborted after the first chunk of its
  second context (answer 2, partly heard), and from then on every
  ``ttsdie`` handshake is refused (503: the vendor is down; the time of
  each death is kept in ``tts_deaths``, on the host's monotonic clock);
* secondary TTS (ElevenLabs ``/v1/text-to-speech/{voice}/multi-stream-input``,
  the ``ttsdie`` agents' ``[tts.secondary]``): a 660 Hz tone (the primary's
  is 440 Hz, so a caller can tell the voices apart), 25 ms per character, in
  100 ms chunks, character alignment with the first chunk, ``isFinal`` at
  ``close_context``; the voice id of every connection's path is counted
  (``secondary_voices``);
* booking (``POST /bookings``, ``POST /slow/bookings`` answers after 3 s):
  every POST body is counted by its ``Idempotency-Key``; a key seen before
  gets the booking it created (``already_booked``), never a second one.

Invariants: an armed fault fires at most ``count`` times (each firing is
counted in ``fired``); an LLM fault fires at most once per ``REFIRE_S`` (a fault is
one failed request of one call: the re-issue of the request it failed -- after the
``Retry-After`` or the first-token timeout, within seconds -- is answered, never taken by
the count meant for another call of the variant); nothing here depends on which call a connection
belongs to beyond its variant; every socket binds 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import orjson
from websockets.asyncio.server import ServerConnection

from bench.harness.chaos import script
from bench.harness.http_server import FakeHttpServer, Reply, Request, json_reply
from bench.harness.llm_wire import error_reply, reply_for
from bench.harness.ws_vendors import FakeElevenLabs, FakeWs

ROOT = Path(__file__).resolve().parents[3]
SLOW_BOOKING_S = 3.0
FAULTS = ("stt_cut", "tts_cut", "llm_hang", "llm_429", "stt_finalize_hang", "tts_die")
REFIRE_S = {"llm_hang": 6.0, "llm_429": 6.0}  # see the invariants
PRIMARY_HZ = 440.0
SECONDARY_HZ = 660.0


class State:
    """Armed faults, firings and the booking API's store (one per vendor process)."""

    def __init__(self) -> None:
        self.armed: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.fired: dict[str, int] = dict.fromkeys(FAULTS, 0)
        self.last_fired: dict[str, float] = {}
        self.posts: dict[str, int] = {}  # Idempotency-Key -> POST bodies received
        self.bookings: dict[str, str] = {}  # Idempotency-Key -> booking number
        self.counts: dict[str, int] = {"stt_connections": 0, "tts_connections": 0, "llm_requests": 0,
                                       "stt_finals": 0, "tts_texts": 0, "tts_refused": 0,
                                       "secondary_connections": 0, "secondary_texts": 0}
        self.tts_down: set[str] = set()  # variants whose primary TTS is down (tts_die fired)
        self.tts_deaths: list[float] = []  # time.monotonic() of each tts_die firing
        self.secondary_voices: dict[str, int] = {}  # voice id on the secondary's path -> connections

    def take(self, fault: str) -> bool:
        now = time.monotonic()
        if self.armed[fault] > 0 and now - self.last_fired.get(fault, -1e9) >= REFIRE_S.get(fault, 0.0):
            self.armed[fault] -= 1
            self.fired[fault] += 1
            self.last_fired[fault] = now
            return True
        return False

    def stats(self) -> dict[str, Any]:
        return {"armed": self.armed, "fired": self.fired, "posts": self.posts, "bookings": self.bookings,
                "tts_deaths": self.tts_deaths, "secondary_voices": self.secondary_voices, **self.counts}


def variant_of(path: str) -> str:
    head = path.lstrip("/").split("/", 1)[0]
    return head if head in script.SCRIPT_OF else "talk"


def _dg(text: str, is_final: bool, from_finalize: bool) -> str:
    return orjson.dumps({"type": "Results", "channel_index": [0, 1], "duration": 0.5, "start": 0.0,
                         "is_final": is_final, "speech_final": False, "from_finalize": from_finalize,
                         "channel": {"alternatives": [{"transcript": text, "confidence": 0.93,
                                                       "words": []}]}}).decode()


GAP_S = 0.6  # silence that separates two utterances of a caller (the fixture's own pauses are shorter)
DONE_S = 0.1  # trailing silence at a Finalize: the utterance is complete
LOUD_RMS = 300.0


def fixture_loud_s() -> float:
    """Loud seconds (10 ms frames above ``LOUD_RMS``) of the caller's recorded question."""
    import soundfile as sf

    from bench.harness.call_daemon import SPEECH

    x, rate = sf.read(SPEECH, dtype="int16")
    n = rate // 100
    frames = x[: len(x) // n * n].astype(np.float32).reshape(-1, n)
    return float(np.sum(np.sqrt(np.mean(frames * frames, axis=1)) > LOUD_RMS)) / 100


class ChaosStt(FakeWs):
    """Utterances are found in the audio itself (loud stretches separated by ``GAP_S`` of
    silence), independent of where the Finalizes fall: a Finalize in the middle of an
    utterance (a worker failover synthesizes a stop) gets the words "spoken" so far
    (by loud time, ``utter_s`` per utterance), the next one the rest."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state
        self.utter_s = fixture_loud_s()

    async def serve(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        variant = variant_of(ws.request.path)
        self.state.counts["stt_connections"] += 1
        utt = -1  # the caller's current utterance on this connection
        loud_in_utt = 0.0
        silence = 1e9
        emitted = 0  # words of the current utterance already answered
        loud_since_final = 0.0
        interim_sent = False
        async for msg in ws:
            if isinstance(msg, bytes):
                x = np.frombuffer(msg[: len(msg) // 2 * 2], dtype="<i2").astype(np.float32)
                for a in range(0, x.size - 159, 160):
                    f = x[a : a + 160]
                    if float(np.sqrt(np.mean(f * f))) > LOUD_RMS:
                        if silence >= GAP_S:
                            utt, loud_in_utt, emitted = utt + 1, 0.0, 0
                        loud_in_utt += 0.01
                        loud_since_final += 0.01
                        silence = 0.0
                    else:
                        silence += 0.01
                words = script.stt_phrase(variant, utt).split()
                if loud_since_final >= 0.3 and not interim_sent and words[emitted:]:
                    interim_sent = True
                    await ws.send(_dg(" ".join(words[emitted:]), False, False))
                continue
            obj = orjson.loads(msg)
            t = obj.get("type")
            if t == "Finalize":
                words = script.stt_phrase(variant, utt).split() if loud_since_final > 0 else []
                complete = silence >= DONE_S
                k = len(words) if complete else sum(
                    1 for i in range(len(words)) if (i + 0.5) / len(words) * self.utter_s <= loud_in_utt)
                text = " ".join(words[emitted:k])
                if (complete and text and variant == "sttcut" and utt == script.TURNS - 1
                        and self.state.take("stt_cut")):
                    ws.transport.abort()
                    return
                if (complete and text and variant == "sttfin" and utt == script.TURNS - 1
                        and self.state.take("stt_finalize_hang")):
                    emitted = max(emitted, k)  # heard, never answered: the socket stays open
                    loud_since_final, interim_sent = 0.0, False
                    continue
                emitted = max(emitted, k)
                self.state.counts["stt_finals"] += 1
                await ws.send(_dg(text, True, True))
                loud_since_final, interim_sent = 0.0, False
            elif t == "CloseStream":
                await ws.send(orjson.dumps({"type": "Metadata", "duration": 1.0}).decode())
                await ws.close()
                return


def tone(n: int, rate: int, phase0: int = 0, hz: float = PRIMARY_HZ) -> bytes:
    t = (np.arange(n) + phase0) / rate
    return (np.sin(2 * np.pi * hz * t) * 6000).astype("<i2").tobytes()


class ChaosTts(FakeWs):
    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    def _check(self, conn: ServerConnection, request: Any) -> Any:
        if variant_of(request.path) in self.state.tts_down:
            self.state.counts["tts_refused"] += 1
            return conn.respond(503, "the primary TTS is down\n")
        return None

    async def serve(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        variant = variant_of(ws.request.path)
        self.state.counts["tts_connections"] += 1
        offsets: dict[str, float] = {}
        contexts: list[str] = []  # in the order they opened on this connection
        async for msg in ws:
            obj = orjson.loads(msg)
            cid = obj.get("context_id")
            if obj.get("cancel"):
                continue
            text = obj.get("transcript", "")
            if text:
                if cid not in contexts:
                    contexts.append(cid)
                self.state.counts["tts_texts"] += 1
                rate = obj["output_format"]["sample_rate"]
                n = int(rate * 0.025 * len(text))
                step = rate // 10
                for i, a in enumerate(range(0, n, step)):
                    part = tone(min(step, n - a), rate, a)
                    await ws.send(orjson.dumps({"type": "chunk", "context_id": cid, "status_code": 206,
                                                "done": False, "data": base64.b64encode(part).decode()}).decode())
                    if i == 0 and variant == "ttscut" and self.state.take("tts_cut"):
                        ws.transport.abort()
                        return
                    if (i == 0 and variant == "ttsdie" and len(contexts) == 2 and cid == contexts[1]
                            and self.state.take("tts_die")):
                        self.state.tts_down.add(variant)
                        self.state.tts_deaths.append(time.monotonic())
                        ws.transport.abort()
                        return
                t0 = offsets.get(cid, 0.0)
                words = text.split()
                dur = n / rate
                stepw = dur / max(1, len(words))
                await ws.send(orjson.dumps({"type": "timestamps", "context_id": cid, "word_timestamps": {
                    "words": words, "start": [t0 + i * stepw for i in range(len(words))],
                    "end": [t0 + (i + 1) * stepw for i in range(len(words))]}}).decode())
                offsets[cid] = t0 + dur
            if obj.get("continue") is False:
                await ws.send(orjson.dumps({"type": "done", "context_id": cid, "done": True,
                                            "status_code": 206}).decode())


class ChaosSecondaryTts(FakeElevenLabs):
    """ElevenLabs' multi-context WebSocket in the secondary's own voice: a 660 Hz tone, 25 ms per
    character in 100 ms chunks at the rate the path asks for, the alignment with the first."""

    def __init__(self, state: State) -> None:
        super().__init__()
        self.state = state

    async def serve(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        path = ws.request.path.split("?", 1)[0]
        parts = path.strip("/").split("/")  # <variant>/v1/text-to-speech/<voice>/multi-stream-input
        voice = parts[-2] if len(parts) >= 2 else ""
        st = self.state
        st.counts["secondary_connections"] += 1
        st.secondary_voices[voice] = st.secondary_voices.get(voice, 0) + 1
        await super().serve(ws)

    def audio(self, ws: ServerConnection, cid: Any, text: str) -> list[dict[str, Any]]:
        assert ws.request is not None
        query = parse_qs(urlsplit(ws.request.path).query)
        rate = int(query.get("output_format", ["pcm_24000"])[0].removeprefix("pcm_"))
        self.state.counts["secondary_texts"] += 1
        n = int(rate * 0.025 * len(text))
        step = rate // 10
        out: list[dict[str, Any]] = []
        for a in range(0, n, step):
            m: dict[str, Any] = {"audio": base64.b64encode(tone(min(step, n - a), rate, a, SECONDARY_HZ)).decode(),
                                 "contextId": cid}
            if a == 0:
                m["alignment"] = {"chars": list(text), "charStartTimesMs": [25.0 * k for k in range(len(text))],
                                  "charDurationsMs": [25.0] * len(text)}
            out.append(m)
        return out


def http_handler(state: State) -> Any:
    def handle(req: Request) -> Reply:
        path = req.path.split("?", 1)[0]
        if path.endswith("/chat/completions"):
            variant = variant_of(path)
            state.counts["llm_requests"] += 1
            if variant == "llmhang" and state.take("llm_hang"):
                return Reply(200, [], first_byte_delay=120.0)
            if variant == "llm429" and state.take("llm_429"):
                r = error_reply("openai", 429)
                r.headers["Retry-After"] = "1"
                return r
            return reply_for("openai", script.llm_answer(variant, req.json or {}))
        if path.endswith("/bookings") and req.method == "POST":
            key = req.headers.get("idempotency-key", "")
            state.posts[key] = state.posts.get(key, 0) + 1
            already = key in state.bookings
            if not already:
                state.bookings[key] = f"BK-{1001 + len(state.bookings)}"
            body = {"booking": state.bookings[key], **(req.json or {}), "already_booked": already}
            r = json_reply(200, body)
            if path.startswith("/slow/"):
                r.first_byte_delay = SLOW_BOOKING_S
            return r
        if path == "/control/arm" and req.method == "POST":
            b = req.json or {}
            if b.get("fault") not in FAULTS:
                return json_reply(400, {"error": f"unknown fault {b.get('fault')!r}"})
            state.armed[b["fault"]] += int(b.get("count", 1))
            return json_reply(200, {"armed": state.armed})
        if path == "/control/stats":
            return json_reply(200, state.stats())
        return json_reply(404, {"error": "no such path"})

    return handle


async def serve(ports_file: Path) -> None:
    state = State()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with (ChaosStt(state) as stt, ChaosTts(state) as tts, ChaosSecondaryTts(state) as tts2,
                FakeHttpServer(http_handler(state)) as http):
        tmp = ports_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"stt": stt.port, "tts": tts.port, "tts2": tts2.port, "http": http.port,
                                   "pid": os.getpid()}))
        os.replace(tmp, ports_file)
        parent = os.getppid()
        while not stop.is_set():  # also ends when the parent that started us is gone
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if os.getppid() != parent:
                break


class VendorProcess:
    """The vendor process of one run: started in its own session, stopped by its pid."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.ports_file = tmp / "vendors.json"
        self.log_path = tmp / "vendors.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}

    def start(self, timeout: float = 15.0) -> VendorProcess:
        env = dict(os.environ, PYTHONPATH=str(ROOT), OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "bench.harness.chaos.vendors",
                                          "--ports", str(self.ports_file)], cwd=ROOT, env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.ports_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the vendor process did not start: {self.log_path.read_text()[-2000:]}")
            time.sleep(0.05)
        self.ports = json.loads(self.ports_file.read_text())
        return self

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ports['http']}"

    def _req(self, path: str, body: Any = None) -> Any:
        data = None if body is None else orjson.dumps(body)
        req = urllib.request.Request(self.http + path, data=data, method="POST" if data else "GET",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            raw = r.read()
        return orjson.loads(raw) if raw else None

    def arm(self, fault: str, count: int) -> None:
        self._req("/control/arm", {"fault": fault, "count": count})

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = self._req("/control/stats")
        return out

    def stop(self) -> None:
        p = self.proc
        if p is None:
            return
        self.proc = None
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.harness.chaos.vendors")
    ap.add_argument("--ports", required=True, type=Path)
    args = ap.parse_args(argv)
    asyncio.run(serve(args.ports))
    return 0


if __name__ == "__main__":
    sys.exit(main())
