"""Speculative LLM start: its configuration, the hit rule and its counters (docs/LATENCY.md).

At a candidate end of turn the runner starts the model on the transcript so far and
buffers its output (:mod:`brisvox.agent.pipeline.speculation.speculator`); when the turn
really ends with the same words the buffer is released at once, so the model's time to
first token is paid while the turn machine still waits (silence timer, Smart Turn, the
finals gate). Otherwise the run is dropped and the turn runs as without speculation:
the conversation, the frames and the words on the wire are the same either way, only
the latency differs. The candidates are the turn driver's
(:mod:`brisvox.agent.pipeline.speculation.offers`).

Owns what both sides share:

* :class:`SpeculationConfig` (the agent file's ``[speculation]`` table; default OFF: every
  pipeline behaves exactly as before). ``max_buffered_events`` is validated to at most
  :data:`MAX_BUFFERED_EVENTS_LIMIT`, so the bound of the buffer is real.
* :func:`normalize`, the text half of the hit rule: lower case, letters and digits only,
  apostrophes dropped, so punctuation and spacing differences do not count. İ is i; a
  combining mark belongs to its letter for the Latin letters of a small compose table
  (NFC and NFD spellings are equal); a mark with no table entry is kept (it can only
  make a miss, never a wrong hit); accents are never folded (``şu`` is not ``su``).
  Symbols that change what a reply or a tool argument would be are kept, so they never
  compare equal to their absence: every currency sign (Unicode category Sc), ``% ‰ @ +
  = < > / & # * ~ ^ ° ± × ÷``, primes, and the joints inside a number or an address
  (``-50``, ``3.5``, ``10:30``, ``john.doe``).
* :func:`fingerprint`, the context half: the number of messages and per message the
  role, the text length, its last 16 characters and the tool call ids. O(messages), not
  O(text): a settled context only ever grows or has a message cut to a prefix, which the
  length and the tail see.
* :class:`SpeculationStats` (the runner's) and :class:`OfferStats` (the driver's), and
  :func:`snapshot`, their one dict for the call record, the actor's stats and the agent
  process's ``/metrics`` totals (:func:`add_totals`).
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from brisvox.agent.conversation.context import AssistantMessage, Context, ToolMessage

MAX_BUFFERED_EVENTS_LIMIT = 4096


@dataclass(frozen=True, slots=True)
class SpeculationConfig:
    """``enabled``: speculate at all. ``on_partial``: also at the VAD stop on the finals so
    far, else the latest interim (one STT round trip earlier than the final), held until
    the caller stayed silent and the text unchanged for ``partial_stable_for`` seconds
    (0: not held). ``max_per_turn``: requests one turn may cost. ``max_age``: a
    speculation older than this is never committed (and its helper ends by itself).
    ``max_buffered_events``: the helper's buffer; a full buffer back-pressures the
    provider stream (nothing is dropped)."""

    enabled: bool = False
    on_partial: bool = False
    partial_stable_for: float = 0.0
    max_per_turn: int = 3
    max_age: float = 5.0
    max_buffered_events: int = 256

    def __post_init__(self) -> None:
        if not 1 <= self.max_buffered_events <= MAX_BUFFERED_EVENTS_LIMIT:
            raise ValueError(f"max_buffered_events must be in 1..{MAX_BUFFERED_EVENTS_LIMIT}")
        if not self.max_age > 0:
            raise ValueError("max_age must be above 0")
        if self.max_per_turn < 1:
            raise ValueError("max_per_turn must be at least 1")
        if self.partial_stable_for < 0:
            raise ValueError("partial_stable_for must not be negative")

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> SpeculationConfig:
        """From the agent file's table; an unknown key or a bad value is a ValueError
        (``key: message``)."""
        names = {f.name for f in fields(cls)}
        for k in table:
            if k not in names:
                raise ValueError(f"{k}: unknown key")
        try:
            return cls(**dict(table))
        except (TypeError, ValueError) as e:
            key = next((n for n in names if n in str(e)), "speculation")
            raise ValueError(f"{key}: {e}") from None


# -- the hit rule: text ----------------------------------------------------------------

_APOSTROPHES = frozenset("'\u2018\u2019\u02bc")
_KEPT = frozenset("%\u2030@+=<>/&#*~^\u00b0\u00b1\u00d7\u00f7\u2032\u2033\u2034\u2035\u2036\u2037\u2057")
_JOINTS = frozenset(".,:-_")
_MINUS = frozenset("-\u2212")
# the Latin letters whose decomposed spelling equals the composed one: Turkish, the common
# French, Spanish and German accents (lower case: the text is lowered first)
_COMPOSED = "çşğöüâîûéèêëàäáíóúñïôùÿãõ"
COMPOSE: dict[tuple[str, str], str] = {
    (d[0], d[1]): c for c in _COMPOSED if len(d := unicodedata.normalize("NFD", c)) == 2
}
COMPOSE[("i", "\u0307")] = "i"  # İ decomposed and lowered: I + dot above


def normalize(text: str) -> str:
    """The text as the hit rule compares it (see the module docstring)."""
    s = text.replace("\u0130", "i").lower()
    chars: list[str] = []
    for c in s:  # compose the table's letter + mark pairs
        if chars and unicodedata.combining(c):
            got = COMPOSE.get((chars[-1], c))
            if got is not None:
                chars[-1] = got
                continue
        chars.append(c)
    out: list[str] = []
    n = len(chars)
    for i, c in enumerate(chars):
        if c.isalnum() or unicodedata.combining(c):
            out.append(c)
        elif c in _APOSTROPHES:
            continue
        elif c in _KEPT or unicodedata.category(c) == "Sc":
            out.append(c)
        elif c in _JOINTS or c in _MINUS:
            nxt = chars[i + 1] if i + 1 < n else ""
            if i > 0 and chars[i - 1].isalnum() and nxt.isalnum():
                out.append("-" if c in _MINUS else c)  # 3.5, 10:30, john.doe, well-known
            elif c in _MINUS and nxt.isdigit():
                out.append("-")  # a sign: -50
    return "".join(out)


# -- the hit rule: context ---------------------------------------------------------------

Fingerprint = tuple[Any, ...]


def fingerprint(ctx: Context) -> Fingerprint:
    """O(messages) identity of a settled context (see the module docstring)."""
    rows: list[Any] = [len(ctx)]
    ids: tuple[Any, ...]
    for m in ctx:
        if isinstance(m, AssistantMessage):
            text, ids = m.text, tuple(c.id for c in m.tool_calls)
        elif isinstance(m, ToolMessage):
            text, ids = m.content, (m.call_id, m.is_error)
        else:
            text, ids = m.content, ()
        rows.append((m.role, len(text), text[-16:], ids))
    return tuple(rows)


# -- counters ------------------------------------------------------------------------------


@dataclass(slots=True)
class SpeculationStats:
    """The runner's. Decided speculations: hits, misses (the text changed),
    context_changes and expired; superseded (a newer candidate), withdrawn (the caller
    resumed) and abandoned (a new turn, barge-in, hang-up, another epoch) were never
    decided. kept: a candidate equal (normalised) to the live speculation's kept it (no
    new request; the turn driver never repeats a standing candidate, so behind it this
    stays 0). skipped_busy: the previous turn's round still ran; skipped_unsafe: the
    context could not be settled (a round task that did not end). failures: the
    speculative stream failed (a committed one is the round's failure: no fresh request).
    wasted_*: tokens of discarded speculations (output: provider-reported, else 4 bytes
    per token). head_start_ms: over the hits, how long before the turn end the request
    left."""

    started: int = 0
    hits: int = 0
    misses: int = 0
    context_changes: int = 0
    expired: int = 0
    superseded: int = 0
    withdrawn: int = 0
    abandoned: int = 0
    kept: int = 0
    skipped_busy: int = 0
    skipped_unsafe: int = 0
    skipped_flow: int = 0
    failures: int = 0
    tool_phases: int = 0
    held_side_effects: int = 0
    wasted_output_tokens: int = 0
    wasted_input_tokens: int = 0
    head_start_ms: int = 0

    def decided(self) -> int:
        return self.hits + self.misses + self.context_changes + self.expired

    def hit_rate(self) -> float:
        d = self.decided()
        return round(self.hits / d, 4) if d else 0.0


@dataclass(slots=True)
class OfferStats:
    """The turn driver's: candidates offered, withdrawn (a resume, an empty gate release),
    and refused by ``max_per_turn``."""

    offered: int = 0
    withdrawn: int = 0
    capped: int = 0


def snapshot(st: SpeculationStats, offers: OfferStats | None = None) -> dict[str, float]:
    d: dict[str, float] = {f.name: getattr(st, f.name) for f in fields(st)}
    d["hit_rate"] = st.hit_rate()
    if offers is not None:
        d["offered"] = offers.offered
        d["offers_withdrawn"] = offers.withdrawn
        d["offers_capped"] = offers.capped
    return d


def add_totals(totals: dict[str, Any], snap: Mapping[str, Any], prefix: str = "") -> None:
    """Add one call's :func:`snapshot` into process totals under ``prefix`` (the agent
    process's stats, so ``/metrics``); ``hit_rate`` is recomputed over the totals."""
    for k, v in snap.items():
        if k != "hit_rate" and isinstance(v, int | float) and not isinstance(v, bool):
            totals[prefix + k] = totals.get(prefix + k, 0) + v
    decided = sum(totals.get(prefix + k, 0) for k in ("hits", "misses", "context_changes", "expired"))
    totals[prefix + "hit_rate"] = round(totals.get(prefix + "hits", 0) / decided, 4) if decided else 0.0
