"""Which rows of a campaign to dial now: a pure planner that returns actions (no clock read, no I/O).

:func:`plan` takes the time (``now``: epoch seconds, the wall clock: calling
hours are wall-clock hours), the campaign's :class:`Settings`, how many of its
calls are in flight, when its last attempt started, and its due rows (in the
order they should go); it returns a :class:`Plan`: the rows to dial now, the
rows to defer to the opening of their calling hours, and when to plan again.
:func:`after_attempt` decides what an attempt's outcome makes of its row: done
with that outcome, or a retry at a time.

Invariants:

* Rate: two dials of a campaign start at least ``1 / rate`` seconds apart
  (``last_started`` comes from the store, so a restart keeps the spacing), so
  no half-open window of one second holds more than ``ceil(rate)`` starts.
* Concurrency: ``in_flight + len(dial) <= max_concurrent``.
* Calling hours: a row is dialled only while the wall clock of its own time
  zone (``zoneinfo``: DST included) is inside one of ``windows`` on one of
  ``days``; a row outside them is deferred to the next opening (a start time
  that falls in a DST gap opens at the instant the gap ends; a repeated hour
  opens at its first occurrence).
* Retries: the delay before retry ``n`` is the one retry policy's
  (:class:`brisvox.runtime.retry.RetryPolicy`, no jitter: ``retry_delay_s``
  times ``retry_multiplier`` ** (n - 1)); at most ``max_attempts`` attempts a
  row; only outcomes in ``retry_on`` (a subset of
  :data:`~.outcomes.RETRYABLE`) are retried.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from datetime import time as dtime
from functools import lru_cache
from typing import Any
from zoneinfo import ZoneInfo

from brisvox.outbound.campaign.outcomes import DEFAULT_RETRY_ON, RETRYABLE
from brisvox.runtime.retry import RetryPolicy

VIAS = ("sip", "twilio")  # how a campaign's rows are dialled (the gateway dial command's via)
DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MAX_RATE = 100.0
MAX_CONCURRENT = 1000
MAX_ATTEMPTS = 10
RETRY_CAP_S = 7 * 86400.0
_LOOKAHEAD_DAYS = 9


@dataclass(frozen=True, slots=True)
class Settings:
    """A campaign's dialling settings (validated here; stored with the campaign).

    ``windows``: calling hours as (start, end) minutes after local midnight, start < end,
    sorted, not overlapping (e.g. (540, 1200): 09:00-20:00). ``days``: weekday numbers
    (0: Monday). ``ring_timeout_s``: 0 for the gateway's ``[sip] dial_ring_timeout_s`` (via twilio:
    Twilio's 60 s). ``via``: ``sip`` (``[campaigns] trunk``) or ``twilio`` (the REST API's calls create,
    its answer awaited: ``[websocket] twilio_*``, docs/OUTBOUND.md)."""

    rate: float = 1.0
    max_concurrent: int = 10
    windows: tuple[tuple[int, int], ...] = ((9 * 60, 20 * 60),)
    days: frozenset[int] = field(default_factory=lambda: frozenset(range(7)))
    max_attempts: int = 3
    retry_delay_s: float = 600.0
    retry_multiplier: float = 1.0
    retry_on: frozenset[str] = DEFAULT_RETRY_ON
    ring_timeout_s: float = 0.0
    via: str = "sip"

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate) and 0 < self.rate <= MAX_RATE):
            raise ValueError(f"rate: calls per second, more than 0 and at most {MAX_RATE:g}")
        if not 1 <= self.max_concurrent <= MAX_CONCURRENT:
            raise ValueError(f"max_concurrent: 1 to {MAX_CONCURRENT}")
        if not self.windows:
            raise ValueError("hours: at least one window")
        prev_end = -1
        for s, e in self.windows:
            if not (0 <= s < e <= 24 * 60) or s < prev_end:
                raise ValueError("hours: HH:MM-HH:MM windows, each start before its end, in order, not overlapping")
            prev_end = e
        if not self.days or not self.days <= set(range(7)):
            raise ValueError("days: at least one of " + ",".join(DAYS))
        if not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            raise ValueError(f"max_attempts: 1 to {MAX_ATTEMPTS}")
        if not self.retry_on <= RETRYABLE:
            raise ValueError(f"retry_on: a subset of {', '.join(sorted(RETRYABLE))}")
        if not (math.isfinite(self.ring_timeout_s) and 0 <= self.ring_timeout_s <= 600):
            raise ValueError("ring_timeout_s: 0 (the gateway's) to 600")
        if self.via not in VIAS:
            raise ValueError(f"via: one of {', '.join(VIAS)}")
        self.policy  # noqa: B018  (validates retry_delay_s and retry_multiplier)

    @property
    def policy(self) -> RetryPolicy:
        try:
            return RetryPolicy(base=self.retry_delay_s, multiplier=self.retry_multiplier,
                               cap=max(RETRY_CAP_S, self.retry_delay_s), max_attempts=self.max_attempts)
        except ValueError as e:
            raise ValueError(f"retry: {e}") from None

    def to_json(self) -> dict[str, Any]:
        return {"rate": self.rate, "max_concurrent": self.max_concurrent, "windows": [list(w) for w in self.windows],
                "days": sorted(self.days), "max_attempts": self.max_attempts, "retry_delay_s": self.retry_delay_s,
                "retry_multiplier": self.retry_multiplier, "retry_on": sorted(self.retry_on),
                "ring_timeout_s": self.ring_timeout_s, "via": self.via}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Settings:
        return cls(rate=float(d["rate"]), max_concurrent=int(d["max_concurrent"]),
                   windows=tuple((int(w[0]), int(w[1])) for w in d["windows"]),
                   days=frozenset(int(x) for x in d["days"]), max_attempts=int(d["max_attempts"]),
                   retry_delay_s=float(d["retry_delay_s"]), retry_multiplier=float(d["retry_multiplier"]),
                   retry_on=frozenset(str(x) for x in d["retry_on"]), ring_timeout_s=float(d["ring_timeout_s"]),
                   via=str(d.get("via", "sip")))  # a campaign stored before via: dialled over SIP


def parse_hours(text: str) -> tuple[tuple[int, int], ...]:
    """``"09:00-12:00,14:00-20:00"`` as minutes after midnight (``24:00`` ends a day); ValueError when malformed."""
    out = []
    for part in text.split(","):
        try:
            a, b = part.strip().split("-")
            out.append((_minutes(a), _minutes(b)))
        except ValueError:
            raise ValueError(f"hours: {part.strip()[:20]!r} is not HH:MM-HH:MM") from None
    return tuple(sorted(out))


def _minutes(hhmm: str) -> int:
    h, m = hhmm.strip().split(":")
    if not (h.isdigit() and m.isdigit() and len(m) == 2 and 1 <= len(h) <= 2):
        raise ValueError(hhmm)
    v = int(h) * 60 + int(m)
    if int(m) > 59 or v > 24 * 60:
        raise ValueError(hhmm)
    return v


def parse_days(text: str) -> frozenset[int]:
    """``"mon-fri"``, ``"mon,wed,sat"`` or ``"all"`` as weekday numbers; ValueError when malformed."""
    t = text.strip().lower()
    if t == "all":
        return frozenset(range(7))
    out: set[int] = set()
    for part in t.split(","):
        ends = part.strip().split("-")
        if len(ends) > 2 or any(x.strip() not in DAYS for x in ends):
            raise ValueError(f"days: {part.strip()[:20]!r} is not a day ({','.join(DAYS)}) or a range mon-fri")
        a, b = DAYS.index(ends[0].strip()), DAYS.index(ends[-1].strip())
        out.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(out)


@lru_cache(maxsize=512)
def _zone(name: str) -> ZoneInfo:
    return ZoneInfo(name)


def in_hours(s: Settings, tz: str, now: float) -> bool:
    """Is ``now`` inside ``s``'s calling hours on the wall clock of ``tz``?"""
    local = datetime.fromtimestamp(now, _zone(tz))
    if local.weekday() not in s.days:
        return False
    m = local.hour * 60 + local.minute + local.second / 60.0
    return any(a <= m < b for a, b in s.windows)


