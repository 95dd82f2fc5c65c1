"""The gateway's call machine on its own (pure: events in, actions out, no core, no rings).

* the ordinary paths: a call started and ended from either side, a failed start, a caller who
  hangs up during the start, the echo agent, the detach timeout, the gateway's stop;
* every sequence of events (hypothesis): ``Release`` at most once and only once both sides are
  done; nothing at all after it; ``StartAgent``, ``StopMedia``, ``SendCallEnd``, ``StopBuiltin``
  and ``NotifyReady`` at most once each; the phase only moves forward; an action that may
  re-enter the machine is the last of its list; and whatever happened, the call is released
  once each side does what the machine asked of it (no call, no ring left behind);
* the module is pure: it imports the standard library only (no I/O module either).
"""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.gateway.core import call_machine as M

ORDER = {M.STARTING: 0, M.ACTIVE: 1, M.ENDING: 2, M.ENDED: 3}
REENTRANT = (M.HangupLeg, M.NotifyReady)


def kinds(actions) -> list[type]:
    return [type(a) for a in actions]


def started(process: bool = True, builtin: bool = False) -> M.CallMachine:
    m = M.CallMachine(detach_timeout_s=10.0)
    m.handle(M.Admit("native", process=process))
    assert m.handle(M.TransportStarted()) == (M.StartAgent(),)
    assert kinds(m.handle(M.AgentStarted(ok=True, builtin=builtin, now=1.0))) == [
        M.StartPacing, M.Count, M.NotifyReady]
    assert m.state == M.ACTIVE
    return m


def test_the_machine_imports_nothing_but_pure_standard_modules():
    tree = ast.parse(Path(M.__file__).read_text(encoding="utf-8"))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "collections.abc", "dataclasses", "typing"}, imported


# -- the ordinary paths ------------------------------------------------------------------------


def test_admission_counts_the_transport_and_an_echo_fallback():
    m = M.CallMachine()
    assert m.handle(M.Admit("sip", process=False, fallback=True)) == (
        M.Count("calls_echo_fallback"), M.Count("calls_admitted_sip"))
    assert M.CallMachine().handle(M.Admit("twilio", process=True)) == (M.Count("calls_admitted_twilio"),)
    assert m.state == M.STARTING and not m.transport_done and not m.agent_done


def test_the_caller_hangs_up_then_the_agent_answers_call_end():
    m = started()
    out = m.handle(M.TransportEnded("bye", now=5.0))
    assert out == (M.StopMedia(), M.SendCallEnd("bye"))
    assert m.state == M.ENDING and m.end_deadline == 15.0 and m.end_reason == "bye"
    assert m.handle(M.TransportEnded("again", now=6.0)) == ()  # idempotent
    assert not m.detach_overdue(15.0) and m.detach_overdue(15.1)
    assert m.handle(M.AgentEnded("bye", leg=True)) == (M.Release(),)
    assert m.released and m.handle(M.AgentEnded("bye", leg=True)) == ()


def test_the_agent_hangs_up_the_leg_reports_the_end():
    m = started()
    assert m.handle(M.AgentHangup("done", leg=True)) == (M.HangupLeg("done"),)
    assert m.agent_done and not m.transport_done and m.end_reason == "done"
    assert m.handle(M.TransportEnded("leg closed")) == (M.StopMedia(), M.Release())
    assert m.end_reason == "done"  # the first reason given


def test_call_ended_before_the_transport_ends_hangs_the_leg_up():
    m = started()
    assert m.handle(M.AgentEnded("", leg=True)) == (M.HangupLeg("agent ended the call"),)
    assert m.handle(M.TransportEnded("closed")) == (M.StopMedia(), M.Release())


def test_without_a_leg_our_hang_up_ends_the_transport_side_here():
    m = started()
    assert m.handle(M.Hangup("rtp timeout", leg=False, now=2.0)) == (M.StopMedia(), M.SendCallEnd("rtp timeout"))


def test_a_failed_start_answers_the_transport_which_ends_and_releases():
    m = M.CallMachine()
    m.handle(M.Admit("native", process=True))
    m.handle(M.TransportStarted())
    assert m.handle(M.AgentStarted(ok=False, why="agent refused: full")) == (
        M.Count("calls_failed_start"), M.NotifyReady(False, "agent refused: full"))
    assert m.state == M.ENDING and m.agent_done
    assert m.handle(M.TransportEnded("start failed")) == (M.StopMedia(), M.Release())


