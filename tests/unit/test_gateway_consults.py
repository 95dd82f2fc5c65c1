"""Warm transfer in the gateway core, on real rings and the real core (no sockets): the consult
leg's dial and its refusals, verdicts forwarded or refused, Hangup from strangers refused, the
Bridge's validation, the bridge's audio bit-exact both ways, and the end of one bridged leg:
the caller's end ends the person's leg; the person's end brings a caller bridged with ``keep``
back to its agent (BridgeEnded, nothing of the person's or the bridge-time agent audio left
queued), or hangs it up (``bridge_lost``: its agent left; ``bridge_ended``: not kept). Frames
the core sends to agent processes are captured at ``Links.send``."""

from __future__ import annotations

import wave
from typing import Any

import numpy as np
import pytest
import zmq

from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core import call_machine as M
from brisvox.gateway.core.consults import MAX_SUMMARY, summary_refusal
from brisvox.gateway.core.host import Dialer
from brisvox.gateway.core.pacer import FRAME_S, RELAY_BACKLOG
from brisvox.gateway.sip.dialogs import TRANSFER_SUMMARY_MAX, transfer_summary_header
from brisvox.gateway.transports import assemble
from ipc import frames as F

PROC, OTHER_PROC, STRANGER = "agent-0", "agent-1", "agent-9"


class Leg:
    """A transport leg that records what the gateway asks of it."""

    transport = "sip"
    marks_by_echo = False

    def __init__(self) -> None:
        self.sent: list[np.ndarray] = []
        self.hangups: list[str] = []
        self.spurts_ended = 0
        self.can_send = True

    def send_audio(self, samples: np.ndarray, now: float) -> bool:
        self.sent.append(samples.copy())
        return True

    def end_spurt(self) -> None:
        self.spurts_ended += 1

    def send_clear(self) -> None:
        pass

    def send_mark(self, name: str) -> None:
        pass

    def tick_dtmf(self, now: float) -> bool:
        return False

    def send_dtmf(self, digits: str) -> int:
        return 0

    def hangup(self, reason: str) -> None:
        self.hangups.append(reason)

    def transfer(self, target: str, done: Any, summary: str = "") -> None:
        done(False, "no")

    def send_call_event(self, name: str, fields: dict[str, Any]) -> bool:
        return False

    def poll(self, now: float) -> None:
        pass


class ListenerStub:
    """The dialer's listener: the stand-in dialers below need none, the core's stats read it."""

    def stats(self) -> dict[str, Any]:
        return {}


SETTINGS = GatewaySettings(GatewayConfig(max_calls=8, ring_seconds=2.0), SipConfig(enabled=False),
                           WebSocketConfig(enabled=False))


@pytest.fixture
def rig(shm_clean):
    ctx = zmq.Context()
    core = assemble(SETTINGS, instance=shm_clean, ctx=ctx)
    sent: list[tuple[str, F.Frame]] = []
    core.links.send = lambda peer, frame, cid=None: sent.append((peer, frame)) or True  # type: ignore[method-assign]
    core.links.reply = lambda peer, frame, cid: sent.append((peer, frame)) or True  # type: ignore[method-assign]
    made = []

    def make(proc: str = PROC, rate: int = 8000, media: str = "answered"):
        call = core.admit("sip", "echo", rate)
        call.agent_proc = proc
        call.machine.process = True  # an agent process serves it (the rig has none to start)
        leg = Leg()
        call.leg = leg
        call.machine.handle(M.TransportStarted())
        call.machine.handle(M.AgentStarted(ok=True))
        core.media_state(call, media)  # as a dialled call's answer says it (its answer time)
        core.pacer.add(call)
        made.append(call)
        return call, leg

    yield core, make, sent
    for c in made:
        core.table.release(c)
    ctx.term()


def frames_of(sent, cls):
    return [(peer, f) for peer, f in sent if isinstance(f, cls)]


def dialer_admitting(core, make, proc: str = PROC, fail: str = ""):
    """A SIP dialer stand-in that admits the dial's call as the real one does (``admitted`` before
    the INVITE), then reports it answered (or ``fail``)."""
    placed: list[Any] = []

    def dial(listener, host, target, agent, ring, done, trunk, params, admitted):
        call, leg = make(proc)
        if admitted is not None:
            admitted(call)
        placed.append((call, leg))
        done(None, fail) if fail else done({"call_id": call.call_id}, "")

    core.dialers = {"sip": Dialer("sip", dial, "SIP is not enabled")}
    core.listeners["sip"] = ListenerStub()  # type: ignore[assignment]
    return placed


