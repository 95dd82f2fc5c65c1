"""The agent link's messages, bounds, declarations, signature and pure state (docs/AGENT_PROTOCOL.md)."""

from __future__ import annotations

import json
import time

import pytest

from brisvox.agent.definition import check_agent_file
from brisvox.agent.link import messages as m
from brisvox.agent.link.client import AgentLink
from brisvox.agent.link.config import LinkConfig, check_link
from brisvox.agent.link.state import LinkState, Phase, TokenBucket, Waiting
from brisvox.agent.tool_engine.registry import ToolKind, ToolRegistry

OBJ = {"type": "object", "properties": {"n": {"type": "integer"}}}


def decl(**kw) -> dict:
    d = {"name": "book", "description": "Book.", "parameters": OBJ, "kind": "side_effect", "timeout_ms": 5000}
    return d | kw


@pytest.mark.parametrize("raw,code", [
    (b"\x00", "bad_message"), ("not json", "bad_message"), ("[1]", "bad_message"), ('{"x": 1}', "bad_message"),
    ('{"type": "nope"}', "unknown_type"), ('{"type": "tool.result", "id": 5, "ok": true}', "bad_message"),
    ('{"type": "tool.result", "id": "r1"}', "bad_message"),
    ('{"type": "tool.result", "id": "' + "x" * 65 + '", "ok": true}', "too_large"),
    ('{"type": "command", "id": "k", "name": "fly"}', "bad_message"),
    ('{"type": "tools.set", "names": "a"}', "bad_message"),
    ('{"type": "session.accept", "tools": [], "subscribe": ["gossip"]}', "bad_message"),
    ('{"type": "session.accept", "tools": [' + ",".join(["{}"] * 65) + '], "subscribe": []}', "invalid_tool"),
])
def test_bad_frames_are_refused_with_a_typed_code(raw, code):
    with pytest.raises(m.BadFrame) as e:
        m.parse(raw)
    assert e.value.code == code and code in m.ERROR_CODES


def test_a_frame_over_one_mebibyte_is_too_large():
    with pytest.raises(m.BadFrame) as e:
        m.parse('{"type": "tool.result", "id": "r1", "ok": true, "result": "' + "x" * (1 << 20) + '"}')
    assert e.value.code == "too_large"


def test_the_messages_parse_into_frozen_dataclasses():
    acc = m.parse(json.dumps({"type": "session.accept", "session": "s", "tools": [decl(), 7],
                              "subscribe": ["hangup"]}))
    assert isinstance(acc, m.Accept) and acc.subscribe == {"hangup"} and len(acc.tools) == 1 and len(acc.refused) == 1
    r = m.parse('{"type": "tool.result", "id": "r1", "ok": false, "error": {"message": "no table"}}')
    assert r == m.ToolResult("r1", False, None, "no table")
    c = m.parse('{"type": "command", "id": "k1", "name": "say", "text": "hi"}')
    assert c == m.Command("k1", "say", "hi")
    with pytest.raises(AttributeError):
        c.text = "x"  # type: ignore[misc]


@pytest.mark.parametrize("kw,why", [
    ({"name": "bad name"}, "invalid name"), ({"kind": "maybe"}, "kind"), ({"timeout_ms": 0}, "timeout_ms"),
    ({"timeout_ms": 30001}, "timeout_ms"), ({"timeout_ms": True}, "timeout_ms"),
    ({"parameters": {"type": "string"}}, "parameters"), ({"parameters": {"type": "object", "minProperties": "x"}},
                                                         "invalid schema"),
    ({"kind": "read_only", "confirm": True}, "side_effect"), ({"filler_after_ms": -1}, "filler_after_ms"),
])
def test_invalid_declarations_are_refused(kw, why):
    acc = m.parse(json.dumps({"type": "session.accept", "tools": [decl(**kw)], "subscribe": []}))
    assert isinstance(acc, m.Accept)
    out = m.decl_spec(acc.tools[0])
    assert isinstance(out, str) and why in out


def test_a_valid_declaration_is_a_tool_spec():
    acc = m.parse(json.dumps({"type": "session.accept", "tools": [decl(filler_after_ms=1200, repeatable=True)],
                              "subscribe": []}))
    spec = m.decl_spec(acc.tools[0])  # type: ignore[union-attr]
    assert not isinstance(spec, str)
    assert spec.kind is ToolKind.SIDE_EFFECT and spec.timeout == 5.0 and spec.filler_after == 1.2 and spec.repeatable


def test_the_signature_verifies_and_ages():
    h = m.sign("k", "sess", 1000.0)
    assert m.verify("k", "sess", h[m.SIGNATURE_HEADER], 1020.0)
    assert not m.verify("k", "other", h[m.SIGNATURE_HEADER], 1020.0)
    assert not m.verify("wrong", "sess", h[m.SIGNATURE_HEADER], 1020.0)
    assert not m.verify("k", "sess", h[m.SIGNATURE_HEADER], 1000.0 + m.MAX_SKEW + 1)
    assert not m.verify("k", "sess", "garbage", 1000.0)
    # the nonce is fresh per dial and inside what is signed
    nonce = h[m.SIGNATURE_HEADER].split(",")[1].removeprefix("n=")
    assert m.NONCE.match(nonce) and nonce != m.sign("k", "sess", 1000.0)[m.SIGNATURE_HEADER].split(",")[1][2:]
    forged = h[m.SIGNATURE_HEADER].replace(nonce, "f" * 32)
    assert not m.verify("k", "sess", forged, 1000.0)


