"""Control-frame codec: round trips, and every kind of bad input is a typed error."""

from __future__ import annotations

import orjson
import pytest

from ipc import frames
from ipc.frames import DecodeGuard, FrameError, decode, decode_env, encode, frame_types


def test_every_frame_type_round_trips():
    import dataclasses

    for tag, cls in frame_types().items():
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
                continue
            t = str(f.type)
            kwargs[f.name] = (
                1 if t.startswith("int") else 1.5 if t.startswith("float") else True if t.startswith("bool")
                else [] if t.startswith("list") else () if t.startswith("tuple") else {} if t.startswith("dict")
                else "x"
            )
        fr = cls(**kwargs)
        assert decode(encode(fr)) == fr, tag


def test_cid_envelope():
    fr = frames.Ping(seq=3, sent_ns=10)
    got, cid = decode_env(encode(fr, cid=42))
    assert got == fr and cid == 42


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"\xff\xfe", "malformed"),
        (b"[1,2]", "malformed"),
        (b'{"seq":1}', "malformed"),
        (b'{"type":"nope"}', "unknown_type"),
        (b'{"type":"ping","seq":1}', "bad_field"),
        (b'{"type":"ping","seq":"1","sent_ns":2}', "bad_field"),
        (b'{"type":"ping","seq":1,"sent_ns":2,"extra":1}', "bad_field"),
        (b'{"type":"ping","seq":1.5,"sent_ns":2}', "bad_field"),
        (b'{"type":"ping","seq":1,"sent_ns":2,"cid":[1]}', "bad_field"),
        (b'{"type":"ping","seq":true,"sent_ns":2}', "bad_field"),
    ],
)
def test_bad_frames_are_typed_errors(data, kind):
    with pytest.raises(FrameError) as ei:
        decode(data)
    assert ei.value.kind == kind


def test_oversized_refused_before_parsing():
    big = orjson.dumps({"type": "child_event", "kind": "x", "detail": "a" * 300_000})
    with pytest.raises(FrameError) as ei:
        decode(big)
    assert ei.value.kind == "oversized"


def test_guard_counts_and_logs_once(caplog):
    g = DecodeGuard("test")
    for _ in range(5):
        assert g.decode(b"garbage") is None
    assert g.decode(encode(frames.Ping(seq=1, sent_ns=1))) is not None
    assert g.errors == {"malformed": 5}
    assert sum("dropped bad frame" in r.message for r in caplog.records) == 1
