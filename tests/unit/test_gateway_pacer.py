"""The pacer and the epoch ledger on real rings, driven tick by tick (no sockets, no timer):
release timing, the first frame at once, partial frames, Clear (cut, gate, final position,
cut marks), OutUtterance opening the gate, marks released or echoed, underruns, admission."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core.call_machine import AgentStarted, TransportStarted
from brisvox.gateway.core.calls import AdmissionError
from brisvox.gateway.core.pacer import FRAME_S
from brisvox.gateway.transports import assemble


class FakeLeg:
    transport = "native"

    def __init__(self, marks_by_echo: bool = False) -> None:
        self.marks_by_echo = marks_by_echo
        self.sent: list[tuple[float, np.ndarray]] = []
        self.events: list[tuple] = []
        self.can_send = True

    def send_audio(self, samples, now):
        self.sent.append((now, samples.copy()))
        self.events.append(("audio", len(samples)))
        return True

    def end_spurt(self):
        self.events.append(("end_spurt",))

    def send_clear(self):
        self.events.append(("clear",))

    def send_mark(self, name):
        self.events.append(("mark", name))

    def tick_dtmf(self, now):
        return False

    def send_dtmf(self, digits):
        return 0

    def hangup(self, reason):
        self.events.append(("hangup", reason))

    def transfer(self, target, done):
        done(False, "no")

    def poll(self, now):
        pass


class Agent:
    """Stands in for the agent side (a built-in agent gets the callbacks directly)."""

    def __init__(self) -> None:
        self.cleared: list[tuple[int, int, list[str]]] = []
        self.played: list[tuple[str, int]] = []

    def tick(self, now):
        pass

    def on_cleared(self, epoch, position, marks):
        self.cleared.append((epoch, position, marks))

    def on_mark_played(self, name, position):
        self.played.append((name, position))

    def on_dtmf(self, digit):
        pass


def activate(call) -> None:
    """The call's machine as after ``start_call`` and a started agent side (the rigs attach the
    leg and the stand-in agent themselves, and add the call to the pacer)."""
    call.machine.handle(TransportStarted())
    call.machine.handle(AgentStarted(ok=True))


@pytest.fixture
def rig(shm_clean):
    ctx = zmq.Context()
    settings = GatewaySettings(GatewayConfig(max_calls=2, ring_seconds=2.0), SipConfig(enabled=False),
                               WebSocketConfig(enabled=False))
    core = assemble(settings, instance=shm_clean, ctx=ctx)
    made = []

    def make(echo_marks: bool = False):
        call = core.admit("native", "echo", 8000)
        leg = FakeLeg(echo_marks)
        agent = Agent()
        call.leg = leg
        call.builtin = agent
        activate(call)
        core.pacer.add(call)
        made.append(call)
        return call, leg, agent

    yield core, make
    for c in made:
        core.table.release(c)
    ctx.term()


def tone(n: int, value: int = 1000) -> np.ndarray:
    return np.full(n, value, dtype=np.int16)


def run_ticks(core, call, t0: float, n: int) -> float:
    t = t0
    for _ in range(n):
        core.pacer.service(call, t)
        t += FRAME_S
    return t


def test_frames_go_out_one_per_tick_never_late(rig):
    core, make = rig
    call, leg, _ = make()
    call.out_ring.write(tone(1600))
    run_ticks(core, call, 10.0, 12)
    assert [len(s) for _, s in leg.sent] == [160] * 10
    times = [t for t, _ in leg.sent]
    assert np.allclose(np.diff(times), FRAME_S)
    assert call.release_pos == 1600 and call.stats.late_frames == 0
    assert leg.events[-1] == ("end_spurt",)


def test_first_frame_of_a_response_goes_out_at_once(rig):
    core, make = rig
    call, leg, _ = make()
    core.pacer._loop = type("L", (), {"time": staticmethod(lambda: 5.007)})()
    run_ticks(core, call, 5.0, 1)  # idle tick
    call.out_ring.write(tone(800))
    core.note_utterance(call, 1, 0)  # OutUtterance: kicks the call
    assert len(leg.sent) == 1 and leg.sent[0][0] == pytest.approx(5.007)
    run_ticks(core, call, 5.02, 4)
    assert len(leg.sent) == 5 and call.release_pos == 800


class FakeLoop:
    def __init__(self, t: float) -> None:
        self.t = t

    def time(self) -> float:
        return self.t


def test_a_new_utterance_is_released_on_its_announcement_then_paced_on_the_grid(rig):
    """The first frame leaves in the callback that read OutUtterance (13 ms before the next
    tick here); the rest follows one frame per tick, never bursting, never late."""
    core, make = rig
    call, leg, _ = make()
    loop = FakeLoop(7.0)
    core.pacer._loop = loop
    run_ticks(core, call, 7.0, 1)  # idle tick at 7.00
    call.out_ring.write(tone(160 * 6))
    loop.t = 7.027
    core.note_utterance(call, 1, 0)
    assert [t for t, _ in leg.sent] == [pytest.approx(7.027)]
    assert core.pacer.first_frame.n == 1 and core.pacer.first_frame.quantile(0.5) <= 0.05
    for k in range(2, 8):  # ticks at 7.04 .. 7.14: one frame each, then the talkspurt ends
        core.pacer.service(call, 7.0 + k * FRAME_S, 7.0 + k * FRAME_S)
    times = [t for t, _ in leg.sent]
    assert len(times) == 6 and call.release_pos == 960
    assert np.allclose(np.diff(times[1:]), FRAME_S) and call.stats.late_frames == 0
    assert all(t2 - t1 <= FRAME_S + 1e-9 for t1, t2 in zip(times, times[1:], strict=False))
    assert leg.events[-1] == ("end_spurt",)


def test_an_announcement_while_playing_does_not_count_as_a_first_frame(rig):
    core, make = rig
    call, leg, _ = make()
    core.pacer._loop = FakeLoop(3.0)
    call.out_ring.write(tone(800))
    run_ticks(core, call, 3.0, 2)  # playing
    core.note_utterance(call, 1, 800)  # the next utterance of the same response
    assert core.pacer.first_frame.n == 0 and not core.pacer._announced


def test_a_clear_that_finds_the_newer_utterance_announced_starts_it_at_once(rig):
    """OutUtterance of epoch 2 raced ahead of the Clear of epoch 1: the Clear cuts the old
    audio and the new response's first frame leaves in the same callback."""
    core, make = rig
    call, leg, agent = make()
    loop = FakeLoop(1.0)
    core.pacer._loop = loop
    call.out_ring.write(tone(3200, 1))
    core.note_utterance(call, 1, 0)
    run_ticks(core, call, 1.02, 3)
    call.out_ring.write(tone(800, 2))  # epoch 2 starts at 3200
    loop.t = 1.075
    core.note_utterance(call, 2, 3200)
    n = len(leg.sent)
    core.apply_clear(call, 1, 0)
    assert agent.cleared[-1][0] == 1 and call.out_ring.floor == 3200
    assert len(leg.sent) == n + 1
    t, x = leg.sent[-1]
    assert t == pytest.approx(1.075) and set(x.tolist()) == {2}
    assert call.release_pos == 3360


