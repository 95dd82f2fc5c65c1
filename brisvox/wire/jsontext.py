"""What the two JSON media-stream protocols (``twilio``, ``native``) share.

Owns the compact JSON text the builders emit (no spaces, UTF-8, the same
bytes ``orjson.dumps`` gives for the strings, ints and objects these messages
hold), the JSON quoting of one string for the byte templates, and the bounds
on caller-supplied call parameters (Twilio ``customParameters``, native
``params``).

Invariants: :func:`quote` is the standard library's C string escaper
(``"``, ``\\`` and control characters escaped, the rest kept as UTF-8), so a
template with quoted strings is valid JSON whatever the strings hold;
:func:`bounded_params` keeps at most ``MAX_PARAMS`` entries, names cut to
``MAX_PARAM_NAME`` and values to ``MAX_PARAM_VALUE`` characters, all strings.
"""

from __future__ import annotations

from json import JSONEncoder
from json.encoder import encode_basestring
from typing import Any

MAX_PARAMS = 32
MAX_PARAM_NAME = 64
MAX_PARAM_VALUE = 1024

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


def bounded_params(obj: Any) -> dict[str, str] | None:
    """Call parameters from untrusted JSON, bounded (see module invariants); None unless an object."""
    if type(obj) is not dict:
        return None
    return {str(k)[:MAX_PARAM_NAME]: str(v)[:MAX_PARAM_VALUE] for k, v in list(obj.items())[:MAX_PARAMS]}