def dial(core, args, sender=PROC):
    out: list[tuple[Any, str]] = []
    core.dial({"target": "sip:person@127.0.0.1", "agent": "echo", **args}, lambda d, e: out.append((d, e)), sender)
    return out[0]


# -- the consult leg's dial ------------------------------------------------------------------


def test_a_consult_dial_marks_both_legs_and_a_second_one_is_refused(rig):
    core, make, sent = rig
    caller, _ = make()
    placed = dialer_admitting(core, make, OTHER_PROC)
    data, error = dial(core, {"consult_for": caller.call_id, "summary": "Anna wants a refund for order 12"})
    assert error == "" and data["consult_for"] == caller.call_id
    leg = placed[0][0]
    assert leg.consult_for == caller.call_id and leg.consult_summary == "Anna wants a refund for order 12"
    assert caller.consult_leg == leg.call_id and "dialled" in leg.times
    _, error = dial(core, {"consult_for": caller.call_id, "summary": "again"})
    assert error.startswith("refused:") and "live consult leg" in error
    assert core.stats()["consult_legs_placed"] == 1 and core.stats()["consult_dials_refused_busy"] == 1
    calls = core.command("calls", {})
    assert calls[leg.call_id]["consult_for"] == caller.call_id
    assert calls[caller.call_id]["consult_leg"] == leg.call_id


@pytest.mark.parametrize(("args", "sender", "counter"), [
    ({"consult_for": "c-nope", "summary": "x"}, PROC, "consult_dials_refused_unknown"),
    ({"consult_for": "CALLER", "summary": "x"}, STRANGER, "consult_dials_refused_foreign"),
    ({"consult_for": "CALLER", "summary": "line one\r\nX-Evil: 1"}, PROC, "consult_dials_refused_summary"),
    ({"consult_for": "CALLER", "summary": "a" * (MAX_SUMMARY + 1)}, PROC, "consult_dials_refused_summary"),
    ({"summary": "a summary without a caller"}, PROC, "consult_dials_refused_summary"),
    ({"consult_for": 7}, PROC, "consult_dials_refused_invalid"),
])
def test_consult_dial_refusals_are_typed_and_counted(rig, args, sender, counter):
    core, make, _ = rig
    caller, _ = make()
    placed = dialer_admitting(core, make)
    args = {k: (caller.call_id if v == "CALLER" else v) for k, v in args.items()}
    data, error = dial(core, args, sender)
    assert data is None and error.startswith("refused:")
    assert placed == [] and core.stats()[counter] == 1 and caller.consult_leg == ""


def test_a_failed_consult_dial_frees_the_caller_for_another(rig):
    core, make, sent = rig
    caller, _ = make()
    placed = dialer_admitting(core, make, fail="busy")
    assert dial(core, {"consult_for": caller.call_id, "summary": "s"}) == (None, "busy")
    assert caller.consult_leg == ""
    core.transport_ended(placed[0][0], "busy")  # the dial's own reply said it: no ConsultResult
    assert frames_of(sent, F.ConsultResult) == []
    dialer_admitting(core, make)
    assert dial(core, {"consult_for": caller.call_id, "summary": "s"})[1] == ""


def test_the_summary_bound_and_characters():
    assert summary_refusal("Anna, order 12: refund (€40)") == ""
    assert summary_refusal("a" * MAX_SUMMARY) == ""
    assert "longer" in summary_refusal("a" * (MAX_SUMMARY + 1))
    for bad in ("a\rb", "a\nb", "a\tb", "a\x00b", "a\u2028b"):
        assert "control" in summary_refusal(bad)
    assert summary_refusal(5) == "summary must be a string"


def test_a_twilio_consult_leg_is_claimed_by_its_call_sid_and_its_caller_told_answered(rig):
    core, make, sent = rig
    caller, _ = make()

    def dial_twilio(listener, host, target, agent, ring, done, trunk, params, admitted):
        done({"via": "twilio", "call_sid": "CA" + "1" * 32, "status": "queued"}, "")

    core.dialers = {"twilio": Dialer("websocket", dial_twilio, "off")}
    core.listeners["websocket"] = ListenerStub()  # type: ignore[assignment]
    assert dial(core, {"via": "twilio", "consult_for": caller.call_id, "summary": "s"})[1] == ""
    assert caller.consult_leg == "twilio:CA" + "1" * 32
    assert dial(core, {"via": "twilio", "consult_for": caller.call_id, "summary": "s"})[1].startswith("refused")
    stream = core.admit("twilio", "echo", 8000)
    stream.transport_ids = {"callSid": "CA" + "1" * 32}
    assert frames_of(sent, F.ConsultResult) == []  # Twilio's 201 is no answer
    core.lifecycle.consults.claim(stream)
    assert stream.consult_for == caller.call_id and caller.consult_leg == stream.call_id
    assert stream.consult_summary == "s"
    # the caller's agent knew only the CallSid: the answer names the leg's call id
    assert frames_of(sent, F.ConsultResult) == [(PROC, F.ConsultResult(
        call_id=caller.call_id, consult_id=stream.call_id, outcome="answered", detail="twilio:CA" + "1" * 32))]
    core.table.release(stream)


