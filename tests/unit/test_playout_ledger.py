"""The agent-side playout machine (EpochLedger): Clear idempotent per epoch and naming the
newest dead epoch, Pause/Resume let through only for the held live epoch, the first Cleared
per epoch final, the release floor monotone, memory bounded."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from brisvox.playout.ledger import (
    MAX_FINALS,
    EpochLedger,
    SendClear,
    SendPause,
    SendResume,
    SendTtsCut,
)


def test_clear_names_the_newest_dead_epoch_once_per_epoch():
    led = EpochLedger()
    assert led.clear_for(2, tts_pos=480, now_ns=7, lazy=True) == [SendClear(1, 7, True), SendTtsCut(1, 480)]
    assert led.clear_for(2, 500, 8) == [] and led.clear_for(1, 500, 8) == []
    assert led.epoch == 2 and led.sent == 1


def test_pause_resume_only_for_the_held_live_epoch_and_a_clear_ends_the_hold():
    led = EpochLedger()
    led.clear_for(2, 0, 0)
    assert led.pause(1, 5) == []  # a dead epoch
    assert led.pause(2, 5) == [SendPause(2, 5)]
    assert led.pause(2, 6) == []  # already held
    assert led.resume(3, 7) == []  # not the held one
    assert led.resume(2, 7) == [SendResume(2, 7)]
    assert led.resume(2, 8) == []  # nothing held any more
    assert led.pause(2, 9) == [SendPause(2, 9)]
    led.clear_for(3, 0, 10)
    assert led.held == 0 and led.resume(2, 11) == []
    assert led.st.pauses == 2 and led.st.resumes == 1 and led.st.pauses_ignored == 2 and led.st.resumes_ignored == 3


def test_the_first_cleared_of_an_epoch_is_final():
    led = EpochLedger()
    assert led.cleared(1, 800) and not led.cleared(1, 1600)
    assert led.finals == {1: 800} and led.st.cleared_repeated == 1


def test_finals_are_bounded():
    led = EpochLedger()
    for e in range(MAX_FINALS * 3):
        led.cleared(e, e)
    assert len(led.finals) == MAX_FINALS and min(led.finals) == MAX_FINALS * 2


@given(st.lists(st.integers(0, 10_000), max_size=60))
def test_the_release_floor_never_goes_backwards(reports):
    led = EpochLedger()
    floors = [led.release(p) for p in reports]
    kept = [f for f in floors if f is not None]
    assert kept == sorted(kept)
    assert led.release_floor == (max(reports) if reports else 0)
    assert led.st.releases_stale == sum(1 for f in floors if f is None)
