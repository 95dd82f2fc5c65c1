"""The keypad aggregator: the caller's key presses, one by one, into keypad entries.

A pure state machine: ``handle(input)`` returns a list of actions and
performs no I/O; the TurnDriver owns one per call, feeds it every DtmfFrame
(:class:`Key`) and, when its ``deadline`` passes, a :class:`Tick`, and turns
each :class:`Entry` into a user turn of its own (a KeypadEntry frame: see
``turn_driver.py``).

An entry is the keys pressed since the previous entry, ended by exactly one of:

* the terminator (``terminator``, "#" by default; "" for none): the entry at
  once, WITHOUT the terminator (``1 2 3 #`` is "123"); a terminator alone is
  the entry "#" itself (a "press # to skip" prompt hears it);
* ``max_digits`` keys (0: no length end): the entry at once, with the key
  that filled it;
* the inter-digit timeout (``inter_digit_timeout`` seconds after the newest
  digit taken, on the call clock): the digits so far.

Every other key (``0-9``, ``*``, ``A-D``, ``#`` when it is not the terminator) is a
digit of the entry. Keys are upper-cased.

Invariants: an entry is never empty and holds at most ``limit`` digits (the
aggregator holds no more than that, whatever comes); a key beyond ``limit``
(a flood without a terminator) is refused with ``Refused(digit, "overflow")``,
counted, and is part of no entry (the timeout still runs from the newest digit
taken); a key that is not a DTMF key is refused ``"invalid"``; ``deadline`` is
set exactly while digits are pending and None otherwise; a Tick before it does
nothing; after :class:`Close` every key is refused ``"closed"`` and the pending
digits are dropped and counted as ``abandoned``. Each key is exactly one of: a
digit of one entry, the terminator that ended one, refused, or abandoned.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

KEYS = "0123456789*#ABCD"
LIMIT = 32  # the most digits one entry holds (KeypadConfig.limit's ceiling)


@dataclass(frozen=True, slots=True)
class KeypadConfig:
    """The agent file's ``[dtmf]`` table (docs/PROVIDERS.md); ``text`` is the user turn
    the LLM reads: ``{digits}`` is the entry ("123"), ``{keys}`` the keys spaced ("1 2 3")."""

    inter_digit_timeout: float = 2.0
    terminator: str = "#"
    max_digits: int = 0
    text: str = "The caller pressed {keys} on the keypad."
    limit: int = LIMIT

    def __post_init__(self) -> None:
        if not 0.05 <= self.inter_digit_timeout <= 30.0:
            raise ValueError("inter_digit_timeout: between 0.05 and 30 seconds")
        if self.terminator and (len(self.terminator) != 1 or self.terminator.upper() not in KEYS):
            raise ValueError(f"terminator: one key of {KEYS} or empty, not {self.terminator!r}")
        if not 1 <= self.limit <= LIMIT:
            raise ValueError(f"limit: between 1 and {LIMIT}")
        if not 0 <= self.max_digits <= self.limit:
            raise ValueError(f"max_digits: between 0 (no length end) and {self.limit}")
        try:
            shows_digits = self.render("1") != self.render("2")
        except (KeyError, IndexError, AttributeError, ValueError) as e:
            raise ValueError(f"text: a format string with {{digits}} or {{keys}} only ({e})") from None
        if not shows_digits:
            raise ValueError("text: must show the entry ({digits} or {keys})")

    def render(self, digits: str) -> str:
        """The user turn of the entry ``digits``."""
        return self.text.format(digits=digits, keys=" ".join(digits))

    @classmethod
    def from_table(cls, table: dict[str, object]) -> KeypadConfig:
        """From an agent file's ``[dtmf]`` table (unknown keys are the schema's to refuse)."""
        names = {f.name for f in fields(cls)} - {"limit"}
        return cls(**{k: v for k, v in table.items() if k in names})  # type: ignore[arg-type]


# --- inputs ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Key:
    digit: str
    now: float


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


@dataclass(frozen=True, slots=True)
class Close:
    """The call ended: pending keys are abandoned."""


KeypadInput = Key | Tick | Close


# --- actions ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """A keypad entry: ``digits`` (never empty), ended by ``reason`` ("terminator",
    "max_digits" or "timeout")."""

    digits: str
    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """A key not taken: ``why`` is "overflow" (the entry holds ``limit`` digits),
    "invalid" (not a DTMF key) or "closed"."""

    digit: str
    why: str


KeypadAction = Entry | Refused


@dataclass(slots=True)
class KeypadStats:
    keys: int = 0
    entries: int = 0
    by_terminator: int = 0
    by_max_digits: int = 0
    by_timeout: int = 0
    overflow: int = 0
    invalid: int = 0
    closed: int = 0
    abandoned: int = 0
    longest: int = 0


class KeypadAggregator:
    """See the module docstring."""

    __slots__ = ("cfg", "deadline", "st", "_digits", "_closed")

    def __init__(self, cfg: KeypadConfig | None = None) -> None:
        self.cfg = cfg or KeypadConfig()
        self.deadline: float | None = None
        self.st = KeypadStats()
        self._digits: list[str] = []
        self._closed = False

    @property
    def refused(self) -> int:
        """Keys refused so far, for any reason."""
        return self.st.overflow + self.st.invalid + self.st.closed

    @property
    def pending(self) -> str:
        """The keys of the entry not yet ended."""
        return "".join(self._digits)

    def handle(self, inp: KeypadInput) -> list[KeypadAction]:
        if isinstance(inp, Key):
            return self._key(inp.digit.upper(), inp.now)
        if isinstance(inp, Tick):
            if self.deadline is None or inp.now < self.deadline:
                return []
            return self._end("timeout")
        if isinstance(inp, Close):
            self._closed = True
            self.st.abandoned += len(self._digits)
            self._digits = []
            self.deadline = None
            return []
        raise TypeError(f"unknown input {inp!r}")

    def _key(self, d: str, now: float) -> list[KeypadAction]:
        st = self.st
        st.keys += 1
        if self._closed:
            st.closed += 1
            return [Refused(d[:8], "closed")]
        if len(d) != 1 or d not in KEYS:
            st.invalid += 1
            return [Refused(d[:8], "invalid")]
        cfg = self.cfg
        if cfg.terminator and d == cfg.terminator.upper():
            if not self._digits:
                self._digits.append(d)  # a terminator alone is the entry
            return self._end("terminator")
        if len(self._digits) >= cfg.limit:
            st.overflow += 1
            return [Refused(d, "overflow")]
        self._digits.append(d)
        if cfg.max_digits and len(self._digits) >= cfg.max_digits:
            return self._end("max_digits")
        self.deadline = now + cfg.inter_digit_timeout
        return []

    def _end(self, reason: str) -> list[KeypadAction]:
        digits = "".join(self._digits)
        self._digits = []
        self.deadline = None
        st = self.st
        st.entries += 1
        st.longest = max(st.longest, len(digits))
        if reason == "terminator":
            st.by_terminator += 1
        elif reason == "max_digits":
            st.by_max_digits += 1
        else:
            st.by_timeout += 1
        return [Entry(digits, reason)]

    def stats(self) -> dict[str, int]:
        return {f"keypad_{k}": getattr(self.st, k) for k in self.st.__slots__}
