"""Control-frame codec: round trips, and every kind of bad input is a typed error."""

from __future__ import annotations

import orjson
import pytest

from ipc import codec, frames, tick_events
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


# -- records: the typed events of a WorkerTick ----------------------------------------------

TICK_EVENTS = [
    tick_events.SpeechStart(call_id="a", pos=100, at=612, ns=1),
    tick_events.SpeechStop(call_id="a", pos=900, at=4100, ns=2),
    tick_events.SpeechStop(call_id="a", pos=900, at=4100, ns=2, reason="worker_lost"),
    tick_events.SpeechFalling(call_id="a", pos=900, at=2600, ns=3),
    tick_events.InputGap(call_id="b", pos=5000, lost=320, ns=4),
    tick_events.VadFailed(call_id="b", pos=6000, failures=5, ns=5),
    tick_events.VadRecovered(call_id="b", pos=9000, ns=6),
]


def test_tick_events_round_trip_through_a_worker_tick():
    tick = frames.WorkerTick(worker=1, seq=2, positions={"a": 1}, events=[tick_events.to_wire(e) for e in TICK_EVENTS],
                             sent_ns=3)
    got = decode(encode(tick))
    assert isinstance(got, frames.WorkerTick)
    assert [tick_events.from_wire(e) for e in got.events] == TICK_EVENTS


def test_the_wire_form_of_an_event_is_the_compact_object_and_leaves_defaults_out():
    assert tick_events.to_wire(TICK_EVENTS[1]) == {"kind": "stop", "call_id": "a", "pos": 900, "at": 4100, "ns": 2}
    assert tick_events.to_wire(TICK_EVENTS[2])["reason"] == "worker_lost"
    assert tick_events.to_wire(TICK_EVENTS[4]) == {"kind": "gap", "call_id": "b", "pos": 5000, "lost": 320, "ns": 4}


@pytest.mark.parametrize(
    "row",
    [
        [1, 2],
        {"call_id": "a", "pos": 1, "at": 2, "ns": 3},  # no kind
        {"kind": "nope", "call_id": "a", "pos": 1, "ns": 3},
        {"kind": ["start"], "call_id": "a", "pos": 1, "at": 2, "ns": 3},
        {"kind": "start", "call_id": "a", "pos": 1, "ns": 3},  # missing at
        {"kind": "start", "call_id": "a", "pos": "1", "at": 2, "ns": 3},
        {"kind": "start", "call_id": "a", "pos": True, "at": 2, "ns": 3},
        {"kind": "start", "call_id": "a", "pos": 1, "at": 2, "ns": 3, "reason": "x"},  # not a start's
        {"kind": "stop", "call_id": "a", "pos": 1, "at": 2, "ns": 3, "reason": None},
    ],
)
def test_bad_events_are_typed_errors(row):
    with pytest.raises(FrameError) as ei:
        tick_events.from_wire(row)
    assert ei.value.kind == "bad_field"


def test_registration_errors():
    with pytest.raises(RuntimeError, match="registered twice"):
        @codec.record("start")
        class Again(codec.Record):
            x: int
    with pytest.raises(RuntimeError, match="no receiver"):
        @codec.frame("nobody_gets_it", to=())
        class Orphan(codec.Frame):
            x: int
    assert "nobody_gets_it" not in frame_types()
