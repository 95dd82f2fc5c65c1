"""Provider benchmarks: shared-client reuse, the local stack's stage latency, local job throughput.

Figures:

* **Shared client**: N sequential streamed completions through 5 adapter
  instances (5 "calls", different keys) to ONE loopback OpenAI-compatible
  server: TCP connections the server accepted (target 1: TLS-free loopback,
  so the figure is the pooling itself) and the per-request overhead of the
  adapter (SSE parse + event translation). Then 20 concurrent streams: the
  connections HTTP/1.1 needs for them (HTTP/2 to a TLS origin would
  multiplex them; loopback servers here speak HTTP/1.1).
* **Local stack stage latency** (a real ``python -m workers.process`` worker,
  models warm): Whisper per utterance (a 2.3 s Piper-spoken question read from
  in16), the default local LLM's first token and whole reply (max 40 tokens), Piper first audio
  for one sentence. Medians of ``runs``.
* **Local job throughput**: jobs of one kind submitted back to back, all at
  once, to one worker (one lane thread per kind): completed jobs per second.

The machine is shared with other sessions while this runs: figures are noisy.
"""

from __future__ import annotations

import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

Row = tuple[str, Any, str, str]


# -- shared client --------------------------------------------------------------------------------


async def _pool(n: int) -> list[Row]:
    from bench.harness.http_server import FakeHttpServer
    from bench.harness.llm_wire import Resp, ScriptedVendor
    from brisvox.providers.base import LlmMessage, LlmRequest
    from brisvox.providers.http import close_all
    from brisvox.providers.openai_compat import OpenAiCompatLlm

    req = LlmRequest((LlmMessage("user", "hi"),))
    sv = ScriptedVendor("openai", lambda i, b: Resp(text=["Hello ", "there, ", "how ", "are ", "you?"]))
    rows: list[Row] = []
    async with FakeHttpServer(sv) as srv:
        ps = [OpenAiCompatLlm("m", preset="openai", base_url=srv.url + "/v1", api_key=f"sk-{i}") for i in range(5)]

        async def one(p: Any) -> None:
            s = p.stream(req)
            async for _ in s:
                pass
            await s.aclose()

        await one(ps[0])  # the first connect
        t0 = time.perf_counter()
        for i in range(n):
            await one(ps[i % 5])
        per = (time.perf_counter() - t0) / n
        rows.append((f"sequential streams over 5 adapters ({n})", srv.connections, "connections", "1"))
        rows.append(("loopback stream round trip (5 deltas)", per * 1000, "ms", "-"))
        before = srv.connections
        await asyncio.gather(*(one(ps[i % 5]) for i in range(20)))
        rows.append(("20 concurrent streams: new connections (HTTP/1.1)", srv.connections - before, "connections",
                     "<= 20"))
        b2 = srv.connections
        for i in range(n):
            await one(ps[i % 5])
        rows.append((f"sequential again after the burst ({n}): new connections", srv.connections - b2,
                     "connections", "0"))
        await close_all()
    return rows


# -- local stack ----------------------------------------------------------------------------------


def _question() -> np.ndarray:
    import soxr

    from workers.local_tts import PiperRunner
    from workers.models import locate

    r = PiperRunner(locate("piper_joe"), locate("piper_joe_config"))
    try:
        pcm = np.concatenate(list(r.synthesize("What is the weather like in Paris today?")))
    finally:
        r.close()
    x = soxr.resample(pcm.astype(np.float32) / 32768.0, 22050, 8000)
    return (np.clip(x, -1, 1) * 32767).astype(np.int16)


