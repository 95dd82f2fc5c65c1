"""Speculative LLM start and the tool phase, on virtual time (the rig and the scripted
provider of :mod:`tests.unit.test_speculation_runner`).

A SideEffect call held by two speculative runs of one turn runs once, a SideEffect call
still runs after a miss whose speculation had held the same call id, a slow ReadOnly tool
of a committed speculation is waited for without an idle timeout, and the filler is
spoken when a committed speculation's tool phase runs long.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from brisvox.agent.conversation.context import AssistantMessage, ToolMessage
from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
from brisvox.agent.pipeline.stage.pipeline_frames import UserTurnStarted
from brisvox.agent.tool_engine.filler import FillerConfig
from brisvox.clock import CLOCK
from brisvox.providers.base import Done, LlmRequest, ProviderTimeouts, TextDelta
from tests.providers_fakes.runner_rig import Rig, ToolLog, scenario_registry
from tests.unit.test_speculation_runner import ON, Llm, booking, offer, run, settle, text_frames


def answered_after_filler(req: LlmRequest, n: int) -> list[Any]:
    """:func:`booking`, but a tool result followed by the filler's message is answered too."""
    if any(m.role == "tool" for m in req.messages):
        return [TextDelta("Booked."), Done()]
    return booking(req, n)


def _tool_messages(rig: Rig) -> list[ToolMessage]:
    return [m for m in rig.runner.ctx if isinstance(m, ToolMessage)]


@pytest.mark.parametrize("restart", ["superseded", "withdrawn_and_offered_again"])
def test_a_side_effect_call_held_by_two_speculative_runs_of_one_turn_runs_once(restart):
    async def main():
        log = ToolLog()
        llm = Llm(script=booking)
        async with Rig(llm, scenario_registry(log), speculation=ON) as rig:
            offer(rig, 1, "book a table")
            await settle(0.8)  # the first run reached Done: t1.0 held
            if restart == "superseded":
                offer(rig, 1, "book a table for two")
                final = "book a table for two"
            else:
                offer(rig, 1, "")
                await settle(0.01)
                offer(rig, 1, "book a table")
                final = "book a table"
            await settle(0.8)  # the second run holds the same call id t1.0 of the same turn
            st = rig.runner.spec.st
            assert (st.started, st.tool_phases, st.held_side_effects) == (2, 2, 2)
            assert log.count("book_table") == 0
            text = await rig.turn(1, final)
            await settle(1.0)
            assert text == "Let me book it.Booked."
            assert log.count("book_table") == 1
            assert [(m.call_id, '"booking":"BK-1001"' in m.content) for m in _tool_messages(rig)] == [("t1.0", True)]
            assert (st.hits, st.superseded, st.withdrawn) == ((1, 1, 0) if restart == "superseded" else (1, 0, 1))
            assert len(llm.requests) == 3  # two speculative runs, the round after the tool
            rig.runner.ctx.validate()
    run(main)


def test_a_side_effect_call_runs_after_a_miss_whose_speculation_held_the_same_call_id():
    async def main():
        log = ToolLog()
        llm = Llm(script=booking)
        async with Rig(llm, scenario_registry(log), speculation=ON) as rig:
            offer(rig, 1, "book a table")
            await settle(0.8)
            assert rig.runner.spec.st.held_side_effects == 1 and log.count("book_table") == 0
            text = await rig.turn(1, "book a table please")  # a miss: the fresh answer calls t1.0 again
            await settle(1.0)
            assert rig.runner.spec.st.misses == 1 and rig.runner.spec.st.hits == 0
            assert text == "Let me book it.Booked."
            assert log.count("book_table") == 1
            assert log.runs[0][1] == {"name": "Kaya", "time": "8pm", "people": 2}
            [msg] = _tool_messages(rig)
            assert msg.call_id == "t1.0" and not msg.is_error and '"booking":"BK-1001"' in msg.content
            assert len(llm.requests) == 3  # the discarded run, the fresh round 0, round 1
            rig.runner.ctx.validate()
    run(main)


