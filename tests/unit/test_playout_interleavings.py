"""Every interleaving of Pause, Clear, the new epoch's first audio and its OutUtterance, across
the agent link and the worker link, with pacer ticks anywhere in between, on the real gateway
core (its PlayoutGate, pacer and action table) and real rings.

The agent link is FIFO (Pause before Clear), the worker link too (the worker writes the new
epoch's first audio into the out ring, then sends OutUtterance); the two links are merged in
every order and a tick (or none) is placed in every gap. Three agent sides: a barge-in with a
Pause, a barge-in without one (while the old answer plays, and after it played out), and a new
response's lazy Clear after the old answer played out.

Checked for every case (the ledger invariants):

* nothing of the dead epoch leaves after the Clear is applied;
* exactly one Cleared for the dead epoch; its position is exactly what was released when the
  Clear was applied (the held position after a Pause): nothing more, nothing less; the agent's
  EpochLedger keeps it as that epoch's final position;
* while held, nothing is released;
* the new epoch's audio goes out in order, without repeats, and whole unless a barge-in Clear
  was applied after some of it had already left (the accepted race: that part was dropped by
  the transport clear, the rest follows contiguously);
* a lazy Clear never makes the peer drop the new response (no transport clear after its first
  frame), and the new response plays whole;
* the release position only moves forward and ends at the write position (nothing left
  stuck behind a closed gate).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

from brisvox.gateway.core.pacer import FRAME_S
from brisvox.playout.ledger import EpochLedger
from tests.unit.test_gateway_pacer import rig  # noqa: F401  (the fixture)

OLD, NEW = 1001, 2002  # sample values: which epoch a released sample belongs to
OLD_N, NEW_N = 1600, 800


def merges(a: list[str], b: list[str]) -> list[list[str]]:
    """Every order of ``a`` and ``b`` that keeps each list's own order."""
    n = len(a) + len(b)
    out = []
    for idx in itertools.combinations(range(n), len(a)):
        seq, ia, ib = [], iter(a), iter(b)
        for i in range(n):
            seq.append(next(ia) if i in idx else next(ib))
        out.append(seq)
    return out


def cases() -> list[tuple[str, tuple[str, ...], tuple[bool, ...]]]:
    out = []
    for side, agent in (("pause", ["P", "C"]), ("barge", ["C"]), ("barge-dry", ["C"]), ("lazy", ["C"])):
        for seq in merges(agent, ["W", "U"]):
            for ticks in itertools.product((False, True), repeat=len(seq) + 1):
                out.append((side, tuple(seq), ticks))
    return out


CASES = cases()


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def time(self) -> float:
        return self.t


def run_case(core, make, side: str, seq: tuple[str, ...], ticks: tuple[bool, ...]):
    call, leg, agent = make()
    clock = Clock(100.0)
    core.pacer._loop = clock  # kick/now read the loop's time
    ring = call.out_ring
    ring.write(np.full(OLD_N, OLD, dtype=np.int16))
    core.note_utterance(call, 1, 0)

    def tick():
        clock.t += FRAME_S
        core.pacer.service(call, clock.t, clock.t)

    if side in ("lazy", "barge-dry"):
        while call.release_pos < OLD_N or call.gate.playing:  # the old answer played out
            tick()
    else:
        for _ in range(3):
            tick()  # the old answer is playing
    sent_ns = time.monotonic_ns()  # the agent sends Pause/Clear now
    released_at: dict[str, int] = {}
    frames_at: dict[str, int] = {}
    positions = [call.release_pos]
    for i, ev in enumerate(seq):
        if ticks[i]:
            tick()
            positions.append(call.release_pos)
        released_at["before_" + ev] = call.release_pos
        frames_at["before_" + ev] = len(leg.sent)
        if ev == "P":
            core.apply_pause(call, 1)
        elif ev == "C":
            core.apply_clear(call, 1, sent_ns, lazy=side == "lazy")
        elif ev == "W":
            released_at["W_at"] = ring.write_pos
            ring.write(np.full(NEW_N, NEW, dtype=np.int16))
        elif ev == "U":
            core.note_utterance(call, 2, released_at["W_at"])
        released_at[ev] = call.release_pos
        frames_at[ev] = len(leg.sent)
        positions.append(call.release_pos)
    if ticks[-1]:
        tick()
    for _ in range(int((OLD_N + NEW_N) / 160) + 10):
        tick()
        positions.append(call.release_pos)
    return call, leg, agent, released_at, frames_at, positions


