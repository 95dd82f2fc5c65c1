"""The warm transfer's decisions (brisvox/agent/host/warm_transfer.py, consult_screen.py), the
summary's bound and sanitising, the ``[warm_transfer]`` table's checks, and the tool's rules
(a listed target only, once per call) through telephony_tools."""

from __future__ import annotations

import asyncio
import struct
import time
import wave
from dataclasses import replace
from pathlib import Path

import pytest

from brisvox.agent.host.consult_screen import (
    MAX_UNCLEAR,
    ConsultScreen,
    Say,
    Verdict,
    answer_of,
    opening_bound_s,
)
from brisvox.agent.host.warm_transfer import (
    BRIDGE_WAIT_S,
    DECLINED_GRACE_S,
    BridgeLegs,
    Dial,
    Done,
    HangUpLeg,
    Hold,
    Phase,
    Resume,
    Speak,
    Summarize,
    WarmConfig,
    WarmTransfer,
    bound_summary,
    dial_outcome,
    template_summary,
)
from brisvox.agent.tool_engine.builtin import TRANSFER_STATS, telephony_tools
from brisvox.agent.tool_engine.registry import ToolContext, ToolError

CFG = WarmConfig(hold_message="Please hold.", timeout_s=30.0)


def _to_dialling(m: WarmTransfer) -> None:
    assert m.start(0.0) == [Speak("Please hold.")]
    assert m.holding
    assert m.hold_spoken(1.5) == [Hold(True), Summarize("billing")]
    assert m.summary_ready("The caller\r\nneeds billing help.", "template", 1.6) == [
        Dial("+4930111", "The caller needs billing help.")]
    assert m.deadline == pytest.approx(31.6)


def test_accepted_is_bridged_and_the_record_has_every_leg_time():
    m = WarmTransfer(CFG, "+4930111", "billing")
    _to_dialling(m)
    assert m.dialled(True, "c2", "", 5.0) == []
    assert m.consult_result("other", "accepted", "", 6.0) == []  # another leg's result: not ours
    assert m.consult_result("c2", "accepted", "", 9.0) == [BridgeLegs("c2")]
    assert m.deadline == pytest.approx(9.0 + BRIDGE_WAIT_S)
    assert m.bridge_result(True, "", 9.1) == [Done("bridged", "", "")]
    assert m.done and m.holding  # bridged: the caller talks to the person, their speech is no turn
    assert m.bridge_result(True, "", 9.2) == [] and m.tick(100.0) == []  # nothing after Done
    rec = m.record()
    assert rec["outcome"] == "bridged" and rec["summary_chars"] == len("The caller needs billing help.")
    caller, consult = rec["legs"]
    assert caller == {"leg": "caller", "held_ms": 1500, "back_ms": None, "bridged_ms": 9100, "bridge_lost_ms": None}
    assert consult == {"leg": "consult", "call_id": "c2", "dialled_ms": 1600, "answered_ms": 5000,
                       "verdict": "accepted", "verdict_ms": 9000, "bridged_ms": 9100}


def test_the_persons_leg_ending_after_the_bridge_resumes_once_with_the_apology_and_a_note():
    m = WarmTransfer(CFG, "+4930111", "billing")
    assert m.bridge_lost("bye", 1.0) == []  # no bridge yet: a stray BridgeEnded does nothing
    _to_dialling(m)
    m.dialled(True, "c2", "", 5.0)
    m.consult_result("c2", "accepted", "", 9.0)
    assert m.bridge_lost("bye", 9.05) == []  # still bridging
    m.bridge_result(True, "", 9.1)
    (act,) = m.bridge_lost("bye", 20.0)
    assert isinstance(act, Resume) and act.said == CFG.bridge_lost_message
    assert "+4930111" in act.note and "bye" in act.note and CFG.bridge_lost_message in act.note
    assert "cannot be used again" in act.note
    assert m.done and not m.holding and m.outcome == "bridge_lost" and m.detail == "bye"
    assert m.bridge_lost("bye", 21.0) == []  # once
    rec = m.record()
    assert rec["outcome"] == "bridge_lost"
    assert rec["legs"][0] == {"leg": "caller", "held_ms": 1500, "back_ms": 20000, "bridged_ms": 9100,
                              "bridge_lost_ms": 20000}
    silent = WarmTransfer(WarmConfig(hold_message="", bridge_lost_message=" "), "+4930111", "x")
    silent.phase, silent.consult_id = Phase.BRIDGED, "c2"
    (act,) = silent.bridge_lost("", 1.0)
    assert act.said == "" and "was told" not in act.note and silent.detail == "the consult leg ended"