def test_a_twilio_consult_leg_whose_caller_left_is_hung_up_without_an_agent(rig):
    core, make, _ = rig
    caller, _ = make()
    sid = "CA" + "2" * 32
    core.dialers = {"twilio": Dialer("websocket", lambda *a: a[5]({"call_sid": sid}, ""), "off")}
    core.listeners["websocket"] = ListenerStub()  # type: ignore[assignment]
    assert dial(core, {"via": "twilio", "consult_for": caller.call_id, "summary": "s"})[1] == ""
    core.transport_ended(caller, "bye")  # the caller hangs up while Twilio rings the person
    stream = core.admit("twilio", "echo", 8000)
    stream.transport_ids = {"callSid": sid}
    leg, ready = Leg(), []
    core.start_call(stream, leg, lambda ok, why: ready.append(ok))  # no agent side is started
    assert leg.hangups == ["caller_gone"] and core.stats()["consult_legs_orphaned"] == 1
    core.transport_ended(stream, "caller_gone")
    assert stream.state == M.ENDED and ready == []


# -- verdicts and hang-ups ------------------------------------------------------------------------


def consult_pair(core, make, leg_proc=OTHER_PROC):
    caller, caller_leg = make()
    placed = dialer_admitting(core, make, leg_proc)
    dial(core, {"consult_for": caller.call_id, "summary": "s"})
    leg, person_leg = placed[0]
    return caller, caller_leg, leg, person_leg


def test_a_verdict_reaches_the_callers_agent_once_and_only_from_the_legs_host(rig):
    core, make, sent = rig
    caller, _, leg, _ = consult_pair(core, make)
    core.router.on_frame(F.ConsultVerdict(call_id=leg.call_id, accepted=True), STRANGER, None)
    core.router.on_frame(F.ConsultVerdict(call_id=caller.call_id, accepted=True), PROC, None)  # not a consult leg
    assert frames_of(sent, F.ConsultResult) == [] and core.stats()["consult_verdicts_refused"] == 2
    core.router.on_frame(F.ConsultVerdict(call_id=leg.call_id, accepted=True, detail="said yes"), OTHER_PROC, None)
    assert frames_of(sent, F.ConsultResult) == [(PROC, F.ConsultResult(
        call_id=caller.call_id, consult_id=leg.call_id, outcome="accepted", detail="said yes"))]
    core.router.on_frame(F.ConsultVerdict(call_id=leg.call_id, accepted=False), OTHER_PROC, None)
    assert len(frames_of(sent, F.ConsultResult)) == 1 and core.stats()["consult_verdicts_refused"] == 3


def test_a_consult_leg_that_ends_before_its_verdict_is_reported_hung_up(rig):
    core, make, sent = rig
    caller, _, leg, _ = consult_pair(core, make)
    core.transport_ended(leg, "bye")
    assert frames_of(sent, F.ConsultResult) == [(PROC, F.ConsultResult(
        call_id=caller.call_id, consult_id=leg.call_id, outcome="hung_up", detail="bye"))]
    assert not caller.transport_done  # the caller's call goes on


def test_a_declined_consult_leg_ending_is_not_reported_again(rig):
    core, make, sent = rig
    caller, _, leg, _ = consult_pair(core, make)
    core.router.on_frame(F.ConsultVerdict(call_id=leg.call_id, accepted=False), OTHER_PROC, None)
    core.transport_ended(leg, "bye")
    assert [f.outcome for _, f in frames_of(sent, F.ConsultResult)] == ["declined"]


