"""Answering-machine screening of a dialled call on virtual time, through the production actor
(the simulated worker reports the detector's verdict, beep and greeting end as scripted):

* a person: their "hello?" before the verdict opens no turn, the agent speaks first only once
  the verdict is in, then the conversation is ordinary;
* a voicemail with ``hang_up``: nothing is said, the call ends ``amd_machine``;
* a voicemail with ``leave_message``: nothing until the beep, then the message, not cut by the
  machine's own noise, then the hang-up ``amd_message_left``;
* no verdict from the workers: the actor's deadline gives ``uncertain`` and the agent converses;
* a flow node for a verdict: the first turn is answered from that node;
* a call the agent did not dial is not screened.
"""

from __future__ import annotations

from brisvox.agent.conversation.context import AssistantMessage, SystemMessage, UserMessage
from brisvox.agent.flows.definition import parse_flow
from brisvox.agent.host.amd_screen import DEADLINE_SLACK_S, AmdConfig
from brisvox.agent.tool_engine.call_info import CallInfo
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall, oracle_mismatches, simulate
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import AmdScripted, Media, Utter, WorldConfig
from ipc.frames import Hangup

GREETING = "Hello, this is the brisvox test line calling about your booking."
MESSAGE = "Hello, this is the brisvox test line. Please call us back about your booking."
VOICEMAIL = "hi you have reached the voicemail of kaya please leave a message after the tone"
DIALLED = CallInfo.of(transport="sip", transport_ids={"sip_call_id": "x@t", "direction": "outbound"})


def dialled(steps, amd_events, cfg: AmdConfig, **kw) -> SimCall:
    return SimCall(steps=steps, llm=kw.pop("llm", [LlmScript((Say("Great, thanks for taking the call."),))]),
                   greeting=kw.pop("greeting", GREETING), media="early", call_info=kw.pop("call_info", DIALLED),
                   amd=cfg, world=WorldConfig(amd=tuple(amd_events)), **kw)


def clean(res) -> None:
    assert oracle_mismatches(res) == []
    res.actor.context.validate()
    assert res.live_tasks_after == 0 and res.stray_tasks == []


def hangups(res) -> list[str]:
    return [f.reason for f in res.platform.sent if isinstance(f, Hangup)]


def test_a_person_is_greeted_only_after_the_verdict_and_their_hello_is_no_turn():
    call = dialled(
        [Media("answered", at=0.5), Utter("hello", after=0.2), Utter("yes speaking who is this", after_bot_done=0.4)],
        [AmdScripted("verdict", 1.2, "human", 0.93)], AmdConfig(enabled=True))
    res = run_virtual(lambda: simulate(call))
    clean(res)
    (t_start, start), = res.platform.amd_starts
    assert start.max_wait_ms == 3000 and not start.leave_message
    wire = res.platform.wire
    assert wire.word_times and min(wire.word_times) >= t_start + 1.2  # nothing said before the verdict
    msgs = list(res.actor.context)
    assert isinstance(msgs[1], AssistantMessage) and msgs[1].text == GREETING
    assert [m.content for m in msgs if isinstance(m, UserMessage)] == ["yes speaking who is this"]
    assert not [m for m in msgs if isinstance(m, SystemMessage) and "Answering-machine" in m.content]
    amd = res.record["amd"]
    assert (amd["verdict"], amd["confidence"], amd["source"], amd["action"]) == ("human", 0.93, "detector", "continue")
    assert 1150 <= amd["verdict_ms"] <= 1300
    assert hangups(res) == []


def test_a_voicemail_is_hung_up_on_and_hears_nothing():
    call = dialled([Media("answered", at=0.5), Utter(VOICEMAIL, after=0.1)],
                   [AmdScripted("verdict", 2.0, "machine", 0.88)], AmdConfig(enabled=True))
    res = run_virtual(lambda: simulate(call))
    clean(res)
    assert res.platform.wire.word_times == []
    assert hangups(res) == ["amd_machine"] and res.record["end_reason"] == "amd_machine"
    assert res.actor.runner.st.turns == 0 and res.actor.driver.st.greetings == 0
    assert res.record["amd"]["verdict"] == "machine"


