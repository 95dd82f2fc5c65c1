"""Call metadata (caller, called, transport ids, parameters): the wire's bounds, the numbers a
SIP URI or the parameters name, the read-only CallInfo a tool receives, and the call record's
``call`` section that never holds a secret."""

from __future__ import annotations

import dataclasses
import math

import pytest

from brisvox.agent.host.call_build import call_info_of
from brisvox.agent.tool_engine.call_info import NO_CALL, CallInfo, secret_name, secret_value
from brisvox.agent.tool_engine.registry import ToolContext
from brisvox.wire.jsontext import (
    MAX_PARAM_NAME,
    MAX_PARAM_VALUE,
    MAX_PARAMS,
    caller_called,
    checked_params,
    param_text,
)
from brisvox.wire.sip_message import uri_number
from ipc import frames as F


def test_parameters_are_bounded_and_a_bad_one_is_dropped_whole_and_counted() -> None:
    assert checked_params(None) == (None, 0)
    for not_an_object in (["a"], "a=b", 5, True):
        assert checked_params(not_an_object) == (None, 1)
    ok, name, value = "k", "n" * MAX_PARAM_NAME, "v" * MAX_PARAM_VALUE
    got, dropped = checked_params({ok: "v", name: value, "": "empty name", "n" * (MAX_PARAM_NAME + 1): "v",
                                   "long": "v" * (MAX_PARAM_VALUE + 1), "nl": "a\nb", "nul\x00": "v",
                                   "c1": "a\x85b", "ls": "a\u2028b"})
    assert got == {ok: "v", name: value} and dropped == 7
    # scalars as their JSON text; null, containers, non-finite and huge numbers are malformed
    got, dropped = checked_params({"i": -3, "f": 1.5, "t": True, "n": False, "big": 2**70, "nan": math.nan,
                                   "inf": math.inf, "null": None, "list": [1], "obj": {"a": 1}})
    assert got == {"i": "-3", "f": "1.5", "t": "true", "n": "false"} and dropped == 6
    # at most MAX_PARAMS kept, in the order given; the rest is counted
    got, dropped = checked_params({f"p{i}": str(i) for i in range(100)})
    assert got is not None and list(got) == [f"p{i}" for i in range(MAX_PARAMS)] and dropped == 100 - MAX_PARAMS
    got, dropped = checked_params({**{f"bad{i}": None for i in range(10)}, **{f"p{i}": "v" for i in range(40)}})
    assert got is not None and len(got) == MAX_PARAMS and dropped == 10 + 40 - MAX_PARAMS
    assert param_text("x" * 40, 32) is None and param_text("sip", 32) == "sip"


def test_the_caller_and_the_called_number_are_named_by_parameters() -> None:
    assert caller_called(None) == ("", "") and caller_called({}) == ("", "")
    assert caller_called({"From": "+15550100", "To": "+15550199"}) == ("+15550100", "+15550199")
    assert caller_called({"from": "+1", "caller": "+2", "to": "+3", "called": "+4"}) == ("+2", "+4")
    assert caller_called({"FROM": "+1", "from": "+9"}) == ("+1", "")  # the first spelling wins
    assert caller_called({"caller": "", "from": "+1"}) == ("+1", "")  # an empty one names nothing
    assert caller_called({"lang": "en"}) == ("", "")


@pytest.mark.parametrize(("uri", "number"), [
    ("sip:+15550100@carrier.example;user=phone", "+15550100"),
    ("sips:alice@example.com:5061", "alice"),
    ("tel:+15550100;phone-context=example.com", "+15550100"),
    ("sip:example.com", ""),
    ("mailto:a@b", ""),
    ("sip:a@h:99999", ""),
    ("", ""),
])
def test_a_sip_uri_names_its_user(uri: str, number: str) -> None:
    assert uri_number(uri) == number


