"""A warm transfer on virtual time, through the production actor, its tool engine and the real
``warm_transfer`` tool, with a scripted gateway answering the consult dial, the ConsultResult
and the BridgeResult (the gateway side is not needed to judge the caller's side):

* accepted: the caller hears the hold message then the hold audio, the dial carries
  ``consult_for`` and the bounded summary, Bridge is sent, the tool answers ``bridged``, the
  record shows both legs with their times;
* declined, the leg hung up before a verdict, no verdict within the screen's longest run after
  the answer, a busy dial, a dial never answered within ``timeout_s``:
  the hold audio stops, the caller hears the matching message, the model is told, a leg that
  may still live is hung up, and the conversation goes on (the next turn is answered);
* while on hold the caller's speech starts no turn;
* the LLM summary: one bounded request, CR/LF stripped; a second warm transfer is refused;
* the person's leg drops after the bridge (BridgeEnded): the caller hears the apology, the
  model reads why in the context, and the conversation goes on; speech during the bridge
  started no turn.
"""

from __future__ import annotations

import asyncio
import wave
from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson

from brisvox.agent.conversation.context import AssistantMessage, ToolMessage, UserMessage
from brisvox.agent.host.call_warm import attach
from brisvox.agent.host.warm_transfer import WarmConfig
from brisvox.agent.tool_engine.builtin import LinkTelephony, telephony_tools
from brisvox.agent.tool_engine.registry import ToolRegistry
from brisvox.providers.seeded_fakes import Call, LlmScript, Say
from brisvox.sim.harness import SimCall, oracle_mismatches, simulate
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter
from ipc.frames import (
    Bridge,
    BridgeEnded,
    BridgeResult,
    Command,
    CommandReply,
    ConsultResult,
    Hangup,
)

TARGET = "+4930111"
ASK = "please put me through to billing"
CFG = WarmConfig(hold_message="Please hold while I connect you.", timeout_s=12.0,
                 summary_template="A caller needs help with {reason}.")


class ScriptedGateway:
    """The gateway's side of the consult: the dial answered (or failed) after ``answer_after``
    s, the consult verdict ``outcome`` after ``verdict_after`` s more (None: never), Bridge
    answered ``bridge_ok`` at once. ``after_ring``: the dial answered that long after its own
    ``ring_timeout_s`` instead (a gateway whose ring timer fired, or a last-moment answer).
    ``lost_after``: the person's leg ends that long after the bridge (BridgeEnded; None: never)."""

    def __init__(self, answer: str = "ok", outcome: str | None = "accepted", answer_after: float = 2.0,
                 verdict_after: float = 3.0, bridge_ok: bool = True, after_ring: float | None = None,
                 lost_after: float | None = None) -> None:
        self.answer, self.outcome, self.after_ring, self.lost_after = answer, outcome, after_ring, lost_after
        self.answer_after, self.verdict_after, self.bridge_ok = answer_after, verdict_after, bridge_ok
        self.port: LinkTelephony | None = None
        self.frames: list[tuple[float, object]] = []
        self.dials: list[tuple[float, dict]] = []

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def to_gateway(self, frame: object) -> None:
        self.frames.append((self.now(), frame))
        if isinstance(frame, Bridge):
            assert self.port is not None
            asyncio.get_running_loop().call_later(0.05, self.port.on_bridge_result,
                                                  BridgeResult(call_id=frame.call_id, ok=self.bridge_ok))
            if self.lost_after is not None and self.bridge_ok and frame.keep:
                asyncio.get_running_loop().call_later(self.lost_after, self.port.on_bridge_ended, BridgeEnded(
                    call_id=frame.call_id, other=frame.other, reason="bye"))

    async def request(self, frame: Command, timeout: float) -> CommandReply:  # noqa: ASYNC109
        assert frame.name == "dial"
        self.dials.append((self.now(), dict(frame.args or {})))
        after = self.answer_after if self.after_ring is None else (frame.args or {})["ring_timeout_s"] + self.after_ring
        await asyncio.sleep(min(after, timeout + 1))
        if after > timeout:
            raise TimeoutError
        if self.answer != "ok":
            return CommandReply(ok=False, data={"reason": self.answer}, error=self.answer)
        if self.outcome is not None:
            assert self.port is not None
            asyncio.get_running_loop().call_later(self.verdict_after, self.port.on_consult_result, ConsultResult(
                call_id="sim1", consult_id="leg-2", outcome=self.outcome))
        return CommandReply(ok=True, data={"call_id": "leg-2"})

    def sent(self, kind: type) -> list:
        return [f for _, f in self.frames if isinstance(f, kind)]


