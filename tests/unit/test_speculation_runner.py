"""Speculative LLM start in the runner, on virtual time (the runner rig, a scripted provider).

Hit and buffering, identical frames and request, miss, withdrawal, replacement, drops
(new turn, barge-in, stop, another epoch), off, tools (SideEffect held then run once,
discarded unrun, ReadOnly ahead and used, ReadOnly cancelled), a late note makes a miss,
expiry, a failed speculative stream (final for the round; re-issued by the resilience layer
inside the helper), failure after output, back-pressure, barge-in after the commit, no leaked
tasks, the helper's first-token and idle timeouts, and a provider streaming forever.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import pytest

from brisvox.agent.conversation.context import SystemMessage, UserMessage
from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
from brisvox.agent.pipeline.stage.pipeline_frames import (
    Interrupt,
    LlmResponseStarted,
    LlmText,
    SpeculationCandidate,
    Stop,
    UserTurnEnded,
    UserTurnStarted,
)
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.clock import CLOCK
from brisvox.providers.base import (
    Done,
    LlmError,
    LlmRequest,
    ProviderTimeouts,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from brisvox.providers.resilience import Resilience, ResilientLlm
from brisvox.sim.vloop import run_virtual
from tests.providers_fakes.runner_rig import Rig, ToolLog, scenario_registry

ON = SpeculationConfig(enabled=True)


def last_user(req: LlmRequest) -> str:
    return next(m.text for m in reversed(req.messages) if m.role == "user")


def echo(req: LlmRequest, n: int) -> list[Any]:
    return [TextDelta("You said "), TextDelta(last_user(req)), TextDelta("."), Usage(10, 3), Done()]


class Llm:
    """Answers each request with ``script(request, n)``: events, ``("sleep", s)``,
    ``("stubborn", s)`` (a sleep that ignores cancellation: a round task that does not end)
    or an exception to raise. Records request times, closes and how many events it yielded."""

    name = "spec-test"

    def __init__(self, script: Callable[[LlmRequest, int], list[Any]] = echo, ttft: float = 0.3,
                 gap: float = 0.02) -> None:
        self.script = script
        self.ttft = ttft
        self.gap = gap
        self.requests: list[LlmRequest] = []
        self.times: list[float] = []
        self.closed = 0
        self.yielded = 0

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        pass

    def stream(self, request: LlmRequest) -> Any:
        n = len(self.requests)
        self.requests.append(request)
        self.times.append(CLOCK.now())
        return _Stream(self, self.script(request, n))


class _Stream:
    def __init__(self, llm: Llm, steps: list[Any]) -> None:
        self.llm = llm
        self.gen = self._run(steps)

    async def _run(self, steps: list[Any]) -> Any:
        await asyncio.sleep(self.llm.ttft)
        for i, s in enumerate(steps):
            if isinstance(s, tuple) and s[0] == "sleep":
                await asyncio.sleep(s[1])
                continue
            if isinstance(s, tuple) and s[0] == "stubborn":
                end = CLOCK.now() + s[1]
                while CLOCK.now() < end:
                    with contextlib.suppress(asyncio.CancelledError):
                        await asyncio.sleep(end - CLOCK.now())
                continue
            if isinstance(s, BaseException):
                raise s
            if i and self.llm.gap:
                await asyncio.sleep(self.llm.gap)
            self.llm.yielded += 1
            yield s

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> Any:
        return await self.gen.__anext__()

    async def aclose(self) -> None:
        self.llm.closed += 1
        await self.gen.aclose()


def run(main: Callable[..., Any]) -> Any:
    return run_virtual(main)


def text_frames(rig: Rig, epoch: int) -> list[tuple[str, int, str]]:
    out = []
    for f in rig.sink.frames:
        if getattr(f, "epoch", None) == epoch and not isinstance(f, Stop):
            out.append((type(f).__name__, getattr(f, "round", -1), getattr(f, "text", "")))
    return out


async def settle(dt: float = 0.0) -> None:
    await asyncio.sleep(dt)
    for _ in range(5):
        await asyncio.sleep(0)


def offer(rig: Rig, epoch: int, text: str) -> None:
    rig.runner.inbox.put_nowait(SpeculationCandidate(epoch, text))


# -- hits -----------------------------------------------------------------------------------


def test_a_hit_releases_the_buffer_at_the_turn_end_with_one_request():
    async def main():
        llm = Llm()
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            rig.watch.bump(1)
            rig.runner.inbox.put_nowait(UserTurnStarted(1))
            t0 = CLOCK.now()
            offer(rig, 1, "book a table")
            await settle(0.5)  # the model answered meanwhile: buffered, nothing sent
            assert not [f for f in rig.sink.frames if isinstance(f, LlmText)]
            assert llm.yielded == 5
            ev = rig.sink.ended.setdefault(1, asyncio.Event())
            t_end = CLOCK.now()
            rig.runner.inbox.put_nowait(UserTurnEnded(1, "Book a table!", t_end))
            await asyncio.wait_for(ev.wait(), 5)
            first_text = next(f for f in rig.sink.frames if isinstance(f, LlmText))
            assert first_text.text == "You said "
            assert CLOCK.now() - t_end < 0.01  # replayed at once, no time to first token
            st = rig.runner.spec.st
            assert (st.started, st.hits, st.misses) == (1, 1, 0) and st.head_start_ms == 500
            assert len(llm.requests) == 1 and rig.runner.st.requests == 1
            marks = rig.timeline.turns[1]
            assert marks.llm_requests == [pytest.approx(t0)]
            assert marks.llm_first_tokens == [pytest.approx(t0 + 0.3)]
            assert [m.content for m in rig.runner.ctx if isinstance(m, UserMessage)] == ["Book a table!"]
            assert rig.runner.st.output_tokens == 3  # the replayed Usage is the round's
    run(main)


def _one_turn(spec: SpeculationConfig, speculate: bool) -> tuple[list[Any], LlmRequest, list[Any]]:
    async def main():
        llm = Llm()
        async with Rig(llm, ToolRegistry(), speculation=spec) as rig:
            rig.watch.bump(1)
            rig.runner.inbox.put_nowait(UserTurnStarted(1))
            if speculate:
                offer(rig, 1, "what is the time")
            await settle(0.5)
            await rig.turn(1, "what is the time")
            return text_frames(rig, 1), llm.requests[0], list(rig.runner.ctx.messages)
    return run(main)


def test_frames_request_and_context_are_identical_with_and_without_speculation():
    frames_off, req_off, ctx_off = _one_turn(SpeculationConfig(), False)
    frames_on, req_on, ctx_on = _one_turn(ON, True)
    assert frames_on == frames_off
    assert frames_on[0][0] == "LlmResponseStarted"
    assert req_on == req_off
    assert ctx_on == ctx_off


def test_off_ignores_candidates():
    async def main():
        llm = Llm()
        async with Rig(llm, ToolRegistry()) as rig:
            offer(rig, 1, "hello")
            await settle(0.5)
            assert llm.requests == []
            await rig.turn(1, "hello")
            assert len(llm.requests) == 1 and rig.runner.spec.st.started == 0
    run(main)


# -- misses and drops ---------------------------------------------------------------------------


def test_a_miss_discards_the_run_and_answers_the_final_text():
    async def main():
        llm = Llm()
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "book a table")
            await settle(0.5)
            text = await rig.turn(1, "book a table for two")
            assert text == "You said book a table for two."
            st = rig.runner.spec.st
            assert (st.started, st.hits, st.misses) == (1, 0, 1)
            assert st.wasted_output_tokens == 3 and st.wasted_input_tokens == 10
            assert len(llm.requests) == 2 and rig.runner.st.requests == 1
            assert st.hit_rate() == 0.0
    run(main)


def test_a_withdrawal_closes_the_stream_and_the_turn_runs_fresh():
    async def main():
        llm = Llm(ttft=1.0)
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "book a table")
            await settle(0.2)
            offer(rig, 1, "")
            await settle(0.01)
            assert llm.closed == 1 and rig.runner.spec.st.withdrawn == 1
            await rig.turn(1, "book a table")
            assert len(llm.requests) == 2 and rig.runner.spec.st.hits == 0
    run(main)


def test_a_newer_candidate_replaces_the_older_and_an_equal_one_is_kept():
    async def main():
        llm = Llm()
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "book a table")
            await settle(0.1)
            offer(rig, 1, "book a table for two")
            await settle(0.1)
            offer(rig, 1, "Book a table, for two.")  # equal normalised: kept
            await settle(0.5)
            text = await rig.turn(1, "book a table for two")
            st = rig.runner.spec.st
            assert (st.started, st.superseded, st.kept, st.hits) == (2, 1, 1, 1)
            assert text == "You said book a table for two." and len(llm.requests) == 2
    run(main)


@pytest.mark.parametrize("how", ["new_turn", "barge_in", "stop", "other_epoch"])
def test_a_speculation_is_dropped_by_a_new_turn_a_barge_in_a_stop_and_another_epoch(how):
    async def main():
        llm = Llm(ttft=2.0)
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "hello")
            await settle(0.1)
            if how == "new_turn":
                rig.runner.inbox.put_nowait(UserTurnStarted(2))
            elif how == "barge_in":
                rig.barge_in(2, 1)
            elif how == "stop":
                rig.runner.inbox.put_nowait(Stop("test"))
            else:
                rig.start_turn(2, "hello")
            await settle(0.1)
            assert llm.closed == 1 and rig.runner.spec.st.abandoned == 1
            assert rig.runner.spec.live is None
            assert not [t for t in asyncio.all_tasks() if "llm-spec" in t.get_name() and not t.done()]
    run(main)


def test_expiry_after_max_age_is_a_fresh_turn():
    async def main():
        llm = Llm(script=lambda r, n: [TextDelta("hi"), ("sleep", 10.0), Done()])
        async with Rig(llm, ToolRegistry(), speculation=SpeculationConfig(enabled=True, max_age=1.0),
                       timeouts=ProviderTimeouts(llm_idle=30.0)) as rig:
            offer(rig, 1, "hello")
            await settle(1.1)
            assert llm.closed == 1  # the helper ended by itself at max_age
            rig.start_turn(1, "hello")
            await settle(0.05)
            assert rig.runner.spec.st.expired == 1 and len(llm.requests) == 2
    run(main)


def test_a_late_note_between_candidate_and_turn_end_is_a_context_change():
    async def main():
        llm = Llm()
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            notes = [[], [SystemMessage("late: the booking went through")]]
            rig.engine.take_late_notes = lambda: notes.pop(0) if notes else []  # type: ignore[method-assign]
            offer(rig, 1, "hello")
            await settle(0.5)
            await rig.turn(1, "hello")
            st = rig.runner.spec.st
            assert (st.hits, st.context_changes) == (0, 1) and len(llm.requests) == 2
            assert "late: the booking" in llm.requests[1].messages[-2].text
    run(main)


# -- failures ----------------------------------------------------------------------------------


def test_a_failed_speculative_stream_is_the_rounds_final_failure():
    """The round does not retry (the resilience layer does, inside the helper: below): the
    turn ends silent, one request, one counted error."""
    async def main():
        llm = Llm(script=lambda r, n: [LlmError("server", "503")] if n == 0 else echo(r, n))
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "hello")
            await settle(0.5)
            text = await rig.turn(1, "hello")
            assert text == "" and rig.runner.st.silent_turns == 1
            assert rig.runner.st.errors == 1 and rig.runner.st.requests == 1 and len(llm.requests) == 1
            assert rig.runner.spec.st.hits == 1 and rig.runner.spec.st.failures == 1
    run(main)


def test_a_speculative_request_that_failed_before_output_is_reissued_by_the_resilience_layer():
    async def main():
        llm = Llm(script=lambda r, n: [LlmError("server", "503")] if n == 0 else echo(r, n))
        wrapped = ResilientLlm(llm, resilience=Resilience())
        async with Rig(wrapped, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "hello")
            await settle(0.5)
            text = await rig.turn(1, "hello")
            assert text == "You said hello."
            assert rig.runner.st.errors == 0 and rig.runner.st.requests == 1 and len(llm.requests) == 2
            assert wrapped.stats()["retries"] == 1
            assert rig.runner.spec.st.hits == 1 and rig.runner.spec.st.failures == 0
    run(main)


def test_a_failure_after_output_keeps_the_partial_text_without_a_retry():
    async def main():
        llm = Llm(script=lambda r, n: [TextDelta("Well, "), TextDelta("the"), LlmError("server", "cut")])
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "hello")
            await settle(0.5)
            text = await rig.turn(1, "hello")
            assert text == "Well, the" and rig.runner.st.errors == 1 and len(llm.requests) == 1
            assert rig.runner.ctx[-1].text == "Well, the"
    run(main)


def test_the_helpers_first_token_timeout_fails_the_committed_round():
    async def main():
        llm = Llm(script=lambda r, n: [("sleep", 100.0)] if n == 0 else echo(r, n))
        async with Rig(llm, ToolRegistry(), speculation=ON,
                       timeouts=ProviderTimeouts(llm_first_token=1.0, llm_idle=1.0)) as rig:
            t0 = CLOCK.now()
            offer(rig, 1, "hello")
            await settle(0.2)
            text = await rig.turn(1, "hello")
            assert text == "" and len(llm.requests) == 1  # no retry in the round
            assert rig.runner.st.first_token_timeouts == 1 and rig.runner.st.silent_turns == 1
            assert CLOCK.now() - t0 == pytest.approx(1.0, abs=0.05)  # at the helper's timeout
    run(main)


def test_the_helpers_idle_timeout_after_output_keeps_the_partial_text():
    async def main():
        llm = Llm(script=lambda r, n: [TextDelta("Well"), ("sleep", 100.0), Done()])
        async with Rig(llm, ToolRegistry(), speculation=ON,
                       timeouts=ProviderTimeouts(llm_first_token=1.0, llm_idle=1.0)) as rig:
            offer(rig, 1, "hello")
            await settle(0.2)
            text = await rig.turn(1, "hello")
            assert text == "Well" and rig.runner.st.idle_timeouts == 1 and len(llm.requests) == 1
    run(main)


# -- the buffer ---------------------------------------------------------------------------------


def test_a_full_buffer_back_pressures_the_provider_and_nothing_is_dropped():
    words = [TextDelta(f"w{i} ") for i in range(50)]
    async def main():
        llm = Llm(script=lambda r, n: [*words, Done()], gap=0.0)
        async with Rig(llm, ToolRegistry(), speculation=SpeculationConfig(enabled=True, max_buffered_events=4)) as rig:
            offer(rig, 1, "hello")
            await settle(1.0)
            assert llm.yielded <= 5  # 4 in the buffer, one waiting to be put
            text = await rig.turn(1, "hello")
            assert text == "".join(w.text for w in words).lstrip()
    run(main)


def test_a_provider_streaming_forever_is_held_by_the_buffer_and_ended_at_max_age():
    async def main():
        def forever(r, n):
            return [TextDelta("la ") for _ in range(100000)]
        llm = Llm(script=forever, gap=0.01)
        async with Rig(llm, ToolRegistry(), speculation=SpeculationConfig(enabled=True, max_age=2.0,
                                                                          max_buffered_events=16)) as rig:
            offer(rig, 1, "sing")
            await settle(1.0)
            assert llm.yielded <= 17
            await settle(1.1)
            assert llm.closed == 1 and not [t for t in asyncio.all_tasks() if "llm-spec" in t.get_name()]
    run(main)


def test_a_barge_in_after_the_commit_ends_the_helper_and_leaks_nothing():
    async def main():
        llm = Llm(script=lambda r, n: [TextDelta(f"w{i} ") for i in range(40)] + [Done()], gap=0.1)
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "hello")
            await settle(0.5)
            rig.start_turn(1, "hello")
            await settle(0.5)
            assert rig.runner.spec.st.hits == 1
            rig.barge_in(2, 1)
            await settle(0.1)
            assert llm.closed == 1
            assert not [t for t in asyncio.all_tasks() if "llm-spec" in t.get_name() and not t.done()]
            assert rig.runner.ctx[-1].text.startswith("w0 ")  # the partial message, as without speculation
        assert rig.tasks.live() == 0
    run(main)


# -- tools -----------------------------------------------------------------------------------------


def booking(req: LlmRequest, n: int) -> list[Any]:
    if req.messages[-1].role == "tool":
        return [TextDelta("Booked."), Done()]
    if "book" in last_user(req):
        return [TextDelta("Let me book it."),
                ToolCallDelta(0, id="c0", name="book_table", arguments='{"name": "Kaya", '),
                ToolCallDelta(0, arguments='"time": "8pm", "people": 2}'), Done("tool_calls")]
    if "weather" in last_user(req):
        return [ToolCallDelta(0, id="c0", name="get_weather", arguments='{"city": "Paris"}'), Done("tool_calls")]
    return [TextDelta("No problem."), Done()]


def test_a_side_effect_call_is_held_and_runs_once_at_the_commit():
    async def main():
        log = ToolLog()
        llm = Llm(script=booking)
        async with Rig(llm, scenario_registry(log), speculation=ON) as rig:
            offer(rig, 1, "book a table")
            await settle(0.8)
            assert log.count("book_table") == 0
            assert rig.runner.spec.st.tool_phases == 1 and rig.runner.spec.st.held_side_effects == 1
            text = await rig.turn(1, "book a table")
            assert text == "Let me book it.Booked." and log.count("book_table") == 1
            rig.runner.ctx.validate()
            assert rig.runner.spec.st.hits == 1
    run(main)


def test_a_missed_speculation_discards_its_held_call_unrun():
    async def main():
        log = ToolLog()
        llm = Llm(script=booking)
        async with Rig(llm, scenario_registry(log), speculation=ON) as rig:
            offer(rig, 1, "book a table")
            await settle(0.8)
            text = await rig.turn(1, "no thanks")
            await settle(1.0)
            assert text == "No problem." and log.count("book_table") == 0
            assert rig.runner.spec.st.misses == 1
    run(main)


def test_a_read_only_call_runs_ahead_and_its_result_is_used():
    async def main():
        log = ToolLog()
        llm = Llm(script=booking)
        async with Rig(llm, scenario_registry(log, weather_delay=0.3), speculation=ON) as rig:
            offer(rig, 1, "the weather")
            await settle(0.4)
            t_end = CLOCK.now()
            text = await rig.turn(1, "the weather")
            assert log.count("get_weather") == 1 and log.started[0][1] < t_end
            assert text == "Booked." and '"temp":18' in rig.runner.ctx[-2].content
            rig.runner.ctx.validate()
    run(main)


def test_a_read_only_call_in_flight_is_cancelled_with_a_miss():
    async def main():
        log = ToolLog()
        llm = Llm(script=booking)
        async with Rig(llm, scenario_registry(log, weather_delay=1.0), speculation=ON) as rig:
            offer(rig, 1, "the weather")
            await settle(0.4)
            assert log.count("get_weather") == 1
            text = await rig.turn(1, "no thanks")
            await settle(2.0)
            assert text == "No problem." and log.finished == []
    run(main)


def test_helper_tasks_never_outlive_the_call():
    async def main():
        llm = Llm(ttft=5.0)
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "hello")
            await settle(0.1)
        assert rig.tasks.live() == 0 and llm.closed == 1
    run(main)


def test_interrupt_frames_still_flow_with_speculation():
    async def main():
        llm = Llm()
        async with Rig(llm, ToolRegistry(), speculation=ON) as rig:
            offer(rig, 1, "hello")
            await settle(0.1)
            rig.barge_in(2, 1)
            await settle(0.1)
            assert any(isinstance(f, Interrupt) for f in rig.sink.frames)
            assert not any(isinstance(f, LlmResponseStarted) for f in rig.sink.frames)
    run(main)