def _at(day: date, minutes: int, zone: ZoneInfo) -> float:
    if minutes >= 24 * 60:
        return datetime.combine(day + timedelta(days=1), dtime(0, 0), tzinfo=zone).timestamp()
    # fold 0: a time in a DST gap maps to the instant after the gap; a repeated one to its first occurrence
    return datetime.combine(day, dtime(minutes // 60, minutes % 60), tzinfo=zone).timestamp()


def next_opening(s: Settings, tz: str, now: float) -> float:
    """The first instant at or after ``now`` inside ``s``'s calling hours in ``tz``."""
    if in_hours(s, tz, now):
        return now
    zone = _zone(tz)
    today = datetime.fromtimestamp(now, zone).date()
    for k in range(_LOOKAHEAD_DAYS):
        day = today + timedelta(days=k)
        if day.weekday() not in s.days:
            continue
        for a, b in s.windows:
            start, end = _at(day, a, zone), _at(day, b, zone)
            if end > now and end > start:
                t = max(start, now)
                if in_hours(s, tz, t):
                    return t
    raise ValueError("no calling hours in the next week")  # unreachable for valid Settings


@dataclass(frozen=True, slots=True)
class Due:
    """A row that may be dialled: its id and time zone."""

    row_id: int
    timezone: str


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do now: ``dial`` these rows (in order), ``defer`` these (row id, until) to their
    calling hours, and plan again at ``wake_at`` at the latest (None: when something changes)."""

    dial: tuple[int, ...] = ()
    defer: tuple[tuple[int, float], ...] = ()
    wake_at: float | None = None


def next_start(s: Settings, last_started: float | None) -> float:
    """The earliest time the next dial may start (the rate)."""
    return -math.inf if last_started is None else last_started + 1.0 / s.rate


def plan(now: float, s: Settings, *, in_flight: int, last_started: float | None, due: Iterable[Due]) -> Plan:
    """The actions for a running campaign (see the module docstring)."""
    dial: list[int] = []
    defer: list[tuple[int, float]] = []
    slots = s.max_concurrent - in_flight
    allowed_at = next_start(s, last_started)
    wake: float | None = None
    for row in due:
        if not in_hours(s, row.timezone, now):
            defer.append((row.row_id, next_opening(s, row.timezone, now)))
            continue
        if slots <= 0:
            continue  # a call ending wakes the runner
        if now < allowed_at:
            wake = allowed_at
            continue
        dial.append(row.row_id)
        slots -= 1
        allowed_at = now + 1.0 / s.rate
    return Plan(tuple(dial), tuple(defer), wake)


def after_attempt(s: Settings, outcome: str, attempts: int, now: float) -> tuple[str | None, float | None]:
    """What an attempt's ``outcome`` makes of its row, ``attempts`` made so far (this one
    included): (final outcome, None) or (None, when to retry)."""
    if outcome in s.retry_on and s.policy.may_attempt(attempts):
        return None, now + s.policy.backoff(attempts)
    return outcome, None


def rate_over(started: Sequence[float], now: float, window_s: float = 10.0) -> float:
    """Attempts per second over the last ``window_s`` seconds (``started``: their start times)."""
    return sum(1 for t in started if now - window_s < t <= now) / window_s