def test_call_warm_bridge_lost_puts_the_note_in_the_context_then_says_the_line():
    from brisvox.agent.host.call_warm import CallWarm

    class Host:
        call_id = "c1"
        ring_rate = 16000

        def __init__(self) -> None:
            self.resumed: list[tuple[str, str]] = []

        def resume(self, note: str, said: str) -> None:
            self.resumed.append((note, said))

    class Clock:
        def now(self) -> float:
            return 5.0

    host = Host()
    warm = CallWarm(host, CFG, Clock())  # type: ignore[arg-type]
    assert warm.bridge_lost("bye") is False and host.resumed == []  # no transfer ran
    warm.machine = m = WarmTransfer(CFG, "+4930111", "billing")
    m.phase, m.consult_id, m.started_at = Phase.BRIDGED, "c2", 0.0
    assert warm.bridge_lost("bye") is True
    ((note, said),) = host.resumed
    assert said == CFG.bridge_lost_message and "failed after the bridge" in note
    assert warm.heard == [CFG.bridge_lost_message] and warm.bridge_lost("bye") is False


@pytest.mark.parametrize(("outcome", "hang", "message"), [
    ("declined", True, CFG.declined_message), ("hung_up", False, CFG.no_answer_message)])
def test_a_verdict_other_than_accepted_comes_back_to_the_caller(outcome, hang, message):
    m = WarmTransfer(CFG, "+4930111", "billing")
    _to_dialling(m)
    m.dialled(True, "c2", "", 5.0)
    acts = m.consult_result("c2", outcome, "", 8.0)
    # a declined leg says its goodbye and hangs up itself: the caller's side only backs that up, later
    assert acts == [*([HangUpLeg("c2", DECLINED_GRACE_S)] if hang else []), Hold(False), Speak(message),
                    Done("no_answer" if outcome == "hung_up" else "declined", message, outcome)]
    assert m.record()["legs"][0]["back_ms"] == 8000


@pytest.mark.parametrize(("error", "outcome"), [("busy", "busy"), ("no answer", "no_answer"),
                                                ("timeout", "no_answer"), ("declined", "declined"),
                                                ("404 not found", "failed")])
def test_a_failed_dial_says_the_matching_message(error, outcome):
    m = WarmTransfer(CFG, "+4930111", "billing")
    _to_dialling(m)
    acts = m.dialled(False, "", error, 4.0)
    assert acts == [Hold(False), Speak(CFG.message(outcome)), Done(outcome, CFG.message(outcome), error)]
    assert dial_outcome(error) == outcome


def test_no_verdict_in_time_hangs_the_leg_up_and_a_late_answer_is_hung_up_too():
    m = WarmTransfer(CFG, "+4930111", "billing")
    _to_dialling(m)
    m.dialled(True, "c2", "", 5.0)
    window = CFG.verdict_window_s(len(m.summary))
    assert m.deadline == pytest.approx(5.0 + window)
    assert m.tick(31.6) == [] and m.tick(5.0 + window - 0.1) == []  # answered: the ring's bound is over
    acts = m.tick(5.0 + window)
    assert acts[0] == HangUpLeg("c2") and acts[-1].outcome == "no_answer"
    assert acts[-1].detail == f"no verdict within {window:.0f} s of the answer"
    assert m.consult_result("c2", "accepted", "", 32.0 + window) == []  # too late: the caller was told
    m2 = WarmTransfer(CFG, "+4930111", "billing")
    _to_dialling(m2)
    assert m2.tick(31.6)[-1] == Done("no_answer", CFG.no_answer_message, "no answer within 30 s")
    assert m2.dialled(True, "c9", "", 33.0) == [HangUpLeg("c9")]  # answered after we gave up
    m3 = WarmTransfer(CFG, "+4930111", "billing")
    _to_dialling(m3)
    acts = m3.dialled(True, "c3", "", 31.7)  # the reply of a last-moment answer, past the ring's end
    assert acts[0] == HangUpLeg("c3") and acts[-1] == Done("no_answer", CFG.no_answer_message,
                                                          "answered after the 30 s ring")


