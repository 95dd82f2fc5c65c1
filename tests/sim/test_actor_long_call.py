"""A 60-minute simulated call with a tool every few turns and a barge-in now and then.

Checks: it runs on virtual time (the wall time is printed, not asserted),
every turn is answered, the context stays valid, no task leaks, and the
actor's memory is flat: what the actor retains (its object graph, without
the providers, rings and link it was given) minus its conversation and the
per-turn data of its call record (which grow by design) grows by less than
64 kB between minute 20 and minute 59.
"""

from __future__ import annotations

import sys
import time

from brisvox.agent.conversation.context import UserMessage
from brisvox.providers.seeded_fakes import Call, LlmScript, Say
from brisvox.sim.harness import SimCall, oracle_mismatches, simulate
from brisvox.sim.memsize import actor_bytes, retained_bytes
from brisvox.sim.sim_tools import SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

MINUTES = 60


def _responder(req):
    last_user = next((m.text for m in reversed(req.messages) if m.role == "user"), "")
    if req.messages[-1].role == "tool":
        return LlmScript((Say("Done, it is sunny there."),))
    if "weather" in last_user:
        return LlmScript((Say("Let me check."), Call("get_weather", {"city": "Oslo"})))
    return LlmScript((Say("Here is a fairly complete answer to your question, with some details."),))


def _steps(n: int) -> list:
    steps = [Utter("hello there", at=0.5)]
    for i in range(1, n):
        if i % 3 == 0:
            steps.append(Utter("what is the weather like", after_bot_done=2.0))
        elif i % 5 == 0:
            steps.append(Utter("sorry one more thing", after_bot=1.2))
        else:
            steps.append(Utter("and tell me more please", after_bot_done=2.0))
    return steps


def test_sixty_minute_call_runs_fast_with_flat_memory():
    tools = SimTools()
    samples: dict[int, tuple[int, int]] = {}

    def probe(t: float, actor) -> None:
        minute = round(t / 60)
        if minute in (20, 59):
            # the conversation and the per-turn record data (timeline, tool records) grow
            # with the call by design; everything else must not
            per_call = retained_bytes(actor.context) + retained_bytes(actor.timeline) + retained_bytes(actor.runner.tool_records)
            samples[minute] = (actor_bytes(actor), per_call)

    call = SimCall(
        steps=_steps(700),
        llm=[],
        llm_default=_responder,
        registry=tools.registry,
        max_time=MINUTES * 60,
        probe=probe,
        probe_every=60.0,
        quiet=5.0,
    )
    t0 = time.perf_counter()
    try:
        res = run_virtual(lambda: simulate(call))
    finally:
        wall = time.perf_counter() - t0
    print(f"60-minute call: {wall:.1f} s wall, {res.actor.runner.st.turns} turns", file=sys.stderr)
    assert res.ended_at >= MINUTES * 60 - 1
    turns = res.actor.runner.st.turns
    assert turns >= 200
    assert tools.bodies["get_weather"] >= 60
    users = sum(isinstance(m, UserMessage) for m in res.actor.context)
    assert users == turns
    assert res.interrupts >= 20
    res.actor.context.validate()
    assert oracle_mismatches(res) == []
    assert res.live_tasks_after == 0 and res.stray_tasks == []
    # bounded request window: the last request is not the whole call
    assert len(res.llm.probe.requests[-1].messages) < len(res.actor.context) / 2
    # memory: growth between minute 20 and 59 beyond the conversation text itself is small
    (m20, c20), (m60, c60) = samples[20], samples[59]
    growth = (m60 - m20) - (c60 - c20)
    print(f"actor without its context: {m20 - c20} B at minute 20, {m60 - c60} B at minute 59", file=sys.stderr)
    assert growth < 64_000, (m20, m60, c20, c60)
    # the behaviour test does not assert speed; the wall time is reported above
