"""The agent file's ``[window]`` table: the request window's budget, turn cap and floor and the
summarizer reach the LLM runner's config; bad values are refused by ``brisvoxd check``
naming the key and its line; no table keeps the defaults (a 16,000-token window, no summary)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisvox.agent.conversation.request import WindowConfig
from brisvox.agent.definition import actor_config, load_agent
from brisvox.agent.pipeline.llm.summarizer import SummaryConfig
from brisvox.cli.brisvoxd import main as brisvoxd

ROOT = Path(__file__).resolve().parents[2]
LOCAL = (ROOT / "configs" / "agents" / "local.toml").read_text()


def _write(tmp_path: Path, table: str) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(LOCAL + "\n" + table)
    return p


def test_no_window_table_keeps_the_defaults() -> None:
    cfg = actor_config(load_agent(ROOT / "configs" / "agents" / "local.toml", env={}))
    assert cfg.llm.request.window == WindowConfig() and cfg.llm.summary == SummaryConfig()
    assert cfg.llm.summary.provider == ""  # no summarizer unless configured


def test_every_key_reaches_the_runner(tmp_path: Path) -> None:
    p = _write(tmp_path, "[window]\nmax_tokens = 3000\nmax_turns = 12\ntool_result_floor_tokens = 100\n"
                         'summary = "agent"\nsummary_timeout = 4.5\nsummary_max_tokens = 300\n')
    cfg = actor_config(load_agent(p, env={}))
    assert cfg.llm.request.window == WindowConfig(max_tokens=3000, max_turns=12, tool_result_floor_tokens=100)
    s = cfg.llm.summary
    assert (s.provider, s.timeout, s.max_tokens) == ("agent", 4.5, 300)
    off = actor_config(load_agent(_write(tmp_path, '[window]\nsummary = "off"\n'), env={}))
    assert off.llm.summary.provider == "" and off.llm.request.window == WindowConfig()


@pytest.mark.parametrize("table,key", [
    ("[window]\nmax_tokens = -1\n", "window.max_tokens"),
    ("[window]\ntool_result_floor_tokens = 10\n", "window.tool_result_floor_tokens"),
    ('[window]\nsummary = "cheap"\n', "window.summary"),
    ("[window]\nsummary_timeout = 0\n", "window.summary_timeout"),
    ("[window]\nbudget = 3\n", "window.budget"),
])
def test_brisvoxd_check_refuses_bad_values_naming_the_key_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   table: str, key: str) -> None:
    p = _write(tmp_path, table)
    assert brisvoxd(["check", str(p)]) == 2
    out = capsys.readouterr().out
    name = key.split(".")[1]
    line = max(i for i, t in enumerate(p.read_text().splitlines(), 1) if t.startswith(name + " "))
    assert f"{p}:{line}: error: {key}:" in out
