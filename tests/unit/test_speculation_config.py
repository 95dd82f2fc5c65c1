"""The agent file's ``[speculation]`` table: wired into the runner and the turn driver, and
checked offline by ``brisvoxd check`` (bad values and a provider that cannot stream are
errors naming the key and its line)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from brisvox.agent import definition
from brisvox.agent.definition import actor_config, check_agent_file, load_agent
from brisvox.cli.brisvoxd import main as brisvoxd

ROOT = Path(__file__).resolve().parents[2]
LOCAL = (ROOT / "configs" / "agents" / "local.toml").read_text()


def _write(tmp_path: Path, table: str) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(LOCAL.replace("[speculation]\nenabled = false\n", table))
    assert table in p.read_text()
    return p


def test_the_shipped_agent_leaves_speculation_off():
    cfg = actor_config(load_agent(ROOT / "configs" / "agents" / "local.toml", env={}))
    assert not cfg.llm.speculation.enabled and not cfg.turn.speculation.enabled


def test_every_key_reaches_the_runner_and_the_driver(tmp_path):
    p = _write(tmp_path, "[speculation]\nenabled = true\non_partial = true\npartial_stable_for = 0.1\n"
                         "max_per_turn = 2\nmax_age = 3.0\nmax_buffered_events = 64\n")
    cfg = actor_config(load_agent(p, env={}))
    s = cfg.llm.speculation
    assert s == cfg.turn.speculation
    assert (s.enabled, s.on_partial, s.partial_stable_for, s.max_per_turn, s.max_age, s.max_buffered_events) == (
        True, True, 0.1, 2, 3.0, 64)


@pytest.mark.parametrize("table,key", [
    ("[speculation]\nenabled = true\nmax_buffered_events = 5000\n", "speculation.max_buffered_events"),
    ("[speculation]\nenabled = true\nmax_age = 0\n", "speculation.max_age"),
    ("[speculation]\nenabled = true\nbuffer = 3\n", "speculation.buffer"),
])
def test_brisvoxd_check_refuses_bad_values_naming_the_key_and_line(tmp_path, capsys, table, key):
    p = _write(tmp_path, table)
    assert brisvoxd(["check", str(p)]) == 2
    out = capsys.readouterr().out
    line = next(i for i, t in enumerate(p.read_text().splitlines(), 1) if t.startswith(key.split(".")[1]))
    assert f"{p}:{line}: error: {key}:" in out


def test_speculation_with_a_provider_that_cannot_stream_is_an_error_naming_the_key(tmp_path, monkeypatch):
    p = _write(tmp_path, "[speculation]\nenabled = true\n")
    _, problems = check_agent_file(p, env={})
    assert [x for x in problems if x.severity == "error"] == []
    monkeypatch.setattr(definition, "STREAMING_LLM", frozenset({"openai"}))
    _, problems = check_agent_file(p, env={})
    errs = [x for x in problems if x.severity == "error"]
    assert [e.key for e in errs] == ["llm.provider"]
    assert "cannot stream" in errs[0].message and "speculation.enabled" in errs[0].message
    assert errs[0].line == next(i for i, t in enumerate(p.read_text().splitlines(), 1) if t == "[llm]") + 1
    out = io.StringIO()
    assert definition.check_main(str(p), env={}, out=out) == 2
    # off, the same provider is fine
    p2 = _write(tmp_path, "[speculation]\nenabled = false\n")
    assert definition.check_main(str(p2), env={}, out=io.StringIO()) == 0
