"""Smart Turn v3.2: end-of-turn probability from the last 8 s of a call's 16 kHz audio.

Owns the ONNX session of the Smart Turn model, the analysis of one snapshot
(features with :class:`workers.mel.LogMel`, one inference, the probability:
the model's output is already a probability, > 0.5 means the turn is
complete) and the install-time recipes of the derived model files the boot
self-benchmark chooses from: :func:`derive_f32_softmax` and
:func:`derive_f32_gelu` (the same edit plus one ``Gelu`` node per GELU).

Why a derived file: the model is int8 QDQ. onnxruntime fuses each attention
layer's ``DequantizeLinear -> Softmax -> QuantizeLinear`` group into a
``QLinearSoftmax`` (lookup-table softmax over 6 x 400 x 400) that costs a
third of an inference, while the same softmax in float32 costs a fraction of
it; onnxruntime has no option to keep one op out of its QDQ fusion. The
recipe writes each such softmax as ``Exp(LogSoftmax(x))``, which onnxruntime
does not fuse, and keeps every Q/DQ node and every int8 op (all 34
``QLinearMatMul`` stay), so the float32 softmax reads exactly the dequantized
scores the fused kernel reads. The derived file is made by ``brisvox models
install`` (:func:`workers.models.derive`), records the source's sha256 and
is verified before use; without it the worker loads the original file and
logs why. Which verified file a worker loads is decided at boot by a short
self-benchmark, cached per host (:mod:`workers.smart_turn_select`).

Invariants: one session per :class:`SmartTurnModel`; ``analyze`` may run on
several job-lane threads at once (onnxruntime's ``run`` is thread-safe, the
feature buffers are per thread); onnxruntime threads are explicit (1 by
default). The recipes are deterministic: the same source bytes give the same
derived bytes.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from workers import mel

log = logging.getLogger("brisvox.workers.smart_turn")

WINDOW_SAMPLES = mel.WINDOW_SAMPLES
DERIVED_NAME = "smart_turn_f32softmax"  # workers.models.DERIVED key
RECIPE = "f32-softmax/2"  # bump when derive_f32_softmax changes: installed files are re-derived
GELU_RECIPE = "f32-softmax-gelu/1"  # derive_f32_gelu: the softmax edit plus one Gelu node per GELU


@dataclass(frozen=True, slots=True)
class TurnVerdict:
    probability: float
    features_us: int
    inference_us: int


def ort_session(path: Path, threads: int = 1, optimized_path: Path | None = None) -> Any:
    """An onnxruntime CPU session with explicit thread counts.

    Measured on Smart Turn (1 thread, 50 runs each): ENABLE_ALL and ENABLE_EXTENDED
    are equal, BASIC is 2.5x slower; denormals-as-zero, GELU approximation, QDQ
    cleanup, no spinning, no memory pattern or arena change nothing measurable;
    ``session.x64quantprecision`` costs +50 %, disabling prepacking +5 %.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = max(1, threads)
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    # no CPU arena: the arena keeps the high-water of the largest batch (the VAD runs every call's
    # window in one batch) for the life of the process; through malloc the memory goes back to
    # the kernel when the worker is idle (brisvox/runtime/memory.py). Measured on Silero VAD, 300
    # runs: batch 1 / 25 / 100 take 0.066 / 0.73 / 2.82 ms without it, 0.066 / 0.72 / 2.80 with it.
    so.enable_cpu_mem_arena = False
    if optimized_path is not None:
        so.optimized_model_filepath = str(optimized_path)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