def test_a_person_who_answers_late_in_the_ring_still_hears_the_summary_and_answers():
    """The ring (``timeout_s``) bounds the answer, not the verdict: a person who picks up one
    second before the ring's end gets the whole screen (the opening, the prompt, the answer);
    the caller's side waits the longest the consult leg's screen can take."""
    m = WarmTransfer(CFG, "+4930111", "billing")
    _to_dialling(m)
    assert m.dialled(True, "c2", "", 30.6) == []  # 29 s into a 30 s ring
    assert m.tick(31.6) == [] and m.tick(50.0) == []
    assert m.consult_result("c2", "accepted", "speech", 52.0) == [BridgeLegs("c2")]
    # the window is the consult screen's own longest run: it never cuts the screen short
    s = ConsultScreen("confirm", verdict_timeout_s=CFG.verdict_timeout_s)
    s.start(m.summary, CFG.consult_prompt, 0.0)
    t = opening_bound_s(len(m.summary), CFG.consult_prompt)  # the opening's bound, then it listens
    s.spoken(t)
    for _ in range(MAX_UNCLEAR - 1):  # unclear answers, each just before the wait's end
        t += CFG.verdict_timeout_s - 0.01
        assert s.transcript("who is it", t) == []
    assert s.tick(t + CFG.verdict_timeout_s)[0] == Verdict(False, "no_response")
    assert t + CFG.verdict_timeout_s < CFG.verdict_window_s(len(m.summary))
    # after_summary: the opening's bound and the slack only; a longer summary, a longer window
    after = replace(CFG, accept="after_summary")
    assert after.verdict_window_s(100) < CFG.verdict_window_s(100) < CFG.verdict_window_s(400)
    assert CFG.consult_bound_s() == CFG.timeout_s + CFG.verdict_window_s(CFG.summary_max_chars)


def test_a_refused_or_lost_bridge_fails_back_to_the_caller():
    for late in (False, True):
        m = WarmTransfer(CFG, "+4930111", "billing")
        _to_dialling(m)
        m.dialled(True, "c2", "", 5.0)
        m.consult_result("c2", "accepted", "", 6.0)
        acts = m.tick(6.0 + BRIDGE_WAIT_S) if late else m.bridge_result(False, "cannot bridge", 6.1)
        assert acts[0] == HangUpLeg("c2") and acts[-1].outcome == "failed"


def test_without_a_hold_message_the_hold_starts_at_once():
    m = WarmTransfer(WarmConfig(hold_message=""), "+4930111", "")
    assert m.start(0.0) == [Hold(True), Summarize("")]
    assert m.start(1.0) == []  # once


def test_summary_bound_strips_control_characters_and_cuts_on_a_word():
    assert bound_summary("a\r\nb\tc\x00d", 100) == "a b c d"
    text = "the caller wants to move their appointment to next tuesday afternoon"
    cut = bound_summary(text, 30)
    assert len(cut) <= 30 and cut.endswith("\u2026") and "\r" not in cut
    assert text.startswith(cut[:-1]) and text[len(cut) - 1] == " "  # ends where a word ended
    assert len(bound_summary("x" * 500, 40)) == 40  # one long word is cut hard
    assert bound_summary(text, len(text)) == text


