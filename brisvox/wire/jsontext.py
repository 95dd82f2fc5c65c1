"""What the two JSON media-stream protocols (``twilio``, ``native``) share.

Owns the compact JSON text the builders emit (no spaces, UTF-8, the same
bytes ``orjson.dumps`` gives for the strings, ints and objects these messages
hold), the JSON quoting of one string for the byte templates, the bounds
on caller-supplied call parameters (Twilio ``customParameters``, native
``params``, a signed token's ``params``, the SIP From/To URIs) and which
parameters name the caller and the called number (:func:`caller_called`); one
carrier id or number kept or dropped, counted, by :func:`kept_text`.

Invariants: :func:`quote` is the standard library's C string escaper
(``"``, ``\\`` and control characters escaped, the rest kept as UTF-8), so a
template with quoted strings is valid JSON whatever the strings hold;
:func:`checked_params` keeps at most ``MAX_PARAMS`` entries, each a name of 1
to ``MAX_PARAM_NAME`` characters and a value of at most ``MAX_PARAM_VALUE``
(a string, or a number or boolean as its JSON text), neither holding a
control character; every other entry is dropped whole (never cut) and
counted, so a bad parameter never refuses the call. :func:`ascii_int` reads a
number only from an int or ASCII digits (``str.isdigit`` is true for "²",
which ``int`` refuses, and for "١٦", which ``int`` reads as 16).
"""

from __future__ import annotations

import math
import re
from json import JSONEncoder
from json.encoder import encode_basestring
from typing import Any

MAX_PARAMS = 32
MAX_PARAM_NAME = 64
MAX_PARAM_VALUE = 256
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_ASCII_DIGITS = re.compile("[0-9]+", re.ASCII)
# the parameters that name the numbers, first match wins (names compared case-insensitively):
# Twilio's TwiML passes its own From/To as <Parameter name="From" value="{{From}}"/>
CALLER_KEYS = ("caller", "from")
CALLED_KEYS = ("called", "to")

# one encoder for the process: json.dumps with non-default options builds one per call
_ENCODER = JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False)


def text(obj: Any) -> str:
    """Compact JSON text of ``obj`` (for a message a client library sends as a str)."""
    return _ENCODER.encode(obj)


def data(obj: Any) -> bytes:
    """Compact JSON of ``obj`` as UTF-8 bytes (for a message the gateway writes itself)."""
    return _ENCODER.encode(obj).encode()


def quote(s: str) -> bytes:
    """``s`` as a JSON string literal, UTF-8, quotes included."""
    return encode_basestring(s).encode()


def ascii_int(v: Any, max_digits: int = 9) -> int | None:
    """``v`` as an int: an int itself (not a bool), or a string of 1 to ``max_digits`` ASCII
    digits; None for anything else (a Unicode digit, a sign, a space, a float, ...)."""
    if type(v) is int:
        return v
    if type(v) is str and 0 < len(v) <= max_digits and _ASCII_DIGITS.fullmatch(v):
        return int(v)
    return None


def param_text(v: Any, limit: int = MAX_PARAM_VALUE) -> str | None:
    """``v`` as a parameter value (see module invariants), or None when it is not one."""
    t = type(v)
    if t is str:
        s = v
    elif t is bool:
        s = "true" if v else "false"
    elif t is int:
        if not -(2**63) <= v < 2**64:
            return None
        s = str(v)
    elif t is float:
        if not math.isfinite(v):
            return None
        s = repr(v)
    else:
        return None
    if len(s) > limit or _CONTROL.search(s):
        return None
    return s


def checked_params(obj: Any) -> tuple[dict[str, str] | None, int]:
    """Call parameters from untrusted JSON, bounded (see module invariants): (the parameters,
    how many entries were dropped). None when absent; anything but an object counts one."""
    if obj is None:
        return None, 0
    if type(obj) is not dict:
        return None, 1
    out: dict[str, str] = {}
    dropped = 0
    for k, v in obj.items():
        if len(out) == MAX_PARAMS:
            return out, len(obj) - MAX_PARAMS  # the rest is dropped
        val = param_text(v)
        if type(k) is not str or not 0 < len(k) <= MAX_PARAM_NAME or val is None or _CONTROL.search(k):
            dropped += 1
            continue
        out[k] = val
    return out, dropped


DIAL_RESERVED = ("from", "to", "direction")  # what the gateway sets itself on a dialled call's parameters
MAX_DIAL_PARAMS = MAX_PARAMS - len(DIAL_RESERVED)


def dial_params(obj: Any) -> tuple[dict[str, str], str]:
    """A ``dial`` command's ``params``: (the parameters, "") or ({}, why they are refused).

    Unlike :func:`checked_params` nothing is dropped: a dial is an operator's request, so a
    malformed entry refuses it. A flat object of at most :data:`MAX_DIAL_PARAMS` string
    values under the same bounds, none named as one of :data:`DIAL_RESERVED`; absent is {}."""
    if obj is None:
        return {}, ""
    if type(obj) is not dict:
        return {}, "params must be an object of strings"
    if len(obj) > MAX_DIAL_PARAMS:
        return {}, f"params: at most {MAX_DIAL_PARAMS} entries"
    for k, v in obj.items():
        if type(k) is not str or not 0 < len(k) <= MAX_PARAM_NAME or _CONTROL.search(k):
            return {}, f"params: a name is 1 to {MAX_PARAM_NAME} characters without control characters"
        if k.lower() in DIAL_RESERVED:
            return {}, f"params: {k!r} is set by the gateway"
        if type(v) is not str or param_text(v) is None:
            return {}, f"params[{k!r}]: a string of at most {MAX_PARAM_VALUE} characters without control characters"
    return dict(obj), ""


def bounded_params(obj: Any) -> dict[str, str] | None:
    """:func:`checked_params` without the count."""
    return checked_params(obj)[0]


def caller_called(params: dict[str, str] | None, caller: str | None = None,
                  called: str | None = None) -> tuple[str, str]:
    """(caller, called): ``caller`` and ``called`` when given (a carrier's own from/to), else
    those the parameters name (``CALLER_KEYS``, ``CALLED_KEYS``); "" when none does."""
    if not params:
        return caller or "", called or ""
    low = {k.lower(): v for k, v in reversed(params.items())}  # the first of two spellings wins
    return (caller or next((low[k] for k in CALLER_KEYS if low.get(k)), ""),
            called or next((low[k] for k in CALLED_KEYS if low.get(k)), ""))


def kept_text(v: Any, limit: int = MAX_PARAM_VALUE) -> tuple[str | None, int]:
    """(``v`` as a kept text: a non-empty string :func:`param_text` takes, else None; 1 if
    ``v`` was present and dropped, else 0)."""
    if v is None:
        return None, 0
    t = param_text(v, limit) if type(v) is str and v else None
    return t, int(t is None)
