"""Drive real worker processes without the daemon: call rings, a real-time audio feeder, worker processes.

Owns the scaffolding the worker's system tests and benchmark share (it plays
the gateway and the supervisor): creating and unlinking a call's four rings,
feeding caller audio into ``in`` rings in 20 ms frames on the wall clock
(recording when each frame was published), and starting/stopping
``python -m workers.process`` children. Not used by the daemon.

Invariants: everything created here is removed by its ``close``/``stop``
(rings unlinked, processes killed by pid and reaped), also when a test fails.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ipc.ring import Ring, ring_name

KINDS = ("in", "in16", "tts", "out")
FRAME_MS = 20
ROOT = Path(__file__).resolve().parent.parent


def create_call_rings(instance: str, call_id: str, call_rate: int = 8000, tts_rate: int = 22050,
                      seconds: float = 16.0) -> dict[str, Ring]:
    """The gateway's job: create ``in``, ``in16``, ``tts``, ``out`` for a call."""
    rings: dict[str, Ring] = {}
    try:
        for kind, rate in (("in", call_rate), ("in16", 16000), ("tts", tts_rate), ("out", call_rate)):
            cap = 1 << int(np.ceil(np.log2(rate * seconds)))
            rings[kind] = Ring.create(ring_name(instance, call_id, kind), cap, rate)
    except BaseException:
        close_rings(rings)
        raise
    return rings


def close_rings(rings: dict[str, Ring]) -> None:
    for r in rings.values():
        r.unlink()
        r.close()


class WorkerProc:
    """A ``python -m workers.process`` child, ready once :meth:`start` returns."""

    def __init__(self, index: int, endpoint: str, max_calls: int = 256, extra: list[str] | None = None) -> None:
        self.index = index
        self.endpoint = endpoint
        self.max_calls = max_calls
        self.extra = extra or []
        self.proc: subprocess.Popen[str] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> WorkerProc:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.process", "--index", str(self.index), "--endpoint", self.endpoint,
             "--max-calls", str(self.max_calls), *self.extra],
            stdout=subprocess.PIPE, stderr=None, text=True, env=env, cwd=str(ROOT))
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        os.set_blocking(self.proc.stdout.fileno(), False)
        buf = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker {self.index} exited with {self.proc.returncode} before ready")
            try:
                chunk = self.proc.stdout.read()
            except (BlockingIOError, TypeError):
                chunk = None
            if chunk:
                buf += chunk
                if "READY" in buf:
                    return self
            time.sleep(0.02)
        self.kill()
        raise TimeoutError(f"worker {self.index} not ready within {timeout}s")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL by pid and reap."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        if self.proc is not None:
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                pass

    def stop(self, timeout: float = 5.0) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _feed(names: list[str], audio: np.ndarray, offsets: list[int], frames: int, rate: int,
          times_path: str, t0_ns: int, groups: int) -> None:
    """Feeder process body: call ``c`` is in group ``c % groups``; group ``g``'s frame
    ``k`` is published at ``t0 + k * 20 ms + g * 20 ms / groups`` (calls' packets
    arrive at different phases, as RTP streams do)."""
    rings = [Ring.attach(n) for n in names]
    times = np.memmap(times_path, dtype=np.int64, mode="r+", shape=(frames, groups))
    step = rate * FRAME_MS // 1000
    n_audio = len(audio)
    loop = np.concatenate([audio, audio[: step * 2]])
    members = [[c for c in range(len(rings)) if c % groups == g] for g in range(groups)]
    period = FRAME_MS * 1_000_000
    try:
        for k in range(frames):
            for g in range(groups):
                due = t0_ns + k * period + g * period // groups
                while True:
                    left = due - time.monotonic_ns()
                    if left <= 0:
                        break
                    time.sleep(min(left / 1e9, 0.005))
                times[k, g] = time.monotonic_ns()
                for c in members[g]:
                    s = (offsets[c] + k * step) % n_audio
                    rings[c].write(loop[s : s + step])
    finally:
        times.flush()
        for r in rings:
            r.close()


class Feeder:
    """Feeds ``audio`` (int16 at ``rate``) into ``in`` rings from a separate process.

    Call ``c`` starts ``offsets[c]`` samples into the (looped) audio. Calls are
    spread over ``groups`` publishing phases within each 20 ms period.
    ``write_time_ns(c, pos)`` is when the frame holding ``in`` position
    ``pos`` of call ``c`` was published.
    """

    def __init__(self, ring_names: list[str], audio: np.ndarray, rate: int, seconds: float,
                 offsets: list[int] | None = None, workdir: Path | None = None, groups: int = 10) -> None:
        self.names = ring_names
        self.audio = audio
        self.rate = rate
        self.frames = int(seconds * 1000 / FRAME_MS)
        self.offsets = offsets or [0] * len(ring_names)
        self.step = rate * FRAME_MS // 1000
        self.groups = max(1, min(groups, len(ring_names)))
        wd = workdir or Path("/tmp")
        self.times_path = str(wd / f"feed-{os.getpid()}-{id(self)}.times")
        np.zeros(self.frames * self.groups, dtype=np.int64).tofile(self.times_path)
        self.proc: mp.process.BaseProcess | None = None
        self.t0_ns = 0
        self._times: np.ndarray | None = None

    def start(self, delay_s: float = 0.1) -> None:
        self.t0_ns = time.monotonic_ns() + int(delay_s * 1e9)
        ctx = mp.get_context("fork")
        self.proc = ctx.Process(target=_feed, args=(self.names, self.audio, self.offsets, self.frames,
                                                     self.rate, self.times_path, self.t0_ns, self.groups),
                                daemon=True)
        self.proc.start()

    def join(self, timeout: float | None = None) -> None:
        if self.proc is not None:
            self.proc.join(timeout)

    def times(self) -> np.ndarray:
        """``[frames, groups]`` publish times (0 = not published yet)."""
        return np.fromfile(self.times_path, dtype=np.int64).reshape(self.frames, self.groups)

    def write_time_ns(self, call_index: int, in_pos: int, times: np.ndarray | None = None) -> int:
        """When the sample at ``in`` position ``in_pos`` of that call was published (0: not yet)."""
        t = self.times() if times is None else times
        k = in_pos // self.step
        if not 0 <= k < self.frames:
            return 0
        return int(t[k, call_index % self.groups])

    def stop(self) -> None:
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        try:
            os.unlink(self.times_path)
        except FileNotFoundError:
            pass
