"""The Twilio and native WebSocket legs under malformed input, against a recording host.

* before the call exists, a Twilio message that is malformed closes at once
  with its kind's code (as without a budget); a native one gets its error
  reply and the connection stays (the start timeout bounds it);
* during a live call every malformed message is counted (the gateway's
  ``ws_malformed_<kind>`` and the call's ``malformed``) and dropped, and the
  caller's audio after it still reaches the call;
* one more than ``fault_max`` within ``fault_window_s`` closes with that
  kind's code and a reason naming the budget, which is the call's end reason;
  the same number spaced beyond the window never closes;
* ``hangup_on_error`` closes on the first one, with the old code and reason;
* an unknown Twilio event and a repeated ``start`` are counted, never charged.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest

from brisvox.gateway.carriers.native import FAULT_CLOSE_CODES, NativeSession
from brisvox.gateway.carriers.twilio import TwilioSession
from brisvox.gateway.config import GatewaySettings, WebSocketConfig, WsRoute
from brisvox.gateway.metrics import CallStats
from brisvox.wire import native, twilio
from brisvox.wire.g711 import PCMU

SID = "MZfaults0001"
TW = twilio.TwilioStream(stream_sid=SID, call_sid="CA1", account_sid="AC1")
BUDGET_REASON = "fault budget exceeded: {} malformed messages in {} s"


class Timer:
    def cancel(self) -> None:
        pass


class FakeCall:
    def __init__(self, call_rate: int) -> None:
        self.call_id = "c-faults"
        self.agent = "echo"
        self.call_rate = call_rate
        self.stats = CallStats()
        self.transport_ids: dict[str, str] = {}
        self.params: dict[str, str] = {}
        self.transport_done = False
        self.end_reason = ""


class Host:
    """Records what a leg asks of the core (the CallHost semantics the legs rely on)."""

    def __init__(self, **websocket: Any) -> None:
        self.settings = GatewaySettings(websocket=WebSocketConfig.from_section(websocket))
        self.draining = False
        self.counters: dict[str, int] = {}
        self.audio: list[np.ndarray] = []
        self.call: FakeCall | None = None

    def call_later(self, delay: float, callback: Any) -> Timer:
        return Timer()

    def admit(self, transport: str, agent: str, call_rate: int, **kw: Any) -> FakeCall:
        self.admitted = kw  # source, media_timeout_s
        self.call = FakeCall(call_rate)
        return self.call

    def start_call(self, call: FakeCall, leg: Any, on_ready: Any) -> None:
        on_ready(True, "")

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def protocol_error(self, call: FakeCall | None, counter: str) -> None:
        if counter:
            self.count(counter)
        if call is not None:
            call.stats.malformed += 1

    def audio_in(self, call: FakeCall, pcm16: np.ndarray, rate: int, wire_bytes: int = -1, gap: int = 0) -> None:
        if not call.transport_done:
            self.audio.append(np.array(pcm16))

    def mark_echo(self, call: FakeCall, name: str) -> None:
        pass

    def dtmf_in(self, call: FakeCall, digit: str, duration_ms: int) -> None:
        pass

    def transport_ended(self, call: FakeCall, reason: str) -> None:
        if not call.transport_done:
            call.transport_done = True
            call.end_reason = reason


class Conn:
    def __init__(self) -> None:
        self.source = "127.0.0.1"  # the client's address (WsConnection.source)
        self.closed = False
        self.close_code: int | None = None
        self.close_reason = ""
        self.texts: list[bytes] = []

    def close(self, code: int = 1000, reason: str = "") -> None:
        if not self.closed:
            self.closed, self.close_code, self.close_reason = True, code, reason

    def send_text(self, data: bytes) -> bool:
        self.texts.append(data)
        return not self.closed

    def send_binary(self, data: bytes) -> bool:
        return not self.closed

    def errors(self) -> list[str]:
        return [native.server_message(orjson.loads(t)).code for t in self.texts
                if b'"event":"error"' in t]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def session(kind: str, start: bool = True, **websocket: Any) -> tuple[Any, Host, Conn, Clock]:
    host, conn, clock = Host(**websocket), Conn(), Clock()
    cls = TwilioSession if kind == "twilio" else NativeSession
    s = cls(host, conn, WsRoute(f"/{kind}", kind, "echo"))  # type: ignore[arg-type]
    s.clock = clock
    if start:
        if kind == "twilio":
            s.on_text(TW.connected().encode())
            s.on_text(TW.start().encode())
        else:
            s.on_text(native.NativeStream(8000).start().encode())
        assert s.call is not None and not conn.closed
    return s, host, conn, clock


ULAW = PCMU.encode(np.full(160, 1000, np.int16)).tobytes()
PCM = np.full(160, 1000, "<i2")

# kind -> (malformed message, counter kind, close code when it exceeds the budget)
TWILIO_BAD: dict[str, tuple[str | bytes, int]] = {
    "bad_json": ("{not json", 1007),
    "bad_message": ("[1, 2]", 1007),
    "bad_media": (f'{{"event":"media","streamSid":"{SID}","media":{{}}}}', 1007),
    "bad_base64": (f'{{"event":"media","streamSid":"{SID}","media":{{"payload":"@@@"}}}}', 1007),
    "bad_mark": (f'{{"event":"mark","streamSid":"{SID}","mark":{{}}}}', 1007),
    "bad_dtmf": (TW.dtmf("Z"), 1007),
    "binary_frame": (b"\x00\x01", 1003),
    "media_too_large": (twilio.BotStream(SID).media(b"\xff" * 8001).decode(), 1009),  # a payload over 1 s
}
NATIVE_BAD: dict[str, tuple[str | bytes, int]] = {
    "bad_json": ("{bad", 1007),
    "bad_message": ("[1]", 1007),
    "odd_frame": (b"\x01\x02\x03", 1007),
    "bad_dtmf": (native.NativeStream.dtmf("Z"), 1007),
    "bad_mark": ('{"event":"mark"}', 1007),
    "unknown_event": ('{"event":"hello"}', 1008),
    "duplicate_start": (native.NativeStream(8000).start(), 1008),
}
BAD = {"twilio": TWILIO_BAD, "native": NATIVE_BAD}


def feed(s: Any, msg: str | bytes) -> None:
    if isinstance(msg, bytes):
        s.on_binary(msg)
    else:
        s.on_text(msg.encode())


def good_audio(s: Any, kind: str) -> None:
    if kind == "twilio":
        s.on_text(twilio.BotStream(SID).media(ULAW))
    else:
        s.on_binary(PCM.tobytes())


def cases() -> list[Any]:
    return [pytest.param(kind, k, id=f"{kind}-{k}") for kind, table in BAD.items() for k in table]


@pytest.mark.parametrize(("kind", "bad"), cases())
def test_mid_call_malformed_messages_are_counted_dropped_and_audio_still_flows(kind, bad):
    s, host, conn, clock = session(kind, fault_max=20, fault_window_s=10.0)
    msg, _ = BAD[kind][bad]
    for _ in range(20):
        feed(s, msg)
        clock.t += 0.01
        good_audio(s, kind)
    assert not conn.closed and not s.call.transport_done
    assert host.counters[f"ws_malformed_{bad}"] == 20
    assert s.call.stats.malformed == 20
    assert len(host.audio) == 20 and all(np.array_equal(a, PCMU.decode(ULAW) if kind == "twilio" else PCM)
                                         for a in host.audio)
    if kind == "native":  # every one still gets its error reply
        assert conn.errors() == [bad] * 20


@pytest.mark.parametrize(("kind", "bad"), cases())
def test_one_more_than_the_budget_closes_with_the_kinds_code_and_a_budget_reason(kind, bad):
    s, host, conn, clock = session(kind, fault_max=20, fault_window_s=10.0)
    msg, code = BAD[kind][bad]
    for _ in range(20):
        feed(s, msg)
        clock.t += 0.4  # 21 within 8 s
    assert not conn.closed
    feed(s, msg)
    reason = BUDGET_REASON.format(21, 10)
    assert (conn.close_code, conn.close_reason) == (code, reason)
    assert s.call.transport_done and s.call.end_reason == reason
    assert s.call.stats.malformed == 21


@pytest.mark.parametrize("kind", ["twilio", "native"])
def test_faults_spaced_beyond_the_window_never_close(kind):
    s, host, conn, clock = session(kind, fault_max=3, fault_window_s=2.0)
    msg, _ = next(iter(BAD[kind].values()))
    for _ in range(200):
        feed(s, msg)
        clock.t += 0.7  # at most 3 in any 2 s
        good_audio(s, kind)
    assert not conn.closed and s.call.stats.malformed == 200 and len(host.audio) == 200


@pytest.mark.parametrize(("kind", "bad"), cases())
def test_hangup_on_error_closes_on_the_first_one_as_before(kind, bad):
    s, host, conn, clock = session(kind, hangup_on_error=True)
    msg, code = BAD[kind][bad]
    feed(s, msg)
    assert conn.closed and conn.close_code == code
    assert "fault budget" not in conn.close_reason and conn.close_reason
    assert s.call.end_reason == f"protocol error: {bad}"
    assert host.counters[f"ws_malformed_{bad}"] == 1 and s.call.stats.malformed == 1


def test_twilio_hangup_on_error_keeps_the_wire_reason():
    s, host, conn, clock = session("twilio", hangup_on_error=True)
    feed(s, TWILIO_BAD["bad_base64"][0])
    assert (conn.close_code, conn.close_reason) == (1007, "invalid base64 payload")


def test_native_budget_close_codes_cover_every_mid_call_error():
    assert set(NATIVE_BAD) <= set(FAULT_CLOSE_CODES)


@pytest.mark.parametrize(("bad", "code"), [
    ("{not json", 1007), ("[1]", 1007), (b"\x00", 1003), (twilio.BotStream(SID).media(ULAW).decode(), 1008),
    (TW.start().replace("audio/x-mulaw", "audio/l16"), 1003), ('{"event":"start"}', 1007),
])
def test_twilio_malformed_before_the_call_closes_at_once(bad, code):
    s, host, conn, clock = session("twilio", start=False)
    feed(s, bad)
    assert conn.closed and conn.close_code == code
    assert s.call is None and host.call is None


def test_native_malformed_before_the_call_is_answered_not_charged():
    s, host, conn, clock = session("native", start=False, fault_max=1)
    for m in ("{bad", b"\x00\x00", native.NativeStream.dtmf("5"), '{"event":"x"}'):
        feed(s, m)
    assert not conn.closed
    assert conn.errors() == ["bad_json", "media_before_start", "dtmf_before_start", "unknown_event"]
    feed(s, native.NativeStream(8000).start())
    assert s.call is not None and s.call.stats.malformed == 0  # the call's budget starts with it
    feed(s, "{bad")
    assert not conn.closed
    feed(s, "{bad")
    assert conn.close_code == 1007 and conn.close_reason == BUDGET_REASON.format(2, 10)


def test_native_bad_rate_still_closes_at_once():
    s, host, conn, clock = session("native", start=False)
    feed(s, '{"event":"start","rate":11025}')
    assert conn.close_code == 1003 and s.call is None


def test_twilio_unknown_events_and_repeated_starts_are_counted_never_charged():
    s, host, conn, clock = session("twilio", fault_max=1, hangup_on_error=False)
    for _ in range(5):
        feed(s, '{"event":"future_event"}')
        feed(s, TW.start())
    assert not conn.closed
    assert host.counters["ws_malformed_unknown_event"] == 5
    assert host.counters["ws_malformed_duplicate_start"] == 5
    assert s.call.stats.malformed == 10
    s2, _, conn2, _ = session("twilio", hangup_on_error=True)
    feed(s2, '{"event":"future_event"}')
    assert not conn2.closed


def test_mixed_kinds_share_one_budget_and_the_last_kind_names_the_code():
    s, host, conn, clock = session("twilio", fault_max=2, fault_window_s=1.0)
    feed(s, "{not json")
    feed(s, TWILIO_BAD["bad_mark"][0])
    assert not conn.closed
    feed(s, b"\x00")
    assert (conn.close_code, conn.close_reason) == (1003, BUDGET_REASON.format(3, 1))
