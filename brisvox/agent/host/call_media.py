"""What a call's record says of its media state (the gateway's ``CallMedia`` frames).

Owns :class:`MediaLog`, held by the call actor: the media state the call started in
(``CallStart.media``), each change after it with its time on the call clock, how often
and how long the caller held the call, and a dialled call's signalling times
(``CallMedia.dial``: ``ringing_at_ms``, ``progress_at_ms``, ``answered_at_ms``, in ms from
its first INVITE). Its :meth:`MediaLog.record` is the call record's ``media`` section.

Invariants: a state outside ``ipc.frames.MEDIA_STATES`` is refused (counted, never
recorded); the same state twice is one state; at most :data:`MAX_CHANGES` changes are
kept (the rest counted in ``changes_dropped``), the totals cover them all; the dial times
are small non-negative integers or left out.
"""

from __future__ import annotations

from typing import Any

from ipc.frames import MEDIA_ANSWERED, MEDIA_HELD, MEDIA_STATES

MAX_CHANGES = 32
DIAL_KEYS = ("ringing_at_ms", "progress_at_ms", "answered_at_ms")
MAX_DIAL_MS = 24 * 3600 * 1000


class MediaLog:
    """See the module docstring. ``started_at``: the call clock when the actor was made."""

    __slots__ = ("state", "initial", "started_at", "changes", "changes_dropped", "refused", "holds",
                 "held_s", "_held_since", "dial")

    def __init__(self, initial: str, started_at: float) -> None:
        self.refused = 0
        if initial not in MEDIA_STATES:
            self.refused += 1
            initial = MEDIA_ANSWERED
        self.state = self.initial = initial
        self.started_at = started_at
        self.changes: list[tuple[str, float]] = []
        self.changes_dropped = 0
        self.holds = 0
        self.held_s = 0.0
        self._held_since: float | None = started_at if initial == MEDIA_HELD else None
        self.dial: dict[str, int] = {}

    @property
    def converses(self) -> bool:
        """The call is answered: the caller's audio may open turns, the bot may speak."""
        return self.state == MEDIA_ANSWERED

    def note(self, state: str, now: float, dial: dict[str, Any] | None = None) -> bool:
        """The gateway says the media state is ``state``; True when that changed it."""
        if dial:
            for k in DIAL_KEYS:
                v = dial.get(k)
                if type(v) is int and 0 <= v <= MAX_DIAL_MS:
                    self.dial[k] = v
        if state not in MEDIA_STATES:
            self.refused += 1
            return False
        if state == self.state:
            return False
        if state == MEDIA_HELD:
            self.holds += 1
            self._held_since = now
        elif self._held_since is not None:
            self.held_s += now - self._held_since
            self._held_since = None
        self.state = state
        if len(self.changes) < MAX_CHANGES:
            self.changes.append((state, now))
        else:
            self.changes_dropped += 1
        return True

    def record(self, now: float) -> dict[str, Any]:
        """The call record's ``media`` section (times in seconds from the actor's start)."""
        held = self.held_s + (now - self._held_since if self._held_since is not None else 0.0)
        out: dict[str, Any] = {
            "initial": self.initial,
            "state": self.state,
            "changes": [{"state": s, "at_s": round(t - self.started_at, 3)} for s, t in self.changes],
            "holds": self.holds,
            "held_s": round(held, 3),
        }
        if self.changes_dropped:
            out["changes_dropped"] = self.changes_dropped
        if self.refused:
            out["refused"] = self.refused
        if self.dial:
            out["dial"] = {k: self.dial[k] for k in DIAL_KEYS if k in self.dial}
        return out
