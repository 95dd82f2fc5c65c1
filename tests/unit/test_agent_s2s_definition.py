"""Speech-to-speech agent files: the [s2s] section checked, parsed, mapped and built (docs/S2S.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisvox.agent.definition import actor_config, check_agent_file, load_agent
from brisvox.providers.registry import CallEnv, build_call
from brisvox.providers.s2s.gemini_live import GeminiLive
from brisvox.providers.s2s.openai_realtime import OpenAiRealtime

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "agents"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return p


def errors(path: Path) -> list[str]:
    _, problems = check_agent_file(path, env={}, load_modules=False)
    return [f"{p.line}:{p.key}: {p.message}" for p in problems if p.severity == "error"]


@pytest.mark.parametrize("name", ["openai_realtime", "gemini_live"])
def test_the_shipped_s2s_agents_check_and_build(name: str) -> None:
    path = CONFIGS / f"{name}.toml"
    assert errors(path) == []
    agent = load_agent(path)
    assert agent.stt is None and agent.llm is None and agent.s2s is not None and agent.s2s.provider == name
    cfg = actor_config(agent)
    assert cfg.s2s.session.instructions == agent.system_prompt
    assert cfg.s2s.session.model == agent.s2s.model and cfg.s2s.session.voice == agent.s2s.voice
    assert cfg.s2s.turn.turn_detection == "provider"
    provs = build_call(agent, CallEnv("c1", env={"OPENAI_API_KEY": "k", "GEMINI_API_KEY": "k"}))
    assert provs.stt is None and provs.llm is None and provs.tts is not None
    assert isinstance(provs.s2s, OpenAiRealtime if name == "openai_realtime" else GeminiLive)


def test_settings_reach_the_stage_config(tmp_path: Path) -> None:
    p = write(tmp_path, '''system_prompt = "Be brief."
[s2s]
provider = "openai_realtime"
base_url = "ws://127.0.0.1:9/v1/realtime"
turn_detection = "brisvox"
g711_passthrough = true
max_reconnects = 1
fallback_line = "Sorry, goodbye."
[s2s.options]
vad = {threshold = 0.7}
[turn]
smart_turn = false
silence = 0.6
[tts]
provider = "espeak"
''')
    assert errors(p) == []
    cfg = actor_config(load_agent(p))
    s = cfg.s2s
    assert (s.turn.turn_detection, s.turn.smart_turn, s.turn.silence) == ("brisvox", False, 0.6)
    assert s.session.g711_passthrough and s.session.extra == {"vad": {"threshold": 0.7}}
    assert (s.max_reconnects, s.fallback_line) == (1, "Sorry, goodbye.")


@pytest.mark.parametrize(("body", "expect"), [
    ('[s2s]\nprovider = "openai_realtime"\n[stt]\nprovider = "deepgram"\n[llm]\nprovider = "openai"\n',
     "2:s2s: an agent has [stt] and [llm], or a speech-to-speech [s2s]"),
    ('[s2s]\nprovider = "openai_realtime"\nturn_detection = "sometimes"\n',
     "4:s2s.turn_detection: expected one of 'provider', 'brisvox', got 'sometimes'"),
    ('[s2s]\nprovider = "deepgram"\n', "3:s2s.provider: unknown provider 'deepgram'"),
    ('[s2s]\nprovider = "gemini_live"\n[s2s.options]\nvadd = 1\n', "5:s2s.options.vadd: unknown option"),
    ('[s2s]\nprovider = "gemini_live"\n[speculation]\nenabled = true\n',
     "5:speculation.enabled: a speech-to-speech agent has no LLM"),
    ('[s2s]\nprovider = "gemini_live"\napi_key = "sk-1"\n', "4:s2s.api_key: keys are never read from the file"),
    ('[s2s]\nprovider = "gemini_live"\n[filler]\nenabled = true\n', "4:filler: [filler] does not apply"),
    ('[s2s]\nprovider = "gemini_live"\n[window]\nmax_tokens = 4000\n', "4:window: [window] does not apply"),
])
def test_bad_s2s_sections_are_refused_with_the_key_and_line(tmp_path: Path, body: str, expect: str) -> None:
    p = write(tmp_path, 'system_prompt = "x"\n' + body + '[tts]\nprovider = "espeak"\n')
    found = errors(p)
    assert any(e.startswith(expect) for e in found), found
