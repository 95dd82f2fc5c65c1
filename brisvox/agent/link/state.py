"""The agent link's state, pure (no I/O, no loop): phases, waiting calls, narrowing, rates.

Owns:

* :class:`Phase` and :data:`TRANSITIONS`: OPENING -> UP (accepted) | CLOSED (refused,
  unreachable); UP -> DOWN (the socket dropped) | CLOSED (hang-up); DOWN -> UP (a
  re-dial was accepted) | GONE (every re-dial failed) | CLOSED. GONE and CLOSED are
  final. :meth:`LinkState.go` refuses any other move (a bug, raised).
* The waiting calls (:class:`Waiting`): at most ``MAX_WAITING`` ids at once; an id
  leaves the table exactly once (settled, given up or failed) and a given-up id is
  remembered (the last 256) so its late result is told apart from an unknown id.
* The offered remote tools: the declared ones (after the handshake or a resume)
  intersected with the last ``tools.set``; :meth:`LinkState.offered` is what the
  model sees and what a call may reach.
* :class:`TokenBucket`: ``rate`` tokens a second up to ``burst``; one per command.
* :class:`LinkStats`: counters (the call record's ``agent_link``), plain ints.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from brisvox.agent.link.messages import COMMAND_BURST, COMMAND_RATE, MAX_WAITING


class Phase(enum.Enum):
    OPENING = "opening"
    UP = "up"
    DOWN = "down"
    GONE = "gone"
    CLOSED = "closed"


TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.OPENING: frozenset({Phase.UP, Phase.CLOSED}),
    Phase.UP: frozenset({Phase.DOWN, Phase.CLOSED}),
    Phase.DOWN: frozenset({Phase.UP, Phase.GONE, Phase.CLOSED}),
    Phase.GONE: frozenset({Phase.CLOSED}),
    Phase.CLOSED: frozenset(),
}


@dataclass(slots=True)
class LinkStats:
    dials: int = 0
    redials: int = 0
    resumes: int = 0
    calls: int = 0
    results: int = 0
    failed_fast: int = 0  # down, or 32 waiting: tool_failed at once
    cancels: int = 0
    late_results: int = 0
    unknown_ids: int = 0
    unknown_outcomes: int = 0
    errors_sent: int = 0
    bad_frames: int = 0
    commands: int = 0
    commands_refused: int = 0
    events_sent: int = 0
    events_dropped: int = 0
    narrowed: int = 0
    calls_dialled: int = 0  # the service's dial commands sent to the gateway
    dials_refused: int = 0  # ... refused here (allow_dial, dial_targets)

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}


@dataclass(slots=True)
class Pending:
    """One waiting tool call; ``box`` is the client's future (opaque here)."""

    rid: str
    tool: str
    side_effect: bool
    box: Any = None


class Waiting:
    """The ids waiting for a result (see the module docstring)."""

    __slots__ = ("_live", "_gone", "_next", "limit")

    def __init__(self, limit: int = MAX_WAITING) -> None:
        self._live: dict[str, Pending] = {}
        self._gone: OrderedDict[str, None] = OrderedDict()
        self._next = 0
        self.limit = limit

    def __len__(self) -> int:
        return len(self._live)

    def full(self) -> bool:
        return len(self._live) >= self.limit

    def add(self, tool: str, side_effect: bool, box: Any = None) -> Pending:
        if self.full():
            raise OverflowError("too many waiting calls")
        self._next += 1
        p = Pending(f"r{self._next}", tool, side_effect, box)
        self._live[p.rid] = p
        return p

    def take(self, rid: str) -> Pending | None:
        """The waiting call ``rid`` answered (None: not waiting)."""
        return self._live.pop(rid, None)

    def give_up(self, rid: str) -> Pending | None:
        """``rid`` will not be read (cancelled, waited out): its result is late."""
        p = self._live.pop(rid, None)
        if p is not None:
            self._gone[rid] = None
            while len(self._gone) > 256:
                self._gone.popitem(last=False)
        return p

    def was_given_up(self, rid: str) -> bool:
        return rid in self._gone

    def drain(self) -> list[Pending]:
        """Every waiting call, removed (the link went down or closed)."""
        out = list(self._live.values())
        for p in out:
            self.give_up(p.rid)
        return out


@dataclass(slots=True)
class TokenBucket:
    rate: float = COMMAND_RATE
    burst: int = COMMAND_BURST
    tokens: float = float(COMMAND_BURST)
    at: float | None = None

    def take(self, now: float) -> bool:
        if self.at is not None:
            self.tokens = min(float(self.burst), self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(slots=True)
class LinkState:
    phase: Phase = Phase.OPENING
    declared: frozenset[str] = frozenset()  # registered remote tools the service declared last
    narrow: frozenset[str] | None = None  # the last tools.set (None: none)
    subscribed: frozenset[str] = frozenset()
    stats: LinkStats = field(default_factory=LinkStats)
    history: list[Phase] = field(default_factory=list)

    def go(self, to: Phase) -> bool:
        """Move to ``to``; False if already there; a move the table refuses raises."""
        if to is self.phase:
            return False
        if to not in TRANSITIONS[self.phase]:
            raise RuntimeError(f"agent link: {self.phase.value} -> {to.value} is not a transition")
        self.history.append(self.phase)
        self.phase = to
        return True

    @property
    def up(self) -> bool:
        return self.phase is Phase.UP

    @property
    def final(self) -> bool:
        return self.phase in (Phase.GONE, Phase.CLOSED)

    def offered(self) -> frozenset[str]:
        return self.declared if self.narrow is None else self.declared & self.narrow

    def set_declared(self, names: Iterable[str]) -> None:
        self.declared = frozenset(names)

    def set_narrow(self, names: Iterable[str]) -> list[str]:
        """Apply a ``tools.set``; returns the names refused (not declared), applying the rest."""
        names = list(names)
        bad = [n for n in names if n not in self.declared]
        self.narrow = frozenset(n for n in names if n in self.declared)
        self.stats.narrowed += 1
        return bad