def test_call_info_is_bounded_read_only_and_empty_by_default() -> None:
    info = CallInfo.of(caller="+15550100", called="x" * (MAX_PARAM_VALUE + 1), transport="twilio",
                       transport_ids={"callSid": "CA1", "bad": None},
                       params={"lang": "en", "long": "v" * 300, **{f"p{i}": "v" for i in range(40)}})
    assert (info.caller, info.called, info.transport) == ("+15550100", "", "twilio")
    assert dict(info.transport_ids) == {"callSid": "CA1"}
    assert len(info.params) == MAX_PARAMS and info.params["lang"] == "en" and "long" not in info.params
    assert info.dropped == 1 + 1 + (1 + 41 - MAX_PARAMS)  # called, an id, the long one and the overflow
    with pytest.raises(TypeError):
        info.params["lang"] = "fr"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.caller = "+1"  # type: ignore[misc]
    src = {"a": "b"}
    built = CallInfo(params=src)  # built directly: a read-only copy
    src["a"] = "changed"
    assert built.params == {"a": "b"} and hash(built) == hash(CallInfo(params={"a": "b"}))
    assert NO_CALL == CallInfo() and not NO_CALL.params and NO_CALL.caller == ""
    ctx = ToolContext("s", 1, "t1.0")  # the positional form every tool test uses
    assert ctx.call_info is NO_CALL and ctx.call == "t1.0"


def test_call_start_carries_the_numbers_and_the_agent_bounds_them_again() -> None:
    start = F.CallStart(call_id="c1", agent="default", transport="sip", call_rate=8000, tts_rate=24000, worker=0,
                        instance="t", started_ns=1, transport_ids={"sip_call_id": "abc@h"},
                        params={"from": "sip:+15550100@h", "to": "sip:sales@h", "junk": ["x"]},
                        caller="+15550100", called="sales")
    back = F.decode(F.encode(start))
    assert back == start
    info = call_info_of(back)
    assert (info.caller, info.called, info.transport) == ("+15550100", "sales", "sip")
    assert dict(info.params) == {"from": "sip:+15550100@h", "to": "sip:sales@h"} and info.dropped == 1
    old = F.decode(F.encode(F.CallStart(call_id="c2", agent="a", transport="native", call_rate=16000,
                                        tts_rate=24000, worker=0, instance="t", started_ns=1)))
    info = call_info_of(old)  # a gateway that sends no metadata
    assert (info.caller, info.called, dict(info.params), dict(info.transport_ids)) == ("", "", {}, {})


@pytest.mark.parametrize("name", [
    "token", "auth_token", "AuthToken", "accessToken", "X-Api-Key", "apiKey", "api_key", "secret", "client_secret",
    "password", "Passwd", "pwd", "authorization", "Auth", "oauth", "credentials", "signature", "sig", "cookie",
    "session_key", "key", "booking_key", "PIN", "card_pin", "otp", "cvv", "ssn", "jwt", "bearer", "pass",
    "passcode", "privateKey", "hmac",
])
def test_secret_looking_names_are_kept_out_of_the_record(name: str) -> None:
    assert secret_name(name)
    info = CallInfo.of(caller="+1", called="+2", params={name: "hunter2", "lang": "en"})
    assert info.params[name] == "hunter2"  # the tools see it
    assert info.record() == {"caller": "+1", "called": "+2", "params": {"lang": "en"}}


@pytest.mark.parametrize("name", ["lang", "customer", "From", "To", "shipping", "keyword", "monkey", "tier",
                                  "user", "plan", "opinion", "spinach"])
def test_plain_names_stay_in_the_record(name: str) -> None:
    assert not secret_name(name)
    assert CallInfo.of(params={name: "x"}).record()["params"] == {name: "x"}


