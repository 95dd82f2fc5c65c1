"""The Twilio stream tokens (brisvox/gateway/control/stream_tokens.py): single use, expiry,
bounded memory, one live token per CallSid, and what a stream's start must match."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import WebSocketConfig
from brisvox.gateway.control.stream_tokens import Binding, StreamTokens, bind_stream
from brisvox.wire.mediastream import StreamError
from brisvox.wire.twilio import TOKEN_PARAM, Start

ACCOUNT = "AC" + "0123456789abcdef" * 2
B = Binding("CA1", ACCOUNT, "default")


class Clock:
    t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_token_is_redeemed_once_and_expires() -> None:
    clock = Clock()
    tokens = StreamTokens(30.0, 8, clock)
    tok = tokens.issue(B)
    assert tok and len(tok) == 43
    assert tokens.redeem(tok) == B
    assert tokens.redeem(tok) == "replayed_stream_token"
    assert tokens.redeem("nope") == "bad_stream_token"
    late = tokens.issue(Binding("CA2", ACCOUNT, "default"))
    clock.t += 30.0
    assert late and tokens.redeem(late) == "bad_stream_token" and len(tokens) == 0  # expired, pruned


def test_memory_is_bounded_and_a_call_holds_one_unused_token() -> None:
    clock = Clock()
    tokens = StreamTokens(30.0, 3, clock)
    first = tokens.issue(B)
    again = tokens.issue(B)  # Twilio (or a replayed signed POST) asking again for CA1: replaced
    assert first and again and len(tokens) == 1 and tokens.redeem(first) == "bad_stream_token"
    assert all(tokens.issue(Binding(f"CA{i}", ACCOUNT, "default")) for i in (2, 3))
    assert tokens.issue(Binding("CA4", ACCOUNT, "default")) is None  # full: refused, nobody evicted
    assert tokens.redeem(again) == B
    clock.t += 31
    assert tokens.issue(Binding("CA4", ACCOUNT, "default")) is not None and len(tokens) == 1


def cfg(**kw: object) -> SimpleNamespace:
    return SimpleNamespace(**{"twilio_account_sid": "", "stream_token_required": True, **kw})


def start(token: str | None, call_sid: str = "CA1", account: str = ACCOUNT) -> Start:
    return Start("MZ1", call_sid, account, {"From": "+1", **({TOKEN_PARAM: token} if token else {})})


def kind(fn) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(StreamError) as e:
        fn()
    assert e.value.code == 1008
    return e.value.kind


def test_a_stream_must_match_what_the_webhook_bound() -> None:
    tokens = StreamTokens(30.0, 8)
    assert kind(lambda: bind_stream(start(None), tokens, cfg(), "default")) == "no_stream_token"
    assert bind_stream(start(None), tokens, cfg(stream_token_required=False), "default") is None
    for what, call_sid, account, agent in (("foreign_call", "CA2", ACCOUNT, "default"),
                                           ("foreign_account", "CA1", "AC" + "f" * 32, "default"),
                                           ("bad_stream_token", "CA1", ACCOUNT, "sales")):
        tok = tokens.issue(B)
        assert tok
        claimed = start(tok, call_sid, account)
        assert kind(lambda s=claimed, a=agent: bind_stream(s, tokens, cfg(), a)) == what  # type: ignore[misc]
    tok = tokens.issue(B)
    assert tok and bind_stream(start(tok), tokens, cfg(), "default") == B
    assert kind(lambda: bind_stream(start(tok), tokens, cfg(), "default")) == "replayed_stream_token"
    # the configured account wins over everything, token or not
    other = cfg(twilio_account_sid="AC" + "e" * 32, stream_token_required=False)
    assert kind(lambda: bind_stream(start(None), tokens, other, "default")) == "foreign_account"
    # a token when none could have been issued (no webhook): refused, never ignored
    assert kind(lambda: bind_stream(start("T"), None, cfg(stream_token_required=False), "default")) \
        == "bad_stream_token"


def test_the_token_setting_follows_twiml_path() -> None:
    assert WebSocketConfig.from_section({"twiml_path": "/twiml"}).stream_token_required
    assert not WebSocketConfig.from_section({}).stream_token_required
    assert not WebSocketConfig.from_section({"twiml_path": "/twiml",
                                             "twilio_require_stream_token": False}).stream_token_required
    with pytest.raises(ConfigError, match="twilio_require_stream_token"):
        WebSocketConfig.from_section({"twilio_require_stream_token": True})