def test_a_start_the_agent_never_answered_is_revoked_there_and_released_here():
    """A CallStart that timed out may still be taken by the agent process later (a restarted
    agent working through its backlog): the machine tells it the call is over (RevokeStart, a
    CallEnd nobody waits for) and releases the call as for any failed start."""
    m = M.CallMachine()
    m.handle(M.Admit("native", process=True))
    m.handle(M.TransportStarted())
    assert m.handle(M.AgentStarted(ok=False, why="agent agent-1: TimeoutError", unanswered=True)) == (
        M.RevokeStart("start unanswered"), M.Count("calls_failed_start"),
        M.NotifyReady(False, "agent agent-1: TimeoutError"))
    assert m.state == M.ENDING and m.agent_done
    assert m.handle(M.TransportEnded("start failed")) == (M.StopMedia(), M.Release())
    # the caller hung up during that start: revoked and released at once
    m2 = M.CallMachine()
    m2.handle(M.Admit("native", process=True))
    m2.handle(M.TransportStarted())
    m2.handle(M.TransportEnded("bye"))
    assert m2.handle(M.AgentStarted(ok=False, why="t", unanswered=True)) == (
        M.RevokeStart("start unanswered"), M.Release())
    # an answered refusal needs no revoke; the echo agent has no process to tell
    m3 = M.CallMachine()
    m3.handle(M.Admit("native", process=False))
    m3.handle(M.TransportStarted())
    assert M.RevokeStart not in kinds(m3.handle(M.AgentStarted(ok=False, why="t", unanswered=True)))


def test_the_caller_hangs_up_during_the_start():
    m = M.CallMachine()
    m.handle(M.Admit("native", process=True))
    m.handle(M.TransportStarted())
    assert m.handle(M.TransportEnded("bye", now=3.0)) == (M.StopMedia(),)  # the start finishes it
    assert m.handle(M.AgentStarted(ok=True, now=4.0)) == (M.SendCallEnd("bye"),)  # no NotifyReady
    assert m.end_deadline == 14.0
    assert m.handle(M.AgentEnded("bye", leg=True)) == (M.Release(),)
    m2 = M.CallMachine()
    m2.handle(M.Admit("native", process=True))
    m2.handle(M.TransportStarted())
    m2.handle(M.TransportEnded("bye"))
    assert m2.handle(M.AgentStarted(ok=False, why="timeout")) == (M.Release(),)


def test_a_call_whose_agent_side_never_started_is_abandoned():
    m = M.CallMachine()
    m.handle(M.Admit("sip", process=True))
    assert m.handle(M.TransportEnded("no rtp port")) == (M.StopMedia(),)
    assert not m.released  # the start would finish it; there is none
    assert m.handle(M.Abandon()) == (M.Release(),)
    late = M.CallMachine()
    late.handle(M.Admit("sip", process=True))
    late.handle(M.TransportEnded("gone"))
    assert late.handle(M.TransportStarted()) == (M.Release(),)  # nothing started for a gone caller


def test_the_echo_agent_is_stopped_then_released():
    m = started(process=False, builtin=True)
    assert m.handle(M.TransportEnded("bye")) == (M.StopMedia(), M.StopBuiltin())
    assert m.handle(M.BuiltinStopped()) == (M.Release(),)


def test_a_silent_agent_is_released_by_the_detach_timeout():
    m = started()
    m.handle(M.TransportEnded("bye", now=0.5))
    assert m.handle(M.DetachTimeout()) == (M.Count("calls_detach_timeout"), M.Release())


def test_a_lost_agent_ends_its_call_and_a_call_waiting_for_it_is_released():
    m = started()
    assert m.handle(M.AgentLost(leg=True)) == (M.Count("calls_agent_lost"), M.HangupLeg("agent process died"))
    assert m.handle(M.AgentLost(leg=True)) == ()  # once
    waiting = started()
    waiting.handle(M.TransportEnded("bye"))
    assert waiting.handle(M.AgentLost(leg=True)) == (M.Count("calls_agent_lost"), M.Release())


def test_the_gateway_stop_hangs_up_then_forces_the_release():
    m = started()
    assert m.handle(M.Shutdown(leg=True)) == (M.HangupLeg("shutdown"),)
    assert m.end_reason == ""  # the leg names its own reason when it reports the end
    assert m.handle(M.ForceRelease(now=1.0)) == (M.StopMedia(), M.SendCallEnd("shutdown"), M.Release())
    legless = started()
    assert kinds(legless.handle(M.Shutdown(leg=False))) == [M.StopMedia, M.SendCallEnd]
    assert legless.handle(M.ForceRelease()) == (M.Release(),)


