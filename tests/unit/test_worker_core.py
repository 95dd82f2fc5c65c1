"""The worker core in one process: real rings and a real ROUTER inbox, driven tick by tick.

The speech model is a deterministic energy model with the Silero runner's
interface (the real model's behaviour is covered in tests/e2e); it lets
failures be injected per call slot so the fail-open path runs exactly as in
production.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import zmq

from ipc.bus import endpoint, make_socket
from ipc.codec import decode, decode_env, encode
from ipc.frames import (
    AttachCall,
    Attached,
    DetachCall,
    Detached,
    ErrorReply,
    OutUtterance,
    Ping,
    SmartTurnCancel,
    SmartTurnRequest,
    TtsCut,
    TtsUtterance,
    WorkerTick,
)
from ipc.ring import SHM_DIR, ring_name
from ipc.tick_events import TickEvent, from_wire
from workers.config import SmartTurnConfig, VadConfig, WorkersConfig
from workers.core import Worker, WorkerModels
from workers.harness import close_rings, create_call_rings


class EnergyBatch:
    """Speech probability 1.0 when a window's RMS exceeds 0.02 of full scale, else 0.0."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.runs = 0
        self.rows = 0
        self.failing: set[int] = set()
        self.batch_sizes: list[int] = []
        self.widths: list[int] = []  # window width of each run: 512 (16 kHz) or 256 (native 8 kHz)

    def reset(self, slot: int) -> None:
        pass

    def warm(self) -> None:
        self.runs += 1

    def run(self, slots: np.ndarray, windows: np.ndarray) -> np.ndarray:
        if self.failing.intersection(int(s) for s in slots):
            raise RuntimeError("injected VAD failure")
        self.runs += 1
        self.rows += len(slots)
        self.batch_sizes.append(len(slots))
        self.widths.append(windows.shape[1])
        rms = np.sqrt((windows.astype(np.float64) ** 2).mean(axis=1))
        return (rms > 0.02).astype(np.float32)


LOUD = 3000.0
SR = 8000
FRAME = 160  # 20 ms at 8 kHz


@dataclass
class Tick:
    """What one worker tick sent the subscriber: in16 positions and the typed events."""

    positions: dict[str, int] = field(default_factory=dict)
    events: list[TickEvent] = field(default_factory=list)


class Rig:
    def __init__(self, tmp: Path, inst: str, **vad_kw) -> None:
        self.inst = inst
        self.model = EnergyBatch(8)
        vad = VadConfig(min_speech_ms=64, min_silence_ms=200, failure_window_ms=1000,
                        recovery_interval_ms=2000, **vad_kw)
        self.w = Worker(0, endpoint(tmp, "w0"), WorkerModels(silero=Path("unused"), smart_turn=None),
                        WorkersConfig(max_calls=8, orphan_timeout_s=0.5), vad, SmartTurnConfig(enabled=False),
                        silero_factory=lambda p, cap, th: self.model)
        self.w.load()
        self.w.bind()
        self.ctx = zmq.Context()
        self.sub = make_socket(self.ctx, zmq.DEALER, identity=b"sub-0")
        self.sub.connect(self.w.endpoint)
        self.rings: dict[str, dict] = {}
        self.rng = np.random.default_rng(3)
        self.cid = 0

    def close(self) -> None:
        self.sub.close(0)
        self.ctx.term()
        self.w.close()
        for r in self.rings.values():
            close_rings(r)

    def call(self, call_id: str, **kw) -> dict:
        self.rings[call_id] = create_call_rings(self.inst, call_id, SR, 16000, seconds=4.0, **kw)
        return self.rings[call_id]

    def request(self, frame) -> object:
        self.cid += 1
        self.sub.send(encode(frame, cid=self.cid))
        assert self.w.sock.poll(2000)
        self.w.dispatch.drain_inbox(self.w.sock)
        return self.recv(lambda f: not isinstance(f, WorkerTick))

    def send(self, frame) -> None:
        self.sub.send(encode(frame))
        assert self.w.sock.poll(2000)
        self.w.dispatch.drain_inbox(self.w.sock)

    def recv(self, want=lambda f: True, timeout_ms: int = 2000):
        deadline = time.monotonic() + timeout_ms / 1000
        while time.monotonic() < deadline:
            if self.sub.poll(50):
                f = decode(self.sub.recv())
                if want(f):
                    return f
        raise TimeoutError("nothing received")

    def attach(self, call_id: str, **kw) -> object:
        return self.request(AttachCall(call_id=call_id, subscriber="sub-0", instance=self.inst, call_rate=SR,
                                       tts_rate=16000, **kw))

    def feed(self, call_id: str, loud: bool, frames: int = 1) -> None:
        n = FRAME * frames
        x = self.rng.normal(0, LOUD if loud else 8.0, n)
        self.rings[call_id]["in"].write(np.clip(x, -32768, 32767).astype(np.int16))

    def tick(self) -> Tick:
        """One worker tick: what its WorkerTicks carried, events typed (ticks go out only
        with news: an empty tick here means nothing was sent)."""
        self.w.realtime.tick()
        t = Tick()
        while self.sub.poll(5):
            f = decode(self.sub.recv())
            if isinstance(f, WorkerTick):
                t.positions.update(f.positions)
                t.events.extend(from_wire(e) for e in f.events)
        return t

    def run(self, pattern: dict[str, list[bool]]) -> list[TickEvent]:
        """Feed one 20 ms frame per call per tick following ``pattern``; return all events."""
        events = []
        for k in range(max(len(v) for v in pattern.values())):
            for call_id, seq in pattern.items():
                if k < len(seq):
                    self.feed(call_id, seq[k])
            events.extend(self.tick().events)
        return events


