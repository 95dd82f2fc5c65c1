"""The LLM runner's paths that had no test, on virtual time (the runner rig, a scripted provider).

* The engine's retry budget for malformed calls spent: the fixed fallback line is spoken as
  its own round and enters the context.
* The confirmation gate's calls from the runner: ``note_user_turn`` at each user turn (a
  confirm in the same turn is refused, one after the next user turn runs),
  ``note_user_speech_started`` at UserTurnStarted (a reply whose speech began before the
  request is no reply) and ``clear_confirmations`` at a barge-in (the request is gone).
* No filler when a barge-in comes before the filler delay (and, as the control, the filler
  at exactly the delay without one).

A filler cut by a barge-in and kept as its heard prefix needs the real output chain (the
playout book's utterances and the wire): tests/sim/test_filler_clips.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from brisvox.agent.conversation import tool_errors as te
from brisvox.agent.conversation.context import AssistantMessage, ToolMessage, UserMessage
from brisvox.agent.pipeline.llm.policy import FALLBACK_LINE
from brisvox.agent.pipeline.stage.pipeline_frames import LlmText, UserTurnStarted
from brisvox.agent.tool_engine.config import D_BUDGET
from brisvox.agent.tool_engine.confirm import Refusal
from brisvox.agent.tool_engine.filler import FillerConfig
from brisvox.clock import CLOCK
from brisvox.providers.base import Done, LlmRequest, TextDelta, ToolCallDelta
from tests.providers_fakes.runner_rig import Rig, ToolLog, scenario_registry
from tests.unit.test_speculation_runner import Llm, run, settle, text_frames


def _results(rig: Rig) -> list[tuple[str, dict[str, Any]]]:
    return [(m.call_id, orjson.loads(m.content)) for m in rig.runner.ctx if isinstance(m, ToolMessage)]


# -- the retry budget ---------------------------------------------------------------------------


def bad_forecast(req: LlmRequest, n: int) -> list[Any]:
    """Every response calls get_forecast with days out of the schema's range (malformed)."""
    return [ToolCallDelta(0, id=f"c{n}", name="get_forecast", arguments='{"city": "Paris", "days": 99}'),
            Done("tool_calls")]


def test_an_exhausted_retry_budget_speaks_the_fallback_line_and_keeps_it_in_the_context():
    async def main():
        log = ToolLog()
        llm = Llm(script=bad_forecast)
        async with Rig(llm, scenario_registry(log)) as rig:
            text = await rig.turn(1, "the forecast please")
            st = rig.runner.st
            # max_invalid_rounds = 2: rounds 1 and 2 are answered invalid_arguments, round 3 exhausts
            assert len(llm.requests) == 3 and st.tool_rounds == 3
            assert (st.fallbacks, st.round_limits, st.errors) == (1, 0, 0)
            assert log.count("get_forecast") == 0
            kinds = [body["error"] for _, body in _results(rig)]
            assert kinds == [te.INVALID_ARGUMENTS, te.INVALID_ARGUMENTS, te.BUDGET_EXHAUSTED]
            assert _results(rig)[2] == ("t1.2", {"error": te.BUDGET_EXHAUSTED, "tool": "get_forecast",
                                                 "detail": D_BUDGET})
            # the fallback line: its own round (ordinal 3), spoken, and the context's last message
            assert text == FALLBACK_LINE
            assert text_frames(rig, 1) == [("LlmResponseStarted", 0, ""), ("LlmResponseStarted", 1, ""),
                                           ("LlmResponseStarted", 2, ""), ("LlmResponseStarted", 3, ""),
                                           ("LlmText", 3, FALLBACK_LINE), ("Flush", 3, ""),
                                           ("LlmResponseEnded", -1, "")]
            assert rig.snapshot[-1] == AssistantMessage(FALLBACK_LINE)
            assert isinstance(rig.snapshot[-2], ToolMessage) and rig.snapshot[-2].call_id == "t1.2"
            assert rig.book.round(1, 3) is not None and rig.book.round(1, 3).msg_index == len(rig.snapshot) - 1
            assert [(r.call_id, r.outcome) for r in rig.runner.tool_records] == [
                ("t1.0", te.INVALID_ARGUMENTS), ("t1.1", te.INVALID_ARGUMENTS), ("t1.2", te.BUDGET_EXHAUSTED)]
            rig.runner.ctx.validate()
    run(main)