def test_template_summary_and_the_tables_checks(tmp_path: Path):
    cfg = WarmConfig(summary_template="Caller {caller} about {reason}", summary_max_chars=40)
    assert template_summary(cfg, "a refund\r\nnow", "+4917") == "Caller +4917 about a refund now"
    assert WarmConfig(summary_template="{reason} {nope}").problems() == [
        ("warm_transfer.summary_template", "unknown field(s) 'nope'; known: called, caller, reason, target")]
    assert WarmConfig(summary_template="{reason").problems()[0][0] == "warm_transfer.summary_template"
    assert "cannot read" in WarmConfig(hold_audio="missing.wav").problems(tmp_path)[0][1]

    def wav(name: str, channels: int, width: int, rate: int = 8000, frames: int = 8000) -> str:
        with wave.open(str(tmp_path / name), "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(width)
            w.setframerate(rate)
            w.writeframes(b"\x00" * frames * channels * width)
        return name

    assert WarmConfig(hold_audio=wav("ok.wav", 1, 2)).problems(tmp_path) == []
    assert "mono 16-bit" in WarmConfig(hold_audio=wav("st.wav", 2, 2)).problems(tmp_path)[0][1]
    assert "mono 16-bit" in WarmConfig(hold_audio=wav("u8.wav", 1, 1)).problems(tmp_path)[0][1]
    assert "Hz" in WarmConfig(hold_audio=wav("r.wav", 1, 2, rate=11025)).problems(tmp_path)[0][1]
    (tmp_path / "big.wav").write_bytes(b"RIFF" + struct.pack("<I", 0) + b"\x00" * (5 << 20))
    assert "at most" in WarmConfig(hold_audio="big.wav").problems(tmp_path)[0][1]
    (tmp_path / "junk.wav").write_bytes(b"not a wav")
    assert "not a PCM WAV" in WarmConfig(hold_audio="junk.wav").problems(tmp_path)[0][1]


# -- the consult leg ------------------------------------------------------------------------

def test_consult_yes_no_dtmf_and_silence():
    s = ConsultScreen("confirm", verdict_timeout_s=10.0)
    assert s.start("A caller about billing.", "Press 1 or 2.", 0.0) == [Say("A caller about billing. Press 1 or 2.")]
    assert s.spoken(4.0) == [] and s.deadline == 14.0
    assert s.transcript("hmm who is it", 5.0) == [] and s.deadline == 15.0  # neither: asked again, waited again
    assert s.transcript("yes no", 5.5) == []  # both: no answer
    assert s.transcript("yeah sure put them through", 6.0)[0] == Verdict(True, "speech")
    assert s.dtmf("2", 7.0) == [] and s.tick(100.0) == []  # once
    d = ConsultScreen()
    d.start("x", "p", 0.0)
    assert d.dtmf("2", 1.0)[0] == Verdict(False, "dtmf")  # during the opening: taken
    k = ConsultScreen()
    k.start("x", "p", 0.0)
    k.spoken(2.0)
    assert k.dtmf("5", 3.0) == [] and k.dtmf("1", 3.1)[0] == Verdict(True, "dtmf")
    q = ConsultScreen(verdict_timeout_s=10.0)
    q.start("x", "p", 0.0)
    q.spoken(2.0)
    assert q.tick(11.9) == [] and q.tick(12.0) == [Verdict(False, "no_response")]
    assert q.record()["verdict"] == "declined" and q.record()["verdict_ms"] == 12000
    n = ConsultScreen()
    n.start("x", "p", 0.0)
    n.spoken(1.0)
    assert n.transcript("no sorry", 2.0)[0] == Verdict(False, "speech")
    e = ConsultScreen()
    e.start("x", "p", 0.0)
    e.ended(0.5)
    assert e.dtmf("1", 1.0) == [] and e.spoken(1.0) == []  # the leg ended: no verdict
    u = ConsultScreen()
    u.start("x", "p", 0.0)
    u.spoken(1.0)
    assert u.transcript("what", 2.0) == [] and u.transcript("hm", 3.0) == []
    assert u.transcript("who", 4.0)[0] == Verdict(False, "unclear")
    assert answer_of("Okay.") is True and answer_of("nope") is False and answer_of("maybe") is None


def test_after_summary_accepts_when_the_opening_played_unless_declined_before():
    s = ConsultScreen("after_summary")
    assert s.start("A caller.", "Press 1 or 2.", 0.0) == [Say("A caller.")]  # no prompt
    assert s.spoken(3.0) == [Verdict(True, "after_summary")]
    t = ConsultScreen("after_summary")
    t.start("A caller.", "", 0.0)
    assert t.transcript("no", 1.0)[0] == Verdict(False, "speech")
    assert t.spoken(3.0) == []
    with pytest.raises(ValueError):
        ConsultScreen("later")


# -- the tool ---------------------------------------------------------------------------------

class Port:
    call_id = "c1"

    def __init__(self) -> None:
        self.warm: list[tuple[str, str]] = []
        self.transfers: list[tuple[str, str]] = []

    def hangup(self, reason: str) -> None: ...

    def send_dtmf(self, digits: str) -> None: ...

    async def transfer(self, target: str, timeout: float, summary: str = "") -> tuple[bool, str]:  # noqa: ASYNC109
        self.transfers.append((target, summary))
        return True, ""

    async def warm_transfer(self, target: str, reason: str) -> dict:
        self.warm.append((target, reason))
        return {"status": "declined"}


def _run(coro):
    return asyncio.run(coro)


def test_the_tool_refuses_an_unlisted_target_and_a_second_transfer_counted():
    port = Port()
    tools = {s.name: (s, t) for s, t in telephony_tools(port, transfer_targets=("+4930111",), warm_timeout_s=45)}
    spec, warm = tools["warm_transfer"]
    assert spec.timeout > 45 and spec.side_effect and spec.filler_after is None
    ctx = ToolContext("s", 1, "t1.0")
    before = dict(TRANSFER_STATS)
    with pytest.raises(ToolError, match="not allowed"):
        _run(warm({"target": "+4930999", "reason": "x"}, ctx))
    assert port.warm == []
    assert _run(warm({"target": "+4930111", "reason": "billing"}, ctx)) == {"status": "declined"}
    with pytest.raises(ToolError, match="already attempted"):
        _run(warm({"target": "+4930111"}, ctx))
    assert port.warm == [("+4930111", "billing")]
    assert TRANSFER_STATS["transfers_refused_target"] == before.get("transfers_refused_target", 0) + 1
    assert TRANSFER_STATS["transfers_refused_repeat"] == before.get("transfers_refused_repeat", 0) + 1


def test_blind_transfer_summary_is_bounded_and_one_line():
    port = Port()
    _, blind = {s.name: (s, t) for s, t in telephony_tools(port, transfer_targets=("+4930111",))}["transfer_call"]
    ctx = ToolContext("s", 1, "t1.0")
    with pytest.raises(ToolError, match="one line"):
        _run(blind({"target": "+4930111", "summary": "a\r\nX-Evil: 1"}, ctx))
    with pytest.raises(ToolError, match="one line"):
        _run(blind({"target": "+4930111", "summary": "x" * 401}, ctx))
    assert port.transfers == []
    assert _run(blind({"target": "+4930111", "summary": "  wants   billing "}, ctx)) == {"status": "transferred"}
    assert port.transfers == [("+4930111", "wants billing")]


# -- the agent file -----------------------------------------------------------------------------

def _file(tmp: Path, extra: str) -> Path:
    from tests.unit.test_providers_agents import BASE

    p = tmp / "a.toml"
    p.write_text(BASE.format(extra=extra))
    return p


def _errors(tmp: Path, extra: str) -> list[tuple[str, str]]:
    from brisvox.agent.definition import check_agent_file

    _, problems = check_agent_file(_file(tmp, extra), env={})
    return [(x.key, x.message) for x in problems if x.severity == "error"]


def test_agent_file_warm_transfer_table(tmp_path: Path):
    from brisvox.agent.definition import check_agent_file, load_agent
    from brisvox.agent.tool_engine.loader import NO_TRANSFER_TARGETS

    good = ('tools = ["warm_transfer"]\ntransfer_targets = ["+4930111"]\n'
            '[warm_transfer]\ntimeout_s = 20\naccept = "after_summary"\nsummary = "llm"\nvia = "twilio"\n'
            'no_answer_message = "Nobody is there."\n')
    agent = load_agent(_file(tmp_path, good), env={})
    w = agent.warm_transfer
    assert (w.timeout_s, w.accept, w.summary, w.via, w.no_answer_message) == (20, "after_summary", "llm", "twilio",
                                                                             "Nobody is there.")
    assert w.summary_max_chars == 400 and w.hold_audio == ""  # defaults
    assert _errors(tmp_path, 'tools = ["warm_transfer"]') == [("tools", NO_TRANSFER_TARGETS)]
    bad = _errors(tmp_path, good + 'hold_musik = "x.wav"\n')
    assert [k for k, _ in bad] == ["warm_transfer.hold_musik"] and "unknown" in bad[0][1]
    assert [k for k, _ in _errors(tmp_path, good + 'summary_max_chars = 5000\n')] == ["warm_transfer.summary_max_chars"]
    assert [k for k, _ in _errors(tmp_path, good.replace('"after_summary"', '"maybe"'))] == ["warm_transfer.accept"]
    assert [k for k, _ in _errors(tmp_path, good + 'hold_audio = "none.wav"\n')] == ["warm_transfer.hold_audio"]
    _, problems = check_agent_file(_file(tmp_path, '[warm_transfer]\ntimeout_s = 20\n'), env={})
    assert [(x.severity, x.key) for x in problems] == [("warning", "warm_transfer")]  # nothing uses it


def test_a_flow_warm_transfer_needs_the_tool_and_a_listed_target(tmp_path: Path):
    flow = '''tools = ["warm_transfer", "end_call"]
transfer_targets = ["+4930111"]
[flow]
start = "a"
[flow.nodes.a]
task = "hand over"
pre_actions = [{ warm_transfer = "+4930999", reason = "billing" }]
post_actions = [{ end_call = true }]
'''
    errs = _errors(tmp_path, flow)
    assert [k for k, _ in errs] == ["flow.nodes.a.pre_actions"] and "transfer_targets" in errs[0][1]
    assert _errors(tmp_path, flow.replace("+4930999", "+4930111")) == []
    errs = _errors(tmp_path, flow.replace("+4930999", "+4930111").replace('"warm_transfer", ', ""))
    assert any("warm_transfer" in m for _, m in errs)


# -- the port's waits ---------------------------------------------------------------------------

def test_link_telephony_consult_and_bridge_waits_are_futures_and_bounded():
    from brisvox.agent.tool_engine.builtin import LinkTelephony
    from ipc.frames import Bridge, BridgeEnded, BridgeResult, CommandReply, ConsultResult, Hangup

    async def main() -> None:
        sent: list[object] = []
        seen_args: list[dict] = []

        async def request(frame, timeout):  # noqa: ASYNC109
            seen_args.append(dict(frame.args))
            return CommandReply(ok=True, data={"call_id": "leg-2"})

        port = LinkTelephony("c1", sent.append, request=request)
        ok, data, _ = await port.dial("+4930111", "a", "sip", 1.0, trunk="t1",
                                      extra={"consult_for": "c1", "summary": "s"})
        assert ok and data["call_id"] == "leg-2"
        assert seen_args == [{"target": "+4930111", "agent": "a", "via": "sip", "trunk": "t1",
                              "consult_for": "c1", "summary": "s"}]
        # a verdict racing the dial's reply is kept for its wait; another leg's does not resolve it
        port.on_consult_result(ConsultResult(call_id="c1", consult_id="leg-2", outcome="declined"))
        assert (await port.consult_result("leg-2", 1.0)).outcome == "declined"
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, port.on_consult_result, ConsultResult(call_id="c1", consult_id="leg-9", outcome="x"))
        loop.call_later(0.02, port.on_consult_result, ConsultResult(call_id="c1", consult_id="leg-3",
                                                                    outcome="accepted"))
        assert (await port.consult_result("leg-3", 1.0)).outcome == "accepted"
        assert await port.consult_result("leg-4", 0.05) is None  # bounded
        for _ in range(10):
            port.on_consult_result(ConsultResult(call_id="c1", consult_id="old", outcome="x"))
        assert len(port.early_results) <= 4  # bounded too
        loop.call_later(0.01, port.on_bridge_result, BridgeResult(call_id="c1", ok=True))
        assert await port.bridge("leg-3", 1.0) == (True, "")
        assert await port.bridge("leg-3", 0.05) == (False, "no answer to the bridge in time")
        port.hangup_leg("leg-3", "warm_transfer_declined")
        port.on_bridge_ended(BridgeEnded(call_id="c1", other="leg-3"))  # no hook: dropped
        ended: list[BridgeEnded] = []
        port.bridge_ended = ended.append  # a warm transfer attached: its Bridge keeps the actor
        await port.bridge("leg-3", 0.01)
        port.on_bridge_ended(BridgeEnded(call_id="c1", other="leg-3", reason="bye"))
        assert ended == [BridgeEnded(call_id="c1", other="leg-3", reason="bye")]
        assert sent == [Bridge(call_id="c1", other="leg-3"), Bridge(call_id="c1", other="leg-3"),
                        Hangup(call_id="leg-3", reason="warm_transfer_declined"),
                        Bridge(call_id="c1", other="leg-3", keep=True)]

    asyncio.run(main())