def test_a_slow_read_only_tool_of_a_committed_speculation_has_no_idle_timeout():
    async def main():
        log = ToolLog()
        llm = Llm(script=booking)
        async with Rig(llm, scenario_registry(log, weather_delay=2.0), speculation=ON,
                       timeouts=ProviderTimeouts(llm_first_token=1.0, llm_idle=0.5)) as rig:
            offer(rig, 1, "the weather")
            await settle(0.4)  # Done at 0.32: the tool runs in the helper from then on, for 2 s
            assert log.count("get_weather") == 1
            t_end = CLOCK.now()  # committed at 0.4; the round's idle limit (0.5 s) would end at 0.9
            text = await rig.turn(1, "the weather")
            assert text == "Booked."
            assert log.count("get_weather") == 1 and log.finished[0][1] == pytest.approx(2.32)
            assert llm.times[1] == pytest.approx(2.32)  # round 1 asked when the result came
            assert rig.runner.st.idle_timeouts == 0 and rig.runner.st.first_token_timeouts == 0
            assert rig.runner.st.errors == 0 and rig.runner.spec.st.hits == 1
            assert '"temp":18' in _tool_messages(rig)[0].content
            assert log.started[0][1] < t_end and len(llm.requests) == 2
            rig.runner.ctx.validate()
    run(main)


def test_the_filler_is_spoken_while_a_committed_speculations_tool_phase_runs_long():
    async def main():
        log = ToolLog()
        llm = Llm(script=answered_after_filler)
        async with Rig(llm, scenario_registry(log, weather_delay=1.5), speculation=ON,
                       filler=FillerConfig(enabled=True, delay=0.2)) as rig:
            offer(rig, 1, "the weather")
            await settle(0.4)  # Done at 0.32: the ReadOnly call runs in the helper until 1.82
            assert log.count("get_weather") == 1 and rig.runner.st.fillers == 0
            ev = rig.sink.ended.setdefault(1, asyncio.Event())
            rig.start_turn(1, "the weather")
            await settle(0.19)  # the filler timer starts at the committed round's tool phase
            assert rig.runner.spec.st.hits == 1 and rig.runner.st.fillers == 0
            await settle(0.02)
            assert rig.runner.st.fillers == 1
            assert text_frames(rig, 1) == [("LlmResponseStarted", 0, ""), ("LlmResponseStarted", 1, ""),
                                           ("LlmText", 1, "One moment, please."), ("Flush", 1, "")]
            await asyncio.wait_for(ev.wait(), 5)
            assert rig.sink.text(1) == "One moment, please.Booked."
            assert text_frames(rig, 1)[4:] == [("LlmResponseStarted", 2, ""), ("LlmText", 2, "Booked."),
                                               ("LlmResponseEnded", -1, "")]
            assert log.count("get_weather") == 1 and log.finished[0][1] == pytest.approx(1.82)
            assert llm.times[1] == pytest.approx(1.82) and len(llm.requests) == 2
            msgs = list(rig.runner.ctx)
            i_tool = next(i for i, m in enumerate(msgs) if isinstance(m, ToolMessage))
            assert '"temp":18' in msgs[i_tool].content
            fillers = [i for i, m in enumerate(msgs) if isinstance(m, AssistantMessage) and m.text == "One moment, please."]
            assert fillers == [i_tool + 1]  # entered once, after the result
            rig.runner.ctx.validate()
    run(main)


def _new_turn_during_the_tool_phase(spec: SpeculationConfig, end_it: bool) -> tuple[list[Any], ToolLog, bool]:
    async def main():
        log = ToolLog()
        llm = Llm(script=booking)
        async with Rig(llm, scenario_registry(log, weather_delay=1.0), speculation=spec) as rig:
            offer(rig, 1, "the weather")
            await settle(0.4)
            rig.start_turn(1, "the weather")
            await settle(0.5)  # both rounds wait for the ReadOnly call (on: since 0.32, off: since 0.72)
            rig.watch.bump(2)  # a new turn without a barge-in (the driver's response backstop)
            rig.runner.inbox.put_nowait(UserTurnStarted(2))
            await settle(0.1)
            if end_it:  # the new turn ends while the call still runs: round 1 is halted
                rig.start_turn(2, "never mind")
            await settle(2.0)
            task = rig.runner._round_task
            return list(rig.runner.ctx.messages), log, task is not None and task.done()
    return run(main)


@pytest.mark.parametrize("end_it", [False, True])
def test_a_new_turn_without_a_barge_in_during_a_committed_tool_phase_is_as_without_speculation(end_it):
    ctx_off, log_off, done_off = _new_turn_during_the_tool_phase(SpeculationConfig(), end_it)
    ctx_on, log_on, done_on = _new_turn_during_the_tool_phase(ON, end_it)
    assert done_on and done_off and ctx_on == ctx_off
    assert log_on.count("get_weather") == log_off.count("get_weather") == 1
    assert len(log_on.finished) == len(log_off.finished) == (0 if end_it else 1)  # halted: cancelled with its round
    tools = [m for m in ctx_on if isinstance(m, ToolMessage)]
    assert len(tools) == 1 and tools[0].is_error == end_it
    if not end_it:
        assert ctx_on[-1].text == "Booked." and '"temp":18' in tools[0].content
