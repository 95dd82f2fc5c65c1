"""Hypothesis strategies over the shared mutation engine (``bench/harness/mutations.py``).

:class:`DrawPicker` makes every choice of a mutation a Hypothesis draw (so a
failing example shrinks); :func:`mutated` is a valid SIP/SDP/RTP message
with 1..max_ops edits, :func:`json_mutated` / :func:`byte_mutated` a valid
JSON text message with values replaced or removed / bytes edited. The same
mutations feed the fuzz campaign on the running daemon (``python -m bench
fuzz``) from a seeded ``random.Random``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import orjson
from hypothesis import strategies as st

from bench.harness.mutations import NASTY, UNICODE_DIGITS, mutate_bytes, mutate_json, mutate_sip

__all__ = ["NASTY", "UNICODE_DIGITS", "DrawPicker", "byte_mutated", "json_mutated", "mutated", "text"]

T = TypeVar("T")

text = st.lists(st.one_of(st.sampled_from(NASTY), st.text(max_size=8)), max_size=8).map("".join)
JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False)
                    | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)


class DrawPicker:
    """A :class:`bench.harness.mutations.Picker` whose choices are Hypothesis draws."""

    def __init__(self, draw: st.DrawFn) -> None:
        self.draw = draw

    def integers(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def sampled_from(self, seq: Sequence[T]) -> T:
        return self.draw(st.sampled_from(seq))

    def binary(self, max_size: int, min_size: int = 0) -> bytes:
        return self.draw(st.binary(min_size=min_size, max_size=max_size))

    def text(self) -> str:
        return self.draw(text)

    def json_value(self) -> Any:
        return self.draw(JSON)


@st.composite
def mutated(draw: st.DrawFn, valid: bytes, max_ops: int = 4) -> bytes:
    """``valid`` with 1..max_ops random edits."""
    return mutate_sip(valid, DrawPicker(draw), max_ops)


@st.composite
def json_mutated(draw: st.DrawFn, valid: list[str]) -> bytes:
    """A valid message with up to three values replaced by arbitrary JSON or removed."""
    p = DrawPicker(draw)
    return orjson.dumps(mutate_json(orjson.loads(p.sampled_from(valid)), p))


@st.composite
def byte_mutated(draw: st.DrawFn, valid: list[str]) -> bytes:
    """A valid message with bytes flipped, cut, inserted or deleted."""
    p = DrawPicker(draw)
    return mutate_bytes(p.sampled_from(valid).encode(), p)