def test_hangup_from_a_stranger_is_refused_and_the_callers_agent_may_end_its_consult_leg(rig):
    core, make, _ = rig
    caller, caller_leg, leg, person_leg = consult_pair(core, make)
    core.router.on_frame(F.Hangup(call_id=caller.call_id, reason="x"), STRANGER, None)
    core.router.on_frame(F.Hangup(call_id=caller.call_id, reason="x"), OTHER_PROC, None)  # the leg's host
    assert caller_leg.hangups == [] and core.stats()["hangups_refused_foreign"] == 2
    core.router.on_frame(F.Hangup(call_id=leg.call_id, reason="given up"), PROC, None)
    assert person_leg.hangups == ["given up"]
    core.router.on_frame(F.Hangup(call_id=caller.call_id, reason="done"), PROC, None)
    assert caller_leg.hangups == ["done"]


def test_control_frames_from_a_stranger_are_refused_and_counted(rig):
    core, make, sent = rig
    call, leg = make()
    for f in (F.Clear(call_id=call.call_id, epoch=1, sent_ns=0), F.Pause(call_id=call.call_id, epoch=1, sent_ns=0),
              F.SendDtmf(call_id=call.call_id, digits="1"), F.Mark(call_id=call.call_id, name="m", position=1),
              F.CallEvent(call_id=call.call_id, name="x", data={}),
              F.CallEnded(call_id=call.call_id, reason="stranger")):
        core.router.on_frame(f, STRANGER, None)
    assert core.stats()["frames_refused_foreign"] == 6
    assert call.gate.held is None and call.stats.clears == 0 and call.stats.dtmf_out == 0
    assert not call.agent_done and leg.hangups == []
    core.pacer._loop = type("Loop", (), {"time": staticmethod(lambda: 5.0)})()
    core.router.on_frame(F.Pause(call_id=call.call_id, epoch=1, sent_ns=0), PROC, None)  # its host: taken
    assert call.gate.held is not None


def test_a_caller_that_hangs_up_ends_its_unbridged_consult_leg(rig):
    core, make, _ = rig
    caller, _, leg, person_leg = consult_pair(core, make)
    core.transport_ended(caller, "bye")
    assert person_leg.hangups == ["caller_gone"]


# -- the bridge ----------------------------------------------------------------------------------


def bridge(core, sent, a, b, sender=PROC) -> F.BridgeResult:
    core.router.on_frame(F.Bridge(call_id=a.call_id, other=b.call_id), sender, 1)
    return frames_of(sent, F.BridgeResult)[-1][1]


def test_bridge_refusals(rig):
    core, make, sent = rig
    a, _ = make()
    b, _ = make()  # unrelated to a
    r = bridge(core, sent, a, b)
    assert not r.ok and "not the consult leg" in r.detail
    caller, _, leg, _ = consult_pair(core, make)
    assert "not a call of the sender" in bridge(core, sent, caller, leg, STRANGER).detail
    assert "not a call of the sender" in bridge(core, sent, caller, leg, OTHER_PROC).detail
    assert "not the consult leg" in bridge(core, sent, leg, caller, OTHER_PROC).detail  # reversed
    leg.media = "early"  # ringing, not answered
    assert "answered and alive" in bridge(core, sent, caller, leg).detail
    leg.media = "answered"
    core.router.on_frame(F.Bridge(call_id=caller.call_id, other="c-gone"), PROC, 1)
    assert frames_of(sent, F.BridgeResult)[-1][1].detail == "unknown call"
    assert core.stats()["bridges_refused"] == 6
    assert not caller.bridged_with and not leg.bridged_with and frames_of(sent, F.CallEnd) == []


def test_bridge_of_legs_at_different_rates_is_refused(rig):
    core, make, sent = rig
    caller, _ = make(rate=16000)
    placed = dialer_admitting(core, make)
    dial(core, {"consult_for": caller.call_id, "summary": "s"})
    r = bridge(core, sent, caller, placed[0][0])
    assert not r.ok and "rates differ" in r.detail


def test_bridge_of_a_consult_leg_that_ended_is_refused(rig):
    core, make, sent = rig
    caller, _, leg, _ = consult_pair(core, make)
    core.transport_ended(leg, "bye")
    assert "answered and alive" in bridge(core, sent, caller, leg).detail