def test_a_clear_without_a_newer_utterance_forgets_the_pending_announcement(rig):
    core, make = rig
    call, leg, _ = make()
    core.pacer._loop = FakeLoop(2.0)
    core.note_utterance(call, 1, 0)  # announced, audio not there yet
    assert core.pacer._announced
    core.apply_clear(call, 1, 0)
    assert not core.pacer._announced and not leg.sent


def test_partial_frame_waits_one_tick_then_goes(rig):
    core, make = rig
    call, leg, _ = make()
    call.out_ring.write(tone(200))
    run_ticks(core, call, 1.0, 1)
    assert [len(s) for _, s in leg.sent] == [160]
    run_ticks(core, call, 1.02, 1)
    assert len(leg.sent) == 1  # 40 samples: wait for more
    run_ticks(core, call, 1.04, 1)
    assert [len(s) for _, s in leg.sent] == [160, 40] and call.release_pos == 200


def test_clear_cuts_gates_stale_audio_and_reports_the_final_position(rig):
    core, make = rig
    call, leg, agent = make()
    call.out_ring.write(tone(4000))
    core.note_utterance(call, 1, 0)
    core.add_mark(call, "end-1", 4000)
    run_ticks(core, call, 1.0, 5)
    assert call.release_pos == 800
    core.apply_clear(call, 1, 0)
    assert leg.events[-1] == ("clear",)
    assert agent.cleared == [(1, 800, ["end-1"])]
    assert call.out_ring.floor == 800  # cut at the release position: the rest waits for the ledger
    # the worker's stale tail of epoch 1 lands after the cut: never released
    call.out_ring.write(tone(1000, 1))
    core.note_utterance(call, 1, 4000)  # a stale utterance start is ignored
    n = len(leg.sent)
    run_ticks(core, call, 2.0, 10)
    assert len(leg.sent) == n
    # epoch 2 starts at 5000: only its audio plays
    call.out_ring.write(tone(480, 2))
    core.note_utterance(call, 2, 5000)
    run_ticks(core, call, 3.0, 5)
    new = np.concatenate([s for _, s in leg.sent[n:]])
    assert len(new) == 480 and set(new.tolist()) == {2}
    assert call.stats.stale_samples == 3200 + 1000 and call.release_pos == 5480
    # the same epoch again: idempotent, no cut, Cleared repeated
    floor = call.out_ring.floor
    core.apply_clear(call, 1, 0)
    assert call.out_ring.floor == floor and agent.cleared[-1] == (1, 5480, [])


