"""The control-frame codec: frozen dataclasses <-> orjson bytes, validated.

Owns how a frame looks on the wire; ``ipc/frames.py`` owns which frames exist.

Wire form: one JSON object ``{"type": <tag>, <field>: <value>, ...}`` plus an
optional ``"cid"`` (correlation id) envelope key used by request/reply. Never
pickle.

Invariants:

* ``decode`` never raises anything but :class:`FrameError`, whatever the
  bytes: oversized input, bad JSON, a non-object, an unknown tag, a missing
  or extra field, or a field of the wrong JSON type are all typed errors.
* Field types are checked against the dataclass annotations (scalars,
  ``X | None``, ``list``/``tuple``/``dict`` containers; container elements are
  not walked). ``tuple`` fields come back as tuples, so decoded frames are
  equal to the frames that were encoded.
* A tag is registered once; registering it twice is a programming error.
  Every frame names who receives it (``to``: see ``RECEIVERS`` in
  ``ipc/frames.py``); :func:`received_by` lists a receiver's frames, so each
  role's dispatch table is checked against the protocol by a test.

Records (:func:`record`) are typed values carried *inside* a frame field (a
WorkerTick's events): frozen slotted dataclasses with a ``kind`` tag. The
frame field holds their wire form, a JSON object ``{"kind": <tag>, <field>:
<value>, ...}`` without the fields that hold their default
(:func:`record_to_wire`); the receiver types them with
:func:`record_from_wire`, which like ``decode`` raises only
:class:`FrameError`. Decoding them inside every frame would cost the hot
path (see ``ipc/tick_events.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import orjson

MAX_FRAME_BYTES = 256 * 1024

log = logging.getLogger("brisvox.ipc")


class FrameError(Exception):
    """A frame could not be decoded. ``kind`` is a stable counter label."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


class Frame:
    """Base of every control frame. Subclasses are frozen slotted dataclasses."""

    TYPE: ClassVar[str] = ""
    __slots__ = ()


_Check = Callable[[Any], Any]  # returns the (possibly converted) value or raises TypeError


class _Spec:
    __slots__ = ("cls", "fields", "required", "to", "always", "defaults")

    def __init__(self, cls: type, fields: list[tuple[str, _Check]], required: frozenset[str],
                 to: tuple[str, ...] = (), defaults: tuple[tuple[str, Any], ...] = ()):
        self.cls = cls
        self.fields = fields
        self.required = required
        self.to = to  # frames: who receives them
        # records: the fields always on the wire, and those left out at their default
        self.always = tuple(name for name, _ in fields if name in required)
        self.defaults = defaults


_REGISTRY: dict[str, _Spec] = {}
_RECORDS: dict[str, _Spec] = {}
_RECORD_OF: dict[type, _Spec] = {}
F = TypeVar("F", bound=type)


def _scalar(t: type) -> _Check:
    if t is float:

        def check_float(v: Any) -> Any:
            if type(v) is float:
                return v
            if type(v) is int:
                return float(v)
            raise TypeError("expected number")

        return check_float
    if t is int:

        def check_int(v: Any) -> Any:
            if type(v) is int:
                return v
            raise TypeError("expected integer")

        return check_int

    def check(v: Any) -> Any:
        if type(v) is t:
            return v
        raise TypeError(f"expected {t.__name__}")

    return check


def _checker(t: Any) -> _Check:
    if t is Any or t is object:
        return lambda v: v
    origin = typing.get_origin(t)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(t)
        inner = [_checker(a) for a in args if a is not type(None)]
        nullable = type(None) in args

        def check_union(v: Any) -> Any:
            if v is None:
                if nullable:
                    return None
                raise TypeError("null not allowed")
            for c in inner:
                try:
                    return c(v)
                except TypeError:
                    continue
            raise TypeError(f"expected {t}")

        return check_union
    if origin is tuple or t is tuple:

        def check_tuple(v: Any) -> Any:
            if type(v) is list or type(v) is tuple:
                return tuple(v)
            raise TypeError("expected array")

        return check_tuple
    if origin is list or t is list:

        def check_list(v: Any) -> Any:
            if type(v) is list:
                return v
            raise TypeError("expected array")

        return check_list
    if origin is dict or t is dict:

        def check_dict(v: Any) -> Any:
            if type(v) is dict:
                return v
            raise TypeError("expected object")

        return check_dict
    if origin is typing.Literal:
        allowed = typing.get_args(t)

        def check_literal(v: Any) -> Any:
            if v in allowed:
                return v
            raise TypeError(f"expected one of {allowed}")

        return check_literal
    if t in (int, float, str, bool):
        return _scalar(t)
    raise TypeError(f"unsupported frame field type {t!r}")