def test_the_phases_refuse_what_the_table_does_not_allow():
    st = LinkState()
    assert st.go(Phase.UP) and st.go(Phase.DOWN) and st.go(Phase.UP) and st.go(Phase.DOWN) and st.go(Phase.GONE)
    with pytest.raises(RuntimeError):
        st.go(Phase.UP)
    assert st.go(Phase.CLOSED) and st.final


def test_waiting_is_bounded_and_tells_late_from_unknown():
    w = Waiting(limit=2)
    a, b = w.add("t", False), w.add("t", True)
    assert w.full()
    with pytest.raises(OverflowError):
        w.add("t", False)
    assert w.give_up(a.rid) is a and w.was_given_up(a.rid) and w.take(a.rid) is None
    assert w.take(b.rid) is b and not w.was_given_up(b.rid) and len(w) == 0
    assert not w.was_given_up("r99")


def test_narrowing_keeps_only_declared_names():
    st = LinkState()
    st.set_declared(["a", "b"])
    assert st.set_narrow(["a", "zz"]) == ["zz"] and st.offered() == {"a"}


def test_the_command_bucket_allows_a_burst_of_40_then_20_a_second():
    b = TokenBucket()
    assert sum(b.take(0.0) for _ in range(100)) == 40
    assert sum(b.take(1.0) for _ in range(100)) == 20


def _link(registry: ToolRegistry) -> AgentLink:
    return AgentLink(LinkConfig("ws://127.0.0.1:1/x", "S"), "k", session="s", call={}, registry=registry)


def test_the_handshake_registers_valid_tools_and_refuses_collisions():
    from brisvox.agent.tool_engine.builtin import END_CALL

    reg = ToolRegistry()

    async def end(args, ctx):  # noqa: ANN001, ANN202
        return {}
    reg.register(END_CALL, end)
    link = _link(reg)
    acc = m.parse(json.dumps({"type": "session.accept", "tools": [
        decl(), decl(name="end_call", kind="read_only"), decl(name="book"), decl(name="x", timeout_ms=99999)],
        "subscribe": ["user_turn"]}))
    assert link._accepted(acc) == ["book"]  # type: ignore[arg-type]
    assert [n for n, _ in link.refused] == ["end_call", "book", "x"]
    assert "agent file" in link.refused[0][1] and "twice" in link.refused[1][1]
    assert "book" in reg and reg.spec("book").side_effect  # type: ignore[union-attr]
    link.st.set_narrow([])
    assert link.screened("book") and not link.screened("end_call")
    assert [s.name for s in link.offered(reg.specs())] == ["end_call"]


def test_bad_frames_after_the_handshake_are_answered_and_counted():
    link = _link(ToolRegistry())
    link.on_frame("{")
    link.on_frame('{"type": "tool.result", "id": "r7", "ok": true}')
    assert link.stats.bad_frames == 1 and link.stats.unknown_ids == 1 and link.stats.errors_sent == 2


def test_hangup_is_the_last_event_even_when_a_turn_settles_after_it():
    link = _link(ToolRegistry())
    sent: list[str] = []
    link.st.subscribed = frozenset({"bot_turn", "hangup"})
    link._send_soon = lambda text: sent.append(text) or True  # type: ignore[method-assign]
    link._event("bot_turn", epoch=1, text="Hello.")
    link._event("hangup", reason="caller_hangup")
    link._event("bot_turn", epoch=2, text="Goodbye.")  # the call's teardown settled one more turn
    assert [json.loads(t)["name"] for t in sent] == ["bot_turn", "hangup"]
    assert link.stats.events_sent == 2 and link.stats.events_dropped == 1


def test_check_reports_a_bad_url_and_an_unset_secret(tmp_path):
    assert check_link({"url": "ws://h:99999/x", "secret_env": "NOPE"}, {})[0][:2] == ("error", "url")
    assert [p[:2] for p in check_link({"url": "wss://h/x", "secret_env": "NOPE"}, {})] == [("warning", "secret_env")]
    assert check_link({"url": "wss://h/x", "secret_env": "S"}, {"S": "v"}) == []
    f = tmp_path / "a.toml"
    f.write_text('system_prompt = "x"\n[stt]\nprovider = "scripted_stt"\n[llm]\nprovider = "scripted"\n'
                 '[tts]\nprovider = "scripted_tts"\n[agent_link]\nurl = "http://h/x"\nsecret_env = "S"\n')
    agent, problems = check_agent_file(f, env={})
    assert agent is None and problems[0].key == "agent_link.url" and problems[0].line == 9
    f.write_text(f.read_text().replace("http://", "wss://") + "side_effect_wait = 30\nrequired = true\n")
    agent, problems = check_agent_file(f, env={})
    assert agent is not None and agent.agent_link == LinkConfig("wss://h/x", "S", True, 5.0, 30.0)
    assert [(p.severity, p.key, p.line) for p in problems] == [("warning", "agent_link.secret_env", 10)]
    f.write_text(f.read_text().replace("side_effect_wait = 30", "side_effect_wait = 121"))
    assert check_agent_file(f, env={})[1][0].key == "agent_link.side_effect_wait"


def test_time_is_unix_seconds_in_the_header():
    t = int(m.sign("k", "s", time.time())[m.SIGNATURE_HEADER].split(",")[0][2:])
    assert abs(t - time.time()) < 5
