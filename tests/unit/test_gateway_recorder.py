"""Call recording (brisvox/gateway/core/recorder.py): one stereo WAV per call, the caller left, the bot
right as released by the pacer (nothing past a Clear's cut), both on one timeline; a full queue
drops and counts; a write error is counted, logged once and never reaches the call; files 0600
in a 0700 directory; the call records' retention; the agent's ``[recording]`` instruction."""

from __future__ import annotations

import errno
import logging
import os
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import zmq

from brisvox.agent.definition import check_agent_file
from brisvox.agent.host.call_build import recording_of, recordings_default
from brisvox.gateway.config import GatewayConfig, GatewaySettings, SipConfig, WebSocketConfig
from brisvox.gateway.core import recorder as R
from brisvox.gateway.core.pacer import FRAME_S
from brisvox.gateway.transports import assemble
from ipc import frames as F
from tests.unit.test_gateway_pacer import Agent, FakeLeg, FakeLoop, activate

ROOT = Path(__file__).resolve().parents[2]


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def read_wav(path: Path) -> tuple[int, np.ndarray, np.ndarray]:
    with wave.open(str(path), "rb") as w:
        assert w.getnchannels() == 2 and w.getsampwidth() == 2
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        return w.getframerate(), x[0::2], x[1::2]


def only(d: Path) -> Path:
    files = sorted(d.glob("*.wav"))
    assert len(files) == 1, files
    return files[0]


def ramp(n: int, start: int) -> np.ndarray:
    return ((np.arange(n) + start) % 20000 + 1).astype(np.int16)  # never 0: silence is visible


@pytest.mark.parametrize("rate", [8000, 16000])
def test_both_sides_on_one_timeline_at_the_call_rate(tmp_path, rate):
    clock = Clock()
    rec = R.Recorder(clock=clock)
    h = rec.open("c1", rate, {"dir": str(tmp_path), "keep_days": 30})
    frame = rate // 50
    caller = ramp(frame * 100, 0)  # 2 s, one 20 ms packet per 20 ms, each ending at its stamp
    bot_at = 50  # the bot speaks 0.5 s in: released frames 50..59
    for k in range(100):
        clock.t = 100.0 + (k + 1) * FRAME_S
        h.caller(caller[k * frame:(k + 1) * frame])
        if bot_at <= k + 1 < bot_at + 10:
            h.bot(np.full(frame, 7000, dtype=np.int16))
        if k % 7 == 0:
            rec.drain()  # the writer's batches fall anywhere
    h.close()
    rec.drain()
    got_rate, left, right = read_wav(only(tmp_path))
    assert got_rate == rate and len(left) == len(caller)
    assert np.array_equal(left, caller)
    nz = np.flatnonzero(right)
    assert nz[0] == bot_at * frame and len(nz) == 10 * frame and np.all(right[nz] == 7000)
    assert rec.stats()["recordings_written"] == 1 and rec.errors == 0 and rec.dropped == 0


def test_a_silent_side_is_padded_so_nothing_waits_for_it(tmp_path):
    """Caller audio of a silent bot is written before the call ends (the bot padded HOLD_S behind)."""
    clock = Clock()
    rec = R.Recorder(clock=clock)
    h = rec.open("c2", 8000, {"dir": str(tmp_path), "keep_days": 0})
    for k in range(100):
        clock.t = 100.0 + (k + 1) * FRAME_S
        h.caller(ramp(160, k * 160))
    rec.drain()
    _, left, right = read_wav(only(tmp_path))  # readable mid-call: the header follows the writes
    assert len(left) >= 8000 * (2.0 - R.HOLD_S) - 160 and not right.any()
    h.close()
    rec.drain()
    _, left, _ = read_wav(only(tmp_path))
    assert len(left) == 16000