def test_secret_looking_values_are_kept_out_of_the_record() -> None:
    for value in ("Bearer abc.def", "basic dXNlcjpwYXNz", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.sig"):
        assert secret_value(value)
        assert CallInfo.of(params={"note": value}).record()["params"] == {}
    assert not secret_value("a bearer of good news") and not secret_value("+15550100")


def test_a_calls_parameters_fill_the_prompts_placeholders_but_never_a_secret_one() -> None:
    from brisvox.agent.definition import fill_placeholders, with_call_params
    from brisvox.agent.host.actor import ActorConfig

    info = CallInfo.of(params={"first_name": "Ada", "account_id": "A-17", "api_token": "t0k",
                               "note": "Bearer abc.def"})
    text = "Greet {{ first_name }} ({{account_id}}); {{missing}}{{api_token}}{{note}}; {literal} {{ bad-name }}"
    assert fill_placeholders(text, info.params) == "Greet Ada (A-17); ; {literal} {{ bad-name }}"
    cfg = ActorConfig()
    replace = dataclasses.replace
    cfg = replace(cfg, llm=replace(cfg.llm, system_prompt="Call {{first_name}}."),
                  s2s=replace(cfg.s2s, session=replace(cfg.s2s.session, instructions="S2S {{first_name}}")))
    out = with_call_params(cfg, info.params)
    assert out.llm.system_prompt == "Call Ada." and out.s2s.session.instructions == "S2S Ada"
    assert cfg.llm.system_prompt == "Call {{first_name}}."  # the agent's own config is not changed


def test_a_dials_params_are_refused_whole_when_malformed_and_never_override_the_gateways() -> None:
    from brisvox.wire.jsontext import MAX_DIAL_PARAMS, dial_params

    assert dial_params(None) == ({}, "")
    assert dial_params({"first_name": "Ada"}) == ({"first_name": "Ada"}, "")
    assert dial_params(["x"])[1] == "params must be an object of strings"
    assert "at most" in dial_params({f"k{i}": "v" for i in range(MAX_DIAL_PARAMS + 1)})[1]
    assert "set by the gateway" in dial_params({"From": "sip:evil@x"})[1]
    assert "a string of at most" in dial_params({"n": 1})[1]
    assert "a string of at most" in dial_params({"n": "x" * 257})[1]
    assert "a name is" in dial_params({"a\nb": "x"})[1]


def test_the_sip_dial_refuses_bad_params_before_the_listener_and_hands_good_ones_on() -> None:
    from brisvox.gateway.transports import DIALERS

    class Listener:
        def __init__(self) -> None:
            self.dials: list[tuple] = []

        def dial(self, *args: object) -> None:
            self.dials.append(args)

    lst, replies = Listener(), []
    sip = DIALERS["sip"].dial
    sip(lst, None, "sip:a@127.0.0.1", "x", 5.0, lambda d, e: replies.append((d, e)), "", {"to": "sip:b@x"})
    sip(lst, None, "sip:a@127.0.0.1", "x", 5.0, lambda d, e: replies.append((d, e)), "", "first_name=Ada")
    assert [e for _, e in replies] == ["params: 'to' is set by the gateway", "params must be an object of strings"]
    assert lst.dials == []  # nothing placed
    sip(lst, None, "sip:a@127.0.0.1", "x", 5.0, replies.append, "", {"first_name": "Ada"})
    assert [(a[0], a[5]) for a in lst.dials] == [("sip:a@127.0.0.1", {"first_name": "Ada"})]
    twilio, got = DIALERS["twilio"].dial, []  # checked as SIP's (then carried in the TwiML: test_twilio_status)
    twilio(lst, None, "+49301", "x", 5.0, lambda d, e: got.append(e), "", {"to": "+1"})
    assert got == ["params: 'to' is set by the gateway"]


def test_brisvoxd_dial_sends_its_params_in_the_dial_command(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """``brisvoxd dial --param`` against a gateway inbox on a real ZeroMQ socket (this test's)."""
    import threading

    import zmq

    from brisvox.cli import brisvoxd
    from ipc.bus import bind, endpoint, make_socket
    from ipc.codec import decode_env, encode

    ctx = zmq.Context()
    inbox = make_socket(ctx, zmq.ROUTER)
    bind(inbox, endpoint(tmp_path, "gateway-0"))
    asked: list = []

    def gateway() -> None:
        if inbox.poll(10_000):
            ident, raw = inbox.recv_multipart()
            frame, cid = decode_env(raw, 1 << 20)
            asked.append(frame)
            inbox.send_multipart([ident, encode(F.CommandReply(ok=True, data={"call_id": "c1", "agent": "a",
                                                                              "codec": "PCMU"}), cid=cid)])

    t = threading.Thread(target=gateway)
    t.start()
    monkeypatch.setattr(brisvoxd, "_running_or_explain", lambda rdir: True)  # no supervisor: its inbox only
    try:
        code = brisvoxd.main(["dial", "sip:a@127.0.0.1", "--runtime-dir", str(tmp_path), "--param", "first_name=Ada",
                              "--param", "note=x=y", "--json"])
    finally:
        t.join(15)
        inbox.close(0)
        ctx.term()
    assert code == 0
    assert asked[0].args["params"] == {"first_name": "Ada", "note": "x=y"}
    with pytest.raises(SystemExit):
        brisvoxd.main(["dial", "sip:a@127.0.0.1", "--param", "noequals"])