def test_a_new_epoch_written_before_the_clear_was_read_plays_whole(rig):
    """The worker converts the new response's first audio within a millisecond of the actor's
    write, so it can land in the out ring before the gateway reads the actor's (earlier sent)
    Clear, and a pacer tick can run before its OutUtterance arrives. Neither may eat it: the
    utterance start, not the moment the Clear was read, says where the stale audio ends."""
    core, make = rig
    call, leg, agent = make()
    core.pacer._loop = FakeLoop(1.0)
    call.out_ring.write(tone(1600, 1))  # epoch 1, playing
    core.note_utterance(call, 1, 0)
    run_ticks(core, call, 1.02, 3)
    assert call.release_pos == 640  # the announcement's frame and three ticks
    call.out_ring.write(tone(800, 1))  # epoch 1's stale tail (worker had not seen the cut yet)
    call.out_ring.write(tone(1600, 2))  # epoch 2's first audio, at 2400
    core.apply_clear(call, 1, 0)  # read late
    n = len(leg.sent)
    run_ticks(core, call, 1.2, 3)  # ticks before the OutUtterance: hold, release nothing, skip nothing
    assert len(leg.sent) == n and call.out_reader.position == 640
    core.pacer._loop = FakeLoop(1.265)
    core.note_utterance(call, 2, 2400)
    run_ticks(core, call, 1.28, 12)
    new = np.concatenate([x for _, x in leg.sent[n:]])
    assert len(new) == 1600 and set(new.tolist()) == {2}
    assert leg.sent[n][0] == pytest.approx(1.265)  # at once, on the announcement
    assert call.stats.stale_samples == 1600 + 800 - 640 and call.release_pos == 4000


def test_clear_after_a_newer_utterance_started_keeps_it(rig):
    core, make = rig
    call, leg, agent = make()
    call.out_ring.write(tone(1600, 1))
    run_ticks(core, call, 1.0, 2)
    call.out_ring.write(tone(800, 2))
    core.note_utterance(call, 2, 1600)  # the new epoch's audio raced ahead of the Clear
    core.apply_clear(call, 1, 0)
    assert call.out_ring.floor == 1600 and call.gate.open
    run_ticks(core, call, 2.0, 6)
    vals = np.concatenate([s for _, s in leg.sent[2:]])
    assert set(vals.tolist()) == {2} and len(vals) == 800


def test_a_lazy_clear_read_after_the_new_response_started_playing_leaves_it_alone(rig):
    """The race of the 4-call Smart Turn daemon test: the actor sends Clear(1) to the gateway
    and TtsUtterance(2) to the worker on the new response's first audio; the worker's
    OutUtterance(2) can reach the gateway first, and its first frame goes out at once. The
    Clear read after it has nothing of epoch <= 1 left to stop: it must not send the
    transport ``clear`` (the client would drop the frame it just got, and everything after it
    looks like audio after a clear), restart the talkspurt or discard epoch 2's marks."""
    core, make = rig
    call, leg, agent = make(echo_marks=True)
    loop = FakeLoop(1.0)
    core.pacer._loop = loop
    run_ticks(core, call, 1.0, 1)  # idle line
    call.out_ring.write(tone(160 * 8, 2))  # epoch 2's first audio at 0
    loop.t = 1.013
    core.note_utterance(call, 2, 0)  # OutUtterance(2) raced ahead of the actor's Clear(1)
    assert [len(x) for _, x in leg.sent] == [160]
    core.add_mark(call, "brisvox-end-2-1", 160 * 8)
    loop.t = 1.015
    core.apply_clear(call, 1, 0)  # the lazy Clear(1), read late
    assert ("clear",) not in leg.events
    assert agent.cleared == [(1, 160, [])] and call.gate.open and call.gate.playing
    assert len(leg.sent) == 1  # no second "first frame" on the Clear
    run_ticks(core, call, 1.02, 10)
    times = [t for t, _ in leg.sent]
    vals = np.concatenate([x for _, x in leg.sent])
    assert len(vals) == 160 * 8 and set(vals.tolist()) == {2} and call.stats.stale_samples == 0
    assert np.allclose(np.diff(times[1:]), FRAME_S) and times[1] == pytest.approx(1.02)
    assert ("mark", "brisvox-end-2-1") in leg.events  # epoch 2's mark survived the Clear


