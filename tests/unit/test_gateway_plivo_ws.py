"""The Plivo WebSocket leg against a recording host, and the Plivo handshake check.

* before the call exists, a malformed message closes at once with its
  kind's code; during a live call each one is counted and dropped (the
  caller's audio after it still reaches the call) and the one beyond the
  fault budget closes with that kind's code and a reason naming the budget;
* unknown events, ``clearedAudio`` and a repeated ``start`` never close,
  and only the unknown and the repeated ones are counted;
* the stream's format fixes the call's rate (L16 16 kHz: 16000) and both
  directions' encoding; the call's metadata comes from ``start``;
* marks are checkpoints whose ``playedStream`` is forwarded as the echo,
  Clear is ``clearAudio``, DTMF out is ``sendDTMF``, transfer is refused
  with the reason, a full gateway answers 1013;
* ``plivo_auth``: a configured token lets in exactly the signed requests;
  without one a route is open on loopback only.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest

from brisvox.gateway.carriers.plivo import TRANSFER_REASON, PlivoSession
from brisvox.gateway.config import WsRoute
from brisvox.gateway.core.calls import AdmissionError
from brisvox.gateway.ws.auth import BAD_PLIVO_SIGNATURE, OPEN, UNCONFIGURED, plivo_auth
from brisvox.wire import plivo
from brisvox.wire.g711 import PCMU
from brisvox.wire.plivo import L16, Format
from tests.unit.test_gateway_ws_faults import BUDGET_REASON, Clock, Conn, Host

SID = "plivo-stream-0001"
MULAW_8K = Format()
PCM = np.full(160, 1000, np.int16)


class MarkHost(Host):
    def __init__(self, **websocket: Any) -> None:
        super().__init__(**websocket)
        self.marks: list[str] = []
        self.digits: list[str] = []
        self.full = False

    def admit(self, transport: str, agent: str, call_rate: int, **kw: Any) -> Any:
        if self.full:
            raise AdmissionError("full")
        return super().admit(transport, agent, call_rate, **kw)

    def mark_echo(self, call: Any, name: str) -> None:
        self.marks.append(name)

    def dtmf_in(self, call: Any, digit: str, duration_ms: int) -> None:
        self.digits.append(digit)


def session(start: bool = True, fmt: Format = MULAW_8K, headers: str | None = None,
            **websocket: Any) -> tuple[PlivoSession, MarkHost, Conn, Clock, plivo.PlivoStream]:
    host, conn, clock = MarkHost(**websocket), Conn(), Clock()
    s = PlivoSession(host, conn, WsRoute("/plivo", "plivo", "echo"))  # type: ignore[arg-type]
    s.clock = clock
    stream = plivo.PlivoStream(stream_id=SID, call_id="call-1", account_id="MA1", fmt=fmt)
    if start:
        s.on_text(stream.start(headers).encode())
        assert s.call is not None and not conn.closed
    return s, host, conn, clock, stream


def media(stream: plivo.PlivoStream, pcm: np.ndarray = PCM) -> bytes:
    return stream.media(base64.b64encode(stream.fmt.encode(pcm)).decode()).encode()


BAD: dict[str, tuple[str | bytes, int]] = {
    "bad_json": ("{not json", 1007),
    "bad_message": ("[1, 2]", 1007),
    "bad_media": (f'{{"event":"media","streamId":"{SID}","media":{{}}}}', 1007),
    "bad_base64": (f'{{"event":"media","streamId":"{SID}","media":{{"payload":"@@@"}}}}', 1007),
    "bad_mark": (f'{{"event":"playedStream","streamId":"{SID}"}}', 1007),
    "bad_dtmf": (f'{{"event":"dtmf","streamId":"{SID}","dtmf":{{"digit":"Z"}}}}', 1007),
    "binary_frame": (b"\x00\x01", 1003),
    "media_too_large": (f'{{"event":"media","media":{{"payload":"{base64.b64encode(bytes(8001)).decode()}"}}}}',
                        1009),
}


def feed(s: PlivoSession, msg: str | bytes) -> None:
    if isinstance(msg, bytes):
        s.on_binary(msg)
    else:
        s.on_text(msg.encode())


@pytest.mark.parametrize("bad", list(BAD))
def test_mid_call_malformed_messages_are_dropped_until_the_budget_closes(bad: str) -> None:
    s, host, conn, clock, stream = session(fault_max=20, fault_window_s=10.0)
    msg, code = BAD[bad]
    for _ in range(20):
        feed(s, msg)
        clock.t += 0.01
        s.on_text(media(stream))
    assert not conn.closed and host.counters[f"ws_malformed_{bad}"] == 20 and s.call.stats.malformed == 20
    assert len(host.audio) == 20 and all(np.array_equal(a, PCMU.decode(PCMU.encode(PCM))) for a in host.audio)
    feed(s, msg)
    assert (conn.close_code, conn.close_reason) == (code, BUDGET_REASON.format(21, 10))
    assert s.call.transport_done and s.call.end_reason == BUDGET_REASON.format(21, 10)


@pytest.mark.parametrize(("bad", "code"), [
    ("{not json", 1007), ("[1]", 1007), (b"\x00", 1003),
    (f'{{"event":"media","media":{{"payload":"{base64.b64encode(bytes(160)).decode()}"}}}}', 1008),
    ('{"event":"start","start":{"streamId":"s"}}', 1003),  # no mediaFormat
    ('{"event":"start","start":{"streamId":"s","mediaFormat":{"encoding":"audio/x-l16","sampleRate":44100}}}', 1003),
    ('{"event":"start"}', 1007),
])
def test_malformed_before_the_call_closes_at_once(bad: str | bytes, code: int) -> None:
    s, host, conn, clock, _ = session(start=False)
    feed(s, bad)
    assert conn.closed and conn.close_code == code and s.call is None and host.call is None


def test_no_start_in_time_closes_with_1008() -> None:
    s, host, conn, _, _ = session(start=False)
    s._no_start()
    assert (conn.close_code, conn.close_reason) == (1008, "no start message")
    assert host.counters["ws_malformed_no_start"] == 1


def test_unknown_events_and_repeated_starts_are_counted_never_charged() -> None:
    s, host, conn, clock, stream = session(fault_max=1)
    for _ in range(5):
        feed(s, '{"event":"future_event"}')
        feed(s, stream.start())
        feed(s, stream.cleared())
    assert not conn.closed
    assert host.counters["ws_malformed_unknown_event"] == 5 and host.counters["ws_malformed_duplicate_start"] == 5
    assert s.call.stats.malformed == 10


@pytest.mark.parametrize("fmt", [Format(), Format(L16, 8000), Format(L16, 16000)])
def test_the_streams_format_is_the_calls_rate_and_both_directions_encoding(fmt: Format) -> None:
    s, host, conn, _, stream = session(fmt=fmt)
    assert s.call.call_rate == fmt.rate
    pcm = np.arange(-160, 160, dtype=np.int16)[: fmt.rate // 50]
    s.on_text(media(stream, pcm))
    want = pcm if fmt.encoding == L16 else PCMU.decode(PCMU.encode(pcm))
    assert np.array_equal(host.audio[-1], want)
    assert s.send_audio(pcm[::1], 0.0) and s.send_audio(np.ascontiguousarray(pcm[::-1])[::-1], 0.0)
    out = orjson.loads(conn.texts[-1])
    assert out["event"] == "playAudio" and (out["media"]["contentType"], out["media"]["sampleRate"]) == (
        fmt.encoding, fmt.rate)
    assert np.array_equal(fmt.decode(base64.b64decode(out["media"]["payload"])), want)
    assert s.call.stats.packets_out == 2


def test_odd_l16_payloads_are_bad_media() -> None:
    s, host, conn, _, stream = session(fmt=Format(L16, 16000))
    s.on_text(stream.media(base64.b64encode(b"\x00\x01\x02").decode()).encode())
    assert host.counters["ws_malformed_bad_media"] == 1 and not conn.closed


def test_the_calls_metadata_comes_from_start() -> None:
    s, host, _, _, _ = session(headers="from=15550100;to=15550199;lang=en;bad")
    call = s.call
    assert call.transport_ids == {"streamId": SID, "callId": "call-1", "accountId": "MA1"}
    assert call.params == {"from": "15550100", "to": "15550199", "lang": "en"}
    assert (call.caller, call.called) == ("15550100", "15550199")
    assert host.counters["call_params_dropped"] == 1


def test_marks_clear_dtmf_and_transfer() -> None:
    s, host, conn, _, stream = session()
    s.send_mark("m1")
    assert orjson.loads(conn.texts[-1]) == {"event": "checkpoint", "streamId": SID, "name": "m1"}
    s.on_text(stream.played("m1").encode())
    s.on_text(b'{"event":"played","name":"m2"}')  # the support article's spelling
    assert host.marks == ["m1", "m2"]
    s.send_clear()
    assert orjson.loads(conn.texts[-1]) == {"event": "clearAudio", "streamId": SID}
    assert s.send_dtmf("1x#") == 1
    assert orjson.loads(conn.texts[-1]) == {"event": "sendDTMF", "dtmf": "1#"}
    assert not s.tick_dtmf(0.0)  # nothing in-band
    s.on_text(stream.dtmf("5").encode())
    assert host.digits == ["5"]
    got: list[tuple[bool, str]] = []
    s.transfer("sip:op@x", lambda ok, why: got.append((ok, why)))
    assert got == [(False, TRANSFER_REASON)]


def test_stop_and_hangup_end_the_transport_side_once() -> None:
    s, host, conn, _, stream = session()
    s.on_text(stream.stop().encode())
    assert (conn.close_code, s.call.end_reason) == (1000, "stop")
    s2, _, conn2, _, _ = session()
    s2.hangup("stage_failed: llm")
    assert conn2.close_code == 1011 and s2.call.end_reason == "stage_failed: llm"
    s2.on_closed(1011, "")
    assert s2.call.end_reason == "stage_failed: llm"


def test_a_full_gateway_answers_1013() -> None:
    s, host, conn, _, stream = session(start=False)
    host.full = True
    s.on_text(stream.start().encode())
    assert (conn.close_code, conn.close_reason) == (1013, "try again later") and s.call is None


# -- the handshake check --------------------------------------------------------------------


def cfg(token: str = "", host: str = "127.0.0.1", public_url: str = "", allow: bool = False,
        trust: bool = True) -> Any:
    return SimpleNamespace(plivo_auth_token=token, host=host, public_url=public_url, allow_unauthenticated=allow,
                           trust_loopback=trust)


def test_plivo_auth_lets_in_exactly_the_signed_requests() -> None:
    c = cfg("TOKEN", host="0.0.0.0")
    path = "/plivo/echo?x=1"
    sig = plivo.signature("TOKEN", "wss://gw.example.com" + path, "n1")
    ok = {"Host": "gw.example.com", "X-Plivo-Signature-V3": sig, "X-Plivo-Signature-V3-Nonce": "n1"}
    assert plivo_auth(c, None, path, ok) is OPEN
    assert plivo_auth(c, None, path, {**ok, "X-Plivo-Signature-V3": "", "X-Plivo-Signature-Ma-V3": sig}) is OPEN
    pub = cfg("TOKEN", public_url="wss://public.example.com")
    assert plivo_auth(pub, None, path, ok) is BAD_PLIVO_SIGNATURE  # signed for another host
    for bad in ({**ok, "X-Plivo-Signature-V3-Nonce": "n2"}, {**ok, "X-Plivo-Signature-V3-Nonce": ""},
                {k: v for k, v in ok.items() if k != "X-Plivo-Signature-V3"}, {**ok, "Host": "evil.example.com"}):
        assert plivo_auth(c, None, path, bad) is BAD_PLIVO_SIGNATURE
    assert plivo_auth(c, None, "/plivo/echo?x=2", ok) is BAD_PLIVO_SIGNATURE


def test_plivo_auth_refuses_a_repeated_signature_header() -> None:
    class Headers(dict):
        def get_all(self, name: str) -> list[str]:
            v = self.get(name)
            return [] if v is None else v if isinstance(v, list) else [v]

    sig = plivo.signature("TOKEN", "wss://h/plivo", "n1")
    h = Headers({"Host": "h", "X-Plivo-Signature-V3": [sig, sig], "X-Plivo-Signature-V3-Nonce": "n1"})
    assert plivo_auth(cfg("TOKEN"), None, "/plivo", h) is BAD_PLIVO_SIGNATURE


def test_without_a_token_a_plivo_route_is_open_on_loopback_only() -> None:
    assert plivo_auth(cfg(), None, "/plivo", {}) is OPEN
    assert plivo_auth(cfg(host="::1"), None, "/plivo", {}) is OPEN
    assert plivo_auth(cfg(host="0.0.0.0"), None, "/plivo", {}) is UNCONFIGURED
    assert plivo_auth(cfg(host="0.0.0.0", allow=True), None, "/plivo", {}) is OPEN
    assert plivo_auth(cfg(trust=False), None, "/plivo", {}) is UNCONFIGURED  # trust_loopback unset


def test_a_public_listener_with_a_plivo_route_needs_its_token_at_start() -> None:
    from brisvox.config.errors import ConfigError
    from brisvox.gateway.config import WebSocketConfig

    routes = [{"path": "/plivo", "protocol": "plivo", "agent": "echo"}]
    with pytest.raises(ConfigError, match="plivo_auth_token"):
        WebSocketConfig.from_section({"host": "0.0.0.0", "routes": routes})
    assert WebSocketConfig.from_section({"host": "0.0.0.0", "routes": routes,
                                         "plivo_auth_token": "t" * 32}).plivo_auth_token == "t" * 32
