"""Cost of the tool engine's ``execute`` (target: <= 50 us for a valid typical call).

Figures, per call, on the real asyncio loop (one process, one thread):

* a valid typical call: size check + schema validation + plan + admit + run of a
  no-op ReadOnly tool, and the same for a no-op SideEffect tool (its own task,
  idempotency store, late-note guard);
* the worst hostile INVALID call at the argument cap (16 KiB) among several
  shapes (all-unique array with an invalid last element, a pattern array,
  duplicated objects under uniqueItems, deep nesting), validation report included;
* a 200 KiB uniqueItems array (refused by the size check before the schema).

Each figure is the median of ``rounds`` rounds of ``n`` calls.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

import orjson

from brisvox.agent.conversation.context import ToolCall
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


def run(quick: bool = False) -> list[tuple[str, float, str, str]]:
    return asyncio.run(_main(quick))


if __name__ == "__main__":
    for row in run(quick=False):
        print(row)