def test_a_lazy_clear_read_after_an_unannounced_new_response_started_leaves_it_alone(rig):
    """The other order of the same race (the 20-call daemon test under load): the new response's
    first frame left on a pacer tick before its OutUtterance arrived, then the lazy Clear(1) is
    read, then the OutUtterance. The talkspurt started from a dry ring after the Clear was sent,
    so it is the new response: no transport ``clear``, nothing cut, the answer plays whole."""
    import time as _time

    core, make = rig
    call, leg, agent = make()
    sent_ns = _time.monotonic_ns()  # the actor's lazy Clear(1) leaves before its audio exists
    call.out_ring.write(tone(160 * 8, 2))  # epoch 2's audio, its OutUtterance not read yet
    t = run_ticks(core, call, 1.0, 1)
    assert [len(x) for _, x in leg.sent] == [160] and call.gate.playing
    core.apply_clear(call, 1, sent_ns, lazy=True)
    assert ("clear",) not in leg.events and call.gate.playing and call.gate.open
    assert agent.cleared == [(1, 160, [])]
    core.note_utterance(call, 2, 0)
    run_ticks(core, call, t, 10)
    vals = np.concatenate([x for _, x in leg.sent])
    assert len(vals) == 160 * 8 and set(vals.tolist()) == {2} and call.stats.stale_samples == 0


def test_a_lazy_clear_after_a_short_first_chunk_ran_dry_leaves_the_response_alone(rig):
    """The same race when the new response's first chunk was one frame and the ring ran dry
    before the Clear was read: the talkspurt is over, but it was the new response's."""
    import time as _time

    core, make = rig
    call, leg, agent = make()
    sent_ns = _time.monotonic_ns()
    call.out_ring.write(tone(160, 2))  # one frame of epoch 2, then the TTS lags
    t = run_ticks(core, call, 1.0, 3)
    assert [len(x) for _, x in leg.sent] == [160] and not call.gate.playing
    core.apply_clear(call, 1, sent_ns, lazy=True)
    assert ("clear",) not in leg.events and call.gate.open
    core.note_utterance(call, 2, 0)
    call.out_ring.write(tone(160 * 4, 2))
    run_ticks(core, call, t, 6)
    vals = np.concatenate([x for _, x in leg.sent])
    assert len(vals) == 160 * 5 and set(vals.tolist()) == {2}


def test_a_barge_in_clear_still_cuts_a_talkspurt_that_started_after_it_was_sent(rig):
    """Only a lazy Clear gets that benefit: a barge-in Clear cuts whatever plays."""
    import time as _time

    core, make = rig
    call, leg, agent = make()
    sent_ns = _time.monotonic_ns()
    call.out_ring.write(tone(160 * 8, 1))
    core.note_utterance(call, 1, 0)
    run_ticks(core, call, 1.0, 2)
    core.apply_clear(call, 1, sent_ns)  # a barge-in: lazy=False
    assert ("clear",) in leg.events and not call.gate.playing and not call.gate.open