def test_a_caller_gap_beyond_the_jitter_slack_is_silence_jitter_within_it_is_not(tmp_path):
    clock = Clock()
    rec = R.Recorder(clock=clock)
    h = rec.open("c3", 8000, {"dir": str(tmp_path), "keep_days": 0})
    clock.t = 100.02
    h.caller(ramp(160, 0))
    clock.t = 100.04 + 0.05  # 50 ms late: jitter, appended right after
    h.caller(ramp(160, 160))
    clock.t = 100.06 + 0.5  # nothing for half a second: a gap
    h.caller(ramp(160, 320))
    h.close()
    rec.drain()
    _, left, _ = read_wav(only(tmp_path))
    assert np.array_equal(left[:320], ramp(320, 0))
    assert not left[320:round(0.54 * 8000)].any()
    assert np.array_equal(left[-160:], ramp(160, 320)) and len(left) == round(0.56 * 8000)


@pytest.fixture
def rig(shm_clean, tmp_path):
    ctx = zmq.Context()
    settings = GatewaySettings(GatewayConfig(max_calls=2, ring_seconds=2.0), SipConfig(enabled=False),
                               WebSocketConfig(enabled=False))
    core = assemble(settings, instance=shm_clean, ctx=ctx)
    loop = FakeLoop(10.0)
    core.pacer._loop = loop
    core.recorder.clock = loop.time
    call = core.admit("native", "echo", 8000)
    leg = FakeLeg()
    call.leg = leg
    call.builtin = Agent()
    activate(call)
    core.pacer.add(call)
    call.recording = core.recorder.open(call.call_id, 8000, {"dir": str(tmp_path / "rec"), "keep_days": 30})
    yield core, call, leg, loop
    core.table.release(call)
    ctx.term()


def test_only_released_bot_samples_are_recorded_a_clear_cuts_them(rig, tmp_path):
    """Through the real pacer and gate: 2 s of bot audio written, a barge-in Clear after 5 frames;
    the right channel holds exactly the released samples, and what the ring held past the cut
    never appears; the caller's audio (through audio_in) is on the left."""
    core, call, leg, loop = rig
    call.out_ring.write(np.full(16000, 5000, dtype=np.int16))
    caller = ramp(160 * 20, 0)
    for k in range(20):
        loop.t = 10.0 + k * FRAME_S
        core.audio_in(call, caller[k * 160:(k + 1) * 160], 8000)
        core.pacer.service(call, loop.t)
        if k == 4:
            core.apply_clear(call, 0)
    assert call.release_pos == 800 and sum(len(s) for _, s in leg.sent) == 800
    call.builtin = None  # no agent side to stop: the call is released at once
    core.transport_ended(call, "hangup")  # closes the recording
    assert call.recording.closed
    core.recorder.drain()
    _, left, right = read_wav(only(tmp_path / "rec"))
    assert np.count_nonzero(right) == 800 and np.all(right[:800] == 5000)
    assert np.array_equal(left[-len(caller) + 160:], caller[160:])  # the first packet ends at t0
    assert core.stats()["recordings_written"] == 1


def test_a_full_queue_drops_frames_and_counts_them_but_the_file_is_finished(tmp_path):
    rec = R.Recorder(max_items=3, clock=Clock())
    h = rec.open("c4", 8000, {"dir": str(tmp_path), "keep_days": 0})
    for _ in range(5):
        h.caller(ramp(160, 0))
    h.close()  # an instruction: never dropped
    assert rec.dropped == 2 and rec.stats()["recording_frames_dropped"] == 2
    rec.drain()
    assert rec.written == 1 and read_wav(only(tmp_path))[1].size == 480


def test_a_write_error_is_counted_logged_once_and_never_reaches_the_call(tmp_path, monkeypatch, caplog):
    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(wave.Wave_write, "writeframes", full)
    clock = Clock()
    rec = R.Recorder(clock=clock)
    calls = [rec.open(f"c{i}", 8000, {"dir": str(tmp_path), "keep_days": 0}) for i in range(2)]
    with caplog.at_level(logging.ERROR, logger="brisvox.gateway.core.recorder"):
        for k in range(60):
            clock.t = 100.0 + (k + 1) * FRAME_S
            for h in calls:
                h.caller(ramp(160, 0))  # never raises
            rec.drain()
        for h in calls:
            h.close()
        rec.drain()
    assert rec.errors == 2 and rec.written == 0 and rec.stats()["recording_write_errors"] == 2
    lines = [r for r in caplog.records if "recording" in r.getMessage()]
    assert len(lines) == 1 and "No space left" in lines[0].getMessage()


