"""The load generator's asyncio side: N Twilio Media Streams calls over WebSocket.

Owns the sockets and the one timer. Calls connect at their planned start
times (staggered), send ``connected`` + ``start``, then one 20 ms timer for all
calls asks each call's script for its frame and sends it (media, then any
mark echoes); a receive task per call timestamps every bot message on arrival
(``time.monotonic``, the clock the CPU/PSS sampler uses too) and feeds the
script. When a script hangs up the call sends ``stop`` and closes.

Invariants: every network await has a timeout (connect, close) or is bounded
by the run's hard deadline (``load.run_timeout_s``), after which every call
still open is closed and marked ``timeout``; a connection whose send buffer
backs up beyond ``MAX_BUFFERED`` drops frames (counted) instead of stalling
the timer for every other call; nothing here is shared between calls except
the timer.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.client import ClientConnection, connect

from bench.loadgen import speech
from bench.loadgen.caller import CallerTiming, CallScript
from bench.loadgen.pacing import Pacer
from bench.loadgen.stats import summarize
from bench.workload import FRAME_SAMPLES, Workload
from brisvox.client.twilio import SILENCE_BYTE, TwilioStream, encode, parse_bot

log = logging.getLogger("bench.loadgen")

MAX_BUFFERED = 64 * 1024  # bytes queued on one socket before its frames are dropped
CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
START_MARGIN_S = 0.5


@dataclass
class _Call:
    script: CallScript
    stream: TwilioStream
    url: str
    ws: ClientConnection | None = None
    active: bool = False  # connected and ticking
    finished: bool = False  # hung up, failed or timed out
    recv_task: asyncio.Task[None] | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


def line_frames(samples, silence_byte: int = SILENCE_BYTE) -> list[str]:
    """int16 speech -> base64 mu-law 20 ms frames; the last frame padded with silence."""
    data = encode(samples)
    rem = len(data) % FRAME_SAMPLES
    if rem:
        data += bytes([silence_byte]) * (FRAME_SAMPLES - rem)
    return [base64.b64encode(data[i:i + FRAME_SAMPLES]).decode()
            for i in range(0, len(data), FRAME_SAMPLES)]


def prepare_lines(wl: Workload, texts: set[str], cache_dir: Path | None) -> dict[str, list[str]]:
    c = wl.caller
    return {t: line_frames(speech.synthesize(t, c.voice, c.words_per_minute, c.peak_dbfs, cache_dir))
            for t in sorted(texts)}


async def run_load(urls: list[str], n_calls: int, wl: Workload, *, quick: bool = False,
                   cache_dir: Path | None = None) -> dict[str, Any]:
    """Run ``n_calls`` concurrent calls (call i goes to ``urls[i % len(urls)]``); return the summary."""
    if not urls or n_calls < 1:
        raise ValueError("need at least one url and one call")
    plans = [wl.plan(i, n_calls, quick) for i in range(n_calls)]
    lines = prepare_lines(wl, {t for p in plans for t in p.lines}, cache_dir)
    silence = base64.b64encode(bytes([SILENCE_BYTE]) * FRAME_SAMPLES).decode()
    timing = CallerTiming.from_workload(wl)
    calls = [_Call(script=CallScript(p, [lines[t] for t in p.lines], silence, timing),
                   stream=TwilioStream(p.index), url=urls[p.index % len(urls)]) for p in plans]

    t0 = time.monotonic() + START_MARGIN_S
    pacer = Pacer(t0=t0, period=FRAME_SAMPLES / 8000)
    hard_deadline = t0 + wl.load.run_timeout_s
    dropped = 0
    connectors = [asyncio.create_task(_connect(c, t0 + c.script.plan.start_ms / 1000.0))
                  for c in calls]
    closers: list[asyncio.Task[None]] = []
    try:
        while True:
            now = time.monotonic()
            n = pacer.due(now)
            if n:
                for c in calls:
                    if not c.active or c.finished or c.ws is None:
                        continue
                    dropped += await _tick(c, n, now, closers)
            if all(c.finished for c in calls) and all(t.done() for t in connectors):
                break
            if now >= hard_deadline:
                for c in calls:
                    if not c.finished:
                        c.script.result.error = c.script.result.error or "timeout"
                        c.script.result.t_end = c.script.result.t_end or now
                        c.finished = True
                        closers.append(asyncio.create_task(_close(c, send_stop=True)))
                break
            await asyncio.sleep(max(0.0, pacer.next_deadline() - time.monotonic()))
    finally:
        for t in connectors:
            t.cancel()
        await asyncio.gather(*connectors, return_exceptions=True)
        if closers:
            await asyncio.wait(closers, timeout=CLOSE_TIMEOUT_S + 1.0)
        for c in calls:
            if c.recv_task is not None and not c.recv_task.done():
                c.recv_task.cancel()
            if c.ws is not None and c.ws.transport is not None:
                c.ws.transport.abort()
        await asyncio.gather(*(c.recv_task for c in calls if c.recv_task), return_exceptions=True)

    summary = summarize([c.script.result for c in calls], late_frame_ms=wl.measure.late_frame_ms,
                        answer_ms=wl.tts.answer_ms, tick_late_s=pacer.late_s,
                        ticks_skipped=pacer.skipped, send_dropped=dropped)
    summary["n_calls"] = n_calls
    summary["urls"] = sorted(set(urls))
    summary["turns_per_call"] = plans[0].turns
    return summary


async def _connect(c: _Call, at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    res = c.script.result
    try:
        c.ws = await asyncio.wait_for(
            connect(c.url, compression=None, ping_interval=None, open_timeout=CONNECT_TIMEOUT_S,
                    close_timeout=CLOSE_TIMEOUT_S, max_size=2**20),
            CONNECT_TIMEOUT_S + 1.0)
        await c.ws.send(c.stream.connected())
        await c.ws.send(c.stream.start())
    except Exception as e:  # refused, timeout, handshake rejected
        res.error = f"connect: {type(e).__name__}: {e}"[:200]
        c.finished = True
        return
    c.recv_task = asyncio.create_task(_receive(c))
    c.script.start(time.monotonic())
    c.active = True


async def _tick(c: _Call, n: int, now: float, closers: list[asyncio.Task[None]]) -> int:
    """Send this tick's ``n`` frames of one call; returns frames dropped."""
    assert c.ws is not None
    dropped = 0
    try:
        for _ in range(n):
            payload = c.script.next_payload(now)
            if payload is None:
                c.finished = True
                closers.append(asyncio.create_task(_close(c, send_stop=True)))
                return dropped
            transport = c.ws.transport
            if transport is not None and transport.get_write_buffer_size() > MAX_BUFFERED:
                dropped += 1
                continue
            await c.ws.send(c.stream.media(payload))
        for name in c.script.due_marks(now):
            await c.ws.send(c.stream.mark(name))
    except Exception as e:  # the server closed or reset the connection
        c.script.result.error = f"send: {type(e).__name__}: {e}"[:200]
        c.script.result.t_end = now
        c.finished = True
        closers.append(asyncio.create_task(_close(c, send_stop=False)))
    return dropped


async def _receive(c: _Call) -> None:
    assert c.ws is not None
    script = c.script
    try:
        async for message in c.ws:
            now = time.monotonic()
            m = parse_bot(message)
            if m.event == "media":
                script.on_media(now, m.payload)
            elif m.event == "clear":
                script.on_clear(now)
            elif m.event == "mark":
                script.on_mark(now, m.name)
            elif m.event == "invalid":
                script.result.invalid_messages += 1
    except Exception as e:
        if not c.finished and script.result.error is None:
            script.result.error = f"receive: {type(e).__name__}"
    if not c.finished and script.result.error is None:
        script.result.error = "closed by server"
        script.result.t_end = time.monotonic()
        c.finished = True


async def _close(c: _Call, send_stop: bool) -> None:
    if c.ws is None:
        return
    try:
        if send_stop:
            await asyncio.wait_for(c.ws.send(c.stream.stop()), CLOSE_TIMEOUT_S)
        await asyncio.wait_for(c.ws.close(), CLOSE_TIMEOUT_S)
    except Exception:
        pass