def test_a_clear_read_after_the_new_epoch_took_over_mid_stream_keeps_playing(rig):
    """Epoch 1 played out into epoch 2's audio (contiguous in the ring) before Clear(1) was
    read: nothing of epoch 1 is left to stop, so the stream goes on without a transport clear."""
    core, make = rig
    call, leg, agent = make()
    core.pacer._loop = FakeLoop(1.0)
    call.out_ring.write(tone(320, 1))
    core.note_utterance(call, 1, 0)
    call.out_ring.write(tone(800, 2))
    core.note_utterance(call, 2, 320)
    run_ticks(core, call, 1.02, 2)  # released through 480: 160 samples of epoch 2 are out
    assert call.release_pos == 480
    core.apply_clear(call, 1, 0)
    assert ("clear",) not in leg.events and agent.cleared[-1] == (1, 480, [])
    run_ticks(core, call, 1.06, 6)
    vals = np.concatenate([x for _, x in leg.sent])
    assert vals.tolist() == [1] * 320 + [2] * 800 and call.stats.stale_samples == 0


def test_marks_released_and_echoed(rig):
    core, make = rig
    call, leg, agent = make()
    call.out_ring.write(tone(800))
    core.add_mark(call, "m1", 480)
    core.add_mark(call, "m0", 160)  # out of order: inserted in place
    run_ticks(core, call, 1.0, 5)
    assert agent.played == [("m0", 160), ("m1", 480)]
    core.add_mark(call, "late", 100)  # already passed: reported at once (next service)
    run_ticks(core, call, 2.0, 1)
    assert agent.played[-1] == ("late", 100)

    call2, leg2, agent2 = make(echo_marks=True)
    call2.out_ring.write(tone(800))
    core.add_mark(call2, "e1", 320)
    core.add_mark(call2, "e2", 800)
    run_ticks(core, call2, 1.0, 2)
    assert leg2.events[:3] == [("audio", 160), ("audio", 160), ("mark", "e1")]
    core.mark_echo(call2, "e1")
    assert agent2.played == [("e1", 320)]
    run_ticks(core, call2, 2.0, 3)
    assert ("mark", "e2") in leg2.events
    core.apply_clear(call2, 1, 0)  # e2 sent but not echoed: cut, its late echo swallowed
    assert agent2.cleared[-1][2] == ["e2"]
    core.mark_echo(call2, "e2")
    assert agent2.played == [("e1", 320)] and core.metrics.counters["marks_echo_after_clear"] == 1


def test_underrun_counts_a_gap_mid_stream_not_the_end_of_speech(rig):
    core, make = rig
    call, leg, _ = make()
    call.out_ring.write(tone(320))
    t = run_ticks(core, call, 1.0, 3)  # 2 frames, then dry
    call.out_ring.write(tone(320))
    run_ticks(core, call, t, 2)  # resumes within 200 ms: an underrun
    assert call.stats.underruns == 1
    run_ticks(core, call, t + 1.0, 1)
    call.out_ring.write(tone(320))
    run_ticks(core, call, t + 2.0, 2)  # resumes a second later: a new response
    assert call.stats.underruns == 1


def test_hold_pauses_release_and_position(rig):
    core, make = rig
    call, leg, _ = make()
    call.out_ring.write(tone(800))
    run_ticks(core, call, 1.0, 2)
    leg.can_send = False
    run_ticks(core, call, 1.04, 5)
    assert call.release_pos == 320
    leg.can_send = True
    run_ticks(core, call, 2.0, 5)
    assert call.release_pos == 800


def test_admission_limit_and_ring_cleanup(rig):
    core, make = rig
    make()
    make()
    with pytest.raises(AdmissionError) as e:
        core.admit("sip", "echo", 8000)
    assert e.value.reason == "full" and core.table.refused["full"] == 1
    core.table.draining = True
    with pytest.raises(AdmissionError) as e2:
        core.admit("sip", "echo", 8000)
    assert e2.value.reason == "draining"


def test_tick_lateness_never_bursts_or_skips_and_missed_ticks_catch_up(rig):
    core, make = rig
    call, leg, _ = make()
    call.out_ring.write(tone(160 * 60))
    rng = np.random.default_rng(7)
    grid = 100.0
    for _ in range(40):  # each tick runs 0..15 ms late: still exactly one frame per tick
        n = len(leg.sent)
        core.pacer.service(call, grid + float(rng.uniform(0, 0.015)), grid)
        assert len(leg.sent) == n + 1
        grid += FRAME_S
    # the loop stalled: two ticks were never run, the next one catches up (3 frames)
    grid += 2 * FRAME_S
    n = len(leg.sent)
    core.pacer.service(call, grid + 0.001, grid)
    assert len(leg.sent) == n + 3 and call.stats.late_frames >= 1
    core.pacer.service(call, grid + FRAME_S, grid + FRAME_S)
    assert len(leg.sent) == n + 4