def hold_wav(tmp: Path) -> Path:
    t = np.arange(int(16000 * 3.0)) / 16000
    pcm = (3000 * np.sin(2 * np.pi * 440 * t)).astype("<i2")
    p = tmp / "hold.wav"
    with wave.open(str(p), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return p


def run(gw: ScriptedGateway, steps, llm, cfg: WarmConfig = CFG, base: Path | None = None, quiet: float = 16.0):
    port = LinkTelephony("sim1", gw.to_gateway, request=gw.request)
    gw.port = port

    def reg() -> ToolRegistry:
        r = ToolRegistry()
        for spec, body in telephony_tools(port, transfer_targets=(TARGET,), names=("warm_transfer",),
                                          warm_timeout_s=cfg.consult_bound_s()):
            r.register(spec, body)
        return r

    call = SimCall(steps=steps, llm=llm, registry=reg, setup=lambda actor: attach(actor, port, cfg, base),
                   max_time=90.0, quiet=quiet)  # a silent hold is no end of the call
    return run_virtual(lambda: simulate(call))


def transfer_script(*after: str) -> list[LlmScript]:
    return [LlmScript((Say("Sure, one moment."), Call("warm_transfer", {"target": TARGET, "reason": "a billing question"}))),
            *(LlmScript((Say(t),)) for t in after)]


def tool_result(res) -> dict:
    (msg,) = [m for m in res.actor.context if isinstance(m, ToolMessage)]
    return orjson.loads(msg.content)


def clean(res) -> None:
    assert oracle_mismatches(res) == []
    res.actor.context.validate()
    assert res.live_tasks_after == 0 and res.stray_tasks == []


def heard(res) -> str:
    w = res.platform.wire
    return " ".join(word for u in w.order for word, _, _ in w.utts[u].words)


def test_accepted_bridges_after_hold_message_and_hold_audio(tmp_path: Path):
    gw = ScriptedGateway()
    cfg = WarmConfig(**{**{k: getattr(CFG, k) for k in CFG.__dataclass_fields__}, "hold_audio": "hold.wav"})
    hold_wav(tmp_path)
    res = run(gw, [Utter(ASK, at=0.5)], transfer_script(""), cfg, tmp_path)
    clean(res)
    assert tool_result(res)["status"] == "bridged"
    (t_dial, args), = gw.dials
    assert args["consult_for"] == "sim1" and args["target"] == TARGET and args["via"] == "sip"
    assert args["summary"] == "A caller needs help with a billing question."
    assert gw.sent(Bridge) == [Bridge(call_id="sim1", other="leg-2", keep=True)]  # the actor stays attached
    assert gw.sent(Hangup) == []
    assert CFG.hold_message in heard(res)
    assert res.actor.tts.st.clips_played >= 2  # the hold audio: looped clip rounds while the dial rang
    rec = res.record["warm_transfer"]
    assert rec["outcome"] == "bridged" and rec["summary_source"] == "template"
    consult = rec["legs"][1]
    assert consult["call_id"] == "leg-2" and consult["verdict"] == "accepted"
    assert consult["dialled_ms"] < consult["answered_ms"] < consult["verdict_ms"] <= consult["bridged_ms"]
    assert 1900 <= consult["answered_ms"] - consult["dialled_ms"] <= 2200
    # the hold message is not in the context (a tool call was open); the model was told the outcome
    assert not [m for m in res.actor.context if isinstance(m, AssistantMessage) and "hold" in m.text.lower()]


def test_declined_comes_back_to_the_caller_who_hears_why_and_the_conversation_goes_on():
    gw = ScriptedGateway(outcome="declined")
    res = run(gw, [Utter(ASK, at=0.5), Utter("okay then what are your opening hours", after_bot_done=1.0)],
              transfer_script("Is there anything else?", "We are open nine to five."))
    clean(res)
    out = tool_result(res)
    assert out["status"] == "declined" and out["caller_heard"] == [CFG.hold_message, CFG.declined_message]
    assert gw.sent(Hangup) == [Hangup(call_id="leg-2", reason="warm_transfer_declined")]
    assert gw.sent(Bridge) == []
    said = heard(res)
    assert said.index(CFG.hold_message) < said.index(CFG.declined_message) < said.index("Is there anything else?")
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == [ASK, "okay then what are your opening hours"]  # the conversation went on
    assert res.record["warm_transfer"]["legs"][0]["back_ms"] is not None


def test_hung_up_before_a_verdict_and_no_verdict_in_time():
    gw = ScriptedGateway(outcome="hung_up")
    res = run(gw, [Utter(ASK, at=0.5)], transfer_script("Anything else?"))
    clean(res)
    assert tool_result(res)["status"] == "no_answer" and gw.sent(Hangup) == []  # the leg is gone already
    # answered, then no verdict: the caller's side waits the longest the consult screen can take
    # (after_summary: its opening's bound), not what is left of the 12 s ring
    cfg = replace(CFG, accept="after_summary")
    gw = ScriptedGateway(outcome=None)
    res = run(gw, [Utter(ASK, at=0.5)], transfer_script("Anything else?"), cfg=cfg, quiet=45.0)
    clean(res)
    out = tool_result(res)
    window = cfg.verdict_window_s(len("A caller needs help with a billing question."))
    assert out["status"] == "no_answer" and f"no verdict within {window:.0f} s of the answer" in out["detail"]
    assert gw.sent(Hangup) == [Hangup(call_id="leg-2", reason="warm_transfer_no_answer")]
    rec = res.record["warm_transfer"]
    waited = rec["ended_ms"] - rec["legs"][1]["answered_ms"]
    assert window * 1000 - 100 <= waited <= window * 1000 + 300, (waited, window)


def test_a_busy_target_and_a_dial_never_answered():
    gw = ScriptedGateway(answer="busy")
    res = run(gw, [Utter(ASK, at=0.5)], transfer_script("Anything else?"))
    clean(res)
    out = tool_result(res)
    assert out["status"] == "busy" and out["caller_heard"][-1] == CFG.busy_message
    gw = ScriptedGateway(answer_after=30.0)
    res = run(gw, [Utter(ASK, at=0.5)], transfer_script("Anything else?"))
    clean(res)
    assert tool_result(res)["status"] == "no_answer"


def test_the_gateways_reply_when_its_ring_timer_fires_is_not_lost():
    """The dial rings for what is left of ``timeout_s`` and its request waits for the reply the
    gateway sends when that ring timer fires: a no-answer is the gateway's, and a leg answered
    at the last moment is hung up at once (not left to hear a summary nobody waits for)."""
    gw = ScriptedGateway(answer="no answer", after_ring=0.05)  # the SIP gateway's words
    res = run(gw, [Utter(ASK, at=0.5)], transfer_script("Anything else?"))
    clean(res)
    out = tool_result(res)
    assert out["status"] == "no_answer" and out["detail"] == "no answer", out
    assert out["caller_heard"][-1] == CFG.no_answer_message
    (_, args), = gw.dials
    assert args["ring_timeout_s"] == 12  # the whole timeout_s: the summary (a template) took no time
    gw = ScriptedGateway(after_ring=0.05, outcome=None)
    res = run(gw, [Utter(ASK, at=0.5)], transfer_script("Anything else?"))
    clean(res)
    assert tool_result(res)["status"] == "no_answer"
    assert gw.sent(Hangup) == [Hangup(call_id="leg-2", reason="warm_transfer_no_answer")]


def test_the_callers_speech_on_hold_starts_no_turn():
    gw = ScriptedGateway(verdict_after=6.0, outcome="declined")
    res = run(gw, [Utter(ASK, at=0.5), Utter("hello are you still there", after=3.5)],
              transfer_script("Anything else?"))
    clean(res)
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == [ASK]  # the words on hold were not a turn
    assert res.actor.pump.media_muted_events >= 1


def test_the_llm_summary_is_one_bounded_request():
    gw = ScriptedGateway()
    cfg = WarmConfig(hold_message="Please hold.", timeout_s=12.0, summary="llm", summary_max_chars=60)
    long = "Ada Lovelace\r\nwants a refund of the double charge on her March invoice number 4711 today"
    llm = [LlmScript((Call("warm_transfer", {"target": TARGET, "reason": "refund"}),)),
           LlmScript((Say(long),)), LlmScript((Say(""),))]
    res = run(gw, [Utter(ASK, at=0.5)], llm, cfg)
    clean(res)
    summary = gw.dials[0][1]["summary"]
    assert len(summary) <= 60 and "\r" not in summary and "\n" not in summary
    assert summary.startswith("Ada Lovelace wants a refund")
    assert res.record["warm_transfer"]["summary_source"] == "llm"
    req = res.llm.probe.requests[1]
    assert "Caller: " + ASK in req.messages[-1].text and not req.tools


def test_a_second_warm_transfer_in_the_call_is_refused():
    gw = ScriptedGateway(outcome="declined")
    llm = [*transfer_script(), LlmScript((Call("warm_transfer", {"target": TARGET}),)), LlmScript((Say("Sorry."),))]
    res = run(gw, [Utter(ASK, at=0.5)], llm)
    clean(res)
    results = [orjson.loads(m.content) for m in res.actor.context if isinstance(m, ToolMessage)]
    assert results[0]["status"] == "declined" and "already attempted" in str(results[1])
    assert len(gw.dials) == 1


def test_a_flow_action_warm_transfers_through_the_engine_and_the_node_goes_on_when_declined():
    from brisvox.agent.flows.definition import parse_flow

    flow = parse_flow({"start": "menu", "nodes": {
        "menu": {"task": "Offer billing.", "functions": [{"name": "billing", "next": "billing",
                                                          "parameters": {"type": "object"}}]},
        "billing": {"task": "Help with billing yourself if the transfer failed.",
                    "pre_actions": [{"warm_transfer": TARGET, "reason": "a billing question"}],
                    "post_actions": [{"end_call": True}]}}})
    gw = ScriptedGateway(outcome="declined")
    port = LinkTelephony("sim1", gw.to_gateway, request=gw.request)
    gw.port = port

    def reg() -> ToolRegistry:
        r = ToolRegistry()
        for spec, body in telephony_tools(port, transfer_targets=(TARGET,), names=("warm_transfer", "end_call"),
                                          warm_timeout_s=CFG.consult_bound_s()):
            r.register(spec, body)
        return r

    call = SimCall(steps=[Utter(ASK, at=0.5)], llm=[LlmScript((Call("billing", {}),)),
                                                     LlmScript((Say("I can help you with billing myself."),))],
                   registry=reg, flow=flow, setup=lambda actor: attach(actor, port, CFG), quiet=16.0)
    res = run_virtual(lambda: simulate(call))
    clean(res)
    (_, args), = gw.dials
    assert args["summary"] == "A caller needs help with a billing question."
    assert res.record["warm_transfer"]["outcome"] == "declined"
    said = heard(res)
    assert said.index(CFG.declined_message) < said.index("I can help you with billing myself.")
    assert res.actor.runner.flow_hook.action_failures == 0


def test_the_caller_hanging_up_on_hold_hangs_the_consult_leg_up():
    from brisvox.sim.world import HangUp

    gw = ScriptedGateway(outcome=None, answer_after=1.0)
    res = run(gw, [Utter(ASK, at=0.5), HangUp(at=10.0)], transfer_script())
    assert res.live_tasks_after == 0 and res.stray_tasks == []
    assert gw.sent(Hangup) == [Hangup(call_id="leg-2", reason="warm_transfer_cancelled")]
    assert res.record["warm_transfer"]["legs"][1]["answered_ms"] is not None
    assert res.record["warm_transfer"]["outcome"] is None  # it never ended on its own


def test_the_persons_leg_dropping_after_the_bridge_brings_the_caller_back_with_an_apology():
    gw = ScriptedGateway(lost_after=8.0)
    steps = [Utter(ASK, at=0.5),
             Utter("hello is this billing", at=14.0),  # to the person, during the bridge: no turn of the agent's
             Utter("can you take a message then", at=28.0)]
    res = run(gw, steps, transfer_script("", "Of course, what is the message?"))
    clean(res)
    assert tool_result(res)["status"] == "bridged"
    said = heard(res)
    assert CFG.bridge_lost_message in said
    assert said.index(CFG.bridge_lost_message) < said.index("Of course, what is the message?")
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == [ASK, "can you take a message then"]  # the words to the person were not a turn
    notes = [m.content for m in res.actor.context if type(m).__name__ == "SystemMessage"
             and "failed after the bridge" in m.content]
    assert len(notes) == 1 and TARGET in notes[0] and "cannot be used again" in notes[0]
    req = res.llm.probe.requests[-1]  # the model answered knowing the transfer failed
    assert any("failed after the bridge" in m.text for m in req.messages)
    rec = res.record["warm_transfer"]
    assert rec["outcome"] == "bridge_lost" and rec["detail"] == "bye"
    caller = rec["legs"][0]
    assert caller["bridged_ms"] is not None and caller["bridge_lost_ms"] - caller["bridged_ms"] >= 7900
    assert caller["back_ms"] == caller["bridge_lost_ms"]
    assert res.actor.pump.media_muted_events >= 1