def test_a_consult_legs_parts_put_the_ear_in_the_models_place_with_no_speculation_or_summary():
    from dataclasses import replace

    from brisvox.agent.host.actor import ActorConfig
    from brisvox.agent.host.call_consult import CallConsult, ConsultEar
    from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
    from brisvox.clock import CLOCK
    from brisvox.providers.registry import CallProviders
    from brisvox.providers.seeded_fakes import FakeLlm, FakeTts
    from brisvox.providers.word_codec import Vocab

    base = ActorConfig()
    spec = SpeculationConfig(enabled=True)
    cfg = replace(base, llm=replace(base.llm, speculation=spec, summary=replace(base.llm.summary, provider="agent")),
                  turn=replace(base.turn, speculation=spec))
    consult = CallConsult("leg", "caller", WarmConfig(), "A caller.", CLOCK, lambda f: None, lambda r: None)
    out_cfg, provs = consult.parts(cfg, CallProviders(stt=None, llm=FakeLlm([]), tts=FakeTts(Vocab())))
    assert isinstance(provs.llm, ConsultEar) and provs.s2s is None
    assert not out_cfg.llm.speculation.enabled and not out_cfg.turn.speculation.enabled
    assert out_cfg.llm.summary.provider == ""


def test_the_consult_legs_summary_is_bounded_again():
    from brisvox.agent.host.call_consult import CONSULT_SUMMARY_MAX, CallConsult
    from brisvox.clock import CLOCK

    c = CallConsult("leg", "caller", WarmConfig(), "a\r\nb " + "word " * 500, CLOCK, lambda f: None, lambda r: None)
    assert len(c.summary) <= CONSULT_SUMMARY_MAX and c.summary.startswith("a b word")


