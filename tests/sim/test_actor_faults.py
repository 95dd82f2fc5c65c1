"""Finals gate, resume, tool-round limit, crashes and provider deaths on the production actor."""

from __future__ import annotations

from dataclasses import replace

from brisvox.agent.conversation.context import AssistantMessage, ToolMessage, UserMessage
from brisvox.agent.pipeline.llm.policy import FALLBACK_LINE
from brisvox.providers.seeded_fakes import Call, Crash, LlmScript, Say, TtsFault
from brisvox.sim.fakes import SttFault
from brisvox.sim.harness import SimCall, default_actor_config, oracle_mismatches, simulate
from brisvox.sim.scenarios import LONG
from brisvox.sim.sim_tools import SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Press, Utter


def sim(call: SimCall):
    return run_virtual(lambda: simulate(call))


def users(res):
    return [m.content for m in res.actor.context if isinstance(m, UserMessage)]


def assistant(res):
    return [m.text for m in res.actor.context if isinstance(m, AssistantMessage)]


def test_the_finals_gate_holds_the_turn_end_for_a_late_final():
    res = sim(
        SimCall(
            steps=[Utter("what time is it please", at=0.5)],
            llm=[LlmScript((Say("It is noon."),))],
            stt_faults=[SttFault(final_delay=1.0)],
        )
    )
    st = res.actor.driver.st
    assert st.gate_holds == 1 and st.gate_timeouts == 0
    assert users(res) == ["what time is it please"]
    # the turn ended when the final arrived, not at the silence deadline
    t = res.record["turns"][0]
    assert t["end_of_turn_ms"] >= 900


def test_speaking_again_while_the_end_is_held_is_a_resume_not_a_barge_in():
    res = sim(
        SimCall(
            steps=[Utter("I would like", at=0.5), Utter("a large coffee please", after=0.55)],
            llm=[LlmScript((Say("One large coffee."),))],
            stt_faults=[SttFault(final_delay=0.9)],
        )
    )
    st = res.actor.driver.st
    assert st.resumes == 1 and st.interrupts == 0
    assert users(res) == ["I would like a large coffee please"]
    assert res.actor.out.st.clears_lazy == 1  # no barge-in clear
    assert len(res.llm.probe.requests) == 1


def test_a_final_that_never_comes_falls_back_to_the_interim_after_the_gate():
    res = sim(
        SimCall(
            steps=[Utter("please call me back tomorrow", at=0.5)],
            llm=[LlmScript((Say("I will."),))],
            stt_faults=[SttFault(hang_finalize=True)],
        )
    )
    st = res.actor.driver.st
    assert st.gate_timeouts == 1 and st.gate_extensions == 0  # an interim existed: no extension
    assert users(res) and users(res)[0].startswith("please call me")
    assert assistant(res) == ["I will."]


def test_the_seventh_tool_round_is_refused_and_a_fallback_line_is_spoken():
    tools = SimTools()
    looping = LlmScript((Call("get_weather", {"city": "Oslo"}),))
    res = sim(
        SimCall(
            steps=[Utter("check the weather again and again", at=0.5)],
            llm=[looping] * 7,
            registry=tools.registry,
            max_time=60.0,
        )
    )
    assert tools.bodies["get_weather"] == 6
    limited = [m for m in res.actor.context if isinstance(m, ToolMessage) and "tool_round_limit" in m.content]
    assert len(limited) == 1
    assert assistant(res)[-1] == FALLBACK_LINE
    assert res.actor.runner.st.round_limits == 1
    res.actor.context.validate()


def test_a_crashing_adapter_closes_the_turn_and_the_next_turn_works():
    res = sim(
        SimCall(
            steps=[Utter("hello there", at=0.5), Utter("hello again", after=3.0)],
            llm=[LlmScript((Crash(),)), LlmScript((Say("Hi, sorry about that."),))],
        )
    )
    assert res.actor.runner.st.round_crashes == 1
    assert assistant(res) == ["Hi, sorry about that."]
    assert res.actor.driver.st.response_deadlines == 0  # closed at once, not by the backstop


def test_a_tts_death_mid_answer_keeps_only_what_was_spoken_and_recovers():
    res = sim(
        SimCall(
            steps=[Utter("tell me about the weather", at=0.5), Utter("and tomorrow", after_bot_done=1.0)],
            llm=[LlmScript((Say(LONG),)), LlmScript((Say("Colder tomorrow."),))],
            tts_faults=[TtsFault(die_after_audio=2.0)],
            max_time=60.0,
        )
    )
    tts = res.actor.tts.st
    assert tts.deaths == 1 and tts.connects >= 2
    a = assistant(res)
    assert LONG.startswith(a[0]) and 0 < len(a[0]) < len(LONG)
    assert a[1] == "Colder tomorrow."
    assert oracle_mismatches(res) == []


