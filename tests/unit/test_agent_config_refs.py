"""``[agents]``: the default agent, where agent files live, which ones a daemon config names."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from brisvox.agent.host.config import (
    BUILTIN_AGENTS,
    AgentsConfig,
    check_referenced_agents,
    referenced_agents,
)
from brisvox.config.daemon import parse_config
from brisvox.config.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_serve_the_local_agent_from_the_agent_files():
    a = AgentsConfig()
    assert a.providers == "definitions" and a.default_agent == "local"
    assert a.agent_name("default") == "local" and a.agent_name("") == "local"
    assert a.agent_name("scripted") == "scripted"
    assert (BUILTIN_AGENTS / "local.toml").is_file()


@pytest.mark.parametrize("bad", ["default", "echo", "../etc", "a b", ""])
def test_default_agent_must_be_a_file_name(bad):
    with pytest.raises(ConfigError) as e:
        AgentsConfig.from_section({"default_agent": bad}, "agents")
    assert e.value.key == "agents.default_agent"


def test_agents_path_next_to_the_config_else_the_checkout(tmp_path):
    a = AgentsConfig()
    assert a.agents_path(str(tmp_path / "brisvoxd.toml")) == BUILTIN_AGENTS  # no agents/ there
    (tmp_path / "agents").mkdir()
    assert a.agents_path(str(tmp_path / "brisvoxd.toml")) == (tmp_path / "agents").resolve()
    assert AgentsConfig(agents_dir=str(tmp_path)).agents_path(None) == tmp_path


def test_referenced_agents_of_the_shipped_configs():
    cfg = parse_config(tomllib.loads((ROOT / "configs" / "brisvoxd.toml").read_text()),
                       str(ROOT / "configs" / "brisvoxd.toml"))
    refs = referenced_agents(cfg)
    assert {name for _, name in refs} == {"local"}  # echo is built in, "default" is local
    assert ("websocket.routes[0].agent -> agents.default_agent", "local") in refs
    assert check_referenced_agents(cfg) == ([], [])
    bench = parse_config(tomllib.loads((ROOT / "configs" / "brisvoxd.bench.toml").read_text()),
                         str(ROOT / "configs" / "brisvoxd.bench.toml"))
    assert referenced_agents(bench) == [("websocket.routes[0].agent", "bench")]  # SIP is off
    scripted = parse_config({"agents": {"providers": "scripted"}})
    assert referenced_agents(scripted) == []


def test_the_audiosocket_agent_is_checked_when_the_listener_is_on(tmp_path):
    off = parse_config({"websocket": {"enabled": False}, "sip": {"enabled": False},
                        "audiosocket": {"agent": "sales"}})
    assert referenced_agents(off) == []
    on = parse_config({"websocket": {"enabled": False}, "sip": {"enabled": False},
                       "agents": {"agents_dir": str(tmp_path)}, "audiosocket": {"enabled": True, "agent": "sales"}})
    assert referenced_agents(on) == [("audiosocket.agent", "sales")]
    errors, _ = check_referenced_agents(on)
    assert len(errors) == 1 and errors[0].startswith("audiosocket.agent: agent 'sales': no agent file")


def test_smart_turn_timeout_reaches_the_driver_and_stays_below_the_fallback():
    assert AgentsConfig(smart_turn_timeout_ms=800).actor_config(8000).turn.analysis_timeout == 0.8
    capped = AgentsConfig(smart_turn_timeout_ms=1000, fallback_silence_ms=600).actor_config(8000)
    assert capped.turn.analysis_timeout == 0.55
