"""Mutations of valid wire messages, shared by the property tests and the fuzz campaign.

One engine, two sources of choices: every mutation draws through a
:class:`Picker` -- :class:`RandomPicker` (a seeded ``random.Random``: the
fuzz campaign, ``bench/harness/fuzz.py``) or the property tests' Hypothesis
adapter (``tests/unit/sip_mutations.py``: every choice is a Hypothesis draw,
so failures shrink). The mutations:

* :func:`mutate_sip`: 1..``max_ops`` edits of a SIP/SDP/RTP message: flip a
  bit, insert bytes or nasty text, delete a run, replace one line's value
  (after its ``:`` or ``=``) by nasty text, replace an ASCII digit by a
  Unicode digit (``²``, Arabic-Indic, fullwidth...), truncate;
* :func:`mutate_line`: the same, confined to the line that starts with a
  given prefix (one header, one SDP line), the rest of the message intact;
* :func:`mutate_bytes`: byte edits of any message (flip, cut, insert, delete);
* :func:`mutate_json`: a decoded JSON message with 1..3 values replaced by
  arbitrary JSON or removed (the keys a parser looks up, the types it expects).

Invariants: a mutation never raises for any input (empty included); with a
:class:`RandomPicker` the output is a pure function of the seed and the input.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

UNICODE_DIGITS = "\u00b2\u00b3\u00b9\u0660\u0661\u0669\u06f1\u0966\u2460\uff11\U0001d7ce"
NASTY = ["\r", "\n", "\r\n", "\x00", "\t", " ", ":", ";", ",", "<", ">", '"', "\\", "/", "=", "@",
         "[", "]", "-1", "99999", "4294967296", "0", "", "\u2028", "\x85"] + list(UNICODE_DIGITS)


class Picker(Protocol):
    """Where a mutation's choices come from."""

    def integers(self, lo: int, hi: int) -> int: ...

    def sampled_from(self, seq: Sequence[T]) -> T: ...

    def binary(self, max_size: int, min_size: int = 0) -> bytes: ...

    def text(self) -> str:
        """Nasty text: up to 8 pieces, each one of :data:`NASTY` or a few arbitrary characters."""
        ...

    def json_value(self) -> Any:
        """An arbitrary JSON value (None, bool, int, float, str, small lists and objects)."""
        ...


