"""Agent definitions, tool hosting and the built-in telephony tools.

* Every file in configs/agents/ passes the offline check with NO key set
  (only warnings for unset key variables); local.toml has no warning at all.
* Problems name the key and its LINE: a secret in the file, an unknown key,
  an unknown provider or option, a listed tool nothing provides (fail closed,
  with what would provide it), confirm_tools outside tools or on a ReadOnly
  tool, a bad scripted rule, a TOML syntax error.
* ``brisvoxd check`` entry point (check_main): exit 0 / 2 and one line per problem.
* build_registry registers exactly the listed tools, turns the confirmation
  gate on, refuses an unprovided tool; a module returning the wrong shape or a
  built-in's name is refused.
* Telephony tools send Hangup / SendDtmf / Transfer frames through the port;
  send_dtmf is repeatable, end_call and transfer_call are not; a transfer
  waits for its TransferResult (bounded) and respects transfer_targets.
* The booking example's own guard: one booking per guest and slot across
  calls, a redelivered call gets the same booking.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path
from typing import Any

import pytest

from brisvox.agent.definition import (
    AgentDefError,
    check_agent_file,
    check_main,
    key_lines,
    load_agent,
    parse,
)
from brisvox.agent.tool_engine.builtin import (
    END_CALL,
    SEND_DTMF,
    TRANSFER_CALL,
    LinkTelephony,
    telephony_tools,
)
from brisvox.agent.tool_engine.loader import ToolSetupError, build_registry, load_module_tools
from brisvox.agent.tool_engine.registry import ToolContext, ToolError, ToolKind, ToolSpec
from ipc.frames import Hangup, SendDtmf, Transfer, TransferResult

ROOT = Path(__file__).resolve().parents[2]
AGENTS = sorted((ROOT / "configs" / "agents").glob("*.toml"))


def write(tmp: Path, text: str, name: str = "a.toml") -> Path:
    p = tmp / name
    p.write_text(text)
    return p


BASE = '''name = "t"
system_prompt = "x"
{extra}
[stt]
provider = "local_whisper"

[llm]
provider = "scripted"

[tts]
provider = "espeak"
'''


@pytest.mark.parametrize("path", AGENTS, ids=lambda p: p.name)
def test_shipped_agents_check_offline(path: Path) -> None:
    agent, problems = check_agent_file(path, env={})
    assert agent is not None
    assert [p for p in problems if p.severity == "error"] == []
    for p in problems:  # only what this host lacks: a key variable, the espeak-ng package
        assert p.line > 0 and ("is not set" in p.message or "(Debian package espeak-ng)" in p.message), p


def test_local_agent_needs_no_key() -> None:
    agent, problems = check_agent_file(ROOT / "configs/agents/local.toml", env={})
    assert problems == []
    assert agent is not None and agent.needs_worker_jobs()
    assert (agent.stt.provider, agent.llm.provider, agent.tts.provider) == ("local_whisper", "local_llm", "local_piper")
    assert agent.tts.secondary is not None and agent.tts.secondary.provider == "espeak"


def test_problems_name_their_lines(tmp_path: Path) -> None:
    p = write(tmp_path, '''name = "bad"
system_prompt = "x"
tools = ["lookup_order", "end_call"]
confirm_tools = ["send_dtmf"]
colour = "blue"

[stt]
provider = "deepgram"
api_key = "dg-secret"

[llm]
provider = "anthropc"

[tts]
provider = "cartesia"
[tts.options]
speeed = 1.2
''')
    agent, problems = check_agent_file(p, env={})
    got = {(x.key, x.line) for x in problems if x.severity == "error"}
    assert ("colour", 5) in got
    assert ("stt.api_key", 9) in got
    assert ("llm.provider", 12) in got
    secret = next(x for x in problems if x.key == "stt.api_key")
    assert "never read from the file" in secret.message
    # fix the schema errors: the semantic checks (options, tools) run
    p2 = write(tmp_path, p.read_text().replace('api_key = "dg-secret"', 'api_key_env = "DG"')
               .replace("anthropc", "anthropic").replace('colour = "blue"\n', ""))
    agent, problems = check_agent_file(p2, env={"DG": "x", "ANTHROPIC_API_KEY": "y", "CARTESIA_API_KEY": "z"})
    errs = {(x.key, x.line): x.message for x in problems if x.severity == "error"}
    assert ("tts.options.speeed", 16) in errs
    assert "'lookup_order' is not provided" in errs[("tools", 3)] and "tool_modules" in errs[("tools", 3)]
    assert "'send_dtmf' is not in tools" in errs[("confirm_tools", 4)]


def test_load_agent_fails_closed(tmp_path: Path) -> None:
    p = write(tmp_path, BASE.format(extra='tools = ["book_table"]'))
    with pytest.raises(AgentDefError) as e:
        load_agent(p, env={})
    assert e.value.line == 3 and "book_table" in str(e.value) and f"{p}:3:" in str(e.value)


def test_confirm_on_read_only_and_bad_rule(tmp_path: Path) -> None:
    text = BASE.format(extra='tool_modules = ["../../examples/booking_tools.py:tools"]\n'
                             'tools = ["check_availability"]\nconfirm_tools = ["check_availability"]')
    text += '\n[[llm.options.rules]]\nmatch = "((unclosed"\n'
    d = tmp_path / "configs" / "agents"
    d.mkdir(parents=True)
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "booking_tools.py").write_text((ROOT / "examples" / "booking_tools.py").read_text())
    agent, problems = check_agent_file(write(d, text), env={})
    msgs = {x.key: x.message for x in problems}
    assert "ReadOnly" in msgs["confirm_tools"]
    assert "bad regular expression" in msgs["llm.options.rules.0.match"]


def test_syntax_error_has_a_line(tmp_path: Path) -> None:
    p = write(tmp_path, 'name = "x"\nsystem_prompt = "y\n')
    _, problems = check_agent_file(p, env={})
    assert problems[0].key == "(syntax)" and problems[0].line == 2


def test_check_main_output_and_exit_code(tmp_path: Path) -> None:
    out = io.StringIO()
    assert check_main(str(ROOT / "configs/agents/local.toml"), env={}, out=out) == 0
    assert "ok (agent local" in out.getvalue()
    out = io.StringIO()
    bad = write(tmp_path, BASE.format(extra='tools = ["nope"]'))
    assert check_main(str(bad), env={}, out=out) == 2
    assert f"{bad}:3: error: tools:" in out.getvalue()


def test_key_lines_tables_and_arrays() -> None:
    text = 'a = 1\n[llm]\nprovider = "x"\n[llm.options]\n"quoted key" = 2\n[[llm.options.rules]]\nmatch = "a"\n' \
           '[[llm.options.rules]]\nmatch = "b"\nprompt = """\nx = 1\n"""\nlast = 3\n'
    lines = key_lines(text)
    assert lines["a"] == 1 and lines["llm.provider"] == 3 and lines["llm.options.quoted key"] == 5
    assert lines["llm.options.rules.0.match"] == 7 and lines["llm.options.rules.1.match"] == 9
    assert "llm.options.rules.1.x" not in lines and lines["llm.options.rules.1.last"] == 13


# -- tools ------------------------------------------------------------------------------------------


class Port:
    call_id = "c1"

    def __init__(self) -> None:
        self.frames: list[Any] = []
        self.link = LinkTelephony("c1", self.frames.append)

    def hangup(self, reason: str) -> None:
        self.link.hangup(reason)

    def send_dtmf(self, digits: str) -> None:
        self.link.send_dtmf(digits)

    async def transfer(self, target: str, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        return await self.link.transfer(target, timeout)


def ctx() -> ToolContext:
    return ToolContext("s", 1, "t1.0")


def test_builtin_specs() -> None:
    assert all(s.kind is ToolKind.SIDE_EFFECT for s in (END_CALL, SEND_DTMF, TRANSFER_CALL))
    assert SEND_DTMF.repeatable and not END_CALL.repeatable and not TRANSFER_CALL.repeatable


def test_telephony_tools_send_frames() -> None:
    port = Port()
    tools = {s.name: t for s, t in telephony_tools(port, transfer_targets=("+4930123",))}

    async def main() -> list[Any]:
        out = [await tools["send_dtmf"]({"digits": "1w#"}, ctx()), await tools["end_call"]({}, ctx()),
               await tools["end_call"]({}, ctx())]
        with pytest.raises(ToolError):
            await tools["transfer_call"]({"target": "+1555"}, ctx())  # not an allowed target
        task = asyncio.ensure_future(tools["transfer_call"]({"target": "+4930123"}, ctx()))
        await asyncio.sleep(0)
        assert isinstance(port.frames[-1], Transfer)
        port.link.on_transfer_result(TransferResult(call_id="c1", ok=True))
        out.append(await task)
        return out

    out = asyncio.run(main())
    assert out[1] == {"status": "ending", "note": "the call ends after your last words are played"}
    assert out[2] == {"status": "already_ending"} and out[3] == {"status": "transferred"}
    assert port.frames[:2] == [SendDtmf(call_id="c1", digits="1w#"), Hangup(call_id="c1", reason="end_call")]
    assert len([f for f in port.frames if isinstance(f, Hangup)]) == 1


def test_transfer_without_answer_is_bounded() -> None:
    port = Port()

    async def main() -> tuple[bool, str]:
        return await port.link.transfer("+4930123", 0.05)

    ok, detail = asyncio.run(main())
    assert not ok and "unknown" in detail


class Agent:
    path = str(ROOT / "configs/agents/booking.toml")
    tool_modules = ("../../examples/booking_tools.py:tools",)
    transfer_targets = ()

    def __init__(self, tools: tuple[str, ...], confirm: tuple[str, ...] = ()) -> None:
        self.tools = tools
        self.confirm_tools = confirm


def test_build_registry_exact_and_fail_closed() -> None:
    reg = build_registry(Agent(("book_table", "send_dtmf"), ("book_table",)), Port())
    assert reg.names() == ["book_table", "confirm_pending", "send_dtmf"]
    assert reg.spec("book_table").confirm  # type: ignore[union-attr]
    with pytest.raises(ToolSetupError) as e:
        build_registry(Agent(("book_table", "lookup_order")), Port())
    assert e.value.tool == "lookup_order"


def test_bad_tool_modules(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "from brisvox.agent.tool_engine.registry import ToolSpec, ToolKind\n"
        "def wrong():\n    return [1, 2]\n"
        "async def t(a, c):\n    return 1\n"
        "def clash():\n    return [(ToolSpec('end_call', 'x', {'type': 'object'}, ToolKind.READ_ONLY), t)]\n")
    with pytest.raises(ToolSetupError, match="pairs"):
        load_module_tools("m.py:wrong", str(tmp_path))
    with pytest.raises(ToolSetupError, match="built-in"):
        load_module_tools("m.py:clash", str(tmp_path))
    with pytest.raises(ToolSetupError, match="cannot import"):
        load_module_tools("no_such_module_xyz:tools")


def test_booking_example_guard() -> None:
    pairs = load_module_tools("../../examples/booking_tools.py:tools", str(ROOT / "configs/agents"))
    book = next(t for s, t in pairs if s.name == "book_table")
    import sys

    store = sys.modules[book.__module__].STORE  # this load's module (other tests load the file too)
    store.clear()
    args = {"name": "Kaya", "date": "2026-12-01", "time": "19:00", "people": 2}

    async def main() -> list[Any]:
        a = await book(dict(args), ToolContext("call-A", 1, "t1.0"))
        b = await book({**args, "name": " kaya "}, ToolContext("call-B", 4, "t4.0"))  # another call, same guest
        c = await book(dict(args, time="20:00"), ToolContext("call-A", 1, "t1.0"))  # redelivery of call A
        return [a, b, c]

    a, b, c = asyncio.run(main())
    assert a["booking"] == "BK-1001" and "already_booked" not in a
    assert b == {**a, "already_booked": True}
    assert c["booking"] == "BK-1001" and c["already_booked"] is True
    assert store.writes == 1


def test_parse_keeps_secondary_and_key_env() -> None:
    agent = parse({"system_prompt": "x", "stt": {"provider": "deepgram", "api_key_env": "DG"},
                   "llm": {"provider": "openai", "secondary": {"provider": "local_llm"}},
                   "tts": {"provider": "espeak"}}, "a.toml")
    assert agent.stt.key_env == "DG" and agent.llm.key_env == "OPENAI_API_KEY"
    assert agent.llm.secondary is not None and agent.llm.secondary.provider == "local_llm"
    assert isinstance(ToolSpec, type)


def test_actor_config_from_agent() -> None:
    from brisvox.agent.definition import actor_config

    agent = load_agent(ROOT / "configs/agents/booking.toml", env={})
    cfg = actor_config(agent)
    assert cfg.llm.system_prompt.startswith("You book tables")
    assert cfg.llm.filler.enabled and cfg.llm.filler.delay == 1.2
    assert cfg.llm.filler_phrases == ("One moment, please.", "Let me look at that.")
    local = actor_config(load_agent(ROOT / "configs/agents/local.toml", env={}))
    assert local.turn.turn.smart_turn is True and local.turn.turn.silence == 0.5
    assert local.turn.turn.interruption.min_speech == 0.3 and not local.llm.filler.enabled
    assert local.stt.stt.language == "en"


def test_a_local_llm_model_is_checked_against_the_workers_list(tmp_path: Path) -> None:
    p = write(tmp_path, '''name = "x"
system_prompt = "x"

[stt]
provider = "local_whisper"

[llm]
provider = "local_llm"
model = "qwen-7b"

[tts]
provider = "local_piper"
''')
    _, problems = check_agent_file(p, env={})
    errs = {(x.key, x.line): x.message for x in problems if x.severity == "error"}
    assert "unknown local model 'qwen-7b'" in errs[("llm.model", 9)] and "qwen_coder_05b" in errs[("llm.model", 9)]
    p.write_text(p.read_text().replace("qwen-7b", "smollm2"))
    assert not [x for x in check_agent_file(p, env={})[1] if x.severity == "error"]