def test_a_directory_that_cannot_be_made_or_written_is_a_counted_error(tmp_path):
    (tmp_path / "afile").write_bytes(b"")
    targets = [tmp_path / "afile" / "rec"]  # under a regular file: NotADirectoryError, even as root
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    if not os.access(ro, os.W_OK):  # not root: permissions are enforced
        targets.append(ro)
    try:
        rec = R.Recorder(clock=Clock())
        for i, d in enumerate(targets):
            h = rec.open(f"c5{i}", 8000, {"dir": str(d), "keep_days": 0})
            h.caller(ramp(160, 0))
            h.close()
        rec.drain()
        assert rec.errors == len(targets) and rec.started == 0 and rec.written == 0
    finally:
        ro.chmod(0o700)


def test_files_are_0600_in_a_0700_directory_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        rec = R.Recorder(clock=Clock())
        h = rec.open("c6", 8000, {"dir": str(tmp_path / "new" / "rec"), "keep_days": 0})
        h.close()
        rec.drain()
    finally:
        os.umask(old)
    f = only(tmp_path / "new" / "rec")
    assert f.stat().st_mode & 0o777 == 0o600 and f.parent.stat().st_mode & 0o777 == 0o700
    assert f.name.endswith("-c6.wav")


def test_retention_is_the_call_records_keep_days(tmp_path):
    old = time.time() - 40 * 86400
    for name in ("20200101T000000-a.wav", "20200101T000000-a.json"):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (old, old))
    (tmp_path / "recent.wav").write_bytes(b"x")
    rec = R.Recorder(clock=Clock())
    rec.open("c7", 8000, {"dir": str(tmp_path), "keep_days": 30}).close()
    rec.drain()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "20200101T000000-a.wav" not in names and "20200101T000000-a.json" in names  # records: the agent's
    assert "recent.wav" in names and rec.pruned == 1


def test_a_bad_instruction_is_refused_and_counted(tmp_path):
    rec = R.Recorder(clock=Clock())
    assert rec.open("c8", 8000, {"dir": "relative/dir", "keep_days": 1}) is None
    assert rec.open("c8", 8000, {"dir": str(tmp_path), "keep_days": "x"}) is None
    assert rec.refused == 2 and rec._thread is None


def test_the_writer_thread_finishes_every_recording_at_stop(tmp_path):
    rec = R.Recorder(flush_s=0.01)
    h = rec.open("c9", 8000, {"dir": str(tmp_path), "keep_days": 0})
    for _ in range(10):
        h.caller(ramp(160, 0))
    time.sleep(0.05)
    rec.stop()
    assert rec.written == 1 and read_wav(only(tmp_path))[1].size >= 1600


# -- the agent's side: [recording] in the agent file, the instruction in CallAccepted ------------


class _Agent:
    def __init__(self, recording: dict) -> None:
        self.recording = recording


def test_the_instruction_is_off_by_default_and_names_an_absolute_directory(tmp_path):
    default = tmp_path / "calls" / "recordings"
    assert recording_of(_Agent({}), lambda: default, 30) is None
    assert recording_of(_Agent({"enabled": False, "path": "/x"}), lambda: default, 30) is None
    assert recording_of(_Agent({"enabled": True}), lambda: default, 30) == {"dir": str(default), "keep_days": 30}
    assert recording_of(_Agent({"enabled": True, "path": "/srv/rec"}), lambda: default, 7)["dir"] == "/srv/rec"
    assert recordings_default("", tmp_path) == tmp_path / "calls" / "recordings"
    assert recordings_default("/var/calls.jsonl", tmp_path) == Path("/var/recordings")
    assert recordings_default("/var/calls", tmp_path) == Path("/var/calls/recordings")