@pytest.fixture(params=[True, False], ids=["vad8k", "vad16k"])
def rig(request, short_tmp, shm_clean):
    """Every core test runs with the 8 kHz calls' VAD in Silero's native 8 kHz mode (on the
    ``in`` samples) and in the 16 kHz mode (on in16)."""
    r = Rig(short_tmp, shm_clean, native_8k=request.param)
    yield r
    r.close()


def speech(ms_silence: int, ms_speech: int, ms_after: int) -> list[bool]:
    return [False] * (ms_silence // 20) + [True] * (ms_speech // 20) + [False] * (ms_after // 20)


def test_warm_up_runs_the_model_before_any_call(rig):
    assert rig.model.runs >= 1 and not rig.w.calls


def test_attach_speak_and_get_backdated_events_once_per_tick(rig):
    rig.call("a")
    rep = rig.attach("a")
    assert isinstance(rep, Attached) and rep.in16_pos == 0 and rep.worker == 0
    evs = rig.run({"a": speech(400, 600, 500)})
    kinds = [(e.KIND, e.call_id) for e in evs]
    assert kinds == [("start", "a"), ("stop", "a")]
    start, stop = evs
    assert abs(start.pos - 400 * 16) <= 512  # in16 positions: 16 samples per ms
    assert abs(stop.pos - 1000 * 16) <= 512
    assert stop.at - stop.pos >= 200 * 16
    assert rig.w.calls["a"].pub_pos == rig.rings["a"]["in16"].write_pos  # what the subscriber last got


def test_one_batched_run_per_tick_for_all_calls(rig):
    for c in ("a", "b", "c"):
        rig.call(c)
        assert isinstance(rig.attach(c), Attached)
    rig.model.batch_sizes.clear()
    rig.run({c: [True] * 40 for c in ("a", "b", "c")})
    # every full 512-sample window of in16 was scored (the window grid starts 8 samples early,
    # see workers/call_table.py GRID_PHASE), in runs that carry every call that had one
    windows = sum((rig.rings[c]["in16"].write_pos + 8) // 512 for c in ("a", "b", "c"))
    assert windows >= 3 * 24 and sum(rig.model.batch_sizes) == windows
    assert all(rig.w.calls[c].vad_pos % 32 == 24 for c in ("a", "b", "c"))
    assert max(rig.model.batch_sizes) == 3 and len(rig.model.batch_sizes) <= 40


def test_8k_and_16k_calls_share_the_timeline_with_one_run_per_vad_rate(rig):
    """An 8 kHz call is scored on its own samples (256-sample windows) with ``native_8k``,
    on in16 otherwise; a 16 kHz call always on in16. Events carry in16 positions either way."""
    rig.call("n")
    rig.rings["w"] = create_call_rings(rig.inst, "w", 16000, 16000, seconds=4.0)
    assert isinstance(rig.attach("n"), Attached)
    assert isinstance(rig.request(AttachCall(call_id="w", subscriber="sub-0", instance=rig.inst,
                                             call_rate=16000, tts_rate=16000)), Attached)
    rig.model.widths.clear()
    events: dict[str, list[TickEvent]] = {"n": [], "w": []}
    for k, loud in enumerate(speech(400, 600, 500)):
        rig.feed("n", loud)
        x = rig.rng.normal(0, LOUD if loud else 8.0, 320)
        rig.rings["w"]["in"].write(np.clip(x, -32768, 32767).astype(np.int16))
        for e in rig.tick().events:
            events[e.call_id].append(e)
            # a decision is published only once in16 holds its audio (Smart Turn reads up to `at`)
            assert e.at <= rig.rings[e.call_id]["in16"].write_pos
        assert rig.w.stats.ticks == k + 1
    native = rig.w.vad_cfg.native_8k
    assert set(rig.model.widths) == ({256, 512} if native else {512})
    assert rig.w.calls["n"].win == (256 if native else 512) and rig.w.calls["w"].win == 512
    for call_id in ("n", "w"):
        kinds = [e.KIND for e in events[call_id]]
        assert kinds == ["start", "stop"], (call_id, kinds)
        start, stop = events[call_id]
        assert abs(start.pos - 400 * 16) <= 512 and abs(stop.pos - 1000 * 16) <= 512
    # both calls hear the same timeline: their decisions fall on the same in16 window grid
    assert events["n"][0].at % 32 == events["w"][0].at % 32 == 24


def test_a_frame_without_a_handler_is_answered_unsupported_counted_and_logged_once(rig, caplog):
    for seq in (1, 2):
        r = rig.request(Ping(seq=seq, sent_ns=0))
        assert isinstance(r, ErrorReply) and r.kind == "unsupported"
    assert rig.w.guard.errors == {"unexpected_type": 2} and rig.w.stats.errors["unsupported"] == 2
    assert sum("unexpected ping frame" in rec.message for rec in caplog.records) == 1


def test_bad_requests_get_typed_errors_and_the_worker_keeps_serving(rig):
    # missing rings
    r = rig.attach("ghost")
    assert isinstance(r, ErrorReply) and r.kind == "bad_ring"
    # a segment with the wrong magic
    name = ring_name(rig.inst, "junk", "in")
    (SHM_DIR / name).write_bytes(b"\x00" * 4096)
    (SHM_DIR / name).chmod(0o600)  # ours and private: the magic is what is wrong
    try:
        r = rig.attach("junk")
        assert isinstance(r, ErrorReply) and r.kind == "bad_ring" and "magic" in r.detail
    finally:
        (SHM_DIR / name).unlink()
    # rings whose rate does not match the request
    rig.call("r16")
    r = rig.request(AttachCall(call_id="r16", subscriber="sub-0", instance=rig.inst, call_rate=16000,
                               tts_rate=16000))
    assert isinstance(r, ErrorReply) and r.kind == "bad_rate"
    r = rig.request(AttachCall(call_id="r16", subscriber="sub-0", instance=rig.inst, call_rate=0, tts_rate=1))
    assert isinstance(r, ErrorReply) and r.kind == "bad_rate"
    r = rig.attach("r16", vad={"threshold": 3})
    assert isinstance(r, ErrorReply) and r.kind == "bad_params"
    # jobs naming an unknown call, an absurd range, a passed deadline
    far = time.monotonic_ns() + 10**9
    r = rig.request(SmartTurnRequest(call_id="nobody", end_pos=100, deadline_ns=far))
    assert isinstance(r, ErrorReply) and r.kind == "unknown_call"
    rig.call("ok")
    assert isinstance(rig.attach("ok"), Attached)
    rig.run({"ok": [False] * 5})
    for end in (-5, 0, 10**12):
        r = rig.request(SmartTurnRequest(call_id="ok", end_pos=end, deadline_ns=far))
        assert isinstance(r, ErrorReply) and r.kind == "bad_range", end
    r = rig.request(SmartTurnRequest(call_id="ok", end_pos=320, deadline_ns=time.monotonic_ns() - 1))
    assert isinstance(r, ErrorReply) and r.kind == "expired"
    # garbage on the wire is counted and dropped
    rig.sub.send(b"\xff not json")
    rig.sub.send(b'{"type": "attach_call", "call_id": 5}')
    assert rig.w.sock.poll(2000)
    time.sleep(0.05)
    rig.w.dispatch.drain_inbox(rig.w.sock)
    assert rig.w.guard.dropped == 2
    # still serving: the good call keeps getting VAD events
    evs = rig.run({"ok": speech(0, 400, 400)})
    assert [e.KIND for e in evs] == ["start", "stop"]
    assert {"bad_ring", "bad_rate", "bad_params", "unknown_call", "bad_range", "expired"} <= set(rig.w.stats.errors)


def test_a_gap_closes_speech_with_a_stop_dated_to_the_last_speech(rig):
    rig.call("a")
    rig.attach("a")
    evs = rig.run({"a": speech(200, 400, 0)})
    assert [e.KIND for e in evs] == ["start"]
    cap = rig.rings["a"]["in"].capacity
    rig.feed("a", True, frames=cap // FRAME + 10)  # the worker was not there for > a ring
    t = rig.tick()
    kinds = [e.KIND for e in t.events]
    assert kinds == ["stop", "gap"]
    stop, gap = t.events
    assert stop.reason == "gap" and stop.pos <= gap.pos
    assert gap.lost > 0
    # positions stayed aligned to the caller's time
    in_w = rig.rings["a"]["in"].write_pos
    assert t.positions["a"] <= in_w * 2


def test_vad_fails_open_after_failures_spanning_the_window_then_recovers(rig):
    for c in ("a", "b"):
        rig.call(c)
        rig.attach(c)
    slot_a = rig.w.calls["a"].slot
    rig.run({"a": speech(0, 200, 0), "b": speech(0, 200, 0)})  # both speaking
    rig.model.failing.add(slot_a)
    evs = rig.run({"a": [True] * 75, "b": speech(0, 300, 1200)})  # 1.5 s of failing windows for a
    a_evs = [e for e in evs if e.call_id == "a"]
    b_evs = [e for e in evs if e.call_id == "b"]
    # a: its speech is closed at the first failure, then exactly one vad_failed, after >= 1 s of audio
    assert [e.KIND for e in a_evs] == ["stop", "vad_failed"]
    assert a_evs[0].reason == "vad_error"
    assert a_evs[1].pos - a_evs[0].at >= 16000 - 512
    assert rig.w.calls["a"].health.failed_open
    # b is unaffected by a's failures (its rows are re-run alone)
    assert [e.KIND for e in b_evs] == ["stop"]
    # failed open: audio still flows into in16, no VAD events
    before = rig.rings["a"]["in16"].write_pos
    evs = rig.run({"a": speech(0, 400, 600)})
    assert [e for e in evs if e.call_id == "a"] == []
    assert rig.rings["a"]["in16"].write_pos > before
    # the model heals: the next probe (every 2 s of audio here) recovers and events resume
    rig.model.failing.clear()
    evs = rig.run({"a": [False] * 110 + speech(0, 400, 400)})
    kinds = [e.KIND for e in evs if e.call_id == "a"]
    assert kinds == ["vad_recovered", "start", "stop"]
    assert rig.w.stats.failed_open == 1 and rig.w.stats.recoveries == 1


def test_a_short_failure_burst_heals_without_failing_open(rig):
    rig.call("a")
    rig.attach("a")
    slot = rig.w.calls["a"].slot
    rig.model.failing.add(slot)
    rig.run({"a": [False] * 10})  # 200 ms of failures: more than 5 but less than the 1 s window
    rig.model.failing.clear()
    evs = rig.run({"a": speech(0, 400, 400)})
    assert [e.KIND for e in evs] == ["start", "stop"]
    assert not rig.w.calls["a"].health.failed_open and rig.w.stats.vad_failures >= 5


def test_reattach_after_a_worker_death_opens_with_a_synthesized_stop(rig):
    rig.call("a")
    r = rig.rings["a"]
    # the dead worker had written 1 s of in16 and the caller was speaking since 0.5 s
    r["in16"].write(np.zeros(16000, dtype=np.int16))
    r["in"].write(np.zeros(8000 + 1600, dtype=np.int16))  # 200 ms more arrived meanwhile
    rep = rig.attach("a", speaking_since=8000)
    assert isinstance(rep, Attached) and rep.in16_pos == 16000
    t = rig.tick()
    assert t.events[0].KIND == "stop" and t.events[0].reason == "worker_lost"
    assert t.events[0].pos == 16000
    assert t.positions["a"] == pytest.approx(16000 + 3200, abs=8)  # the backlog was converted seamlessly


def test_detach_stops_serving_and_unmaps(rig):
    rig.call("a")
    rig.attach("a")
    rep = rig.request(DetachCall(call_id="a"))
    assert isinstance(rep, Detached) and "a" not in rig.w.calls
    assert rig.w.attached.free_slots.count(0) == 1 or len(rig.w.attached.free_slots) == 8
    rig.w.realtime.tick()
    assert rig.w.attached.by_sub == {}


def test_attach_is_idempotent(rig):
    rig.call("a")
    a1, a2 = rig.attach("a"), rig.attach("a")
    assert isinstance(a1, Attached) and isinstance(a2, Attached) and len(rig.w.calls) == 1


def test_calls_of_an_unreachable_subscriber_are_detached(rig):
    rig.call("a")
    r = rig.request(AttachCall(call_id="a", subscriber="gone-9", instance=rig.inst, call_rate=SR,
                               tts_rate=16000))
    assert isinstance(r, Attached)
    deadline = time.monotonic() + 3
    while "a" in rig.w.calls and time.monotonic() < deadline:
        rig.w.realtime.tick()
        time.sleep(0.02)
    assert "a" not in rig.w.calls and rig.w.stats.orphan_detaches == 1


def _attach_with_gateway(rig, call_id: str = "a") -> None:
    rig.call(call_id)
    rig.request(AttachCall(call_id=call_id, subscriber="sub-0", instance=rig.inst, call_rate=SR, tts_rate=16000,
                           gateway="sub-0"))


def _no_out_utterance(rig) -> bool:
    while rig.sub.poll(20):
        if isinstance(decode(rig.sub.recv()), OutUtterance):
            return False
    return True


def test_tts_utterances_are_placed_on_the_out_ring_and_reported(rig):
    _attach_with_gateway(rig)
    tts, out = rig.rings["a"]["tts"], rig.rings["a"]["out"]
    # announced before its audio (the protocol's order): reported with its first audio
    rig.send(TtsUtterance(call_id="a", utterance=1, epoch=1, tts_pos=0))
    assert _no_out_utterance(rig)
    tts.write(np.full(3200, 1000, dtype=np.int16))
    rig.w.realtime.tick()
    got = rig.recv(lambda f: isinstance(f, OutUtterance))
    assert (got.utterance, got.out_pos) == (1, 0)
    rig.recv(lambda f: isinstance(f, OutUtterance))  # the gateway copy
    rig.send(TtsUtterance(call_id="a", utterance=2, epoch=1, tts_pos=3200))
    tts.write(np.full(1600, 1000, dtype=np.int16))
    rig.w.realtime.tick()
    got = rig.recv(lambda f: isinstance(f, OutUtterance))
    assert (got.utterance, got.out_pos) == (2, 1600)
    rig.recv(lambda f: isinstance(f, OutUtterance))  # the gateway copy
    rig.send(TtsCut(call_id="a", epoch=1, tts_pos=tts.write_pos))
    out_w = out.write_pos
    tts.write(np.full(1600, 1000, dtype=np.int16))
    rig.w.realtime.tick()
    assert out.write_pos - out_w == pytest.approx(800, abs=4)
    r = rig.request(TtsCut(call_id="zzz", epoch=1, tts_pos=0))
    assert isinstance(r, ErrorReply) and r.kind == "unknown_call"


def test_an_utterance_whose_audio_is_written_is_converted_and_announced_at_once(rig):
    """The agent process writes the first audio before its TtsUtterance leaves: the worker
    converts that call's tts -> out while handling the frame (no tick) and announces it, so
    the out ring already holds the first frame when the gateway hears of the utterance."""
    _attach_with_gateway(rig)
    tts, out = rig.rings["a"]["tts"], rig.rings["a"]["out"]
    tts.write(np.full(4000, 1000, dtype=np.int16))  # utterance 1: 250 ms at 16 kHz
    ticks = rig.w.stats.ticks
    rig.send(TtsUtterance(call_id="a", utterance=1, epoch=1, tts_pos=0))
    got = rig.recv(lambda f: isinstance(f, OutUtterance))
    assert (got.utterance, got.out_pos) == (1, 0)
    assert rig.w.stats.ticks == ticks and rig.w.stats.out_nudges == 1
    assert out.write_pos >= 1990  # all of it converted (8 kHz), at least one 20 ms frame
    # the next utterance of the response (previous one converted completely): the same
    tts.write(np.full(800, 2000, dtype=np.int16))
    rig.send(TtsUtterance(call_id="a", utterance=2, epoch=1, tts_pos=4000))
    got = [rig.recv(lambda f: isinstance(f, OutUtterance)) for _ in range(3)]  # u1 gateway copy, u2 x2
    assert [(f.utterance, f.out_pos) for f in got[1:]] == [(2, 2000), (2, 2000)]
    assert rig.w.stats.ticks == ticks and out.write_pos - 2000 == pytest.approx(400, abs=4)


def test_an_utterance_announced_before_its_audio_goes_out_as_soon_as_the_audio_lands(rig):
    """Announced first (the protocol's order), written a few ms later: the worker's loop
    watches the call (1 ms polls, at most one tick) and converts once 20 ms of the
    utterance's audio is in the tts ring, outside the tick."""
    import threading

    _attach_with_gateway(rig)
    rig.w.realtime.tick_s = 0.3  # a tick far away: only the loop's watch can announce in time
    tts, out = rig.rings["a"]["tts"], rig.rings["a"]["out"]
    stop = threading.Event()
    loop = threading.Thread(target=rig.w.run, args=(stop,), daemon=True)
    loop.start()
    try:
        rig.sub.send(encode(TtsUtterance(call_id="a", utterance=7, epoch=2, tts_pos=0)))
        time.sleep(0.01)
        tts.write(np.full(160, 1000, dtype=np.int16))  # 10 ms: less than a frame, keep waiting
        time.sleep(0.005)
        assert rig.w.stats.out_nudges == 0
        tts.write(np.full(1440, 1000, dtype=np.int16))
        got = rig.recv(lambda f: isinstance(f, OutUtterance))
        seen_out = out.write_pos
    finally:
        stop.set()
        loop.join(2)
    assert (got.utterance, got.epoch, got.out_pos) == (7, 2, 0)
    assert seen_out >= 790  # the 100 ms of audio was in the out ring before the announcement
    assert rig.w.stats.out_nudges >= 1


def test_falling_events_are_opt_in_per_call_and_match_their_stop(rig):
    rig.call("a")
    rig.call("b")
    rig.attach("a", vad={"fall_delay_ms": 96})
    rig.attach("b")
    evs = rig.run({"a": speech(200, 400, 400), "b": speech(200, 400, 400)})
    a = [e for e in evs if e.call_id == "a"]
    b = [e for e in evs if e.call_id == "b"]
    assert [e.KIND for e in a] == ["start", "falling", "stop"]
    assert a[1].pos == a[2].pos and a[1].at < a[2].at
    assert [e.KIND for e in b] == ["start", "stop"]


def test_smart_turn_jobs_queue_by_deadline_and_a_newer_request_supersedes_the_queued_one(rig):
    """The worker starts the analysis whose deadline comes first (not the first to arrive) and
    a newer request for the same call replaces its queued older one (answered ``superseded``)."""
    from workers.jobs import JobLane

    lane = JobLane("jobs", rig.w.dispatch.run_job, rig.w.notify, threads=1, capacity=8)  # not started: jobs stay queued
    rig.w.dispatch.jobs, rig.w.dispatch.smart = lane, object()  # type: ignore[assignment]
    for c in ("a", "b"):
        rig.call(c)
        assert isinstance(rig.attach(c), Attached)
    rig.run({"a": [False] * 25, "b": [False] * 25})  # 500 ms of in16 each
    now = time.monotonic_ns()
    for call_id, end, deadline_ms in (("a", 1600, 900), ("b", 800, 700), ("a", 6400, 500)):
        rig.cid += 1
        rig.sub.send(encode(SmartTurnRequest(call_id=call_id, end_pos=end, deadline_ns=now + deadline_ms * 10**6),
                            cid=rig.cid))
        assert rig.w.sock.poll(2000)
        rig.w.dispatch.drain_inbox(rig.w.sock)
    queued = sorted(lane._queue)
    assert [(j.call_id, j.args["end_pos"]) for _, _, j in queued] == [("a", 6400), ("b", 800)]
    assert queued[0][0] == now + 500 * 10**6  # ordered by the request's deadline
    rig.w.dispatch.send_job_results()
    r = rig.recv(lambda f: isinstance(f, ErrorReply))
    assert r.kind == "superseded" and r.call_id == "a" and lane.counters["superseded"] == 1
    assert rig.w.stats.errors.get("superseded") == 1
    rig.w.dispatch.jobs = None


def test_a_cancelled_smart_turn_analysis_still_queued_never_runs_and_is_answered_cancelled(rig):
    """SmartTurnCancel names the analysis by call and end position: the sender's queued job
    leaves the queue (its request answered ``cancelled``, counted); another call's, another
    position's and another sender's stay."""
    from workers.jobs import JobLane

    lane = JobLane("jobs", rig.w.dispatch.run_job, rig.w.notify, threads=1, capacity=8)  # not started
    rig.w.dispatch.jobs, rig.w.dispatch.smart = lane, object()  # type: ignore[assignment]
    for c in ("a", "b"):
        rig.call(c)
        assert isinstance(rig.attach(c), Attached)
    rig.run({"a": [False] * 25, "b": [False] * 25})
    far = time.monotonic_ns() + 10**9
    for call_id, end in (("a", 1600), ("b", 1600)):
        rig.cid += 1
        rig.sub.send(encode(SmartTurnRequest(call_id=call_id, end_pos=end, deadline_ns=far), cid=rig.cid))
        assert rig.w.sock.poll(2000)
        rig.w.dispatch.drain_inbox(rig.w.sock)
    a_cid = rig.cid - 1
    rig.send(SmartTurnCancel(call_id="a", end_pos=800))  # not the queued analysis's position
    assert lane.queued == 2 and lane.counters["cancelled"] == 0
    other = make_socket(rig.ctx, zmq.DEALER, identity=b"sub-1")
    other.connect(rig.w.endpoint)
    try:
        other.send(encode(SmartTurnCancel(call_id="a", end_pos=1600)))  # not the requester
        assert rig.w.sock.poll(2000)
        rig.w.dispatch.drain_inbox(rig.w.sock)
    finally:
        other.close(0)
    assert lane.queued == 2
    rig.send(SmartTurnCancel(call_id="a", end_pos=1600))
    assert [j.call_id for _, _, j in lane._queue] == ["b"] and lane.counters["cancelled"] == 1
    rig.w.dispatch.send_job_results()
    got = None
    deadline = time.monotonic() + 2
    while got is None and time.monotonic() < deadline:
        if rig.sub.poll(50):
            f, cid = decode_env(rig.sub.recv())
            if isinstance(f, ErrorReply):
                got = (f, cid)
    assert got is not None
    assert got[0].kind == "cancelled" and got[0].call_id == "a" and got[1] == a_cid  # the request's answer
    assert rig.w.stats.errors.get("cancelled") == 1
    rig.w.dispatch.jobs = None


def hold_the_tick_in_a_named_function(seconds: float) -> None:
    time.sleep(seconds)  # stands for a tick that overran (a slow model run)


def test_the_serve_loop_probe_counts_a_late_tick_and_logs_the_stack_that_held_it(rig, caplog):
    """The worker's loop-stall driver is its own tick: how late each tick runs."""
    import logging
    import threading

    caplog.set_level(logging.WARNING, logger="brisvox.loop")
    tick, n = rig.w.realtime.tick, {"ticks": 0}

    def slow_once() -> None:
        n["ticks"] += 1
        if n["ticks"] == 10:
            hold_the_tick_in_a_named_function(0.4)
        tick()

    rig.w.realtime.tick = slow_once
    stop = threading.Event()
    reports: list[dict] = []
    t = threading.Thread(target=rig.w.run, args=(stop,), kwargs={"report": lambda calls, st: reports.append(st)})
    t.start()
    time.sleep(1.2)
    stop.set()
    t.join(5)
    p = rig.w.probe
    assert n["ticks"] > 20 and p.lag.count >= n["ticks"] - 1
    assert p.stalls == 1 and p.long_stalls == 1 and p.stacks == 1  # the tick after the held one ran 400 ms late
    assert 0.3 < p.max_lag_s < 0.6
    (line,) = [r.getMessage() for r in caplog.records if "event loop stalled" in r.getMessage()]
    assert "worker-0:" in line and "in hold_the_tick_in_a_named_function" in line
    assert reports and reports[-1]["loop"]["long_stalls"] == 1  # what the worker reports with its pongs


class LingeringBatch(EnergyBatch):
    """EnergyBatch whose speech probability lingers ``hangover`` windows after the energy
    falls, per slot, as Silero's does after a voice stops."""

    def __init__(self, capacity: int, hangover: int) -> None:
        super().__init__(capacity)
        self.hangover = hangover
        self.left = [0] * capacity

    def reset(self, slot: int) -> None:
        self.left[slot] = 0

    def run(self, slots: np.ndarray, windows: np.ndarray) -> np.ndarray:
        out = super().run(slots, windows)
        for i, s in enumerate(int(x) for x in slots):
            if out[i] > 0.5:
                self.left[s] = self.hangover
            elif self.left[s] > 0:
                self.left[s] -= 1
                out[i] = 1.0
        return out


@pytest.fixture(params=[True, False], ids=["vad8k", "vad16k"])
def lingering(request, short_tmp, shm_clean):
    r = Rig(short_tmp, shm_clean, native_8k=request.param)
    r.model = LingeringBatch(8, hangover=3)  # 96 ms of hangover
    r.w.realtime.silero = r.model
    yield r
    r.close()


def test_the_stop_window_is_counted_from_the_voices_end_not_from_the_models_hangover(lingering):
    rig = lingering
    rig.call("a")
    rig.attach("a")
    evs = rig.run({"a": speech(400, 600, 600)})
    assert [e.KIND for e in evs] == ["start", "stop"]
    stop = evs[1]
    assert abs(stop.pos - 1000 * 16) <= 160  # the voice's end (10 ms blocks), not Silero's last window
    # decided by the first window that ends min_silence (200 ms) after it: the model's three
    # windows of hangover would otherwise come on top
    assert 200 * 16 <= stop.at - stop.pos < 200 * 16 + 512
    assert rig.w.stats.end_hints == 1 and rig.w.stats.end_hints_moved == 1


def test_a_silent_calls_deciding_window_is_scored_and_published_as_its_audio_lands(lingering):
    """In a silence the call is due: the worker's loop scores its next window as soon as the
    window's audio is in the ring (no tick), and sends the stop at once."""
    import threading

    rig = lingering
    rig.call("a")
    rig.attach("a")
    evs = rig.run({"a": speech(400, 600, 200)})  # the ticks saw the first silent window after the hangover
    assert [e.KIND for e in evs] == ["start"] and "a" in rig.w.realtime.due
    rig.w.realtime.tick_s = 1.0  # no tick while the rest of the stop window comes in
    ticks = rig.w.stats.ticks
    stop = threading.Event()
    loop = threading.Thread(target=rig.w.run, args=(stop,), daemon=True)
    loop.start()
    got = None
    try:
        for _ in range(20):  # 400 ms of silence at the caller's pace
            rig.feed("a", False)
            t_fed = time.monotonic()
            deadline = t_fed + 0.02
            while got is None and time.monotonic() < deadline:
                if rig.sub.poll(2):
                    f = decode(rig.sub.recv())
                    if isinstance(f, WorkerTick):
                        got = next((e for e in map(from_wire, f.events) if e.KIND == "stop"), None)
            if got is not None:
                break
        ticks_at_stop = rig.w.stats.ticks
    finally:
        stop.set()
        loop.join(2)
    assert got is not None, "no stop before the next tick"
    assert ticks_at_stop == ticks  # scored outside the tick
    assert rig.w.stats.vad_prompt >= 1
    assert 200 * 16 <= got.at - got.pos < 200 * 16 + 512
    assert got.at <= rig.rings["a"]["in16"].write_pos  # in16 holds what the stop was decided on


def test_a_due_call_is_polled_every_millisecond_once_its_window_is_less_than_a_frame_away(lingering):
    """Audio lands a frame (20 ms) at a time: when less than a frame of the due window is
    missing, the frame that completes it may come any moment (1 ms polls); further away
    the loop sleeps until it is that close; with the audio there, at once."""
    rig = lingering
    rig.call("a")
    rig.attach("a")
    rig.run({"a": speech(400, 600, 200)})
    lane = rig.w.realtime
    c = rig.w.calls["a"]
    assert "a" in lane.due
    w = c.inp.src.write_pos
    for missing, want in ((0, 0), (-40, 0), (8, 1), (100, 1), (159, 1), (400, 30), (800, 80)):
        c.need_in = w + missing
        assert lane.due_in_ms() == want, (missing, want)
    lane.due["a"] = (c, 0)  # due for longer than DUE_NS: dropped, nothing is due
    assert lane.due_in_ms() == -1 and not lane.due