class RandomPicker:
    """A :class:`Picker` over a seeded ``random.Random``."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integers(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def sampled_from(self, seq: Sequence[T]) -> T:
        return seq[self.rng.randrange(len(seq))]

    def binary(self, max_size: int, min_size: int = 0) -> bytes:
        return self.rng.randbytes(self.rng.randint(min_size, max_size))

    def _chars(self, n: int) -> str:
        r = self.rng
        out = []
        for _ in range(n):
            band = r.random()
            cp = (r.randint(0x20, 0x7E) if band < 0.5 else r.randint(0, 0x1F) if band < 0.6
                  else r.randint(0x80, 0x2FFF) if band < 0.9 else r.randint(0x10000, 0x1FFFF))
            out.append(chr(cp))
        return "".join(out)

    def text(self) -> str:
        r = self.rng
        return "".join(r.choice(NASTY) if r.random() < 0.5 else self._chars(r.randint(0, 8))
                       for _ in range(r.randint(0, 8)))

    def json_value(self, depth: int = 0) -> Any:
        r = self.rng
        k = r.randrange(8 if depth < 2 else 6)
        if k == 0:
            return None
        if k == 1:
            return r.random() < 0.5
        if k == 2:
            return r.choice((0, -1, 1, 2**31, 2**40, -2**40, r.randint(-1000, 1000)))
        if k == 3:
            return r.choice((0.5, -1.5, 1e300, 8000.0, r.uniform(-1e6, 1e6)))
        if k in (4, 5):
            return self.text()[:20]
        if k == 6:
            return [self.json_value(depth + 1) for _ in range(r.randint(0, 4))]
        return {self.text()[:8]: self.json_value(depth + 1) for _ in range(r.randint(0, 4))}


def _edit(data: bytearray, p: Picker, op: str) -> bytearray:
    n = len(data)
    if op == "flip" and n:
        i = p.integers(0, n - 1)
        data[i] ^= 1 << p.integers(0, 7)
    elif op == "insert":
        i = p.integers(0, n)
        data[i:i] = p.binary(8) if p.integers(0, 1) else p.text().encode("utf-8")
    elif op == "delete" and n:
        i = p.integers(0, n - 1)
        del data[i:i + p.integers(1, 16)]
    elif op == "value":
        lines = bytes(data).split(b"\r\n")
        i = p.integers(0, len(lines) - 1)
        key, sep, _ = lines[i].partition(b":" if b":" in lines[i] else b"=")
        lines[i] = key + (sep or b":") + p.text().encode("utf-8")
        data = bytearray(b"\r\n".join(lines))
    elif op == "digit":
        s = bytes(data).decode("utf-8", "replace")
        idx = [j for j, c in enumerate(s) if c in "0123456789"]
        if idx:
            j = p.sampled_from(idx)
            s = s[:j] + p.sampled_from(UNICODE_DIGITS) + s[j + 1:]
            data = bytearray(s.encode("utf-8"))
    elif op == "truncate" and n:
        data = data[: p.integers(0, n - 1)]
    return data


SIP_OPS = ("flip", "insert", "delete", "value", "digit", "truncate")


def mutate_sip(valid: bytes, p: Picker, max_ops: int = 4) -> bytes:
    """``valid`` with 1..max_ops random edits (see the module docstring)."""
    data = bytearray(valid)
    for _ in range(p.integers(1, max_ops)):
        data = _edit(data, p, p.sampled_from(SIP_OPS))
    return bytes(data)


def mutate_line(valid: bytes, prefix: bytes, p: Picker, max_ops: int = 3) -> bytes:
    """``valid`` with one CRLF-terminated line starting with ``prefix`` (a random one) mutated (no truncation
    of the message: the other lines stay intact); unchanged when no line starts so."""
    lines = valid.split(b"\r\n")
    which = [i for i, ln in enumerate(lines) if ln.startswith(prefix)]
    if not which:
        return valid
    i = p.sampled_from(which)
    data = bytearray(lines[i])
    for _ in range(p.integers(1, max_ops)):
        data = _edit(data, p, p.sampled_from(SIP_OPS[:5]))
    lines[i] = bytes(data)
    return b"\r\n".join(lines)


def mutate_bytes(valid: bytes, p: Picker, max_ops: int = 4) -> bytes:
    """``valid`` with bytes flipped, cut, inserted or deleted (1..max_ops edits)."""
    data = bytearray(valid)
    for _ in range(p.integers(1, max_ops)):
        op = p.sampled_from(("flip", "cut", "insert", "delete"))
        i = p.integers(0, max(0, len(data) - 1))
        if op == "flip" and data:
            data[i] ^= p.integers(1, 255)
        elif op == "cut":
            del data[i:]
        elif op == "insert":
            data[i:i] = p.binary(8, min_size=1)
        elif data:
            del data[i:i + p.integers(1, 8)]
    return bytes(data)


def json_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``obj`` (the root is ``()``)."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += json_paths(v, prefix + (i,))
    return out


def mutate_json(msg: Any, p: Picker, max_ops: int = 3) -> Any:
    """``msg`` (a decoded JSON value, modified in place and returned) with 1..max_ops values
    replaced by arbitrary JSON, or removed from their object."""
    for _ in range(p.integers(1, max_ops)):
        path = p.sampled_from(json_paths(msg))
        if not path:
            msg = p.json_value()
            continue
        parent = msg
        for k in path[:-1]:
            parent = parent[k]
        if isinstance(parent, dict) and p.integers(0, 1):
            del parent[path[-1]]
        else:
            parent[path[-1]] = p.json_value()
    return msg
