"""``pause_on_candidate`` reaches the turn machine from an agent file, as every
[interruption] key does (schema-checked; on by default, so the shipped agents hold
the bot's audio at a barge-in candidate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisvox.agent.definition import AgentDefError, actor_config, load_agent

ROOT = Path(__file__).resolve().parents[2]
BASE = """system_prompt = "x"
[stt]
provider = "local_whisper"
[llm]
provider = "local_llm"
[tts]
provider = "espeak"
"""


def write(tmp_path: Path, extra: str) -> Path:
    p = tmp_path / "a.toml"
    p.write_text(BASE + extra)
    return p


def test_default_and_shipped_agents_pause_on_candidate():
    local = actor_config(load_agent(ROOT / "configs/agents/local.toml", env={}))
    assert local.turn.turn.interruption.pause_on_candidate is True


def test_the_agent_file_key_switches_it_off(tmp_path):
    agent = load_agent(write(tmp_path, "[interruption]\npause_on_candidate = false\n"), env={})
    icfg = actor_config(agent).turn.turn.interruption
    assert icfg.pause_on_candidate is False and icfg.enabled is True


def test_the_key_is_schema_checked(tmp_path):
    with pytest.raises(AgentDefError) as e:
        load_agent(write(tmp_path, '[interruption]\npause_on_candidate = "yes"\n'), env={})
    assert "pause_on_candidate" in str(e.value)