def test_call_accepted_carries_it_across_the_process_boundary():
    f = F.CallAccepted(call_id="c1", worker=0, recording={"dir": "/srv/rec", "keep_days": 30})
    assert F.decode(F.encode(f)) == f
    assert F.decode(F.encode(F.CallAccepted(call_id="c1"))).recording is None


def test_check_names_bad_recording_keys(tmp_path):
    base = (ROOT / "configs" / "agents" / "scripted.toml").read_text()
    good = tmp_path / "good.toml"
    good.write_text(base + '\n[recording]\nenabled = true\npath = "/var/lib/brisvox/rec"\n')
    agent, problems = check_agent_file(good, env={})
    assert agent is not None and not [p for p in problems if p.severity == "error"]
    assert agent.recording == {"enabled": True, "path": "/var/lib/brisvox/rec"}
    bad = tmp_path / "bad.toml"
    bad.write_text(base + '\n[recording]\nenabeld = true\npath = "rec"\n')
    _, problems = check_agent_file(bad, env={})
    keys = {p.key: p for p in problems if p.severity == "error"}
    assert "recording.enabeld" in keys and "unknown key" in keys["recording.enabeld"].message
    assert "recording.path" in keys and keys["recording.path"].line > 0


def test_call_accepted_with_a_recording_opens_it_and_the_transports_end_closes_it(shm_clean, tmp_path):
    """The gateway's side of the instruction: CallAccepted(recording=...) -> recorded from then on."""
    import asyncio

    ctx = zmq.Context()
    settings = GatewaySettings(GatewayConfig(max_calls=2, ring_seconds=2.0), SipConfig(enabled=False),
                               WebSocketConfig(enabled=False))
    core = assemble(settings, instance=shm_clean, ctx=ctx)
    sent: list = []

    async def request(proc, frame, timeout):
        return F.CallAccepted(call_id=frame.call_id, recording={"dir": str(tmp_path), "keep_days": 30})

    core.links.request = request
    core.links.send = lambda proc, frame: sent.append(frame)
    core.peer_load.agents["agent-0"] = 0
    try:
        async def run():
            core.loop = asyncio.get_running_loop()
            call = core.admit("native", "someagent", 8000)
            assert call.agent_proc == "agent-0"
            ready: list = []
            core.start_call(call, FakeLeg(), lambda ok, why: ready.append(ok))
            await asyncio.gather(*list(core._tasks))
            return call, ready

        call, ready = asyncio.run(run())
        assert ready == [True] and call.state == "active" and call.recording is not None
        core.audio_in(call, ramp(160, 0), 8000)
        core.transport_ended(call, "hangup")
        assert call.recording.closed and isinstance(sent[-1], F.CallEnd)
        core.recorder.drain()
        assert read_wav(only(tmp_path))[1].size == 160 and core.recorder.written == 1
    finally:
        for c in list(core.table.calls.values()):
            core.table.release(c)
        core.links.close()
        ctx.term()


def test_a_killed_gateway_leaves_a_readable_file_up_to_its_last_write(tmp_path):
    """The header is patched after every write: a process that dies (os._exit, no close) mid-call
    leaves a WAV every reader opens, holding what was written."""
    import subprocess
    import sys

    code = f"""
import os, numpy as np
from brisvox.gateway.core.recorder import Recorder
t = [100.0]
rec = Recorder(clock=lambda: t[0])
h = rec.open("ck", 8000, {{"dir": {str(tmp_path)!r}, "keep_days": 0}})
for k in range(100):
    t[0] = 100.0 + (k + 1) * 0.02
    h.caller(np.full(160, 1000, dtype=np.int16))
    h.bot(np.full(160, 2000, dtype=np.int16))
    if k % 10 == 9:
        rec.drain()
os._exit(9)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 9, r.stderr
    _, left, right = read_wav(only(tmp_path))
    assert len(left) >= 8000 * (2.0 - R.HOLD_S) - 160
    assert np.all(left == 1000) and np.count_nonzero(right == 2000) >= len(left) - 160
