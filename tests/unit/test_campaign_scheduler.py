"""The campaign planner: rate spacing, the concurrency cap, calling hours per time zone (DST
included), retries, and what pause/cancel do to a plan (via the store's states: test_campaign_store)."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from brisvox.outbound.campaign.outcomes import BUSY, FAILED, NO_ANSWER, REFUSED
from brisvox.outbound.campaign.scheduler import (
    Due,
    Settings,
    after_attempt,
    in_hours,
    next_opening,
    parse_days,
    parse_hours,
    plan,
    rate_over,
)

ALL_DAY = ((0, 24 * 60),)


def utc(*a: int) -> float:
    return datetime(*a, tzinfo=UTC).timestamp()


def rows(n: int, tz: str = "UTC") -> list[Due]:
    return [Due(i, tz) for i in range(1, n + 1)]


def simulate(s: Settings, n_rows: int, seconds: float, step: float, call_s: float) -> list[float]:
    """Run the planner on virtual time: every dial lasts call_s; returns the dial start times."""
    t, last, starts = 1_000_000.0, None, []
    ends: list[float] = []
    left = rows(n_rows)
    while t < 1_000_000.0 + seconds:
        ends = [e for e in ends if e > t]
        p = plan(t, s, in_flight=len(ends), last_started=last, due=left)
        for _ in p.dial:
            starts.append(t)
            last = t
            ends.append(t + call_s)
            assert len(ends) <= s.max_concurrent
        left = [r for r in left if r.row_id not in p.dial]
        t += step
    return starts


def test_the_rate_spaces_starts_and_no_second_holds_more_than_the_rate():
    s = Settings(rate=5, max_concurrent=100, windows=ALL_DAY)
    starts = simulate(s, 200, 10.0, 0.01, 0.5)
    assert 48 <= len(starts) <= 51  # 5/s for 10 s
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert min(gaps) >= 0.2 - 1e-9
    for t0 in starts:
        assert sum(1 for t in starts if t0 <= t < t0 + 1.0) <= 5


def test_the_cap_bounds_calls_in_flight_and_limits_throughput():
    s = Settings(rate=100, max_concurrent=3, windows=ALL_DAY)
    starts = simulate(s, 200, 10.0, 0.05, 2.0)  # 3 calls of 2 s at a time: 1.5/s
    assert 14 <= len(starts) <= 16
    p = plan(0.0, s, in_flight=3, last_started=None, due=rows(5))
    assert p.dial == () and p.wake_at is None  # a call ending wakes the runner, not a timer


def test_a_restart_keeps_the_spacing_from_the_last_recorded_start():
    s = Settings(rate=2, windows=ALL_DAY)
    p = plan(100.2, s, in_flight=0, last_started=100.0, due=rows(3))
    assert p.dial == () and p.wake_at == pytest.approx(100.5)
    assert plan(100.5, s, in_flight=0, last_started=100.0, due=rows(3)).dial == (1,)


def test_calling_hours_follow_each_rows_own_zone():
    s = Settings(windows=parse_hours("09:00-20:00"), days=parse_days("all"))
    now = utc(2026, 6, 10, 12, 0)  # 14:00 in Berlin, 21:00 in Tokyo, 05:00 in Los Angeles
    due = [Due(1, "Europe/Berlin"), Due(2, "Asia/Tokyo"), Due(3, "America/Los_Angeles")]
    p = plan(now, Settings(rate=100, windows=s.windows, days=s.days), in_flight=0, last_started=None, due=due)
    assert p.dial == (1,)
    defer = dict(p.defer)
    assert defer[2] == utc(2026, 6, 11, 0, 0)  # Tokyo's 09:00 tomorrow
    assert defer[3] == utc(2026, 6, 10, 16, 0)  # Los Angeles's 09:00 today (PDT, UTC-7)


def test_calling_days_skip_to_the_next_allowed_day_in_the_rows_zone():
    s = Settings(windows=parse_hours("09:00-17:00"), days=parse_days("mon-fri"))
    fri_evening = utc(2026, 6, 12, 18, 0)  # Friday 20:00 in Berlin
    assert next_opening(s, "Europe/Berlin", fri_evening) == utc(2026, 6, 15, 7, 0)  # Monday 09:00 CEST


def test_dst_spring_forward_and_fall_back_move_the_opening_in_utc():
    s = Settings(windows=parse_hours("09:00-17:00"), days=parse_days("all"))
    ny = "America/New_York"
    # the night before the March 2026 change (8 March): 09:00 EST is 14:00 UTC; the day after: 13:00 UTC
    assert next_opening(s, ny, utc(2026, 3, 7, 23, 0)) == utc(2026, 3, 8, 13, 0)
    assert next_opening(s, ny, utc(2026, 3, 6, 23, 0)) == utc(2026, 3, 7, 14, 0)
    # November 1 2026 (back to EST): 09:00 is 14:00 UTC again
    assert next_opening(s, ny, utc(2026, 11, 1, 3, 0)) == utc(2026, 11, 1, 14, 0)
    assert in_hours(s, ny, utc(2026, 3, 8, 13, 30)) and not in_hours(s, ny, utc(2026, 3, 7, 13, 30))


def test_a_window_starting_in_the_dst_gap_opens_when_the_gap_ends():
    s = Settings(windows=parse_hours("02:30-04:00"), days=parse_days("all"))
    # Berlin, 29 March 2026: 02:00 CET jumps to 03:00 CEST (01:00 UTC); 02:30 does not exist
    t = next_opening(s, "Europe/Berlin", utc(2026, 3, 28, 22, 0))
    local = datetime.fromtimestamp(t, ZoneInfo("Europe/Berlin"))
    assert (local.hour, local.minute) == (3, 30) and t == utc(2026, 3, 29, 1, 30)


def test_retries_reuse_the_retry_policy_only_for_the_outcomes_asked_and_at_most_max_attempts():
    s = Settings(max_attempts=3, retry_delay_s=60, retry_multiplier=2.0, retry_on=frozenset({BUSY, NO_ANSWER}))
    assert after_attempt(s, BUSY, 1, 1000.0) == (None, 1060.0)
    assert after_attempt(s, NO_ANSWER, 2, 1000.0) == (None, 1120.0)  # the second retry waits twice as long
    assert after_attempt(s, BUSY, 3, 1000.0) == (BUSY, None)  # attempts spent: done, busy
    assert after_attempt(s, FAILED, 1, 1000.0) == (FAILED, None)  # not asked to retry failed
    assert after_attempt(s, "answered", 1, 1000.0) == ("answered", None)


def test_settings_refuse_what_cannot_run():
    with pytest.raises(ValueError, match="rate"):
        Settings(rate=0)
    with pytest.raises(ValueError, match="max_concurrent"):
        Settings(max_concurrent=0)
    with pytest.raises(ValueError, match="hours"):
        Settings(windows=((600, 540),))
    with pytest.raises(ValueError, match="retry_on"):
        Settings(retry_on=frozenset({"answered"}))
    with pytest.raises(ValueError, match="retry"):
        Settings(retry_delay_s=-1)
    with pytest.raises(ValueError, match="HH:MM"):
        parse_hours("9-17")
    with pytest.raises(ValueError, match="days"):
        parse_days("mon-funday")
    assert parse_days("fri-mon") == {4, 5, 6, 0}
    s = Settings(rate=3, max_concurrent=7, retry_on=frozenset({REFUSED}))
    assert Settings.from_json(s.to_json()) == s


def test_the_current_rate_counts_the_last_ten_seconds():
    assert rate_over([90.0, 95.0, 99.0, 100.0, 101.0], 100.0) == 0.3