def test_bridged_audio_crosses_bit_exact_both_ways_and_one_legs_end_ends_the_other(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = consult_pair(core, make)
    core.audio_in(caller, np.full(480, 7, np.int16), 8000)  # said before the bridge: never replayed
    r = bridge(core, sent, caller, leg)
    assert r.ok, r.detail
    assert sorted(f.call_id for _, f in frames_of(sent, F.CallEnd)) == sorted([caller.call_id, leg.call_id])
    assert {f.reason for _, f in frames_of(sent, F.CallEnd)} == {"bridged"}
    assert core.stats()["bridged_calls_active"] == 2 and core.stats()["bridges_ok"] == 1
    # the agents detach: their CallEnded ends the agent side only, the legs stay up
    core.router.on_frame(F.CallEnded(call_id=caller.call_id, reason="bridged"), PROC, None)
    core.router.on_frame(F.CallEnded(call_id=leg.call_id, reason="bridged"), OTHER_PROC, None)
    assert caller_leg.hangups == [] and person_leg.hangups == []
    rng = np.random.default_rng(3)
    said_a = rng.integers(-32768, 32767, 160 * 10, dtype=np.int16)
    said_b = rng.integers(-32768, 32767, 160 * 10, dtype=np.int16)
    t = 100.0
    for k in range(10):  # one 20 ms packet each way per tick, as RTP brings them
        core.audio_in(caller, said_a[k * 160:(k + 1) * 160], 8000)
        core.audio_in(leg, said_b[k * 160:(k + 1) * 160], 8000)
        core.pacer.service(caller, t, t)
        core.pacer.service(leg, t, t)
        assert len(person_leg.sent) == k + 1 and len(caller_leg.sent) == k + 1  # within the tick
        t += FRAME_S
    assert np.array_equal(np.concatenate(person_leg.sent), said_a)
    assert np.array_equal(np.concatenate(caller_leg.sent), said_b)
    # the agent's late audio in the out ring, and its Hangup, change nothing now
    caller.out_ring.write(np.full(800, 99, np.int16))
    core.pacer.service(caller, t, t)
    assert len(caller_leg.sent) == 10
    core.router.on_frame(F.Hangup(call_id=caller.call_id, reason="late"), PROC, None)
    assert caller_leg.hangups == [] and core.stats()["hangups_refused_bridged"] == 1
    # the person hangs up: the caller is hung up too, and nothing more is read
    core.transport_ended(leg, "bye")
    assert caller_leg.hangups == ["bridge_ended"] and caller.relay is None and leg.relay is None
    assert core.stats()["bridged_calls_active"] == 0
    core.transport_ended(caller, "bridge_ended")
    assert caller.state == leg.state == M.ENDED  # both released (their agents had detached)
    rec = core.command("transfers", {})["transfers"][-1]
    assert rec["caller"] == caller.call_id
    legs = rec["legs"]
    assert legs[leg.call_id]["end_reason"] == "bye" and legs[caller.call_id]["end_reason"] == "bridge_ended"
    for c in (caller, leg):
        times = legs[c.call_id]["times"]
        assert times["admitted"] <= times["answered"] <= times["bridged"] <= times["ended"]
    assert "dialled" in legs[leg.call_id]["times"]


def contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    starts = np.flatnonzero(haystack[: len(haystack) - len(needle) + 1] == needle[0])
    return any(np.array_equal(haystack[i:i + len(needle)], needle) for i in starts)


def test_the_recordings_of_both_bridged_legs_go_on_with_each_direction(rig, tmp_path):
    """Each leg's WAV keeps its own voice on the left and, from the bridge on, the other
    leg's voice (what its pacer sent) on the right."""
    core, make, sent = rig
    clock = [50.0]
    core.recorder.clock = lambda: clock[0]
    caller, _, leg, _ = consult_pair(core, make)
    for c in (caller, leg):  # as CallAccepted's recording instruction opens it
        c.recording = core.recorder.open(c.call_id, 8000, {"dir": str(tmp_path / c.call_id), "keep_days": 1})
    assert bridge(core, sent, caller, leg).ok
    rng = np.random.default_rng(5)
    said_a = rng.integers(-20000, 20000, 160 * 20, dtype=np.int16)
    said_b = rng.integers(-20000, 20000, 160 * 20, dtype=np.int16)
    for k in range(20):
        clock[0] += FRAME_S
        core.audio_in(caller, said_a[k * 160:(k + 1) * 160], 8000)
        core.audio_in(leg, said_b[k * 160:(k + 1) * 160], 8000)
        core.pacer.service(caller, clock[0], clock[0])
        core.pacer.service(leg, clock[0], clock[0])
    core.transport_ended(leg, "bye")
    core.transport_ended(caller, "bridge_ended")
    core.recorder.stop()
    for c, own, other in ((caller, said_a, said_b), (leg, said_b, said_a)):
        (path,) = (tmp_path / c.call_id).glob("*.wav")
        with wave.open(str(path)) as w:
            assert w.getnchannels() == 2 and w.getframerate() == 8000
            stereo = np.frombuffer(w.readframes(w.getnframes()), "<i2").reshape(-1, 2)
        assert contains(stereo[:, 0], own) and contains(stereo[:, 1], other)


def test_a_lagging_bridge_drops_its_oldest_audio_and_stays_bounded(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = consult_pair(core, make)
    assert bridge(core, sent, caller, leg).ok
    burst = np.arange(160 * (RELAY_BACKLOG + 6), dtype=np.int16)
    core.audio_in(caller, burst, 8000)  # a burst of 10 frames at once
    core.pacer.service(leg, 1.0, 1.0)
    assert np.array_equal(person_leg.sent[0], burst[-160:])  # only the newest frame went
    assert core.stats()["bridge_samples_dropped"] == len(burst) - 160


def test_a_bridged_call_survives_its_agent_process_loss(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = consult_pair(core, make)
    assert bridge(core, sent, caller, leg).ok
    core.lifecycle.agent_lost(PROC)
    assert caller_leg.hangups == [] and not caller.transport_done


def test_max_call_duration_ends_a_bridged_pair(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = consult_pair(core, make)
    assert bridge(core, sent, caller, leg).ok
    caller.machine.call_deadline = 1.0
    core.lifecycle.expire_detaches(2.0)
    assert caller_leg.hangups == ["max call duration"]
    core.transport_ended(caller, "max call duration")
    assert person_leg.hangups == ["bridge_ended"]


# -- a kept bridge: the person's leg ends, the caller goes back to its agent --------------------


def kept_bridge(core, sent, make):
    caller, caller_leg, leg, person_leg = consult_pair(core, make)
    core.router.on_frame(F.Bridge(call_id=caller.call_id, other=leg.call_id, keep=True), PROC, 1)
    assert frames_of(sent, F.BridgeResult)[-1][1].ok
    core.router.on_frame(F.CallEnded(call_id=leg.call_id, reason="bridged"), OTHER_PROC, None)  # the consult actor left
    return caller, caller_leg, leg, person_leg


def test_a_kept_bridge_ends_only_the_consult_legs_agent(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = kept_bridge(core, sent, make)
    assert [(p, f.call_id, f.reason) for p, f in frames_of(sent, F.CallEnd)] == [(OTHER_PROC, leg.call_id, "bridged")]
    assert caller.bridged_with == leg.call_id and caller.machine.bridge_kept and not caller.agent_done
    # its agent's playout frames are still refused while bridged: the caller hears the person only
    core.router.on_frame(F.Pause(call_id=caller.call_id, epoch=1, sent_ns=0), PROC, None)
    assert caller.gate.held is None and core.stats()["frames_refused_bridged"] == 1


def test_the_persons_hangup_brings_a_kept_caller_back_to_its_agent(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = kept_bridge(core, sent, make)
    t = 100.0
    person = np.arange(160 * 3, dtype=np.int16)
    for k in range(3):
        core.audio_in(leg, person[k * 160:(k + 1) * 160], 8000)
        core.pacer.service(caller, t, t)
        t += FRAME_S
    assert np.array_equal(np.concatenate(caller_leg.sent), person)  # the bridge carried the person
    caller.out_ring.write(np.full(800, 99, np.int16))  # the agent's words during the bridge (the hold's tail)
    core.router.on_frame(F.Mark(call_id=caller.call_id, name="r1-end", position=800), PROC, None)  # booked
    assert frames_of(sent, F.MarkPlayed) == [] and core.stats().get("frames_refused_bridged", 0) == 0
    core.audio_in(leg, np.full(160, 5, np.int16), 8000)  # the person's last packet, never sent
    core.transport_ended(leg, "bye")
    assert caller_leg.hangups == [] and not caller.transport_done  # the caller is NOT hung up
    assert frames_of(sent, F.BridgeEnded) == [(PROC, F.BridgeEnded(
        call_id=caller.call_id, other=leg.call_id, reason="bye",
        ended_ns=frames_of(sent, F.BridgeEnded)[0][1].ended_ns))]
    assert caller.bridged_with == "" and caller.relay is None and not caller.machine.bridged
    assert caller_leg.spurts_ended >= 1  # the person's talkspurt ended at the un-bridge
    # the dropped reply's end mark is reported passed, so the agent's book ends that reply
    assert [(p, f.name) for p, f in frames_of(sent, F.MarkPlayed)] == [(PROC, "r1-end")]
    st = core.stats()
    assert st["bridges_lost"] == 1 and st["bridges_lost_resumed"] == 1 and st["bridged_calls_active"] == 0
    assert "bridge_lost" in caller.times and caller.times["bridge_lost"] >= caller.times["bridged"]
    n = len(caller_leg.sent)
    core.pacer.service(caller, t, t)
    t += FRAME_S
    assert len(caller_leg.sent) == n  # nothing queued of the person's, nor the agent's words from the bridge
    apology = np.arange(1000, 1000 + 160 * 2, dtype=np.int16)
    caller.out_ring.write(apology)
    for _ in range(2):
        core.pacer.service(caller, t, t)
        t += FRAME_S
    assert np.array_equal(np.concatenate(caller_leg.sent[n:]), apology)  # the agent's voice again, bit-exact
    # an ordinary call of its agent again: its playout frames and its hang-up are taken
    core.pacer._loop = type("Loop", (), {"time": staticmethod(lambda: t)})()
    core.router.on_frame(F.Pause(call_id=caller.call_id, epoch=1, sent_ns=0), PROC, None)
    assert caller.gate.held is not None
    core.router.on_frame(F.Hangup(call_id=caller.call_id, reason="done"), PROC, None)
    assert caller_leg.hangups == ["done"]
    core.transport_ended(caller, "done")
    rec = core.command("transfers", {})["transfers"][-1]
    assert rec["legs"][caller.call_id]["times"]["bridge_lost"] == caller.times["bridge_lost"]
    assert rec["legs"][leg.call_id]["end_reason"] == "bye"
    assert len(frames_of(sent, F.BridgeEnded)) == 1


def test_an_unbridged_caller_may_consult_again(rig):
    core, make, sent = rig
    caller, _, leg, _ = kept_bridge(core, sent, make)
    core.transport_ended(leg, "bye")
    placed = dialer_admitting(core, make, OTHER_PROC)
    assert dial(core, {"consult_for": caller.call_id, "summary": "again"})[1] == ""
    assert caller.consult_leg == placed[0][0].call_id


@pytest.mark.parametrize("how", ["call_ended", "agent_lost", "hangup"])
def test_a_kept_caller_whose_agent_left_during_the_bridge_is_hung_up_bridge_lost(rig, how):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = kept_bridge(core, sent, make)
    if how == "call_ended":
        core.router.on_frame(F.CallEnded(call_id=caller.call_id, reason="stage_failed:llm"), PROC, None)
    elif how == "agent_lost":
        core.lifecycle.agent_lost(PROC)
    else:  # its kept agent's Hangup: the agent side leaves, the bridge goes on
        core.router.on_frame(F.Hangup(call_id=caller.call_id, reason="agent max duration"), PROC, None)
    assert caller.agent_done and caller_leg.hangups == [] and person_leg.hangups == []
    assert core.stats().get("hangups_refused_bridged", 0) == 0
    core.transport_ended(leg, "bye")
    assert caller_leg.hangups == ["bridge_lost"] and frames_of(sent, F.BridgeEnded) == []
    assert core.stats()["bridges_lost_hung_up"] == 1
    core.transport_ended(caller, "bridge_lost")
    assert caller.state == M.ENDED
    assert core.command("transfers", {})["transfers"][-1]["legs"][caller.call_id]["end_reason"] == "bridge_lost"


def test_a_kept_callers_own_hangup_still_ends_the_persons_leg(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = kept_bridge(core, sent, make)
    core.transport_ended(caller, "bye")
    assert person_leg.hangups == ["bridge_ended"] and frames_of(sent, F.BridgeEnded) == []
    assert [(f.call_id, f.reason) for _, f in frames_of(sent, F.CallEnd) if f.call_id == caller.call_id] == \
        [(caller.call_id, "bye")]  # its kept agent hears of the end now
    core.transport_ended(leg, "bridge_ended")
    assert frames_of(sent, F.BridgeEnded) == [] and core.stats().get("bridges_lost", 0) == 0


def test_the_gateways_stop_does_not_bring_a_kept_caller_back(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = kept_bridge(core, sent, make)
    core.lifecycle.hang_up_all()
    assert caller_leg.hangups == ["shutdown"] and person_leg.hangups == ["shutdown"]
    core.transport_ended(leg, "shutdown")  # the person's leg reports its end first
    assert frames_of(sent, F.BridgeEnded) == [] and caller_leg.hangups == ["shutdown"]


def test_a_bridge_without_keep_still_hangs_the_caller_up_when_the_person_leaves(rig):
    core, make, sent = rig
    caller, caller_leg, leg, person_leg = consult_pair(core, make)
    assert bridge(core, sent, caller, leg).ok
    core.transport_ended(leg, "bye")
    assert caller_leg.hangups == ["bridge_ended"] and frames_of(sent, F.BridgeEnded) == []


# -- the call machine ------------------------------------------------------------------------


def active_machine() -> M.CallMachine:
    m = M.CallMachine(detach_timeout_s=5.0)
    m.handle(M.Admit("sip", process=True))
    m.handle(M.TransportStarted())
    m.handle(M.AgentStarted(ok=True))
    return m


def test_machine_kept_bridge_sends_no_call_end_and_unbridges_once():
    m = active_machine()
    assert m.handle(M.Bridged(now=1.0, keep=True)) == ()
    assert m.bridged and m.bridge_kept
    assert m.handle(M.Unbridged(leg=True, now=2.0)) == (M.Count("bridges_lost_resumed"), M.SEND_BRIDGE_ENDED)
    assert not m.bridged and not m.bridge_kept
    assert m.handle(M.Unbridged(leg=True, now=2.5)) == ()  # once per bridge
    assert m.handle(M.TransportEnded("bye", 3.0)) == (M.STOP_MEDIA, M.SendCallEnd("bye"))


def test_machine_kept_bridge_whose_agent_left_hangs_up_bridge_lost():
    m = active_machine()
    m.handle(M.Bridged(now=1.0, keep=True))
    assert m.handle(M.AgentEnded("stage_failed:llm", leg=True)) == ()  # the bridge goes on
    assert m.handle(M.Unbridged(leg=True, now=2.0)) == (M.Count("bridges_lost_hung_up"), M.HangupLeg("bridge_lost"))
    assert m.handle(M.TransportEnded("bridge_lost", 3.0)) == (M.STOP_MEDIA, M.RELEASE)


def test_machine_unbridged_without_keep_hangs_up_and_a_hangup_under_way_wins():
    m = active_machine()
    m.handle(M.Bridged(now=1.0))
    assert m.handle(M.Unbridged(leg=True, now=2.0)) == (M.HangupLeg("bridge_ended"),)
    k = active_machine()
    k.handle(M.Bridged(now=1.0, keep=True))
    k.handle(M.Shutdown(leg=True, now=1.5))
    assert k.handle(M.Unbridged(leg=True, now=2.0)) == ()  # the stop ends it, no BridgeEnded
    assert active_machine().handle(M.Unbridged(leg=True, now=2.0)) == ()  # not bridged: nothing




def test_machine_bridged_sends_call_end_once_and_its_agent_end_does_not_hang_up():
    m = M.CallMachine(detach_timeout_s=5.0)
    m.handle(M.Admit("sip", process=True))
    m.handle(M.TransportStarted())
    m.handle(M.AgentStarted(ok=True))
    assert m.handle(M.Bridged(now=1.0)) == (M.SendCallEnd("bridged"),)
    assert m.handle(M.Bridged(now=1.0)) == ()
    assert m.handle(M.AgentEnded("bridged", leg=True)) == ()
    assert m.handle(M.TransportEnded("bye", 2.0)) == (M.STOP_MEDIA, M.RELEASE)


def test_machine_bridged_transport_end_before_call_ended_waits_for_it_once():
    m = M.CallMachine(detach_timeout_s=5.0)
    m.handle(M.Admit("sip", process=True))
    m.handle(M.TransportStarted())
    m.handle(M.AgentStarted(ok=True))
    m.handle(M.Bridged(now=1.0))
    assert m.handle(M.TransportEnded("bye", 2.0)) == (M.STOP_MEDIA,)  # no second CallEnd
    assert not m.detach_overdue(5.9) and m.detach_overdue(6.1)


def test_machine_refuses_bridging_a_call_not_active():
    m = M.CallMachine()
    m.handle(M.Admit("sip", process=True))
    assert m.handle(M.Bridged(now=1.0)) == ()


# -- X-Transfer-Summary -------------------------------------------------------------------------


def test_transfer_summary_header_is_bounded_and_has_no_line_break():
    value, changed = transfer_summary_header("Anna: refund for order 12")
    assert value == '"Anna: refund for order 12"' and not changed
    value, changed = transfer_summary_header('evil\r\nX-Injected: 1 "quoted"')
    assert "\r" not in value and "\n" not in value and changed
    assert value == '"evil X-Injected: 1 \\"quoted\\""'
    value, changed = transfer_summary_header("é" * 400)
    assert len(value.encode()) <= TRANSFER_SUMMARY_MAX + 2 and changed