def test_a_worker_lost_is_forgotten_only_while_the_call_lives():
    m = started()
    assert m.handle(M.WorkerLost()) == (M.ForgetWorker(),)
    m.handle(M.ForceRelease())
    assert m.handle(M.WorkerLost()) == ()


# -- every sequence ----------------------------------------------------------------------------

REASONS = st.sampled_from(["bye", "", "stop"])
LEG = st.booleans()
NOW = st.floats(min_value=0.0, max_value=100.0)
EVENTS = st.one_of(
    st.builds(M.Admit, st.sampled_from(["sip", "native"]), st.booleans(), st.booleans()),
    st.just(M.TransportStarted()),
    st.builds(M.AgentStarted, st.booleans(), st.just("why"), st.booleans(), NOW, st.booleans()),
    st.builds(M.TransportEnded, REASONS, NOW),
    st.builds(M.Hangup, REASONS, LEG, NOW),
    st.builds(M.AgentHangup, REASONS, LEG, NOW),
    st.builds(M.AgentEnded, REASONS, LEG, NOW),
    st.builds(M.AgentLost, LEG, NOW),
    st.just(M.BuiltinStopped()),
    st.just(M.Abandon()),
    st.just(M.DetachTimeout()),
    st.just(M.WorkerLost()),
    st.builds(M.Shutdown, LEG, NOW),
)
ONCE = (M.Release, M.StartAgent, M.StopMedia, M.SendCallEnd, M.RevokeStart, M.StopBuiltin, M.NotifyReady)


class Checked:
    """Feeds a machine and checks every answer against the invariants."""

    def __init__(self, process: bool) -> None:
        self.m = M.CallMachine()
        self.seen: list[type] = []
        self.feed(M.Admit("native", process=process))

    def feed(self, event: M.Event) -> tuple[M.Action, ...]:
        m = self.m
        before, was_released = m.state, m.released
        out = m.handle(event)
        if was_released:
            assert out == (), f"{event} after the release: {out}"
        assert ORDER[m.state] >= ORDER[before], f"{before} -> {m.state} on {event}"
        for i, a in enumerate(out):
            if isinstance(a, REENTRANT):
                assert i == len(out) - 1, f"{a} is not last in {out}"
            if isinstance(a, M.Release):
                assert m.transport_done and m.agent_done and m.released
        self.seen += kinds(out)
        for kind in ONCE:
            assert self.seen.count(kind) <= 1, f"{kind.__name__} twice: {self.seen}"
        assert m.released == (M.Release in self.seen)
        return out

    def finish(self) -> None:
        """Each side does what it was asked (and what it would do by itself): released."""
        m = self.m
        if m.start == M.START_PENDING:
            self.feed(M.AgentStarted(ok=True, builtin=not m.process))
        self.feed(M.TransportEnded("end"))
        if M.StartAgent not in self.seen:
            self.feed(M.Abandon())
        if M.SendCallEnd in self.seen:
            self.feed(M.AgentEnded("bye", leg=True))
        if M.StopBuiltin in self.seen:
            self.feed(M.BuiltinStopped())
        assert m.released, f"left in the table: {m.state}, {self.seen}"


SEQUENCES = st.tuples(st.booleans(), st.lists(EVENTS, max_size=12))


def fed(case: tuple[bool, list[M.Event]]) -> Checked:
    process, events = case
    c = Checked(process)
    for e in events:
        c.feed(e)
    return c


@settings(max_examples=400, deadline=None)
@given(SEQUENCES)
def test_every_sequence_keeps_the_invariants_and_ends_released(case):
    fed(case).finish()


@settings(max_examples=200, deadline=None)
@given(SEQUENCES)
def test_a_forced_release_always_releases_once(case):
    c = fed(case)
    c.feed(M.ForceRelease())
    assert c.m.released and c.seen.count(M.Release) == 1


def test_the_checker_catches_a_second_release():
    m = started()
    m.handle(M.TransportEnded("bye"))
    m.handle(M.AgentEnded("bye", leg=True))
    c = Checked(True)
    c.m = m
    c.seen = [M.StartAgent, M.StartPacing, M.NotifyReady, M.StopMedia, M.SendCallEnd, M.Release]
    m.state = M.ENDING  # a broken machine that forgot it released
    try:
        c.feed(M.AgentEnded("bye", leg=True))
    except AssertionError as e:
        assert "Release twice" in str(e)
    else:
        raise AssertionError("a second Release went through")