def test_leave_message_waits_for_the_beep_and_the_machines_noise_cannot_cut_it():
    cfg = AmdConfig(enabled=True, on_machine="leave_message", message=MESSAGE)
    call = dialled([Media("answered", at=0.5), Utter(VOICEMAIL, after=0.1), Utter("static hiss crackle", after=5.5)],
                   [AmdScripted("verdict", 2.0, "machine", 0.9), AmdScripted("beep", 4.5)], cfg)
    res = run_virtual(lambda: simulate(call))
    clean(res)
    (t_start, start), = res.platform.amd_starts
    assert start.leave_message
    wire = res.platform.wire
    assert wire.word_times and min(wire.word_times) >= t_start + 4.5  # after the beep
    texts = [m.text for m in res.actor.context if isinstance(m, AssistantMessage)]
    assert texts == [MESSAGE]  # said whole (the hiss during it cut nothing), the greeting not at all
    assert res.interrupts == 0 and res.actor.runner.st.turns == 0
    assert hangups(res) == ["amd_message_left"]
    last_word = max(wire.word_times)
    amd = res.record["amd"]
    assert amd["action"] == "leave_message" and 4400 <= amd["beep_ms"] == amd["message_ms"] <= 4600
    assert res.ended_at >= last_word  # the hang-up came after the message played


def test_no_verdict_from_the_workers_converses_at_the_deadline():
    cfg = AmdConfig(enabled=True, max_wait_ms=1000)
    call = dialled([Media("answered", at=0.5), Utter("yes speaking who is this", after_bot_done=0.4)], [], cfg)
    res = run_virtual(lambda: simulate(call))
    clean(res)
    (t_start, _), = res.platform.amd_starts
    assert min(res.platform.wire.word_times) >= t_start + 1.0 + DEADLINE_SLACK_S
    amd = res.record["amd"]
    assert (amd["verdict"], amd["source"]) == ("uncertain", "deadline")
    notes = [m.content for m in res.actor.context if isinstance(m, SystemMessage) and "Answering-machine" in m.content]
    assert len(notes) == 1 and "uncertain" in notes[0]  # the model is told what it talks to


FLOW = parse_flow({
    "start": "greet",
    "nodes": {
        "greet": {"task": "Confirm the booking."},
        "menu": {"task": "You reached a phone menu: ask for the front desk."},
    },
})


def test_a_verdict_can_send_the_flow_to_a_node_first():
    cfg = AmdConfig(enabled=True, on_ivr="node:menu")
    call = dialled([Media("answered", at=0.5), Utter("for reservations press one", after=0.1),
                    Utter("front desk here", after=3.0)],
                   [AmdScripted("verdict", 1.5, "ivr", 0.8)], cfg, greeting="", flow=FLOW,
                   llm=[LlmScript((Say("Front desk please."),))])
    res = run_virtual(lambda: simulate(call))
    clean(res)
    first = res.llm.probe.requests[0]
    assert "phone menu" in str(first.messages[0]), first.messages[0]  # the request was built at the menu node
    assert res.record["amd"]["action"] == "node:menu"


def test_a_call_that_was_not_dialled_is_not_screened():
    call = SimCall(steps=[Utter("hello there", at=2.0)], llm=[LlmScript((Say("Hello."),))], greeting=GREETING,
                   amd=AmdConfig(enabled=True), call_info=CallInfo.of(transport="sip"),
                   world=WorldConfig(amd=(AmdScripted("verdict", 0.1, "machine", 1.0),)))
    res = run_virtual(lambda: simulate(call))
    clean(res)
    assert res.platform.amd_starts == [] and "amd" not in res.record
    assert min(res.platform.wire.word_times) < 1.0  # greeted at once
