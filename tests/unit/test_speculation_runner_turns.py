"""Speculative LLM start around the claim and the turn, on virtual time (the rig and the
scripted provider of :mod:`tests.unit.test_speculation_runner`).

The age limit around the claim (an expired speculation cannot be claimed, a claimed one
keeps its helper past ``max_age`` while the turn settles, also when it was claimed before
its helper's first step), a new turn without a barge-in does not end a committed round,
and the candidates the runner skips (``skipped_busy``, ``skipped_unsafe``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
from brisvox.agent.pipeline.stage.pipeline_frames import UserTurnEnded, UserTurnStarted
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.clock import CLOCK
from brisvox.providers.base import Done, LlmRequest, TextDelta
from tests.providers_fakes.runner_rig import Rig
from tests.unit.test_speculation_runner import ON, Llm, echo, offer, run, settle

# -- max_age around the claim -------------------------------------------------------------------


def test_a_finished_speculation_older_than_max_age_cannot_be_claimed():
    async def main():
        llm = Llm()
        async with Rig(llm, ToolRegistry(), speculation=SpeculationConfig(enabled=True, max_age=1.0)) as rig:
            offer(rig, 1, "hello")
            await settle(0.5)
            assert llm.yielded == 5 and llm.closed == 1  # the whole answer is in the buffer
            await settle(0.5)  # age 1.0: expired although its task ended cleanly
            text = await rig.turn(1, "hello")
            st = rig.runner.spec.st
            assert (st.expired, st.hits) == (1, 0) and st.wasted_output_tokens == 3
            assert text == "You said hello." and len(llm.requests) == 2 and llm.times[1] == pytest.approx(1.0)
    run(main)


def _slow_answer(r: LlmRequest, n: int) -> list[Any]:
    return [TextDelta("One, "), ("sleep", 0.6), TextDelta("two, "), ("sleep", 0.6), TextDelta("three."), Done()]


def test_a_claimed_speculation_keeps_its_helper_past_max_age_while_the_turn_settles():
    async def main():
        llm = Llm(script=_slow_answer)
        async with Rig(llm, ToolRegistry(), speculation=SpeculationConfig(enabled=True, max_age=1.0)) as rig:
            waits = [0.0, 0.4]  # the candidate's settle, then the turn end's (a played-text wait)

            async def wait_settled() -> bool:
                await asyncio.sleep(waits.pop(0) if waits else 0.0)
                return True
            rig.book.wait_settled = wait_settled  # type: ignore[method-assign]
            offer(rig, 1, "hello")
            await settle(0.8)  # claimed at 0.8 < max_age, committed at 1.2 > max_age
            t_end = CLOCK.now()
            text = await rig.turn(1, "hello")
            st = rig.runner.spec.st
            assert (st.hits, st.expired) == (1, 0) and st.head_start_ms == 1200
            assert text == "One, two, three." and len(llm.requests) == 1 and llm.yielded == 4
            assert CLOCK.now() - t_end == pytest.approx(0.3 + 1.2 + 0.06 - 0.8)  # the stream's own pace
    run(main)


def test_a_speculation_claimed_before_its_helper_ran_keeps_it_past_max_age():
    async def main():
        llm = Llm(script=_slow_answer)
        async with Rig(llm, ToolRegistry(), speculation=SpeculationConfig(enabled=True, max_age=1.0)) as rig:
            ev = rig.sink.ended.setdefault(1, asyncio.Event())
            t0 = CLOCK.now()
            offer(rig, 1, "hello")  # candidate and turn end queued together: the claim comes first
            rig.runner.inbox.put_nowait(UserTurnEnded(1, "hello", CLOCK.now()))
            await asyncio.wait_for(ev.wait(), 5)
            st = rig.runner.spec.st
            assert (st.hits, st.expired, st.failures) == (1, 0, 0)
            assert rig.sink.text(1) == "One, two, three." and len(llm.requests) == 1
            assert CLOCK.now() - t0 == pytest.approx(1.56)  # the whole stream, past max_age
    run(main)


# -- the turn around a committed round ---------------------------------------------------------


def _new_turn_while_answering(spec: SpeculationConfig) -> tuple[list[Any], bool, int]:
    async def main():
        llm = Llm(script=lambda r, n: [TextDelta(f"w{i} ") for i in range(20)] + [Done()], gap=0.1)
        async with Rig(llm, ToolRegistry(), speculation=spec) as rig:
            offer(rig, 1, "hello")
            await settle(0.5)
            rig.start_turn(1, "hello")
            await settle(0.5)
            rig.watch.bump(2)  # a new turn without a barge-in (the driver's response backstop)
            rig.runner.inbox.put_nowait(UserTurnStarted(2))
            await settle(3.0)
            task = rig.runner._round_task
            return list(rig.runner.ctx.messages), task is not None and task.done(), rig.runner.spec.st.hits
    return run(main)


def test_a_new_turn_without_a_barge_in_does_not_end_a_committed_round():
    ctx_off, done_off, _ = _new_turn_while_answering(SpeculationConfig())
    ctx_on, done_on, hits = _new_turn_while_answering(ON)
    assert hits == 1 and done_on and done_off
    assert ctx_on == ctx_off and ctx_on[-1].text == "".join(f"w{i} " for i in range(20))


# -- skipped candidates -------------------------------------------------------------------------


def test_a_candidate_while_the_previous_turn_is_still_answered_is_skipped_busy():
    async def main():
        llm = Llm(script=lambda r, n: [TextDelta(f"w{i} ") for i in range(20)] + [Done()] if n == 0 else echo(r, n),
                  gap=0.1)
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            rig.start_turn(1, "tell me a story")
            await settle(0.5)  # round 1 streams until 2.2
            rig.watch.bump(2)  # a new turn without a barge-in (the driver's response backstop)
            rig.runner.inbox.put_nowait(UserTurnStarted(2))
            offer(rig, 2, "hello")
            await settle(0.5)
            st = rig.runner.spec.st
            assert (st.skipped_busy, st.started) == (1, 0) and len(llm.requests) == 1
            text = await rig.turn(2, "hello")  # halts round 1, answers fresh
            assert text == "You said hello." and len(llm.requests) == 2 and rig.runner.st.halts == 1
            assert (st.skipped_busy, st.started, st.hits, st.misses) == (1, 0, 0, 0)
    run(main)


def test_a_candidate_while_a_round_task_that_did_not_end_lingers_is_skipped_unsafe():
    async def main():
        llm = Llm(script=lambda r, n: [("stubborn", 3.0), *echo(r, n)] if n == 0 else echo(r, n))
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            rig.start_turn(1, "hello")
            await settle(0.5)
            rig.barge_in(2, 1)  # the round ignores its cancel: a zombie after the 1 s join
            await settle(1.1)
            assert rig.runner.st.zombies == 1
            offer(rig, 2, "hello")  # joined again for 1 s: still running (until 3.3)
            await settle(1.1)
            st = rig.runner.spec.st
            assert (st.skipped_unsafe, st.started) == (1, 0) and len(llm.requests) == 1
            await settle(1.0)  # the zombie ended
            text = await rig.turn(2, "hello")
            assert text == "You said hello." and len(llm.requests) == 2
            assert (st.skipped_unsafe, st.started, st.hits) == (1, 0, 0)
    run(main)