class SmartTurnModel:
    """The loaded model. ``analyze`` takes int16 or float 16 kHz audio (any length).

    ``path`` is the verified original model file. ``select=True`` loads the
    file the boot self-benchmark chose (:func:`workers.smart_turn_select.choose`:
    the cheapest verified candidate on this host, cached per host); otherwise
    the float32-softmax file derived from it is loaded when it is present and
    verified (``derived=False`` forces the original). ``loaded`` names the
    file in use, ``label`` its candidate name ("int8", "f32softmax", ...) and
    ``choice`` the benchmark's record (None without ``select``).
    """

    def __init__(self, path: Path, threads: int = 1, derived: bool = True, select: bool = False) -> None:
        from workers import models

        self.path = path
        self.loaded = path
        self.label = "int8"
        self.choice: Any = None
        session: Any = None
        if select:
            from workers.smart_turn_select import choose

            t0 = time.perf_counter()
            ch = self.choice = choose(path, threads)
            self.loaded, self.label, session = ch.path, ch.label, ch.session
            how = "cached for this host" if ch.cached else f"measured in {time.perf_counter() - t0:.2f} s"
            table = ", ".join(f"{k} {v:.1f} ms" for k, v in ch.table.items())
            log.info("Smart Turn: loading %s (%s: %.1f ms per inference; %s, %d thread(s))%s", ch.path.name,
                     ch.label, ch.ms, table, threads, f"; {how}" + "".join(
                         f"; {k} not a candidate: {v}" for k, v in ch.rejected.items()))
        elif derived:
            alt, why = models.derived_for(DERIVED_NAME, path)
            if alt is not None:
                self.loaded, self.label = alt, DERIVED_NAME.removeprefix("smart_turn_")
                log.info("Smart Turn: loading %s (float32 softmax, derived from %s)", alt.name, path.name)
            else:
                log.warning("Smart Turn: loading the original %s (%s)", path.name, why)
        self.session = session if session is not None else ort_session(self.loaded, threads)
        inp = self.session.get_inputs()[0]
        if inp.name != "input_features" or list(inp.shape[1:]) != [mel.N_MELS, mel.N_FRAMES]:
            raise ValueError(f"{self.loaded}: unexpected Smart Turn input {inp.name} {inp.shape}")
        self._out = self.session.get_outputs()[0].name
        self._local = threading.local()
        self.runs = 0

    @property
    def is_derived(self) -> bool:
        return self.loaded != self.path

    def features(self, audio: np.ndarray) -> np.ndarray:
        """``[80, 800]`` float32 features with this thread's :class:`mel.LogMel`."""
        ext = getattr(self._local, "mel", None)
        if ext is None:
            ext = self._local.mel = mel.LogMel()
        return ext(audio)

    def infer(self, features: np.ndarray) -> float:
        """Probability for one ``[80, 800]`` feature matrix."""
        (out,) = self.session.run([self._out], {"input_features": features[None, :, :]})
        self.runs += 1
        return float(out.reshape(-1)[0])

    def analyze(self, audio: np.ndarray) -> TurnVerdict:
        t0 = time.perf_counter_ns()
        feats = self.features(audio)
        t1 = time.perf_counter_ns()
        p = self.infer(feats)
        t2 = time.perf_counter_ns()
        return TurnVerdict(p, (t1 - t0) // 1000, (t2 - t1) // 1000)

    def warm(self) -> TurnVerdict:
        """One analysis of silence: allocates the session's buffers before the first call."""
        return self.analyze(np.zeros(WINDOW_SAMPLES, dtype=np.int16))


# -- the install-time recipe ----------------------------------------------------------------------


def derive_f32_softmax(src: Path, dst: Path, source_sha256: str) -> list[str]:
    """Write ``src`` with every QDQ softmax taken out of onnxruntime's fusion to ``dst``.

    A Softmax qualifies when its input is a ``DequantizeLinear`` and its output
    feeds only a ``QuantizeLinear`` (each used only there): the pattern
    onnxruntime fuses into ``QLinearSoftmax``. The edit keeps every Q/DQ node:

    * ``Softmax(x)`` becomes ``Exp(LogSoftmax(x))`` (same axis; onnxruntime has
      no QDQ fusion for LogSoftmax, so both run in float32 on the dequantized
      scores, exactly the values the fused kernel reads);
    * the ``QuantizeLinear`` after it gets its own scale ``1 / floor(1 / s)``:
      the fused kernel quantizes with ``floor(1 / s)`` steps, not ``1 / s``
      (258 instead of 258.06 here), and the result should match what the
      original file computes in onnxruntime. The ``DequantizeLinear`` after it
      keeps ``s`` (the int8 ``attn @ V`` reads it).

    ``dst`` records ``source_sha256`` and :data:`RECIPE` in its metadata.
    Returns the names of the edited Softmax nodes; raises ``ValueError`` when
    there is none (a model this recipe does not fit). Needs the ``onnx``
    package (install time only).
    """
    import onnx

    model = onnx.load(str(src))
    edited = _f32_softmax(model, src)
    _save(model, dst, RECIPE, source_sha256, {"brisvox.softmax_nodes": ",".join(edited)})
    return edited


def derive_f32_gelu(src: Path, dst: Path, source_sha256: str) -> list[str]:
    """:func:`derive_f32_softmax`'s edit, then every erf GELU written as one ``Gelu`` node.

    The exporter spelled each GELU ``x * (0.5 * (1 + erf(x / sqrt(2))))`` in five
    float32 nodes, and onnxruntime's GELU fusion cannot see it: its QDQ pass gives
    the ``Div`` and the last ``Mul`` each a copy of the ``DequantizeLinear`` that
    produces ``x`` (one per consumer), so the two no longer read the same tensor.
    The edit replaces the five nodes by onnxruntime's ``com.microsoft.Gelu`` (the
    same exact erf formula) on ``x``; onnxruntime then fuses the bias ``Add``
    before the four feed-forward ones into ``BiasGelu``. Every Q/DQ node and every
    int8 op stays. Measured on the real model, 1 thread, interleaved: about 1 ms
    (4 %) cheaper per inference than the float32-softmax file, outputs within 1e-3.

    Returns the edited Softmax nodes' names followed by the new Gelu nodes' names;
    ``ValueError`` when either pattern is absent.
    """
    import onnx

    model = onnx.load(str(src))
    softmaxes = _f32_softmax(model, src)
    gelus = _fused_gelu(model, src)
    _save(model, dst, GELU_RECIPE, source_sha256,
          {"brisvox.softmax_nodes": ",".join(softmaxes), "brisvox.gelu_nodes": ",".join(gelus)})
    return softmaxes + gelus


def _save(model: Any, dst: Path, recipe: str, source_sha256: str, extra: dict[str, str]) -> None:
    import onnx

    for key, value in (("brisvox.recipe", recipe), ("brisvox.source_sha256", source_sha256), *extra.items()):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.checker.check_model(model)
    dst.write_bytes(model.SerializeToString(deterministic=True))


def _graph_maps(g: Any) -> tuple[dict[str, Any], dict[str, list[Any]], set[str], dict[str, Any]]:
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    return producer, consumers, {o.name for o in g.output}, {t.name: t for t in g.initializer}


def _f32_softmax(model: Any, src: Path) -> list[str]:
    """The softmax edit of :func:`derive_f32_softmax`, in place; the edited nodes' names."""
    from onnx import helper, numpy_helper

    g = model.graph
    producer, consumers, graph_outputs, inits = _graph_maps(g)

    def only_consumer(tensor: str, node: Any) -> bool:
        return tensor not in graph_outputs and [id(c) for c in consumers.get(tensor, [])] == [id(node)]

    edited: list[str] = []
    for sm in list(g.node):
        if sm.op_type != "Softmax" or sm.domain not in ("", "ai.onnx"):
            continue
        dq = producer.get(sm.input[0])
        if dq is None or dq.op_type != "DequantizeLinear" or not only_consumer(dq.output[0], sm):
            continue
        outs = consumers.get(sm.output[0], [])
        if sm.output[0] in graph_outputs or len(outs) != 1 or outs[0].op_type != "QuantizeLinear":
            continue
        q = outs[0]
        scale = inits.get(q.input[1])
        if scale is None:
            continue  # a computed scale: the fused kernel would not see a constant either
        s = numpy_helper.to_array(scale).astype(np.float32)
        if s.size != 1 or not float(s.reshape(-1)[0]) > 0.0:
            continue
        steps = np.floor(np.float32(1.0) / s.reshape(-1)[0])
        kernel_scale = numpy_helper.from_array(
            np.array(np.float32(1.0) / np.float32(steps), dtype=np.float32).reshape(s.shape),
            f"{q.input[1]}_qlinearsoftmax_steps")
        g.initializer.append(kernel_scale)
        q.input[1] = kernel_scale.name
        log_out = f"{sm.output[0]}_logsoftmax"
        exp = helper.make_node("Exp", [log_out], [sm.output[0]], name=f"{sm.name}_exp")
        sm.op_type = "LogSoftmax"
        sm.output[0] = log_out
        g.node.insert(list(g.node).index(sm) + 1, exp)
        edited.append(sm.name)
    if not edited:
        raise ValueError(f"{src}: no DequantizeLinear -> Softmax -> QuantizeLinear group to edit")
    return edited


def _fused_gelu(model: Any, src: Path) -> list[str]:
    """The GELU edit of :func:`derive_f32_gelu`, in place: ``Div(x, sqrt 2) -> Erf ->
    Add(1) -> Mul(0.5) -> Mul(x)`` (each intermediate used once) becomes ``Gelu(x)``."""
    from onnx import helper, numpy_helper

    g = model.graph
    producer, consumers, graph_outputs, inits = _graph_maps(g)

    def scalar(name: str) -> float | None:
        t = inits.get(name)
        if t is None:
            p = producer.get(name)
            if p is None or p.op_type != "Constant" or not p.attribute:
                return None
            t = p.attribute[0].t
        a = numpy_helper.to_array(t)
        return float(a.reshape(-1)[0]) if a.size == 1 else None

    def sole(tensor: str, op: str) -> Any:
        c = consumers.get(tensor, [])
        return c[0] if tensor not in graph_outputs and len(c) == 1 and c[0].op_type == op else None

    def other(node: Any, tensor: str) -> float | None:
        rest = [i for i in node.input if i != tensor]
        return scalar(rest[0]) if len(rest) == 1 else None

    replaced: dict[int, Any] = {}  # id(last Mul) -> its Gelu
    dropped: set[int] = set()
    for erf in list(g.node):
        if erf.op_type != "Erf":
            continue
        div = producer.get(erf.input[0])
        if div is None or div.op_type != "Div" or sole(div.output[0], "Erf") is not erf:
            continue
        k = scalar(div.input[1])
        if k is None or abs(k - float(np.sqrt(2.0))) > 1e-5:
            continue
        x = div.input[0]
        add = sole(erf.output[0], "Add")
        if add is None or other(add, erf.output[0]) != 1.0:
            continue
        half = sole(add.output[0], "Mul")
        if half is None or other(half, add.output[0]) != 0.5:
            continue
        last = sole(half.output[0], "Mul")
        if last is None or sorted(last.input) != sorted([x, half.output[0]]):
            continue
        dropped |= {id(div), id(erf), id(add), id(half)}
        replaced[id(last)] = helper.make_node("Gelu", [x], [last.output[0]], domain="com.microsoft",
                                              name=f"{last.name or last.output[0]}_gelu")
    if not replaced:
        raise ValueError(f"{src}: no erf GELU (Div -> Erf -> Add -> Mul -> Mul) to fuse")
    nodes = [replaced.get(id(n), n) for n in g.node if id(n) not in dropped]
    del g.node[:]
    g.node.extend(nodes)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return [n.name for n in replaced.values()]
