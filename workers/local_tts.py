"""Local text-to-speech in an inference worker: the Piper joe voice, synthesized out of process.

Owns :class:`PiperRunner`, the worker's client of the Piper host
(:mod:`workers.piper_host`): it starts the host lazily (one per worker,
started on the TTS lane thread; about 0.4 s to load the voice), sends one
request per job and yields each sentence's PCM (22,050 Hz int16) as soon as
the host has it, so the first sentence plays while the next is synthesized.
A cancelled job stops yielding at the next sentence (the rest of the
answer is read and discarded, keeping the pipe in step). A host that dies or
answers garbage is killed and restarted on the next job; the failing job
ends with an error.

Why a subprocess: piper-tts 1.8 is GPL-3.0-or-later and links espeak-ng into
the process (docs/PROVIDERS.md, "Licenses"); brisvox keeps GPL code out of
its own processes, as it does for the espeak-ng fallback.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

RATE = 22_050
MAX_SENTENCE = 60 * RATE  # a sanity bound on one answer chunk


class PiperError(Exception):
    pass


class PiperRunner:
    def __init__(self, model: Path, config: Path, start_timeout: float = 30.0) -> None:
        self.model = Path(model)
        self.config = Path(config)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.load_s = 0.0
        self.restarts = 0

    def load(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            return
        if self.proc is not None:
            self.restarts += 1
        t0 = time.perf_counter()
        env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "workers.piper_host", str(self.model), str(self.config)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
            close_fds=True,
        )
        try:
            if self._read_int() != 0:
                raise PiperError("the Piper host did not start")
        except PiperError:
            self.close()
            raise
        self.load_s = time.perf_counter() - t0

    def _read_exact(self, n: int) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        buf = bytearray()
        while len(buf) < n:
            chunk = self.proc.stdout.read(n - len(buf))
            if not chunk:
                raise PiperError("the Piper host exited")
            buf += chunk
        return bytes(buf)

    def _read_int(self) -> int:
        return int(struct.unpack("<i", self._read_exact(4))[0])

    def synthesize(self, text: str, speed: float = 1.0, cancelled: Callable[[], bool] = lambda: False,
                   noise: tuple[float, float] | None = None) -> Iterator[np.ndarray]:
        """Each sentence's PCM. ``noise``: (noise_scale, noise_w_scale) instead of the voice's own
        ((0, 0): deterministic output)."""
        self.load()
        assert self.proc is not None and self.proc.stdin is not None
        complete = False
        req: dict[str, object] = {"text": text, "speed": speed}
        if noise is not None:
            req["noise_scale"], req["noise_w_scale"] = noise
        try:
            self.proc.stdin.write(json.dumps(req).encode() + b"\n")
            self.proc.stdin.flush()
            while True:
                n = self._read_int()
                if n == 0:
                    complete = True
                    return
                if n < 0:
                    msg = self._read_exact(-n).decode("utf-8", "replace")
                    complete = True  # the host ended the request itself
                    raise PiperError(msg)
                if n > MAX_SENTENCE:
                    raise PiperError(f"the Piper host sent {n} samples for one sentence")
                pcm = np.frombuffer(self._read_exact(2 * n), dtype="<i2")
                if not cancelled():
                    yield pcm
        except (OSError, struct.error) as e:
            raise PiperError(str(e)) from None
        finally:
            if not complete:  # the pipe is out of step (host died, garbage, consumer left): restart
                self.close()

    def close(self) -> None:
        p, self.proc = self.proc, None
        if p is None:
            return
        for f in (p.stdin, p.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            p.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=1.0)
