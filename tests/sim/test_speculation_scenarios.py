"""The scenario suite s01-s11 with speculation on and off: identical contexts and identical
words on the wire; only the latency differs (s11's caller hangs up at a fixed instant, so
there the earlier answer is heard further: the same words, then more).

The scenarios script the model as a sequence of answers, which a speculative request
would consume out of turn. So both runs answer through a deterministic "model": the off
run records which scripted answer each request got (keyed by the whole request and how
often that request was made), the on run answers the same request with the same answer
and any other request (a speculation that is then discarded) with the default one. Each
stream draws from its own generator seeded by that key, so a replayed answer streams in
the same pieces with the same timing.
"""

from __future__ import annotations

import random
import zlib
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
from brisvox.providers.base import LlmRequest
from brisvox.providers.seeded_fakes import FakeLlm, FakeLlmStream, Responder
from brisvox.sim import harness
from brisvox.sim.harness import default_actor_config, oracle_mismatches, simulate
from brisvox.sim.scenarios import SCENARIOS
from brisvox.sim.vloop import run_virtual

ON = SpeculationConfig(enabled=True)
ABSOLUTE_END = {"s11"}  # HangUp(at=4.2): the one scenario whose caller does not wait for the bot


def _key(req: LlmRequest) -> str:
    return repr([(m.role, m.text, [(c.id, c.name) for c in m.tool_calls], m.call_id) for m in req.messages])


class _Model(FakeLlm):
    answers: dict[tuple[str, int], Responder] = {}
    recording = True

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.seen: Counter[str] = Counter()

    def stream(self, request: LlmRequest) -> FakeLlmStream:
        self.probe.requests.append(request)
        self.probe.request_times.append(self.probe.count)
        self.probe.count += 1
        key = _key(request)
        n = self.seen[key]
        self.seen[key] += 1
        if self.recording:
            r = self.script.popleft() if self.script else self.default
            self.answers[(key, n)] = r
        else:
            r = self.answers.get((key, n), self.default)
        script = r(request) if callable(r) else r
        rng = random.Random(zlib.crc32(f"{key}#{n}".encode()))
        return FakeLlmStream(SimpleNamespace(rng=rng, probe=self.probe), script)  # type: ignore[arg-type]


def _run(name: str, spec: SpeculationConfig | None, monkeypatch: Any) -> Any:
    call, _ = SCENARIOS[name]()
    cfg = call.actor or default_actor_config()
    if spec is not None:
        cfg = replace(cfg, llm=replace(cfg.llm, speculation=spec), turn=replace(cfg.turn, speculation=spec))
    call = replace(call, actor=cfg)
    monkeypatch.setattr(harness, "FakeLlm", _Model)
    _Model.recording = spec is None
    return run_virtual(lambda: simulate(call))


def _words(res: Any) -> list[tuple[int, list[str]]]:
    w = res.platform.wire
    return [(w.utts[u].epoch, w.heard_words(u)) for u in w.order]


@pytest.fixture(scope="module")
def runs():
    mp = pytest.MonkeyPatch()
    out = {}
    try:
        for name in sorted(SCENARIOS):
            _Model.answers = {}
            off = _run(name, None, mp)
            on = _run(name, ON, mp)
            out[name] = (off, on)
    finally:
        mp.undo()
    return out


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_speculation_changes_neither_the_context_nor_the_words_on_the_wire(runs, name):
    off, on = runs[name]
    if name in ABSOLUTE_END:
        # the caller hangs up at a fixed instant: the answer began earlier, so the caller
        # heard at least as much (the same words, then more), and the context is what was heard
        a, b = off.assistant_texts(), on.assistant_texts()
        assert len(a) == len(b) and all(y.startswith(x) for x, y in zip(a, b, strict=True))
        assert [u for u, _ in _words(on)] == [u for u, _ in _words(off)]
    else:
        assert on.context == off.context
        assert _words(on) == _words(off)
    assert oracle_mismatches(on) == []
    assert on.live_tasks_after == 0 and on.stray_tasks == []
    st = on.actor.stats()
    assert st["llm"]["zombies"] == 0 and st["llm"]["round_crashes"] == 0
    assert off.record["speculation"]["started"] == 0


def test_speculations_were_offered_and_committed_across_the_suite(runs):
    hits = {n: on.record["speculation"]["hits"] for n, (_, on) in runs.items()}
    offered = {n: on.record["speculation"]["offered"] for n, (_, on) in runs.items()}
    assert sum(offered.values()) >= len(runs) - 2  # s07's cough offers nothing
    assert hits["s01"] == 1 and hits["s02"] >= 1 and hits["s08"] >= 1  # plain, barge-in, tool call
    # a committed speculation answers earlier: the request left before the turn end
    t = runs["s01"][1].record["turns"][0]
    assert t["request_ms"] < 0
    assert runs["s01"][1].record["turns"][0]["response_ms"] < runs["s01"][0].record["turns"][0]["response_ms"]
