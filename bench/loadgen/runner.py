"""The load generator's asyncio side: N Twilio Media Streams calls over WebSocket.

Owns the sockets and the one timer. Calls connect at their planned start
times (staggered), send ``connected`` + ``start``, then one 20 ms timer for all
calls asks each call's script for its frame and writes it (media, then any
mark echoes); the connection's read callback timestamps every bot message on
arrival (``time.monotonic``, the clock the CPU/PSS sampler uses too) and feeds
the script. When a script hangs up the call sends ``stop`` and closes.

The load generator shares the cores of the server it measures, so it is kept
cheap (about a quarter of its former CPU): every line's 20 ms media frames are
encoded once per run and shared by all callers (:mod:`bench.loadgen.wire`:
only three counters per frame are formatted and masked), sends are
synchronous writes from the timer (no task or await per frame), and reads go
through one shared buffer with the frames split outside the ``websockets``
library (:mod:`bench.loadgen.wsclient`). The bytes on the wire are the same
messages as before.

Invariants: every network await has a timeout (connect, close) or is bounded
by the run's hard deadline (``load.run_timeout_s``), after which every call
still open is closed and marked ``timeout``; a connection whose send buffer
backs up beyond ``MAX_BUFFERED`` drops frames (counted) instead of stalling
the timer for every other call; nothing here is shared between calls except
the timer, the pre-encoded line frames and the receive buffer.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bench.loadgen import speech, wire, wsclient
from bench.loadgen.caller import CallerTiming, CallScript
from bench.loadgen.pacing import Pacer
from bench.loadgen.stats import client_timeline, summarize
from bench.workload import FRAME_SAMPLES, Workload
from brisvox.wire.g711 import ULAW_SILENCE, ulaw_encode
from brisvox.wire.twilio import bot_event

log = logging.getLogger("bench.loadgen")

MAX_BUFFERED = 64 * 1024  # bytes queued on one socket before its frames are dropped
CONNECT_TIMEOUT_S = 10.0
CLOSE_TIMEOUT_S = 2.0
START_MARGIN_S = 0.5


@dataclass
class _Call:
    script: CallScript
    stream: wire.WireStream
    url: str
    ws: wsclient.WsClient | None = None
    active: bool = False  # connected and ticking
    finished: bool = False  # hung up, failed or timed out
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


def line_frames(samples, silence_byte: int = ULAW_SILENCE) -> list[str]:
    """int16 speech -> base64 mu-law 20 ms frames; the last frame padded with silence."""
    data = ulaw_encode(samples)
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
    key = wire.new_key()
    lines = {t: wire.encode_payloads(frames, key)  # once per line, shared by every caller
             for t, frames in prepare_lines(wl, {t for p in plans for t in p.lines}, cache_dir).items()}
    silence = wire.MediaPayload(base64.b64encode(bytes([ULAW_SILENCE]) * FRAME_SAMPLES).decode(), key)
    timing = CallerTiming.from_workload(wl)
    calls = [_Call(script=CallScript(p, [lines[t] for t in p.lines], silence, timing),
                   stream=wire.WireStream(p.index, key), url=urls[p.index % len(urls)]) for p in plans]

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
                    dropped += _tick(c, n, now, closers)
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
            if c.ws is not None:
                c.ws.abort()

    summary = summarize([c.script.result for c in calls], late_frame_ms=wl.measure.late_frame_ms,
                        answer_ms=wl.tts.answer_ms, tick_late_s=pacer.late_s,
                        ticks_skipped=pacer.skipped, send_dropped=dropped)
    summary["n_calls"] = n_calls
    summary["urls"] = sorted(set(urls))
    summary["turns_per_call"] = plans[0].turns
    # per call and turn, the client's own stamps: the server side's breakdown joins them by stream sid
    summary["timeline"] = [client_timeline(c.stream.stream_sid, c.script.result) for c in calls]
    return summary


async def _connect(c: _Call, at: float) -> None:
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    res = c.script.result
    try:
        c.ws = await wsclient.connect(c.url, functools.partial(_on_message, c), functools.partial(_on_closed, c),
                                      timeout=CONNECT_TIMEOUT_S, close_timeout=CLOSE_TIMEOUT_S, max_size=2**20)
        c.ws.send_text(c.stream.connected())
        c.ws.send_text(c.stream.start())
    except Exception as e:  # refused, timeout, handshake rejected
        res.error = f"connect: {type(e).__name__}: {e}"[:200]
        c.finished = True
        if c.ws is not None:
            c.ws.abort()
        return
    c.script.start(time.monotonic())
    c.active = True


def _tick(c: _Call, n: int, now: float, closers: list[asyncio.Task[None]]) -> int:
    """Send this tick's ``n`` frames of one call; returns frames dropped."""
    ws = c.ws
    assert ws is not None
    dropped = 0
    for _ in range(n):
        payload = c.script.next_payload(now)
        if payload is None:
            c.finished = True
            closers.append(asyncio.create_task(_close(c, send_stop=True)))
            return dropped
        if ws.buffered() > MAX_BUFFERED:
            dropped += 1
            continue
        if not ws.write(c.stream.media_frame(payload)):
            return dropped + _send_failed(c, now, closers)
    for name in c.script.due_marks(now):
        if not ws.send_text(c.stream.mark(name)):
            return dropped + _send_failed(c, now, closers)
    return dropped


def _send_failed(c: _Call, now: float, closers: list[asyncio.Task[None]]) -> int:
    """The server closed or reset the connection under a send."""
    c.script.result.error = "send: the connection is closed"
    c.script.result.t_end = now
    c.finished = True
    closers.append(asyncio.create_task(_close(c, send_stop=False)))
    return 0


def _on_message(c: _Call, data: bytes, now: float) -> None:
    script = c.script
    try:
        event, value = bot_event(orjson.loads(data))
    except orjson.JSONDecodeError:
        event, value = "invalid", None
    if event == "media":
        script.on_media(now, value)
    elif event == "clear":
        script.on_clear(now)
    elif event == "mark":
        script.on_mark(now, value)
    elif event == "invalid":
        script.result.invalid_messages += 1


def _on_closed(c: _Call) -> None:
    script = c.script
    if not c.finished and script.result.error is None:
        script.result.error = "closed by server"
        script.result.t_end = time.monotonic()
        c.finished = True


async def _close(c: _Call, send_stop: bool) -> None:
    ws = c.ws
    if ws is None:
        return
    try:
        if send_stop:
            ws.send_text(c.stream.stop())
        await ws.close(CLOSE_TIMEOUT_S)
    except Exception:
        ws.abort()
