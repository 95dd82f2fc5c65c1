"""What a call is, as its tools and its record see it: :class:`CallInfo` (docs/TOOLS.md).

Owns the call's metadata from the transport (``CallStart`` from the gateway,
docs/PROTOCOL.md "What the gateway reads of a call"): the caller's and the
called number, the transport and its ids (Twilio streamSid/callSid/accountSid,
the SIP Call-ID), the call's parameters (Twilio ``customParameters``, native
``start.params`` or a signed token's, SIP ``from``/``to`` URIs); and what of
it the call record keeps (:meth:`CallInfo.record`).

Invariants:

* A :class:`CallInfo` is read-only (a frozen dataclass whose mappings are
  read-only views of private copies): a tool cannot change what another tool
  or the record sees. :data:`NO_CALL` (every field empty) is the default of
  a :class:`~brisvox.agent.tool_engine.registry.ToolContext` built without one.
* :meth:`CallInfo.of` bounds whatever it is given as the gateway does
  (:func:`brisvox.wire.jsontext.checked_params`: at most 32 entries, names of
  1-64 characters, values of at most 256, no control characters; the numbers
  the same as a value) and counts what it dropped in ``dropped``: a
  malformed entry never refuses the call.
* :meth:`CallInfo.record` never holds a secret: a parameter whose name looks
  like a credential (:func:`secret_name`: token, secret, password, auth,
  key, signature, cookie, PIN, ...) or whose value looks like one (a bearer
  or basic credential, a JWT) is left out. The tools see every parameter
  (a local tool runs with the daemon's rights anyway).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from brisvox.wire.jsontext import checked_params, param_text

_EMPTY: Mapping[str, str] = MappingProxyType({})

# a name is secret when it holds one of these (lower-cased, separators removed) ...
_SECRET_PARTS = ("token", "secret", "passw", "passcode", "pwd", "auth", "apikey", "credential", "signature",
                 "cookie", "bearer", "jwt", "privatekey", "sessionkey", "accesskey", "cvv", "ssn")
# ... or one of its words is one of these (words split at separators and lower-to-upper case changes)
_SECRET_WORDS = frozenset({"key", "pin", "otp", "sig", "pass", "cvc", "hmac", "nonce"})
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_SECRET_VALUE = re.compile(r"^\s*(bearer|basic)\s+\S|^eyJ[\w-]*\.[\w-]*\.", re.IGNORECASE)


def secret_name(name: str) -> bool:
    """Whether a parameter named ``name`` may hold a credential (kept out of records)."""
    flat = re.sub(r"[^a-z0-9]", "", name.lower())
    if any(p in flat for p in _SECRET_PARTS):
        return True
    return any(w.lower() in _SECRET_WORDS for w in _WORD.findall(name))


def secret_value(value: str) -> bool:
    """Whether ``value`` looks like a credential itself (``Bearer ...``, ``Basic ...``, a JWT)."""
    return bool(_SECRET_VALUE.search(value))


@dataclass(frozen=True, slots=True)
class CallInfo:
    """The call a tool runs in (``ctx.call_info``). Every field may be empty: a transport
    that does not say (a native client without parameters, Twilio without From/To
    parameters) leaves ``caller``/``called`` "".

    ``caller``: the caller's number or name (SIP From user part, a ``tel:`` number, the
    ``From``/``caller`` parameter). ``called``: the number they called (SIP To user part,
    the ``To``/``called`` parameter). ``transport``: ``sip``, ``twilio``, ``native`` (or
    ``sim``). ``transport_ids``: ``streamSid``/``callSid``/``accountSid`` (Twilio),
    ``sip_call_id`` (SIP). ``params``: the call's parameters, strings. ``dropped``: entries
    :meth:`of` refused."""

    caller: str = ""
    called: str = ""
    transport: str = ""
    transport_ids: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    params: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    dropped: int = 0

    def __post_init__(self) -> None:
        for name in ("transport_ids", "params"):  # built directly: read-only views of copies
            m = getattr(self, name)
            if type(m) is not MappingProxyType:
                object.__setattr__(self, name, MappingProxyType(dict(m)) if m else _EMPTY)

    def __hash__(self) -> int:
        return hash((self.caller, self.called, self.transport, tuple(self.transport_ids.items()),
                     tuple(self.params.items())))

    @classmethod
    def of(cls, *, caller: Any = "", called: Any = "", transport: Any = "", transport_ids: Any = None,
           params: Any = None) -> CallInfo:
        """A bounded, read-only CallInfo from untrusted values (see module invariants)."""
        ids, dropped_ids = checked_params(transport_ids)
        kept, dropped = checked_params(params)
        numbers = [param_text(n) if n else "" for n in (caller, called)]
        dropped += dropped_ids + sum(1 for n in numbers if n is None)
        return cls(numbers[0] or "", numbers[1] or "", param_text(transport, 32) or "",
                   MappingProxyType(ids) if ids else _EMPTY, MappingProxyType(kept) if kept else _EMPTY, dropped)

    def record(self) -> dict[str, Any]:
        """The call record's ``call`` section: the numbers and the parameters but the secret ones."""
        return {
            "caller": self.caller,
            "called": self.called,
            "params": {k: v for k, v in self.params.items() if not secret_name(k) and not secret_value(v)},
        }


NO_CALL = CallInfo()
