"""Smart Turn v3.2: end-of-turn probability from the last 8 s of a call's 16 kHz audio.

Owns the ONNX session of the Smart Turn model and the analysis of one
snapshot: features (:func:`workers.mel.log_mel`), one inference, the
probability (the model's output is already a probability; > 0.5 means the
turn is complete).

Invariants: one session per :class:`SmartTurnModel`, used by one thread at a
time (the job lane's thread); onnxruntime threads are explicit (1 by default:
measured 27 ms per analysis, batching does not help).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workers import mel

WINDOW_SAMPLES = mel.WINDOW_SAMPLES


@dataclass(frozen=True, slots=True)
class TurnVerdict:
    probability: float
    features_us: int
    inference_us: int


def ort_session(path: Path, threads: int = 1) -> Any:
    """An onnxruntime CPU session with explicit thread counts."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class SmartTurnModel:
    """The loaded model. ``analyze`` takes int16 or float 16 kHz audio (any length)."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        self.path = path
        self.session = ort_session(path, threads)
        inp = self.session.get_inputs()[0]
        if inp.name != "input_features" or list(inp.shape[1:]) != [mel.N_MELS, mel.N_FRAMES]:
            raise ValueError(f"{path}: unexpected Smart Turn input {inp.name} {inp.shape}")
        self._out = self.session.get_outputs()[0].name
        self.runs = 0

    def infer(self, features: np.ndarray) -> float:
        """Probability for one ``[80, 800]`` feature matrix."""
        (out,) = self.session.run([self._out], {"input_features": features[None, :, :]})
        self.runs += 1
        return float(out.reshape(-1)[0])

    def analyze(self, audio: np.ndarray) -> TurnVerdict:
        t0 = time.perf_counter_ns()
        feats = mel.log_mel(audio)
        t1 = time.perf_counter_ns()
        p = self.infer(feats)
        t2 = time.perf_counter_ns()
        return TurnVerdict(p, (t1 - t0) // 1000, (t2 - t1) // 1000)

    def warm(self) -> TurnVerdict:
        """One analysis of silence: allocates the session's buffers before the first call."""
        return self.analyze(np.zeros(WINDOW_SAMPLES, dtype=np.int16))
