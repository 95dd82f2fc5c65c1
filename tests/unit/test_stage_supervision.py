"""Stage supervision, the pure parts and the task owner's attribution.

* The reason ``stage_failed:<stage>`` round-trips, and the gateway reads the
  same prefix the agent writes; its close code (1011) and Q.850 cause (41),
  and a normal end's (1000, 16); the BYE's Reason header value.
* Which task end is a failure (not a cancellation, not a normal return);
  when the apology is spoken; the apology's epoch is above every other.
* The TaskOwner attributes a helper to the stage that spawned it (also a
  helper's helper), calls the failure hook once per failed task with that
  stage (never for a cancellation or a normal end), logs without a hook,
  and survives a hook that raises.
* The agent process counts failures per stage in its stats, and a call its
  actor ended itself is answered with an unasked CallEnded carrying the reason.
* The Twilio and native legs close with 1011 for a stage failure, 1000 else.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from brisvox.agent.host import supervision as S
from brisvox.agent.pipeline.stage.base import TaskOwner
from brisvox.gateway.core import leg
from brisvox.gateway.sip.dialogs import bye_reason
from ipc import frames as F


def test_the_reason_round_trips_and_the_gateway_reads_the_agents_prefix():
    assert S.failure_reason("llm") == "stage_failed:llm"
    assert S.failure_reason("") == "stage_failed:call"
    assert S.failed_stage("stage_failed:tts") == "tts"
    assert S.failed_stage("hangup") is None and S.failed_stage("stage_failed:") is None
    assert S.STAGE_FAILED == leg.FAILURE_PREFIX
    assert leg.is_failure(S.failure_reason("stt"))


@pytest.mark.parametrize(("reason", "code", "cause"), [
    ("stage_failed:segmenter", 1011, 41), ("agent done", 1000, 16), ("caller_hangup", 1000, 16), ("", 1000, 16),
    ("shutdown", 1001, 41), ("agent process died", 1011, 41),  # a host going away, a lost agent: not a normal end
])
def test_close_code_and_q850_cause(reason, code, cause):
    assert leg.ws_close_code(reason) == code
    assert leg.q850_cause(reason) == cause


def test_the_bye_reason_header():
    assert bye_reason("stage_failed:llm") == 'Q.850;cause=41;text="stage_failed:llm"'
    assert bye_reason("hangup") == 'Q.850;cause=16;text="hangup"'
    assert bye_reason('a "quoted" \\ reason') == 'Q.850;cause=16;text="a \\"quoted\\" \\\\ reason"'
    assert len(bye_reason("x" * 300)) == len('Q.850;cause=16;text=""') + 128


def test_which_task_ends_are_failures(vrun):
    async def body():
        async def ok():
            return 1

        async def bad():
            raise KeyError("x")

        async def hang():
            await asyncio.sleep(10)

        t_ok, t_bad, t_hang = (asyncio.create_task(c()) for c in (ok, bad, hang))
        await asyncio.sleep(0)
        t_hang.cancel()
        await asyncio.wait([t_ok, t_bad, t_hang])
        pending = asyncio.create_task(hang())
        got = [S.unexpected_exception(t) for t in (t_ok, t_bad, t_hang, pending)]
        pending.cancel()
        return got

    got = vrun(body)
    assert got[0] is None and isinstance(got[1], KeyError) and got[2] is None and got[3] is None


@pytest.mark.parametrize(("stage", "alive", "text", "speaks"), [
    ("stt", True, "Sorry.", True), ("turn", True, "Sorry.", True), ("llm", True, "Sorry.", True),
    ("segmenter", True, "Sorry.", True), ("call", True, "Sorry.", True),
    ("tts", True, "Sorry.", False), ("out", True, "Sorry.", False),
    ("llm", False, "Sorry.", False), ("llm", True, "  ", False),
])
def test_the_apology_is_spoken_only_through_a_working_output_path(stage, alive, text, speaks):
    assert S.speaks_apology(stage, alive, text) is speaks


def test_the_apology_epoch_is_above_every_epoch():
    assert S.apology_epoch() == 1
    assert S.apology_epoch(3, 0, 7, 2) == 8


def test_the_default_config_apologizes_within_six_seconds():
    c = S.SupervisionConfig()
    assert c.enabled and c.apology == S.DEFAULT_APOLOGY and c.apology_timeout == 6.0


def test_helpers_are_attributed_to_the_stage_that_spawned_them_and_failures_reach_the_hook(vrun):
    failures: list[tuple[str, str, str]] = []

    async def body():
        owner = TaskOwner("call:c1")
        owner.on_failure = lambda t, stage, exc: failures.append((t.get_name(), stage, type(exc).__name__))
        seen: dict[str, str] = {}

        async def grandchild():
            seen["grandchild"] = owner.stage_of(asyncio.current_task())
            raise ValueError("helper bug")

        async def child():
            seen["child"] = owner.stage_of(asyncio.current_task())
            owner.spawn(grandchild(), "grandchild")
            await asyncio.sleep(10)

        async def stage_body():
            owner.spawn(child(), "child")
            await asyncio.sleep(10)

        async def quiet():
            return None

        st = owner.spawn(stage_body(), "llm", stage="llm")
        loose = owner.spawn(quiet(), "loose")  # spawned outside every stage
        await asyncio.sleep(0.1)
        assert owner.stage_of(st) == "llm"
        assert {owner.stage_of(t) for t in owner.of_stages({"llm"})} == {"llm"}
        assert len(owner.of_stages({"llm"})) == 2 and owner.of_stages({"stt"}) == []
        left = await owner.close()
        return seen, left, loose.done()

    seen, left, loose_done = vrun(body)
    assert seen == {"child": "llm", "grandchild": "llm"}
    assert left == 0 and loose_done
    assert failures == [("call:c1:grandchild", "llm", "ValueError")]  # the cancelled ones are no failures


def test_without_a_hook_a_failure_is_logged_and_a_raising_hook_is_contained(vrun, caplog):
    caplog.set_level(logging.ERROR, logger="brisvox.agent")

    async def body():
        async def bad():
            raise RuntimeError("bug")

        plain = TaskOwner("call:a")
        t1 = plain.spawn(bad(), "x")
        broken = TaskOwner("call:b")
        broken.on_failure = lambda t, stage, exc: 1 / 0
        t2 = broken.spawn(bad(), "y")
        await asyncio.wait([t1, t2])
        await asyncio.sleep(0)

    vrun(body)
    msgs = [r.getMessage() for r in caplog.records]
    assert "task call:a:x failed" in msgs
    assert any("call:b:y failed and its failure handler failed too" in m for m in msgs)


# -- the agent process ------------------------------------------------------------------


class _Links:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []

    def send(self, peer: str, frame: Any) -> bool:
        self.sent.append((peer, frame))
        return True

    def stats(self) -> dict[str, int]:
        return {}


class _Actor:
    def __init__(self) -> None:
        self.reasons: list[str] = []
        self.driver = type("D", (), {"st": type("St", (), {"interrupts": 0})()})()

    async def hangup(self, reason: str) -> dict[str, Any]:
        self.reasons.append(reason)
        return {"call_id": "c1", "end_reason": reason}


def test_the_agent_process_counts_failures_and_answers_an_unasked_call_ended(vrun):
    from brisvox.agent.host.config import AgentsConfig, CallsConfig
    from brisvox.agent.host.process import AgentProcess, _CallSlot

    rt = type("Rt", (), {"index": 0})()
    proc = AgentProcess(rt, AgentsConfig(), CallsConfig(), None)
    proc.links = _Links()
    actor = _Actor()

    async def body():
        proc.calls["c1"] = _CallSlot(actor, None, [], "gateway-0")  # type: ignore[arg-type]
        proc._stage_failed("llm")
        proc._ended_itself("c1", "stage_failed:llm")
        await asyncio.sleep(0.1)

    vrun(body)
    assert proc.stats()["stage_failures"] == {"llm": 1}
    assert actor.reasons == ["stage_failed:llm"] and "c1" not in proc.calls
    assert [(p, type(f), f.reason) for p, f in proc.links.sent] == [("gateway-0", F.CallEnded, "stage_failed:llm")]


# -- the WebSocket legs --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["twilio", "native"])
@pytest.mark.parametrize(("reason", "code"), [("stage_failed:tts", 1011), ("agent done", 1000)])
def test_websocket_legs_close_with_1011_for_a_stage_failure(kind, reason, code):
    from tests.unit.test_gateway_ws_faults import session

    s, host, conn, _ = session(kind)
    s.hangup(reason)
    assert (conn.close_code, conn.close_reason) == (code, reason)
    assert host.call is not None and host.call.end_reason == reason