@pytest.mark.parametrize("side,seq,ticks", CASES, ids=[f"{s}-{''.join(q)}-{''.join('t' if x else '_' for x in k)}"
                                                          for s, q, k in CASES])
def test_every_interleaving_keeps_the_ledger(rig, side, seq, ticks):  # noqa: F811
    core, make = rig
    call, leg, agent, at, frames_at, positions = run_case(core, make, side, seq, ticks)
    try:
        frames = [s for _, s in leg.sent]
        after_clear = frames[frames_at["before_C"]:]
        # nothing of the dead epoch after the Clear was applied
        assert all((f != OLD).all() for f in after_clear), "stale audio after the Clear"
        # one Cleared for epoch 1, at exactly what had been released when it was applied
        cleared = [c for c in agent.cleared if c[0] == 1]
        assert len(cleared) == 1
        released_before = sum(len(f) for f in frames[: frames_at["before_C"]])
        assert cleared[0][1] == at["before_C"] == released_before
        # the agent side: its ledger takes the first Cleared as epoch 1's final position
        ledger = EpochLedger()
        ledger.clear_for(2, tts_pos=0, now_ns=0)
        for e, pos, _ in agent.cleared:
            ledger.cleared(e, pos)
        assert ledger.finals == {1: released_before}
        if side == "pause":
            # held from the Pause to the Clear: nothing released in between
            assert frames_at["before_C"] == frames_at["P"] and at["before_C"] == at["P"]
        # the new epoch: in order, no repeats; whole unless a barge-in cut some of it already
        new = np.concatenate([f[f == NEW] for f in frames]) if frames else np.zeros(0)
        assert len(new) <= NEW_N
        new_before_clear = sum(int((f == NEW).sum()) for f in frames[: frames_at["before_C"]])
        events = leg.events
        i_clear = [i for i, e in enumerate(events) if e == ("clear",)]
        audio_events = [i for i, e in enumerate(events) if e[0] == "audio"]  # one per sent frame
        first_new = next((audio_events[k] for k, f in enumerate(frames) if (f == NEW).any()), None)
        if side == "lazy":
            assert len(new) == NEW_N, "a lazy Clear lost part of the new response"
            assert first_new is not None
            assert not [i for i in i_clear if i > first_new], "the peer was told to drop the new response"
        elif new_before_clear == 0:
            assert len(new) == NEW_N, "the new response did not play whole"
        elif seq.index("U") < seq.index("C"):
            # the new epoch was announced and started before the Clear was read: the Clear stops
            # nothing (no cut, no transport clear that would drop the new response's frames)
            assert len(new) == NEW_N and first_new is not None
            assert not [i for i in i_clear if i > first_new], "the peer was told to drop the new response"
        else:
            # the accepted race: a barge-in Clear read after the new epoch's first frame left
            # (its OutUtterance still on the way) cuts it at the peer; the gateway skips nothing
            assert side == "barge-dry" and i_clear and first_new is not None and i_clear[0] > first_new
            assert len(new) == NEW_N
        # the release position only moves forward and ends at the write position
        assert all(b >= a for a, b in zip(positions, positions[1:], strict=False))
        assert call.release_pos == call.out_ring.write_pos
        assert call.gate.open and call.gate.held is None
    finally:
        core.pacer.remove(call)
        core.table.release(call)


def test_the_cases_cover_every_merge_and_tick_placement():
    assert len(merges(["P", "C"], ["W", "U"])) == 6 and len(merges(["C"], ["W", "U"])) == 3
    assert len(CASES) == 6 * 2 ** 5 + 3 * 3 * 2 ** 4
