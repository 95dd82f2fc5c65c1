"""Every setting is wired or refused: per-leg voices and models, the pipeline's timing rules.

* A leg's voice or model its provider cannot use is an error of ``brisvoxd check`` naming
  the key (espeak-ng's listed voices, the workers' local models and voice, the shape of a
  network provider's ids); a secondary with none of its own uses its provider's default.
* ``[filler] per_tool`` with ``delay``, ``[turn] early_analysis`` while the workers'
  ``[vad] fall_delay_ms`` is 0, ``[agents] early_smart_turn`` likewise, ``final_wait_ms``
  not below the 3 s Finalize timeout (``finalize > final_wait``) and ``settle_wait_ms``
  above ``analysis_job / 2`` are refused, each with one line naming the key and the fix.
* An agent with tools whose LLM chain has a leg that cannot call tools gets a warning.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from brisvox.agent.definition import actor_config, check_agent_file, load_agent
from brisvox.agent.host.config import AgentsConfig, check_referenced_agents
from brisvox.config.daemon import parse_config
from brisvox.config.errors import ConfigError

BASE = '''name = "t"
system_prompt = "x"
{top}
[stt]
provider = "local_whisper"
{stt}
[llm]
provider = "scripted"
{llm}
[tts]
provider = "local_piper"
{tts}
'''

ESPEAK = shutil.which("espeak-ng") is not None


def check(tmp_path: Path, top: str = "", stt: str = "", llm: str = "", tts: str = "",
          **kw: Any) -> list[tuple[str, str, str]]:
    p = tmp_path / "t.toml"
    p.write_text(BASE.format(top=top, stt=stt, llm=llm, tts=tts), encoding="utf-8")
    _, problems = check_agent_file(p, env={}, **kw)
    return [(x.severity, x.key, x.message) for x in problems]


def errors(problems: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    return [(k, m) for s, k, m in problems if s == "error"]


# -- each leg's own voice and model -----------------------------------------------------------------

@pytest.mark.skipif(not ESPEAK, reason="espeak-ng (Debian package) is not installed")
def test_an_espeak_secondary_with_an_elevenlabs_voice_id_is_refused(tmp_path: Path) -> None:
    tts = '[tts.secondary]\nprovider = "espeak"\nvoice = "21m00Tcm4TlvDq8ikWAM"\n'
    [(key, msg)] = errors(check(tmp_path, tts=tts))
    assert key == "tts.secondary.voice" and "espeak-ng has no voice '21m00Tcm4TlvDq8ikWAM'" in msg
    assert "espeak-ng --voices" in msg


@pytest.mark.skipif(not ESPEAK, reason="espeak-ng (Debian package) is not installed")
@pytest.mark.parametrize("voice", ["en-us", "en", "EN-GB", "de", "en-us+f3", "gmw/en-US"])
def test_espeak_voices_it_lists_are_accepted(tmp_path: Path, voice: str) -> None:
    assert errors(check(tmp_path, tts=f'[tts.secondary]\nprovider = "espeak"\nvoice = "{voice}"\n')) == []


@pytest.mark.skipif(not ESPEAK, reason="espeak-ng (Debian package) is not installed")
def test_an_espeak_secondary_without_a_voice_uses_its_own_default_not_the_primarys(tmp_path: Path) -> None:
    p = tmp_path / "a.toml"
    p.write_text(BASE.format(top="", stt="", llm="", tts="").replace(
        'provider = "local_piper"\n', 'provider = "elevenlabs"\nvoice = "21m00Tcm4TlvDq8ikWAM"\n'
        '[tts.secondary]\nprovider = "espeak"\n'), encoding="utf-8")
    agent = load_agent(p, env={"ELEVENLABS_API_KEY": "k"})
    assert agent.tts.voice == "21m00Tcm4TlvDq8ikWAM"
    assert agent.tts.secondary is not None and agent.tts.secondary.voice == ""
    from brisvox.providers.registry import CallEnv, build

    tts = build("tts", agent.tts, CallEnv("c", env={"ELEVENLABS_API_KEY": "k"}))
    prim, sec = tts.legs.legs
    assert prim.own["voice"] == "21m00Tcm4TlvDq8ikWAM" and sec.own["voice"] == ""
    assert sec.provider.voice == "en-us"  # config.voice "" -> the adapter's own


@pytest.mark.parametrize(("tts", "key", "part"), [
    ('voice = "alloy"\n', "tts.voice", "local_piper has no voice 'alloy'"),
    ('[tts.secondary]\nprovider = "elevenlabs"\nvoice = "alloy"\n', "tts.secondary.voice",
     "is not an ElevenLabs voice id"),
    ('[tts.secondary]\nprovider = "cartesia"\nvoice = "21m00Tcm4TlvDq8ikWAM"\n', "tts.secondary.voice",
     "is not a Cartesia voice id"),
    ('[tts.secondary]\nprovider = "openai_tts"\nvoice = "en-us"\n', "tts.secondary.voice",
     "is not an OpenAI voice name"),
    ('[tts.secondary]\nprovider = "elevenlabs"\nmodel = "gpt-4o-mini-tts"\n', "tts.secondary.model",
     "is not an ElevenLabs model id"),
    ('[tts.secondary]\nprovider = "scripted_tts"\nvoice = "x"\n', "tts.secondary.voice", "has no voices"),
])
def test_a_voice_or_model_of_another_provider_is_refused(tmp_path: Path, tts: str, key: str, part: str) -> None:
    [(k, msg)] = errors(check(tmp_path, tts=tts))
    assert k == key and part in msg


def test_local_stt_and_llm_models_are_the_ones_the_workers_install(tmp_path: Path) -> None:
    out = errors(check(tmp_path, stt='model = "nova-3"\n[stt.secondary]\nprovider = "deepgram"\nmodel = "nova 3"\n',
                       llm='[llm.secondary]\nprovider = "local_llm"\nmodel = "gpt-4.1-mini"\n'))
    keys = {k for k, _ in out}
    assert keys == {"stt.model", "stt.secondary.model", "llm.secondary.model"}, out
    assert any("unknown local_whisper model 'nova-3'" in m for _, m in out)
    assert any("unknown local model 'gpt-4.1-mini'" in m for _, m in out)


def test_a_local_whisper_leg_hears_english_only(tmp_path: Path) -> None:
    [(k, msg)] = errors(check(tmp_path, top='language = "de"'))
    assert k == "language" and "transcribes en only" in msg  # the leg took the agent's language
    [(k, _)] = errors(check(tmp_path, stt='language = "fr"\n'))
    assert k == "stt.language"


# -- the timing rules and silent settings --------------------------------------------------------

def test_per_tool_with_delay_is_refused(tmp_path: Path) -> None:
    [(k, msg)] = errors(check(tmp_path, top="[filler]\nper_tool = true\ndelay = 1.0\n"))
    assert k == "filler.delay" and "remove delay, or set per_tool = false" in msg
    assert errors(check(tmp_path, top="[filler]\nper_tool = true\n")) == []
    assert errors(check(tmp_path, top="[filler]\ndelay = 1.0\n")) == []


def test_early_analysis_needs_falling_events(tmp_path: Path) -> None:
    top = "[turn]\nsmart_turn = true\nearly_analysis = true\n"
    [(k, msg)] = errors(check(tmp_path, top=top, fall_delay_ms=0))
    assert k == "turn.early_analysis" and "[vad] fall_delay_ms" in msg
    assert errors(check(tmp_path, top=top, fall_delay_ms=100)) == []
    alone = check(tmp_path, top=top)  # no daemon config known: a warning that says what it needs
    assert [(s, k) for s, k, _ in alone] == [("warning", "turn.early_analysis")]
    [(k, msg)] = errors(check(tmp_path, top="[turn]\nsmart_turn = false\nearly_analysis = true\n"))
    assert k == "turn.early_analysis" and "smart_turn = false" in msg


def test_a_daemon_config_checks_early_analysis_against_the_workers_vad(tmp_path: Path) -> None:
    (tmp_path / "a.toml").write_text(BASE.format(top="[turn]\nearly_analysis = true\n", stt="", llm="", tts=""))
    cfg = parse_config({"agents": {"agents_dir": str(tmp_path), "default_agent": "a"},
                        "websocket": {"enabled": True}}, str(tmp_path / "brisvoxd.toml"))
    errs, _ = check_referenced_agents(cfg)
    assert len(errs) == 1 and "turn.early_analysis" in errs[0] and "fall_delay_ms" in errs[0], errs
    ok = parse_config({"agents": {"agents_dir": str(tmp_path), "default_agent": "a"},
                       "websocket": {"enabled": True}, "vad": {"fall_delay_ms": 100}})
    assert check_referenced_agents(ok)[0] == []
    daemon = parse_config({"agents": {"agents_dir": str(tmp_path), "default_agent": "a", "early_smart_turn": True},
                           "websocket": {"enabled": True}})
    errs, _ = check_referenced_agents(daemon)
    assert any(e.startswith("agents.early_smart_turn: needs the workers' [vad] fall_delay_ms > 0") for e in errs)


def test_early_finalize_needs_falling_events_and_reaches_the_stt_stage(tmp_path: Path) -> None:
    top = "[turn]\nearly_finalize = true\n"
    [(k, msg)] = errors(check(tmp_path, top=top, fall_delay_ms=0))
    assert k == "turn.early_finalize" and "[vad] fall_delay_ms" in msg
    assert errors(check(tmp_path, top=top, fall_delay_ms=100)) == []
    assert [(s, k) for s, k, _ in check(tmp_path, top=top)] == [("warning", "turn.early_finalize")]
    (tmp_path / "a.toml").write_text(BASE.format(top=top, stt="", llm="", tts=""))
    assert actor_config(load_agent(tmp_path / "a.toml")).stt.early_finalize is True
    daemon = parse_config({"agents": {"agents_dir": str(tmp_path), "default_agent": "a", "early_finalize": True},
                           "websocket": {"enabled": True}})
    errs, _ = check_referenced_agents(daemon)
    assert any(e.startswith("agents.early_finalize: needs the workers' [vad] fall_delay_ms > 0") for e in errs)
    on = AgentsConfig.from_section({"early_finalize": True}, "agents").actor_config()
    assert on.stt.early_finalize is True
    assert AgentsConfig.from_section({}, "agents").actor_config().stt.early_finalize is False
    off = BASE.format(top="[turn]\nearly_finalize = false\n", stt="", llm="", tts="")
    (tmp_path / "a.toml").write_text(off)
    assert actor_config(load_agent(tmp_path / "a.toml"), on).stt.early_finalize is False  # the file wins


@pytest.mark.parametrize(("key", "value", "ok"), [
    ("final_wait_ms", 2999, True), ("final_wait_ms", 3000, False), ("final_wait_ms", 5000, False),
    ("settle_wait_ms", 500, True), ("settle_wait_ms", 501, False), ("settle_wait_ms", 2000, False),
])
def test_final_wait_and_settle_wait_fit_their_fixed_bounds(key: str, value: int, ok: bool) -> None:
    if ok:
        AgentsConfig.from_section({key: value}, "agents")
        return
    with pytest.raises(ConfigError) as e:
        AgentsConfig.from_section({key: value}, "agents")
    assert e.value.key == f"agents.{key}"
    rule = "finalize > final_wait" if key == "final_wait_ms" else "settle_wait <= analysis_job / 2"
    fix = "set final_wait_ms below 3000" if key == "final_wait_ms" else "set settle_wait_ms to 500 or less"
    assert rule in str(e.value) and fix in str(e.value)


def test_the_late_final_extension_ends_at_the_finalize_timeout() -> None:
    cfg = AgentsConfig.from_section({"final_wait_ms": 2000}, "agents").actor_config()
    assert cfg.turn.final_wait + cfg.turn.late_final_wait == pytest.approx(cfg.stt.timeouts.finalize)
    assert AgentsConfig().actor_config().turn.late_final_wait == pytest.approx(1.5)


# -- a tool agent whose chain has a leg that cannot call tools ----------------------------------------

def test_a_tool_agent_failing_over_to_the_local_llm_gets_a_warning(tmp_path: Path) -> None:
    out = check(tmp_path, top='tools = ["end_call"]', llm='[llm.secondary]\nprovider = "local_llm"\n')
    assert errors(out) == []
    [(sev, k, msg)] = [x for x in out if x[1].startswith("llm")]
    assert (sev, k) == ("warning", "llm.secondary.provider")
    assert "local_llm cannot call tools" in msg and "end_call" in msg
    assert [x for x in check(tmp_path, llm='[llm.secondary]\nprovider = "local_llm"\n')
            if x[1].startswith("llm")] == []  # no tools: nothing lost