def test_without_word_timings_the_cut_is_an_estimate_at_a_word_end():
    res = sim(
        SimCall(
            steps=[Utter("what is the weather like", at=0.5), Utter("wait stop please", after_bot=1.7)],
            llm=[LlmScript((Say(LONG),)), LlmScript((Say("Okay."),))],
            tts_faults=[TtsFault(no_words=True)],
        )
    )
    assert res.actor.book.st.estimated == 1
    first = assistant(res)[0]
    assert LONG.startswith(first) and 0 < len(first) < len(LONG)
    assert first == LONG[: len(first)] and (len(first) == len(LONG) or LONG[len(first)] == " ")


def test_dtmf_is_retagged_and_reaches_the_runner():
    res = sim(
        SimCall(
            steps=[Utter("hello there", at=0.5), Press("5", after=2.5)],
            llm=[LlmScript((Say("Hi."),))],
        )
    )
    assert res.actor.driver.st.dtmf == 1 and res.actor.runner.st.dtmf == 1


def test_guards_off_interrupts_a_backchannel():
    cfg = default_actor_config()
    from brisvox.agent.pipeline.cascade.turn_machine import InterruptionConfig

    cfg = replace(cfg, turn=replace(cfg.turn, turn=replace(cfg.turn.turn, interruption=InterruptionConfig.off())))
    res = sim(
        SimCall(
            steps=[Utter("tell me about the weather", at=0.5), Utter("uh-huh", after_bot=2.0)],
            llm=[LlmScript((Say(LONG),)), LlmScript((Say("Yes?"),))],
            actor=cfg,
        )
    )
    assert res.interrupts == 1 and res.actor.driver.st.vetoed == 0
    assert oracle_mismatches(res) == []


def test_a_tool_that_ignores_its_cancellation_cannot_hold_the_hang_up():
    """The caller is gone while a SideEffect tool runs that swallows its cancellation: the
    hang-up still ends within the actor's stop budget and the record is written."""
    import asyncio

    from brisvox.agent.tool_engine.registry import ToolKind, ToolRegistry, ToolSpec

    started: list[float] = []

    async def stubborn(args, ctx):
        started.append(asyncio.get_running_loop().time())
        for _ in range(100):  # swallows every cancellation (as a body stuck in a shielded call does)
            try:
                await asyncio.sleep(60.0)
                break
            except asyncio.CancelledError:
                continue
        return {"ok": True}

    def registry() -> ToolRegistry:
        r = ToolRegistry()
        r.register(ToolSpec("stubborn", "A tool that will not stop.", {"type": "object"}, ToolKind.SIDE_EFFECT,
                            timeout=120.0), stubborn)
        return r

    res = sim(SimCall(steps=[Utter("please do the thing", at=0.5)],
                      llm=[LlmScript((Say("Doing it."), Call("stubborn", {})))], registry=registry))
    assert started, "the tool never ran"
    budget = 3 * res.actor.cfg.stop_timeout + 1.0  # stages, the engine, the task owner
    assert res.ended_at - started[0] < 2.5 + 1.0 + budget, (res.ended_at, started)
    assert res.record["end_reason"] == "sim_end"


def test_a_model_that_calls_tools_when_none_were_offered_is_bounded_by_the_round_limit():
    """No tools configured and a model that asks for one on every request: each call is
    answered unknown_tool, the rounds count toward the limit, and the turn ends with the
    fallback line instead of asking the model forever."""
    looping = LlmScript((Call("get_weather", {"city": "Oslo"}),))
    res = sim(SimCall(steps=[Utter("check the weather again and again", at=0.5)], llm=[looping] * 20,
                      max_time=60.0))
    st = res.actor.runner.st
    rounds = res.actor.runner.cfg.max_tool_rounds
    unknown = [m for m in res.actor.context if isinstance(m, ToolMessage) and "unknown_tool" in m.content]
    assert len(unknown) == rounds and st.requests == rounds + 1, (len(unknown), st.requests)
    assert st.round_limits == 1 and assistant(res)[-1] == FALLBACK_LINE
    res.actor.context.validate()