def test_a_speech_to_speech_agent_cannot_warm_transfer(tmp_path: Path):
    from brisvox.agent.definition import check_agent_file

    root = Path(__file__).resolve().parents[2] / "configs" / "agents" / "openai_realtime.toml"
    text = root.read_text()
    p = tmp_path / "s2s.toml"
    assert 'tools = ["end_call"]' in text
    p.write_text(text.replace('tools = ["end_call"]', 'tools = ["end_call", "warm_transfer"]\n'
                                                     'transfer_targets = ["+4930111"]'))
    _, problems = check_agent_file(p, env={}, load_modules=False)
    errs = [x.message for x in problems if x.severity == "error"]
    assert errs and "cascaded agent" in errs[0]


def test_a_twilio_consult_dial_waits_for_the_answer_that_names_the_leg_then_bridges_it():
    """Twilio's dial answers 201 with the CallSid alone: the leg is the one the gateway's
    ConsultResult ``answered`` names (its stream arrived); no answer within ``timeout_s``:
    ``no_answer``, and an answer after that is hung up."""
    from brisvox.agent.host.call_warm import CallWarm
    from brisvox.agent.tool_engine.builtin import LinkTelephony
    from brisvox.clock import LoopClock
    from ipc.frames import ConsultResult, Hangup

    sid = "CA" + "7" * 32
    cfg = WarmConfig(hold_message="", timeout_s=5.0, via="twilio")

    class Host:
        call_id = "c1"
        ring_rate = 16000

        def __init__(self, port: LinkTelephony, answer: bool) -> None:
            self.port, self.answer = port, answer
            self.dials: list[tuple[str, dict]] = []
            self.bridged: list[str] = []
            self.hung: list[str] = []

        def caller(self) -> tuple[str, str]:
            return "+4930222", "+4930333"

        async def announce(self, text: str, clip: bool) -> None:
            return None  # nothing is played here: the outcome's line is not waited for

        def agent(self) -> str:
            return "desk"

        async def dial(self, target, agent, via, timeout, trunk, extra):  # noqa: ASYNC109
            self.dials.append((via, extra))
            loop = asyncio.get_running_loop()
            if self.answer:  # the stream arrives, the person accepts: each as the gateway reports it
                loop.call_later(0.05, self.port.on_consult_result, ConsultResult(
                    call_id="c1", consult_id="leg-7", outcome="answered", detail="twilio:" + sid))
                loop.call_later(0.1, self.port.on_consult_result, ConsultResult(
                    call_id="c1", consult_id="leg-7", outcome="accepted", detail="dtmf"))
            return True, {"via": "twilio", "call_sid": sid, "status": "queued"}, ""

        def consult_result(self, consult_id, timeout):  # noqa: ASYNC109
            return self.port.consult_result(consult_id, timeout)

        async def bridge(self, other, timeout):  # noqa: ASYNC109
            self.bridged.append(other)
            return True, ""

        def hangup_leg(self, consult_id, reason):
            self.hung.append(consult_id)

    sent: list[object] = []

    async def main(answer: bool, cfg: WarmConfig = cfg) -> tuple[dict, Host, CallWarm]:
        host = Host(LinkTelephony("c1", sent.append), answer)
        warm = CallWarm(host, cfg, LoopClock())  # type: ignore[arg-type]
        return await asyncio.wait_for(warm.run("+4930111", "billing"), 10), host, warm

    loop = asyncio.new_event_loop()
    try:
        res, host, warm = loop.run_until_complete(main(True))
        assert res["status"] == "bridged" and host.bridged == ["leg-7"] and host.hung == [], (res, host.hung)
        assert host.dials[0][0] == "twilio" and host.dials[0][1]["ring_timeout_s"] == 5
        rec = warm.record()
        assert rec is not None and rec["legs"][1]["call_id"] == "leg-7" and rec["legs"][1]["verdict"] == "accepted"
        assert rec["legs"][1]["dialled_ms"] + 40 <= rec["legs"][1]["answered_ms"] <= rec["legs"][1]["verdict_ms"]

        # never answered: bounded by timeout_s like a SIP dial (a short one: the dataclass is not checked)
        t0 = time.monotonic()
        res, host, warm = loop.run_until_complete(main(False, replace(cfg, timeout_s=0.3)))
        assert res["status"] == "no_answer" and sid in res["detail"] and host.bridged == host.hung == [], res
        assert time.monotonic() - t0 < 2.0 and warm.record()["legs"][1]["call_id"] is None
        assert sent == []
        # the person answers after all: that leg is hung up, once
        late = ConsultResult(call_id="c1", consult_id="leg-8", outcome="answered", detail="twilio:" + sid)
        host.port.on_consult_result(late)
        host.port.on_consult_result(late)
        assert sent == [Hangup(call_id="leg-8", reason="warm_transfer_no_answer")], sent
    finally:
        loop.close()