def _dataclass(cls: type, what: str, reserved: tuple[str, ...]) -> tuple[Any, list[tuple[str, _Check]], set[str]]:
    dc: Any = dataclasses.dataclass(frozen=True, slots=True)(cls)
    hints = typing.get_type_hints(dc)
    fields = []
    required = set()
    for f in dataclasses.fields(dc):
        if f.name in reserved:
            raise RuntimeError(f"{what}: field name {f.name!r} is reserved")
        fields.append((f.name, _checker(hints[f.name])))
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.add(f.name)
    return dc, fields, required


@typing.dataclass_transform(frozen_default=True)  # type checkers see the fields of every frame
def frame(tag: str, *, to: str | tuple[str, ...]) -> Callable[[F], F]:
    """Class decorator: make ``cls`` a frozen slotted dataclass frame with ``tag``,
    received by ``to`` (one receiver or several)."""
    receivers = (to,) if isinstance(to, str) else tuple(to)

    def wrap(cls: F) -> F:
        if tag in _REGISTRY:
            raise RuntimeError(f"frame type {tag!r} registered twice")
        if not receivers:
            raise RuntimeError(f"frame {tag}: no receiver")
        dc, fields, required = _dataclass(cls, f"frame {tag}", ("type", "cid"))
        dc.TYPE = tag
        _REGISTRY[tag] = _Spec(dc, fields, frozenset(required), receivers)
        return typing.cast(F, dc)

    return wrap


def frame_types() -> dict[str, type]:
    """Every registered tag and its class (the whole protocol)."""
    return {tag: spec.cls for tag, spec in sorted(_REGISTRY.items())}


def frame_receivers() -> dict[type, tuple[str, ...]]:
    """Every frame class and who receives it (its ``to``)."""
    return {spec.cls: spec.to for _, spec in sorted(_REGISTRY.items())}


def received_by(receiver: str) -> frozenset[type]:
    """The frame classes ``receiver`` is documented to receive (what its dispatch table must handle)."""
    return frozenset(spec.cls for spec in _REGISTRY.values() if receiver in spec.to)


# -- records: typed values inside a frame field ------------------------------------


class Record:
    """Base of a record: a frozen slotted dataclass registered with a ``kind`` tag."""

    KIND: ClassVar[str] = ""
    __slots__ = ()


@typing.dataclass_transform(frozen_default=True)
def record(kind: str) -> Callable[[F], F]:
    """Class decorator: make ``cls`` a frozen slotted dataclass record of ``kind``."""

    def wrap(cls: F) -> F:
        if kind in _RECORDS:
            raise RuntimeError(f"record kind {kind!r} registered twice")
        dc, fields, required = _dataclass(cls, f"record {kind}", ("kind",))
        defaults = tuple((f.name, f.default) for f in dataclasses.fields(dc) if f.name not in required)
        dc.KIND = kind
        _RECORDS[kind] = _RECORD_OF[dc] = _Spec(dc, fields, frozenset(required), defaults=defaults)
        return typing.cast(F, dc)

    return wrap


def record_to_wire(r: Record) -> dict[str, Any]:
    """A record -> its wire object (the fields at their default left out)."""
    spec = _RECORD_OF[type(r)]
    d: dict[str, Any] = {"kind": r.KIND}
    for name in spec.always:
        d[name] = getattr(r, name)
    for name, default in spec.defaults:
        v = getattr(r, name)
        if v != default:
            d[name] = v
    return d


def record_from_wire(obj: Any) -> Record:
    """A record's wire object -> the record. Raises :class:`FrameError` (``bad_field``) only."""
    if type(obj) is not dict:
        raise FrameError("bad_field", "record: expected an object")
    kind = obj.get("kind")
    spec = _RECORDS.get(kind) if type(kind) is str else None
    if spec is None:
        raise FrameError("bad_field", f"unknown record kind {str(kind)[:64]!r}")
    kwargs: dict[str, Any] = {}
    for name, check in spec.fields:
        if name in obj:
            try:
                kwargs[name] = check(obj[name])
            except TypeError as e:
                raise FrameError("bad_field", f"{kind}.{name}: {e}") from None
        elif name in spec.required:
            raise FrameError("bad_field", f"{kind}: missing field {name!r}")
    if len(kwargs) + 1 != len(obj):
        extra = sorted(k for k in obj if k != "kind" and k not in kwargs)
        raise FrameError("bad_field", f"{kind}: unknown field(s) {extra[:5]}")
    r: Record = spec.cls(**kwargs)
    return r


