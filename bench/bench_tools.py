"""Cost of the tool engine's ``execute`` (target: <= 50 us for a valid typical call).

Figures, per call, on the real asyncio loop (one process, one thread):

* a valid typical call: size check + schema validation + plan + admit + run of a
  no-op ReadOnly tool, and the same for a no-op SideEffect tool (its own task,
  idempotency store, late-note guard);
* the worst hostile INVALID call at the argument cap (16 KiB) among several
  shapes (all-unique array with an invalid last element, a pattern array,
  duplicated objects under uniqueItems, deep nesting), validation report included;
* a 200 KiB uniqueItems array (refused by the size check before the schema).
* the request build of a 60-minute tool-heavy call (120 turns, each with a 12 KB
  tool result, the latest with 12 results of 60 KB, so over the default 16,000-token
  window and clipped; target: <= 1 ms) and of the same call between turns (no
  clipping), and the clip of one 60 KB result to the floor (target: <= 50 us).

Each figure is the median of ``rounds`` rounds of ``n`` calls.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import orjson

from brisvox.agent.conversation.context import (
    AssistantMessage,
    Context,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.conversation.request import RequestConfig, build_request, clip_tool_message
from brisvox.agent.tool_engine.config import EngineConfig
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.agent.tool_engine.registry import ToolKind, ToolRegistry, ToolSpec

TYPICAL = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "maxLength": 100},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city"],
    "additionalProperties": False,
}
HOSTILE = {
    "type": "object",
    "properties": {
        "xs": {"type": "array", "uniqueItems": True,
               "items": {"type": "object", "properties": {"i": {"type": "integer"}}}},
        "ps": {"type": "array", "items": {"type": "string", "pattern": "^(a|b)+$"}},
        "ds": {"type": "array", "uniqueItems": True},
        "deep": {"type": "array"},
    },
}


async def _noop(args: dict[str, Any], ctx: Any) -> dict[str, Any]:
    return {"ok": True}


def _engine() -> ToolEngine:
    reg = ToolRegistry()
    reg.register(ToolSpec("weather", "w", TYPICAL, ToolKind.READ_ONLY), _noop)
    reg.register(ToolSpec("note", "n", TYPICAL, ToolKind.SIDE_EFFECT, repeatable=True), _noop)
    reg.register(ToolSpec("hostile", "h", HOSTILE, ToolKind.READ_ONLY), _noop)
    return ToolEngine(reg, "bench", config=EngineConfig(max_invalid_rounds=10**9))


def _hostile_args() -> dict[str, dict[str, Any]]:
    cap = 16 * 1024

    def fit(make) -> dict[str, Any]:
        n = 1
        while len(orjson.dumps(make(n * 2))) <= cap:
            n *= 2
        lo, hi = n, n * 2
        while lo + 1 < hi:
            mid = (lo + hi) // 2
            if len(orjson.dumps(make(mid))) <= cap:
                lo = mid
            else:
                hi = mid
        return make(lo)

    return {
        "unique objects, last invalid": fit(lambda n: {"xs": [{"i": i} for i in range(n - 1)] + [{"i": "x"}]}),
        "pattern array, all invalid": fit(lambda n: {"ps": ["ab" * 4 + "c"] * n}),
        "duplicated objects": fit(lambda n: {"ds": [{} for _ in range(n)]}),
        "unique numbers, last duplicate": fit(lambda n: {"ds": list(range(n - 1)) + [0]}),
        "deep nesting (250)": {"deep": orjson.loads("[" * 250 + "]" * 250)},
    }


async def _measure(eng: ToolEngine, make_call, n: int, rounds: int, epoch: int) -> float:
    per: list[float] = []
    seq = 0
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            ex = await eng.execute([make_call(seq)], epoch)
            ex.mark_delivered()
            seq += 1
        per.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(per)


async def _main(quick: bool) -> list[tuple[str, float, str, str]]:
    n, rounds = (200, 3) if quick else (2000, 7)
    eng = _engine()
    rows: list[tuple[str, float, str, str]] = []
    typical = {"city": "Paris", "days": 3}
    ro = await _measure(eng, lambda i: ToolCall(f"t1.{i}", "weather", typical), n, rounds, 1)
    rows.append(("execute, valid typical call, no-op ReadOnly tool", ro, "us/call", "<= 50"))
    se = await _measure(eng, lambda i: ToolCall(f"t2.{i}", "note", typical), n, rounds, 2)
    rows.append(("execute, valid typical call, no-op SideEffect tool", se, "us/call", "<= 50"))
    worst = ("", 0.0)
    hn, hr = (5, 3) if quick else (20, 5)
    for label, args in _hostile_args().items():
        cost = await _measure(eng, lambda i, a=args: ToolCall(f"t3.{i}", "hostile", a), hn, hr, 3)
        rows.append((f"execute, hostile invalid at 16 KiB cap: {label}", cost, "us/call", "bounded"))
        if cost > worst[1]:
            worst = (label, cost)
    rows.append((f"execute, WORST hostile invalid call at the cap ({worst[0]})", worst[1], "us/call", "bounded"))
    big = {"ds": [{"k": i} for i in range(200 * 1024 // 8 + 10)]}
    cost = await _measure(eng, lambda i: ToolCall(f"t4.{i}", "hostile", big), hn, hr, 4)
    rows.append(("execute, 200 KiB uniqueItems array (refused by size)", cost, "us/call", "bounded"))
    return rows


def long_call(turns: int = 120, latest_results: int = 12) -> Context:
    """A 60-minute tool-heavy call: ``turns`` turns of a 12 KB result each, then a turn
    with ``latest_results`` results of 60 KB (0: the call between two turns)."""
    msgs: list[Message] = [SystemMessage("You are a booking assistant. Answer briefly. " * 20)]
    for t in range(turns):
        msgs.append(UserMessage(f"turn {t}: could you look up my booking and the menu, please?"))
        msgs.append(AssistantMessage("", (ToolCall(f"t{t}.0", "lookup", {"q": t}),)))
        msgs.append(ToolMessage(f"t{t}.0", orjson.dumps({"q": t, "rows": "r" * 12_000}).decode()))
        msgs.append(AssistantMessage("Here is what I found: your table is booked for seven."))
    if latest_results:
        msgs.append(UserMessage("Read me the full report."))
        calls = tuple(ToolCall(f"t{turns}.{i}", "report", {"part": i}) for i in range(latest_results))
        msgs.append(AssistantMessage("", calls))
        msgs.extend(ToolMessage(c.id, orjson.dumps({"part": i, "text": "x" * 60_000}).decode())
                    for i, c in enumerate(calls))
    return Context(msgs)


def _per_call(fn, n: int, rounds: int) -> float:
    per: list[float] = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        per.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(per)


def window_rows(quick: bool) -> list[tuple[str, float, str, str]]:
    n, rounds = (50, 3) if quick else (300, 7)
    cfg = RequestConfig()  # the default window: 16,000 tokens, 40 turns, floor 250
    heavy = long_call()
    between = long_call(latest_results=0)
    result = heavy[len(heavy) - 1]
    assert isinstance(result, ToolMessage)
    return [
        (f"request build, 60-minute tool-heavy call ({len(heavy)} messages, latest turn 12 x 60 KB, clipped)",
         _per_call(lambda: build_request(heavy, [], cfg), n, rounds), "us/build", "<= 1000"),
        (f"request build, the same call between turns ({len(between)} messages, no clipping)",
         _per_call(lambda: build_request(between, [], cfg), n, rounds), "us/build", "<= 1000"),
        ("clip of one 60 KB tool result to the floor (250 tokens)",
         _per_call(lambda: clip_tool_message(result, 250), n * 10, rounds), "us/clip", "<= 50"),
    ]


def run(quick: bool = False) -> list[tuple[str, float, str, str]]:
    return asyncio.run(_main(quick)) + window_rows(quick)


if __name__ == "__main__":
    for row in run(quick=False):
        print(row)
