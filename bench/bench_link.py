"""The agent link's costs on loopback (docs/AGENT_PROTOCOL.md; target: <= 2 ms p99 at 200 calls).

A no-op agent service runs in its own process (``python -m bench.bench_link --serve PORT``:
websockets, one connection per call, every ``tool.call`` answered at once). The bench, in
this process, opens real :class:`~brisvox.agent.link.client.AgentLink` objects (the daemon's
code: signed handshake, offer, accept, ready, the tool registered) and measures:

* the handshake per call (dial + offer + accept + ready), median and p99;
* the ``tool.call`` -> ``tool.result`` round trip through the registered tool body, p50/p99,
  at 1 call (back to back) and at 200 concurrent calls each calling every 100 ms
  (2,000 round trips a second through one agent process's loop: a stress figure) and
  every 1 s (200 a second; a real call makes one every few seconds);
* the link's memory per call (tracemalloc, 200 open links, socket buffers of the kernel aside).
"""

from __future__ import annotations

import asyncio
import random
import socket
import statistics
import subprocess
import sys
import time
import tracemalloc
from typing import Any

import orjson

from brisvox.agent.link.client import AgentLink
from brisvox.agent.link.config import LinkConfig
from brisvox.agent.tool_engine.registry import ToolContext, ToolRegistry

SECRET = "bench-secret"
NOOP = {"name": "noop", "description": "Nothing.", "parameters": {"type": "object", "properties": {}},
        "kind": "read_only", "timeout_ms": 1000, "filler_after_ms": None}


async def serve(port: int) -> None:
    import websockets

    async def one(ws: Any) -> None:
        offer = orjson.loads(await ws.recv())
        await ws.send(orjson.dumps({"type": "session.accept", "session": offer["session"], "tools": [NOOP],
                                    "subscribe": []}).decode())
        async for raw in ws:
            f = orjson.loads(raw)
            if f.get("type") == "tool.call":
                await ws.send(orjson.dumps({"type": "tool.result", "id": f["id"], "ok": True, "result": {}}).decode())

    async with websockets.serve(one, "127.0.0.1", port, compression=None, max_size=1 << 20):
        print("ready", flush=True)
        await asyncio.Future()


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")


async def open_links(port: int, n: int) -> tuple[list[AgentLink], list[float]]:
    cfg = LinkConfig(f"ws://127.0.0.1:{port}/bench", "S")
    links, times = [], []
    for i in range(n):
        link = AgentLink(cfg, SECRET, session=f"bench-{i}-{random.random():.6f}", call={"call_id": str(i)},
                         registry=ToolRegistry())
        t0 = time.perf_counter()
        await link.open()
        times.append((time.perf_counter() - t0) * 1000)
        links.append(link)
    return links, times


async def round_trips(link: AgentLink, n: int, every: float, out: list[float]) -> None:
    body = link.registry.get("noop")
    assert body is not None
    await asyncio.sleep(random.random() * every)
    for i in range(n):
        ctx = ToolContext(link.session, 1, f"t1.{i}")
        t0 = time.perf_counter()
        await body.tool({}, ctx)
        out.append((time.perf_counter() - t0) * 1000)
        if every:
            await asyncio.sleep(every)


async def measure(port: int, quick: bool) -> list[tuple[str, Any, str, str]]:
    rows: list[tuple[str, Any, str, str]] = []
    one, hs = await open_links(port, 1 if quick else 20)
    for x in one[1:]:
        await x.aclose()
    rt1: list[float] = []
    await round_trips(one[0], 200 if quick else 2000, 0.0, rt1)
    await one[0].aclose()
    n = 20 if quick else 200
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    links, hs200 = await open_links(port, n)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    mem = sum(s.size_diff for s in after.compare_to(before, "filename")) / n
    rt200: list[float] = []
    per = 10 if quick else 30
    await asyncio.gather(*(round_trips(x, per, 0.1, rt200) for x in links))
    rt200s: list[float] = []
    await asyncio.gather(*(round_trips(x, 3 if quick else 10, 1.0, rt200s) for x in links))
    for x in links:
        await x.aclose()
    hs_all = hs + hs200
    rows += [
        ("handshake per call (dial+offer+accept+ready), p50", statistics.median(hs_all), "ms", ""),
        ("handshake per call, p99", pct(hs_all, 0.99), "ms", ""),
        ("round trip tool.call->tool.result, 1 call, p50", statistics.median(rt1), "ms", ""),
        ("round trip, 1 call, p99", pct(rt1, 0.99), "ms", "<= 2"),
        (f"round trip, {n} calls (each every 100 ms), p50", statistics.median(rt200), "ms", ""),
        (f"round trip, {n} calls (each every 100 ms), p99", pct(rt200, 0.99), "ms", "<= 2"),
        (f"round trip, {n} calls (each every 1 s), p50", statistics.median(rt200s), "ms", ""),
        (f"round trip, {n} calls (each every 1 s), p99", pct(rt200s, 0.99), "ms", "<= 2"),
        ("link memory per call (Python heap, tracemalloc)", round(mem / 1024, 1), "KiB", ""),
    ]
    return rows


def run(quick: bool = False) -> list[tuple[str, Any, str, str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    svc = subprocess.Popen([sys.executable, "-m", "bench.bench_link", "--serve", str(port)], stdout=subprocess.PIPE,
                           text=True)
    try:
        assert svc.stdout is not None and svc.stdout.readline().strip() == "ready"
        return asyncio.run(measure(port, quick))
    finally:
        svc.kill()
        svc.wait(5)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        asyncio.run(serve(int(sys.argv[2])))
    else:
        for row in run("--quick" in sys.argv):
            print(*row)