# -- the confirmation gate ----------------------------------------------------------------------


def book_call(cid: str) -> list[Any]:
    return [ToolCallDelta(0, id=cid, name="book_table", arguments='{"name": "Kaya", "time": "8pm", "people": 2}'),
            Done("tool_calls")]


def confirm_call(cid: str, call_id: str = "t1.0") -> list[Any]:
    return [ToolCallDelta(0, id=cid, name="confirm_pending", arguments=f'{{"call_id": "{call_id}"}}'),
            Done("tool_calls")]


def gated(confirm_at_once: bool):
    """Turn 1: book_table (held: confirmation required), then (``confirm_at_once``) a
    confirm_pending in the SAME turn, then a question. Every later turn: confirm_pending,
    then an answer after its result."""
    def script(req: LlmRequest, n: int) -> list[Any]:
        last = req.messages[-1]
        if last.role == "user":
            if last.text == "book a table":
                return book_call("c0")
            return confirm_call(f"c{n}")
        body = orjson.loads(last.text)
        if body.get("status") == "confirmation_required" and confirm_at_once:
            return confirm_call("c1")
        if "booking" in body:
            return [TextDelta("Booked."), Done()]
        return [TextDelta("Shall I book it?"), Done()]
    return script


def _gated_rig(llm: Llm, log: ToolLog) -> Rig:
    reg = scenario_registry(log)
    reg.require_confirmation("book_table")
    return Rig(llm, reg)


REQUIRED = {"status": "confirmation_required", "tool": "book_table", "call_id": "t1.0"}


def _required(body: dict[str, Any]) -> dict[str, Any]:
    return {k: body[k] for k in REQUIRED}


def refused(why: Refusal) -> dict[str, Any]:
    return {"error": te.CONFIRMATION_REFUSED, "tool": "confirm_pending", "detail": why.value}


def test_a_confirmation_in_the_same_turn_is_refused_and_one_after_the_next_user_turn_runs():
    async def main():
        log = ToolLog()
        llm = Llm(script=gated(confirm_at_once=True))
        async with _gated_rig(llm, log) as rig:
            assert await rig.turn(1, "book a table") == "Shall I book it?"
            assert log.count("book_table") == 0
            res = _results(rig)
            assert [cid for cid, _ in res] == ["t1.0", "t1.1"]
            assert _required(res[0][1]) == REQUIRED
            assert res[1][1] == refused(Refusal.NO_REPLY)  # no user turn since the request
            assert await rig.turn(2, "yes please") == "Booked."
            assert log.count("book_table") == 1 and log.runs[0][1] == {"name": "Kaya", "time": "8pm", "people": 2}
            assert _results(rig)[2] == ("t2.0", {"booking": "BK-1001", "name": "Kaya", "time": "8pm"})
            assert rig.engine.stats().confirmations_refused == 1 and rig.engine.stats().confirmations_run == 1
    run(main)


def test_a_barge_in_clears_the_pending_confirmation():
    async def main():
        log = ToolLog()
        llm = Llm(script=gated(confirm_at_once=False))
        async with _gated_rig(llm, log) as rig:
            assert await rig.turn(1, "book a table") == "Shall I book it?"
            assert len(rig.engine.confirmations) == 1
            rig.barge_in(2, 1)  # the caller talks over the question
            await settle(0.05)
            assert len(rig.engine.confirmations) == 0
            assert await rig.turn(2, "yes") == "Shall I book it?"
            assert _results(rig)[1] == ("t2.0", refused(Refusal.NOT_PENDING))
            assert log.count("book_table") == 0
    run(main)


