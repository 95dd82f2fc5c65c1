"""One validator for every config table: daemon, worker, gateway and agent sections, agent files.

Every section class is declared with ``brisvox.config.schema.section`` (a strict pydantic
dataclass); the agent files' JSON Schema is generated from the same classes, committed, and
agrees with the server on the shipped files and on bad ones.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import jsonschema
import pytest
from pydantic.dataclasses import is_pydantic_dataclass

from brisvox.agent import file_model
from brisvox.agent.definition import check_agent_file
from brisvox.config.daemon import section_parsers

ROOT = Path(__file__).resolve().parents[2]
AGENTS = sorted((ROOT / "configs" / "agents").glob("*.toml"))


def _cls(ref: str) -> type:
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", sorted(section_parsers()))
def test_every_section_of_brisvoxd_toml_is_a_strict_section(name: str) -> None:
    cls = _cls(section_parsers()[name])
    assert is_pydantic_dataclass(cls), f"[{name}] ({cls.__qualname__}) is not declared with @section"
    assert cls.__pydantic_config__.get("extra") == "forbid"


def test_the_committed_agent_schema_is_the_generated_one() -> None:
    assert file_model.SCHEMA_PATH.read_text(encoding="utf-8") == file_model.render(), (
        "brisvox/config/agent.schema.json is stale: run python -m brisvox.agent.file_model")
    assert file_model.main(["--check"]) == 0


def test_the_generated_schema_is_valid_draft_2020_12() -> None:
    jsonschema.Draft202012Validator.check_schema(file_model.json_schema())


@pytest.mark.parametrize("path", AGENTS, ids=lambda p: p.name)
def test_shipped_agent_files_pass_the_server_and_the_editor_schema(path: Path) -> None:
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    editor = jsonschema.Draft202012Validator(file_model.json_schema())
    assert [e.message for e in editor.iter_errors(data)] == []
    agent, problems = check_agent_file(path, env={}, load_modules=False)
    assert [p for p in problems if p.severity == "error"] == [] and agent is not None


BAD = [  # (the file's first lines, the key, the line named, what the message says)
    ('system_prompt = "x"\nvoise = "a"\n', "voise", 2, "unknown key"),
    ('system_prompt = "x"\n[llm]\nprovider = "openai"\napi_key = "sk-1"\n', "llm.api_key", 4,
     "never read from the file"),
    ('system_prompt = "x"\n[llm]\nprovider = "openai"\n[llm.options]\ntoken = "t"\n', "llm.options.token", 5,
     "never read from the file"),
    ('system_prompt = "x"\n[llm]\nprovider = "gpt"\n', "llm.provider", 3, "unknown provider 'gpt'"),
    ('system_prompt = "x"\n[turn]\nsilence = 9\n', "turn.silence", 3, "must be <= 5"),
    ('system_prompt = "x"\n[turn]\nsmart_turn = 1\n', "turn.smart_turn", 3, "expected true or false"),
    ('system_prompt = "x"\ntools = ["a", "a"]\n', "tools.1", 2, "listed twice"),
    ('system_prompt = "x"\n[flow]\nstart = "a"\n[flow.nodes.a]\nrole = "r"\n', "flow.nodes.a.task", 4,
     "required"),
]
TTS = '[tts]\nprovider = "espeak"\n'


@pytest.mark.parametrize(("body", "key", "line", "fragment"), BAD, ids=[b[1] for b in BAD])
def test_bad_agent_files_are_refused_by_both_naming_key_and_line(tmp_path: Path, body: str, key: str, line: int,
                                                                fragment: str) -> None:
    rest = '[stt]\nprovider = "scripted_stt"\n' + ("" if "[llm]" in body else '[llm]\nprovider = "scripted"\n')
    text = body + TTS + rest
    p = tmp_path / "a.toml"
    p.write_text(text)
    _, problems = check_agent_file(p, env={}, load_modules=False)
    found = {pr.key: pr for pr in problems}
    assert key in found, problems
    assert fragment in found[key].message and found[key].line == line
    editor = jsonschema.Draft202012Validator(file_model.json_schema())
    assert list(editor.iter_errors(tomllib.loads(text))), "the editor schema lets the bad file through"


def test_cascade_or_speech_to_speech_is_one_rule(tmp_path: Path) -> None:
    p = tmp_path / "a.toml"
    p.write_text('system_prompt = "x"\n' + TTS)
    _, problems = check_agent_file(p, env={}, load_modules=False)
    assert [(pr.key, pr.message.split(",")[0]) for pr in problems] == [("(file)", "an agent has [stt] and [llm]")]