def _default(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return list(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def encode(f: Frame, cid: int | str | None = None) -> bytes:
    """Frame -> bytes. ``cid`` adds the correlation envelope key."""
    d: dict[str, Any] = {"type": f.TYPE}
    slots: tuple[str, ...] = f.__slots__
    for name in slots:
        d[name] = getattr(f, name)
    if cid is not None:
        d["cid"] = cid
    return orjson.dumps(d, default=_default)


def decode_env(data: bytes | memoryview, max_bytes: int = MAX_FRAME_BYTES) -> tuple[Frame, int | str | None]:
    """Bytes -> (frame, cid). Raises :class:`FrameError` only."""
    if len(data) > max_bytes:
        raise FrameError("oversized", f"{len(data)} bytes > {max_bytes}")
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise FrameError("malformed", f"bad JSON: {e}") from None
    if type(obj) is not dict:
        raise FrameError("malformed", "not a JSON object")
    tag = obj.pop("type", None)
    if type(tag) is not str:
        raise FrameError("malformed", "missing type tag")
    spec = _REGISTRY.get(tag)
    if spec is None:
        raise FrameError("unknown_type", f"unknown frame type {tag[:64]!r}")
    cid = obj.pop("cid", None)
    if cid is not None and type(cid) not in (int, str):
        raise FrameError("bad_field", "cid must be an integer or a string")
    kwargs: dict[str, Any] = {}
    for name, check in spec.fields:
        if name in obj:
            try:
                kwargs[name] = check(obj.pop(name))
            except TypeError as e:
                raise FrameError("bad_field", f"{tag}.{name}: {e}") from None
        elif name in spec.required:
            raise FrameError("bad_field", f"{tag}: missing field {name!r}")
    if obj:
        raise FrameError("bad_field", f"{tag}: unknown field(s) {sorted(obj)[:5]}")
    try:
        return spec.cls(**kwargs), cid
    except (TypeError, ValueError) as e:  # __post_init__ validation
        raise FrameError("bad_field", f"{tag}: {e}") from None


def decode(data: bytes | memoryview, max_bytes: int = MAX_FRAME_BYTES) -> Frame:
    """Bytes -> frame, dropping any correlation id."""
    return decode_env(data, max_bytes)[0]


def note_unexpected(counts: dict[str, int], seen: set[str], where: str, f: Frame) -> None:
    """A dispatch table's miss: ``counts["unexpected_type"]`` + 1; logged the first time
    its frame type is met (``seen``: the types already logged by this receiver)."""
    counts["unexpected_type"] = counts.get("unexpected_type", 0) + 1
    if f.TYPE not in seen:
        seen.add(f.TYPE)
        log.warning("dropped unexpected %s frame on %s (no handler)", f.TYPE, where)


class DecodeGuard:
    """Decode for a receiving loop: bad frames are counted, logged once per kind, dropped.

    ``errors`` maps error kind -> count (exported as a metric by the owner).
    """

    __slots__ = ("where", "errors", "max_bytes", "_unexpected")

    def __init__(self, where: str, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self.where = where
        self.errors: dict[str, int] = {}
        self.max_bytes = max_bytes
        self._unexpected: set[str] = set()  # frame types without a handler, already logged

    def decode_env(self, data: bytes | memoryview) -> tuple[Frame, int | str | None] | None:
        try:
            return decode_env(data, self.max_bytes)
        except FrameError as e:
            n = self.errors.get(e.kind, 0)
            self.errors[e.kind] = n + 1
            if n == 0:
                log.warning("dropped bad frame on %s: %s", self.where, e)
            return None

    def decode(self, data: bytes | memoryview) -> Frame | None:
        r = self.decode_env(data)
        return None if r is None else r[0]

    def unexpected(self, f: Frame) -> None:
        """A frame that decoded but has no handler here: counted as ``unexpected_type``,
        logged once per frame type (see :func:`note_unexpected`)."""
        note_unexpected(self.errors, self._unexpected, self.where, f)

    @property
    def dropped(self) -> int:
        return sum(self.errors.values())