def test_a_reply_whose_speech_began_before_the_request_does_not_confirm_it():
    async def main():
        log = ToolLog()
        llm = Llm(script=gated(confirm_at_once=False))
        async with _gated_rig(llm, log) as rig:
            ev_done = rig.sink.ended.setdefault(1, asyncio.Event())
            rig.start_turn(1, "book a table")
            await settle(0.1)  # the model has not answered yet: no request is pending
            assert len(rig.engine.confirmations) == 0
            rig.runner.inbox.put_nowait(UserTurnStarted(2))  # the caller starts speaking now ...
            await ev_done.wait()
            assert len(rig.engine.confirmations) == 1  # ... the request comes after that start
            assert await rig.turn(2, "yes") == "Shall I book it?"  # ... so this reply is no reply
            assert _results(rig)[1] == ("t2.0", refused(Refusal.NO_REPLY))
            assert log.count("book_table") == 0
            rig.runner.inbox.put_nowait(UserTurnStarted(3))
            assert await rig.turn(3, "yes, book it") == "Booked."
            assert [cid for cid, _ in _results(rig)] == ["t1.0", "t2.0", "t3.0"]
            assert log.count("book_table") == 1
    run(main)


# -- no filler before the delay -------------------------------------------------------------------


def weather(req: LlmRequest, n: int) -> list[Any]:
    if req.messages[-1].role == "tool":
        return [TextDelta("It is 18 degrees."), Done()]
    if req.messages[-1].role == "user" and "weather" in req.messages[-1].text:
        return [TextDelta("Let me check."),
                ToolCallDelta(0, id="c0", name="get_weather", arguments='{"city": "Paris"}'), Done("tool_calls")]
    return [TextDelta("Okay."), Done()]


def _filler_turn(barge_at: float | None, clips: bool = True) -> tuple[list[Any], list[Any], int, float | None]:
    async def main():
        log = ToolLog()
        llm = Llm(script=weather)
        async with Rig(llm, scenario_registry(log, weather_delay=1.0),
                       filler=FillerConfig(enabled=True, delay=0.6, clips=clips)) as rig:
            t0 = CLOCK.now()
            rig.start_turn(1, "the weather please")
            filler_at = None
            while CLOCK.now() - t0 < 2.0:
                await settle(0.01)
                if barge_at is not None and CLOCK.now() - t0 >= barge_at and not rig.watch.stale(1):
                    rig.barge_in(2, 1)
                if filler_at is None and rig.runner.st.fillers:
                    filler_at = CLOCK.now() - t0
            frames = text_frames(rig, 1)
            frames += [("clip", f.round, f.text) for f in rig.sink.frames if isinstance(f, LlmText) and f.clip]
            return frames, list(rig.runner.ctx), rig.runner.st.fillers, filler_at
    return run(main)


def test_no_filler_when_a_barge_in_comes_before_the_filler_delay():
    # the tool starts at 0.34 s (Done), the filler would follow at 0.94 s; the barge-in is at 0.6 s
    frames, ctx, fillers, _ = _filler_turn(barge_at=0.6)
    assert fillers == 0
    assert frames == [("LlmResponseStarted", 0, ""), ("LlmText", 0, "Let me check."), ("Flush", 0, "")]
    assert [type(m).__name__ for m in ctx] == ["SystemMessage", "UserMessage", "AssistantMessage", "ToolMessage"]
    assert ctx[2].text == "Let me check." and orjson.loads(ctx[3].content)["error"] == te.INTERRUPTED
    assert not any(isinstance(m, AssistantMessage) and m.text == "One moment, please." for m in ctx)


@pytest.mark.parametrize("clips", [True, False])
def test_the_filler_comes_at_the_delay_without_a_barge_in(clips: bool):
    frames, ctx, fillers, filler_at = _filler_turn(barge_at=None, clips=clips)
    assert fillers == 1 and filler_at is not None and 0.94 <= filler_at < 0.96
    assert frames[:6] == [("LlmResponseStarted", 0, ""), ("LlmText", 0, "Let me check."), ("Flush", 0, ""),
                          ("LlmResponseStarted", 1, ""), ("LlmText", 1, "One moment, please."), ("Flush", 1, "")]
    # the filler is a clip round (the TTS stage may play it from memory) unless clips are off
    assert [f for f in frames if f[0] == "clip"] == ([("clip", 1, "One moment, please.")] if clips else [])
    assert [m.content for m in ctx if isinstance(m, UserMessage)] == ["the weather please"]
