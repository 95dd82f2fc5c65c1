"""The pacer's hold, driven tick by tick on real rings (no sockets, no timer): a paused
call releases nothing and keeps its position, ends its talkspurt (RTP: the next packet
carries the marker bit) without counting an underrun, continues from the held position,
and is released by itself after the gate's ``pause_max_s`` (counted)."""

from __future__ import annotations

import numpy as np

from brisvox.gateway.core.pacer import FRAME_S
from brisvox.playout.gate import Kick, PauseIn, ResumeIn
from tests.unit.test_gateway_pacer import rig, run_ticks  # noqa: F401  (the fixture)


def ramp(n: int) -> np.ndarray:
    return (np.arange(n) % 20000).astype(np.int16)


def test_a_hold_releases_nothing_and_resumes_from_the_held_position(rig):  # noqa: F811
    core, make = rig
    call, leg, _ = make()
    audio = ramp(3200)
    call.out_ring.write(audio)
    t = run_ticks(core, call, 10.0, 5)
    held = call.release_pos
    assert held == 5 * 160
    core.playout.run_actions(call, call.gate.handle(PauseIn(1, t)))
    assert leg.events[-1] == ("end_spurt",)  # the talkspurt ends at the hold
    n_sent = len(leg.sent)
    t = run_ticks(core, call, t, 25)  # 0.5 s held
    assert len(leg.sent) == n_sent and call.release_pos == held
    assert Kick() in call.gate.handle(ResumeIn(1))  # the rig has no loop: the ticks release
    run_ticks(core, call, t, 20)
    got = np.concatenate([s for _, s in leg.sent])
    assert np.array_equal(got, audio)  # nothing lost, nothing repeated
    assert call.stats.underruns == 0


def test_a_hold_ends_by_itself_after_pause_max(rig):  # noqa: F811
    core, make = rig
    call, leg, _ = make()
    call.out_ring.write(ramp(1600))
    t = run_ticks(core, call, 10.0, 2)
    call.gate.pause_max_s = 0.3
    core.playout.run_actions(call, call.gate.handle(PauseIn(1, t)))
    t2 = run_ticks(core, call, t, 14)  # 0.28 s: still held
    assert len(leg.sent) == 2
    run_ticks(core, call, t2, 3)
    assert len(leg.sent) > 2 and leg.sent[2][0] >= t + 0.3 - FRAME_S / 2
    assert core.metrics.counters["pauses_expired"] == 1
    assert call.gate.held is None
