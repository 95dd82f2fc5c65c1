"""A warm transfer's consult leg on virtual time, through the production actor in consult mode
(brisvox/agent/host/call_consult.py): the person hears the summary and the prompt from the
agent's TTS, never a model's answer, and the verdict leaves once:

* DTMF 1 accepts, "yes" accepts, "no" declines (and the leg hangs up after the reply),
  an unclear answer is met with the prompt again, silence past ``verdict_timeout_s`` declines
  ``no_response``; with ``accept = "after_summary"`` the end of the opening accepts.
"""

from __future__ import annotations

from brisvox.agent.conversation.context import UserMessage
from brisvox.agent.host.call_consult import CallConsult
from brisvox.agent.host.consult_screen import ACCEPTED_REPLY
from brisvox.agent.host.warm_transfer import WarmConfig
from brisvox.clock import CLOCK
from brisvox.sim.harness import SimCall, oracle_mismatches, simulate
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Press, Utter
from ipc.frames import ConsultVerdict

SUMMARY = "A caller needs help with a billing question."
CFG = WarmConfig(verdict_timeout_s=6.0, consult_prompt="Press one or say yes to take the call.")


def consult_call(steps, cfg: WarmConfig = CFG):
    sent: list[object] = []
    hangups: list[str] = []

    async def go():
        consult = CallConsult("sim1", "caller-1", cfg, SUMMARY, CLOCK, sent.append, hangups.append)
        res = await simulate(SimCall(steps=steps, llm=[], greeting=consult.opening(), llm_provider=consult.ear,
                                     setup=consult.bind, quiet=10.0, max_time=60.0))
        return res, consult

    res, consult = run_virtual(go)
    assert oracle_mismatches(res) == [] and res.live_tasks_after == 0 and res.stray_tasks == []
    return res, consult, [f for f in sent if isinstance(f, ConsultVerdict)], hangups


def heard(res) -> str:
    w = res.platform.wire
    return " ".join(word for u in w.order for word, _, _ in w.utts[u].words)


def test_dtmf_1_accepts_and_the_leg_waits_for_the_bridge():
    res, consult, verdicts, hangups = consult_call([Press("1", at=1.0)])
    assert verdicts == [ConsultVerdict(call_id="sim1", accepted=True, detail="dtmf")]
    assert hangups == []  # the bridge ends an accepted leg
    said = heard(res)
    assert said.startswith(SUMMARY) and ACCEPTED_REPLY in said
    assert res.record["consult"]["verdict"] == "accepted" and res.record["consult"]["consult_for"] == "caller-1"


def test_yes_accepts_no_declines_and_an_unclear_answer_hears_the_prompt_again():
    res, _, verdicts, _ = consult_call([Utter("who is calling", after_bot_done=0.5),
                                        Utter("yes put them through", after_bot_done=0.5)])
    assert verdicts == [ConsultVerdict(call_id="sim1", accepted=True, detail="speech")]
    assert heard(res).count(CFG.consult_prompt) == 2  # the opening's, and again after "who is calling"
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == ["who is calling", "yes put them through"]
    res, _, verdicts, hangups = consult_call([Utter("no sorry i am busy", after_bot_done=0.5)])
    assert verdicts == [ConsultVerdict(call_id="sim1", accepted=False, detail="speech")]
    assert hangups == ["consult_declined"]


def test_silence_declines_after_the_bound_and_after_summary_accepts_at_the_openings_end():
    res, consult, verdicts, hangups = consult_call([])
    assert verdicts == [ConsultVerdict(call_id="sim1", accepted=False, detail="no_response")]
    rec = res.record["consult"]
    assert 5900 <= rec["verdict_ms"] - rec["spoken_ms"] <= 6300 and hangups == ["consult_declined"]
    cfg = WarmConfig(accept="after_summary")
    res, _, verdicts, _ = consult_call([], cfg)
    assert verdicts == [ConsultVerdict(call_id="sim1", accepted=True, detail="after_summary")]
    assert CFG.consult_prompt not in heard(res)


def test_a_leg_started_in_early_media_decides_nothing_before_its_answer():
    from brisvox.sim.world import Media

    sent: list[object] = []

    async def go():
        consult = CallConsult("sim1", "caller-1", WarmConfig(accept="after_summary"), SUMMARY, CLOCK, sent.append,
                              lambda r: None)
        return await simulate(SimCall(steps=[Media("answered", at=4.0)], llm=[], greeting=consult.opening(),
                                      llm_provider=consult.ear, setup=consult.bind, media="early", quiet=10.0))

    res = run_virtual(go)
    (v,) = [f for f in sent if isinstance(f, ConsultVerdict)]
    assert v.accepted and res.record["consult"]["spoken_ms"] > 4000  # after the answer and the summary
    assert heard(res).startswith(SUMMARY)
