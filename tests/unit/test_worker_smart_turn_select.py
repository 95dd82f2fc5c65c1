"""The boot self-benchmark that picks the Smart Turn file (workers/smart_turn_select.py).

* The candidates are the source file and its verified derived files; a derived
  file that is missing or corrupt is named with the reason and never timed.
* The fastest candidate by median wins, a derived file within the tie margin
  wins over the source; a candidate whose outputs differ from the source's on
  the benchmark inputs is rejected whatever its speed.
* The choice is cached per host key (CPU, onnxruntime, threads, file hashes) in
  the models directory: a second boot creates no session to time; another
  thread count or another file times again; an unwritable directory only
  costs the cache.
* The worker reports the choice as numbers (``smart_turn_model.<label>``,
  ``smart_turn_ms``) so /metrics shows it.
"""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from tests.unit.test_worker_smart_turn import fake_source  # noqa: F401 - the fixture
from workers import models, smart_turn_select
from workers.core import Worker
from workers.smart_turn import SmartTurnModel, ort_session

pytest.importorskip("onnx")


class Slowed:
    """A session whose ``run`` takes ``extra_s`` longer (or answers ``1 - p`` when ``flip``)."""

    def __init__(self, inner, extra_s: float = 0.0, flip: bool = False) -> None:
        self.inner, self.extra_s, self.flip = inner, extra_s, flip

    def get_inputs(self):
        return self.inner.get_inputs()

    def get_outputs(self):
        return self.inner.get_outputs()

    def run(self, names, feeds):
        if self.extra_s:
            time.sleep(self.extra_s)
        out = self.inner.run(names, feeds)
        return [1.0 - out[0]] if self.flip else out


def factory(made: list, slow: str = "", flip: str = "", extra_s: float = 0.004):
    def make(path, threads=1):
        made.append((path.name, threads))
        s = ort_session(path, threads)
        return Slowed(s, extra_s if slow in path.name else 0.0, bool(flip) and flip in path.name)
    return make


@pytest.fixture
def installed(fake_source):  # noqa: F811
    d, _ = fake_source
    models.install(d, names=["fake_st"])
    return models.locate("fake_st", d)


@pytest.mark.serial  # the candidates' timings differ by 4 ms
def test_the_fastest_candidate_wins_and_the_choice_is_cached_per_host(installed):
    made: list = []
    ch = smart_turn_select.choose(installed, session_factory=factory(made, slow="f32softmax"))
    assert ch.label == "int8" and ch.path == installed and not ch.cached and ch.session is not None
    assert set(ch.table) == {"int8", "f32"} and ch.table["f32"] > ch.table["int8"]
    assert sorted(n for n, _ in made) == ["fake-st.f32softmax.onnx", "fake-st.onnx"]
    rec = json.loads((installed.parent / smart_turn_select.CACHE_NAME).read_text())
    assert [e["choice"] for e in rec.values()] == ["int8"]
    made.clear()
    again = smart_turn_select.choose(installed, session_factory=factory(made))
    assert again.cached and again.label == "int8" and again.session is None and made == []
    other = smart_turn_select.choose(installed, threads=2, session_factory=factory(made))
    assert not other.cached and made  # another thread count: timed again


@pytest.mark.serial  # the candidates' timings differ by 4 ms
def test_a_derived_file_within_the_margin_wins_and_a_wrong_one_is_rejected(installed):
    ch = smart_turn_select.choose(installed, use_cache=False, session_factory=factory([], slow="fake-st.onnx"))
    assert ch.label == "f32"
    assert smart_turn_select._pick({"int8": 10.0, "f32": 10.2}) == "f32"
    assert smart_turn_select._pick({"int8": 10.0, "f32": 11.0}) == "int8"
    bad = smart_turn_select.choose(installed, use_cache=False,
                                   session_factory=factory([], slow="fake-st.onnx", flip="f32softmax"))
    assert bad.label == "int8" and "f32" in bad.rejected and "f32" not in bad.table


def test_a_corrupt_derived_file_is_no_candidate_and_a_new_file_times_again(installed):
    smart_turn_select.choose(installed)
    derived = installed.parent / "fake-st.f32softmax.onnx"
    derived.write_bytes(derived.read_bytes()[:-1] + b"\x00")
    made: list = []
    ch = smart_turn_select.choose(installed, session_factory=factory(made))
    assert not ch.cached and ch.label == "int8" and "corrupt" in ch.rejected["f32"]
    assert [n for n, _ in made] == ["fake-st.onnx"]


def test_an_unwritable_models_dir_costs_only_the_cache(installed, monkeypatch):
    def refuse(*a, **kw):
        raise PermissionError("read-only")

    monkeypatch.setattr(smart_turn_select.tempfile, "mkstemp", refuse)
    ch = smart_turn_select.choose(installed)
    assert ch.label in ("int8", "f32") and not (installed.parent / smart_turn_select.CACHE_NAME).exists()


def test_the_model_loads_the_choice_and_the_worker_reports_it_as_numbers(installed):
    m = SmartTurnModel(installed, select=True)
    assert m.loaded == m.choice.path and m.label == m.choice.label and 0.0 <= m.warm().probability <= 1.0
    stats = Worker._smart_turn_stats(SimpleNamespace(smart=m))  # type: ignore[arg-type]
    assert stats == {"smart_turn_model": {m.label: 1}, "smart_turn_ms": m.choice.ms} and m.choice.ms > 0
    assert Worker._smart_turn_stats(SimpleNamespace(smart=None)) == {}  # type: ignore[arg-type]