async def _local(runs: int, burst: int) -> list[Row]:
    import zmq.asyncio

    from brisvox.providers.base import (
        LlmMessage,
        LlmRequest,
        SttConfig,
        TextDelta,
        TtsAudio,
        TtsConfig,
        TtsFlushed,
    )
    from brisvox.providers.local_llm import LocalLlm
    from brisvox.providers.local_piper import LocalPiperTts
    from brisvox.providers.local_whisper import LocalWhisperStt
    from brisvox.providers.worker_jobs import WorkerJobChannel
    from ipc.bus import endpoint
    from ipc.frames import SttJob
    from ipc.ring import instance_id
    from ipc.worker_client import WorkerClient
    from workers.harness import WorkerProc, close_rings, create_call_rings

    q = _question()
    inst = instance_id()
    tmp = Path(tempfile.mkdtemp(prefix="bvb", dir="/tmp"))
    ep = endpoint(tmp, "worker-0")
    call = "bench-local"
    rings = create_call_rings(inst, call, call_rate=8000, tts_rate=22050, seconds=64)
    w = WorkerProc(0, ep, extra=["--no-smart-turn"]).start(timeout=120)
    rows: list[Row] = []
    ctx = zmq.asyncio.Context()
    client = WorkerClient(ctx, "bench-0", {0: ep}, request_timeout=10.0)
    try:
        await client.start()
        ch = WorkerJobChannel(client)
        await client.attach(call, inst, 8000, 22050, worker=0)
        sil = np.zeros(4000, dtype=np.int16)
        rings["in"].write(np.concatenate([sil, q, sil]))
        for _ in range(100):
            await asyncio.sleep(0.05)
            if client.calls[call].in16_pos >= (len(q) + 8000) * 2 - 320:
                break
        end16 = client.calls[call].in16_pos
        start16 = end16 - (len(q) + 4000) * 2
        stt, llm, tts = LocalWhisperStt(ch, call), LocalLlm(ch, call, max_tokens=40), LocalPiperTts(ch, call)
        t0 = time.perf_counter()
        await asyncio.gather(stt.warm(60), llm.warm(60), tts.warm(60))
        rows.append(("local models warm-up (3 models, cold, in parallel)", (time.perf_counter() - t0) * 1000, "ms",
                     "-"))
        s_t, l_ft, l_all, t_fa = [], [], [], []
        text = ""
        for _ in range(runs):
            sess = await stt.connect(SttConfig(), 5.0)
            it = sess.events().__aiter__()
            sess.note_span(start16, end16)
            t0 = time.perf_counter()
            await sess.finalize(1.0)
            tr = await asyncio.wait_for(it.__anext__(), 60)
            s_t.append(time.perf_counter() - t0)
            text = getattr(tr, "text", "")
            await sess.close(1.0)
            req = LlmRequest((LlmMessage("system", "Answer in one short sentence."), LlmMessage("user", text)),
                             max_tokens=40, temperature=0.0)
            t0 = time.perf_counter()
            first = None
            reply = ""
            s = llm.stream(req)
            async for ev in s:
                if isinstance(ev, TextDelta):
                    first = first or time.perf_counter() - t0
                    reply += ev.text
            await s.aclose()
            l_ft.append(first or 0.0)
            l_all.append(time.perf_counter() - t0)
            ts = await tts.connect(TtsConfig(), 5.0)
            tit = ts.events().__aiter__()
            t0 = time.perf_counter()
            await ts.send_text(1, "The weather in Paris is sunny today.", continue_=False, timeout=1.0)
            await ts.flush(1, 1.0)
            fa = None
            while True:
                ev = await asyncio.wait_for(tit.__anext__(), 60)
                if isinstance(ev, TtsAudio) and fa is None:
                    fa = time.perf_counter() - t0
                if isinstance(ev, TtsFlushed):
                    break
            t_fa.append(fa or 0.0)
            await ts.close(1.0)
        med = statistics.median
        rows += [
            (f"STT per utterance (Whisper tiny.en, {len(q) / 8000:.1f} s clip, median of {runs})",
             med(s_t) * 1000, "ms", "~330 idle"),
            ("LLM first token (default local LLM, warm)", med(l_ft) * 1000, "ms", "~200 cold / 8 cached"),
            ("LLM whole reply (<= 40 tokens)", med(l_all) * 1000, "ms", "-"),
            ("TTS first audio (Piper joe, one sentence)", med(t_fa) * 1000, "ms", "~83 per 1.9 s"),
        ]

        # throughput: `burst` jobs of a kind at once
        async def stt_job() -> None:
            r = await ch.request(SttJob(call_id=call, start_pos=start16, end_pos=end16,
                                        deadline_ns=time.monotonic_ns() + int(120e9)), 120)
            assert r.TYPE == "stt_job_result", r

        async def llm_job() -> None:
            s = llm.stream(LlmRequest((LlmMessage("user", "Say hello."),), max_tokens=16))
            async for _ in s:
                pass
            await s.aclose()

        async def tts_job() -> None:
            ts = await tts.connect(TtsConfig(), 5.0)
            it = ts.events().__aiter__()
            await ts.send_text(1, "One moment, please.", continue_=False, timeout=1.0)
            await ts.flush(1, 1.0)
            while not isinstance(await asyncio.wait_for(it.__anext__(), 120), TtsFlushed):
                pass
            await ts.close(1.0)

        for name, fn, unit in ((f"STT jobs ({(end16 - start16) / 16000:.1f} s utterance)", stt_job, "jobs/s"),
                               ("LLM jobs (16 tokens)", llm_job, "jobs/s"),
                               ("TTS jobs (one short sentence)", tts_job, "jobs/s")):
            t0 = time.perf_counter()
            await asyncio.gather(*(fn() for _ in range(burst)))
            rows.append((f"worker sustains: {name}, {burst} at once", burst / (time.perf_counter() - t0), unit, "-"))
        await client.detach(call)
    finally:
        await client.close()
        ctx.term()
        w.stop()
        close_rings(rings)
        shutil.rmtree(tmp, ignore_errors=True)
    return rows


def run(quick: bool) -> list[Row]:
    rows = asyncio.run(_pool(20 if quick else 200))
    try:
        rows += asyncio.run(_local(runs=1 if quick else 5, burst=3 if quick else 10))
    except Exception as e:  # the local models are missing: say so, keep the pool figures
        rows.append(("local stack", f"not measured: {type(e).__name__}: {e}"[:120], "", "-"))
    return rows
