"""Outages across calls under the production call actor, on virtual time: breakers and budgets.

* All primaries down, four sequential calls: the secondaries answer every
  turn; the breakers (threshold 2 here) open within the first two calls and
  the third call sends nothing to the primaries and makes no retry; the
  primaries come back, after the open period the probes succeed, the
  breakers close and the primaries serve the fourth call alone.
* No secondaries, every breaker half-open, two calls start together: both
  are answered whole and neither is refused (the probe that connects lets
  the other call in at once: probation).
* Every provider down (both legs), 100 sequential calls: the provider
  contacts stay within the breakers' bound (per leg: the threshold, then one
  probe per open period) and the retries within the buckets' bound (per call
  3 + one per 20 s, per process 50 + one per 100 ms); every contact was an
  admitted attempt of the layer.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from brisvox.providers.resilience import Resilience, ResilienceConfig, wrap
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim import harness
from brisvox.sim.harness import SimCall
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter
from tests.sim.failover_kit import Contacts, LegLlm, LegStt, LegTts, Switch, conversation, layered

STAGES = ("stt", "llm", "tts")
LEG = {"stt": LegStt, "llm": LegLlm, "tts": LegTts}
ANSWER1, ANSWER2 = "It is noon right now.", "You are very welcome."
WANT = ([("user", "what time is it please"), ("assistant", ANSWER1), ("user", "thanks a lot"),
         ("assistant", ANSWER2)], (ANSWER1 + " " + ANSWER2).split())


def call(call_id: str) -> SimCall:
    return SimCall(steps=[Utter("what time is it please", at=0.5), Utter("thanks a lot", after_bot_done=1.0)],
                   llm=[LlmScript((Say(ANSWER1),)), LlmScript((Say(ANSWER2),))], call_id=call_id)


class World:
    """Two legs per stage over the sim's fakes; switches and contacts shared by every call."""

    def __init__(self, res: Resilience, secondaries: bool = True) -> None:
        self.res = res
        self.secondaries = secondaries
        self.sw = {"a": Switch(), "b": Switch()}
        self.contacts = {(s, leg): Contacts() for s in STAGES for leg in "ab"}
        self.wrappers: list[Any] = []

    def layer(self, stt: Any, llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        out = []
        for stage, fake in zip(STAGES, (stt, llm, tts), strict=True):
            a = LEG[stage](fake, self.sw["a"], self.contacts[(stage, "a")], f"{stage}-a")
            b = LEG[stage](fake, self.sw["b"], self.contacts[(stage, "b")], f"{stage}-b") if self.secondaries else None
            out.append(wrap(stage, a, b, resilience=self.res))
        self.wrappers += out
        return out[0], out[1], out[2]

    def counts(self, leg: str) -> dict[str, int]:
        return {s: self.contacts[(s, leg)].n for s in STAGES}

    def states(self, leg: str) -> dict[str, str]:
        return {s: self.res.breaker(f"{s}:{s}-{leg}").state for s in STAGES}


def test_an_outage_of_every_primary_across_four_calls() -> None:
    async def main() -> list[Any]:
        w = World(Resilience(ResilienceConfig(breaker_threshold=2, breaker_open_for=60.0)))
        w.sw["a"].down = True
        rows = []
        with layered(w.layer):
            for n in range(4):
                if n == 3:
                    w.sw["a"].down = False
                    await asyncio.sleep(61.0)
                pa, sb, k = w.counts("a"), w.counts("b"), len(w.wrappers)
                res = await harness.simulate(call(f"c{n}"))
                retries = sum(x.stats()["retries"] for x in w.wrappers[k:])
                rows.append((conversation(res), {s: w.counts("a")[s] - pa[s] for s in STAGES},
                             {s: w.counts("b")[s] - sb[s] for s in STAGES}, w.states("a"), retries))
        return rows

    rows = run_virtual(main)
    for conv, *_ in rows:
        assert conv == WANT  # every turn of every call answered (by whichever leg)
    (_, p0, s0, _, _), (_, p1, s1, st1, _), (_, p2, s2, st2, r2), (_, p3, s3, st3, _) = rows
    assert p0 == {"stt": 1, "llm": 2, "tts": 1} and s0 == {"stt": 1, "llm": 2, "tts": 1}
    assert p1 == {"stt": 1, "llm": 0, "tts": 1}  # the LLM breaker opened in the first call (two turns)
    assert st1 == {"stt": "open", "llm": "open", "tts": "open"}
    assert p2 == {"stt": 0, "llm": 0, "tts": 0} and r2 == 0  # nothing to the primaries, no retry
    assert s2 == {"stt": 1, "llm": 2, "tts": 1}
    assert st2 == {"stt": "open", "llm": "open", "tts": "open"}
    assert p3 == {"stt": 1, "llm": 2, "tts": 1} and s3 == {"stt": 0, "llm": 0, "tts": 0}  # probes, then served
    assert st3 == {"stt": "closed", "llm": "closed", "tts": "closed"}


def test_half_open_breakers_without_secondaries_admit_two_calls_that_start_together() -> None:
    async def main() -> tuple[Any, Any, World]:
        w = World(Resilience(ResilienceConfig(breaker_threshold=2, breaker_open_for=30.0)), secondaries=False)
        for s in STAGES:
            b = w.res.breaker(f"{s}:{s}-a")
            b.failure()
            b.failure()
        await asyncio.sleep(31.0)  # every breaker half-opens at its next caller
        with layered(w.layer):
            r1, r2 = await asyncio.gather(harness.simulate(call("x")), harness.simulate(call("y")))
        return r1, r2, w

    r1, r2, w = run_virtual(main)
    assert conversation(r1) == WANT and conversation(r2) == WANT
    assert sum(x.stats()["breaker_refusals"] for x in w.wrappers) == 0  # neither was refused
    assert w.states("a") == {"stt": "closed", "llm": "closed", "tts": "closed"}
    assert w.counts("a") == {"stt": 2, "llm": 4, "tts": 2}  # one connect per call, one request per turn


def test_a_total_outage_over_100_calls_stays_within_the_bound_of_the_breakers_and_the_buckets() -> None:
    cfg = ResilienceConfig()
    calls = 100

    async def main() -> tuple[World, list[float], float]:
        w = World(Resilience(cfg))
        w.sw["a"].down = w.sw["b"].down = True
        durations = []
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with layered(w.layer):
            for n in range(calls):
                t = loop.time()
                c = call(f"d{n}")
                c.steps = [Utter("hello is anybody there", at=0.5)]
                await harness.simulate(c)
                durations.append(loop.time() - t)
        return w, durations, loop.time() - t0

    w, durations, total = run_virtual(main)
    st = [x.stats() for x in w.wrappers]
    contacts = {k: c.n for k, c in w.contacts.items()}
    attempts = sum(s["attempts"] for s in st)
    retries = sum(s["retries"] for s in st)
    assert attempts == sum(contacts.values())  # nothing reached a provider but through the layer
    # the breakers: per leg, `threshold` failures, then one probe per open period
    per_leg = cfg.breaker_threshold + math.ceil(total / cfg.breaker_open_for) + 1
    assert max(contacts.values()) <= per_leg, (contacts, per_leg)
    # the buckets: retries within the calls' tokens and the process's tokens
    call_tokens = sum(cfg.call_tokens + int(d / cfg.call_refill) for d in durations)
    process_tokens = cfg.process_tokens + int(total / cfg.process_refill)
    assert retries <= min(call_tokens, process_tokens), (retries, call_tokens, process_tokens)
    assert retries <= sum(s["attempts"] for s in st) - sum(1 for s in st if s["attempts"])  # a first attempt is free
    print(f"\n100 calls down, {total:.0f} s: contacts {contacts}, per leg bound {per_leg}, "
          f"retries {retries} <= {min(call_tokens, process_tokens)}, refused by breakers "
          f"{sum(s['breaker_refusals'] for s in st)}, by the budget {sum(s['budget_refusals'] for s in st)}")
