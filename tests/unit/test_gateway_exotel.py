"""The Exotel leg (brisvox.gateway.carriers.exotel) and its handshake check, against a recording host.

* ``start`` admits the call at the stream's rate (8, 16 or 24 kHz; the URL's
  ``sample-rate`` when the start does not say), with its metadata (ids,
  parameters or a signed token's, ``from``/``to``); a full gateway closes
  with 1013;
* the caller's media reaches the call decoded (little-endian); the bot's
  audio goes out in chunks of at least 3.2 KB, multiples of 320 bytes, the
  rest sent at the end of the talkspurt, before a mark, after the last tone
  and before a hang-up, kept over a Pause, dropped by a Clear;
* marks and clear carry the stream's ``stream_sid``; digits in, in-band out;
* malformed input closes at once before the call, is counted and charged
  to the fault budget during it; unknown events and repeated starts are
  counted, never charged;
* ``exotel_auth``: the password of ``Authorization: Basic`` (or ``?token=``)
  is the native secret or a signed token for the route's agent; without
  ``native_secret`` only a loopback (or ``allow_unauthenticated``) listener
  lets anyone in.
"""

from __future__ import annotations

import base64
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
from websockets.datastructures import Headers

from brisvox.config.errors import ConfigError
from brisvox.gateway.carriers.exotel import TRANSFER_REASON, ExotelSession
from brisvox.gateway.config import WebSocketConfig, WsRoute
from brisvox.gateway.ws import auth as ws_auth
from brisvox.gateway.ws.auth import Grant
from brisvox.wire import dtmf, exotel, native
from brisvox.wire.mediastream import MediaFormat
from tests.unit.test_gateway_telnyx import (  # the carriers' message set: the same helpers
    TELNYX_BAD,
    RecordingHost,
    feed,
    media,
)
from tests.unit.test_gateway_ws_faults import BUDGET_REASON, Clock, Conn

ROUTE = WsRoute("/exotel", "exotel", "echo")
PCM = np.full(160, 1000, np.int16)


def session(fmt: MediaFormat = exotel.DEFAULT_FORMAT, start: bool = True, grant: Grant | None = None,
            path: str = "", **websocket: Any) -> tuple[ExotelSession, RecordingHost, Conn, Clock, exotel.ExotelStream]:
    host, conn, clock = RecordingHost(**websocket), Conn(), Clock()
    if grant is not None:
        conn.grant = grant  # type: ignore[attr-defined]
    if path:
        conn.request = SimpleNamespace(path=path)  # type: ignore[attr-defined]
    s = ExotelSession(host, conn, ROUTE)  # type: ignore[arg-type]
    s.clock = clock
    tx = exotel.ExotelStream(1, "t", fmt=fmt)
    if start:
        s.on_text(tx.connected().encode())
        s.on_text(tx.start({"lang": "en"}, caller="+9111", called="+9122").encode())
        assert s.call is not None and not conn.closed
    return s, host, conn, clock, tx


def sent(conn: Conn) -> list[dict[str, Any]]:
    return [orjson.loads(t) for t in conn.texts]


def payloads(conn: Conn) -> list[bytes]:
    return [base64.b64decode(m["media"]["payload"]) for m in sent(conn) if m["event"] == "media"]


# -- the call -----------------------------------------------------------------------------


def test_start_admits_the_call_with_its_metadata() -> None:
    s, host, conn, clock, tx = session()
    call = s.call
    assert host.rates == [8000] and s.stream_id == tx.stream_sid
    assert call.transport_ids == {"stream_sid": tx.stream_sid, "call_sid": tx.call_sid, "account_sid": "ACbrisvox"}
    assert call.params == {"lang": "en"} and (call.caller, call.called) == ("+9111", "+9122")
    assert "call_params_dropped" not in host.counters


def test_a_signed_tokens_parameters_replace_the_streams_and_a_full_gateway_closes_with_1013() -> None:
    s, *_ = session(grant=Grant({"tenant": "a"}))
    assert s.call.params == {"tenant": "a"}
    s, host, conn, clock, tx = session(start=False)
    host.full = True
    feed(s, tx.start())
    assert (conn.close_code, conn.close_reason) == (1013, "try again later") and s.call is None


def test_the_urls_sample_rate_is_the_calls_when_the_start_does_not_say() -> None:
    s, host, conn, clock, tx = session(start=False, path="/exotel?sample-rate=24000&lang=en")
    start = orjson.loads(tx.start())
    del start["start"]["media_format"]
    feed(s, orjson.dumps(start).decode())
    assert host.rates == [24000] and s.rate == 24000


@pytest.mark.parametrize("rate", [8000, 16000, 24000])
def test_each_rate_both_ways_in_exotels_chunk_sizes(rate) -> None:
    fmt = exotel.FORMATS[rate]
    s, host, conn, clock, tx = session(fmt)
    assert host.rates == [rate] and s.rate == rate
    caller = np.arange(fmt.frame * 5, dtype=np.int16)
    feed(s, media(tx, caller.astype("<i2").tobytes()))  # Exotel's ~100 ms a message
    assert len(host.audio) == 1 and np.array_equal(host.audio[0], caller)
    bot = np.arange(fmt.frame * 23, dtype=np.int16) - 5000
    for k in range(23):
        assert s.send_audio(bot[k * fmt.frame:(k + 1) * fmt.frame], 0.0)
    assert all(len(p) >= exotel.MIN_CHUNK_BYTES and len(p) % 320 == 0 for p in payloads(conn))
    s.end_spurt()  # the talkspurt is over: the rest goes out, padded to the multiple
    got = payloads(conn)
    assert all(len(p) % 320 == 0 for p in got) and list(sent(conn)[0]) == ["event", "stream_sid", "media"]
    wire = b"".join(got)
    assert wire[:len(bot) * 2] == bot.astype("<i2").tobytes() and not wire[len(bot) * 2:].strip(b"\0")
    assert s.call.stats.packets_out == len(got)


def test_a_mark_follows_the_audio_before_it_and_a_clear_drops_what_is_kept() -> None:
    s, host, conn, clock, tx = session()
    for _ in range(3):
        s.send_audio(PCM, 0.0)
    assert conn.texts == []  # 960 bytes: under Exotel's minimum chunk
    s.send_mark("m1")
    msgs = sent(conn)
    assert [m["event"] for m in msgs] == ["media", "mark"] and len(payloads(conn)[0]) == 960
    assert msgs[1] == {"event": "mark", "stream_sid": tx.stream_sid, "mark": {"name": "m1"}}
    s.send_audio(PCM, 0.0)
    s.send_clear()
    s.end_spurt()
    assert sent(conn)[2:] == [{"event": "clear", "stream_sid": tx.stream_sid}]  # the kept frame is gone
    feed(s, tx.mark("m1"))
    feed(s, tx.dtmf("5"))
    assert host.marks == ["m1"] and host.digits == ["5"]


def test_a_pause_keeps_the_chunk_and_a_hangup_sends_it_first() -> None:
    s, host, conn, clock, tx = session()
    s.call.gate = SimpleNamespace(held=(1, 0.0))  # type: ignore[attr-defined]  # a Pause holds the call
    s.send_audio(PCM, 0.0)
    s.end_spurt()
    assert conn.texts == []
    s.call.gate = SimpleNamespace(held=None)  # type: ignore[attr-defined]
    s.hangup("agent done")
    assert len(payloads(conn)) == 1 and (conn.close_code, s.call.end_reason) == (1000, "agent done")


def test_stop_and_transfer() -> None:
    s, host, conn, clock, tx = session()
    done: list[tuple[bool, str]] = []
    s.transfer("sip:op@x", lambda ok, why: done.append((ok, why)))
    assert done == [(False, TRANSFER_REASON)]
    feed(s, tx.stop())
    assert (conn.close_code, conn.close_reason) == (1000, "stop") and s.call.end_reason == "stop"


@pytest.mark.parametrize("rate", [8000, 24000])
def test_digits_out_are_in_band_tones_at_the_streams_rate(rate) -> None:
    fmt = exotel.FORMATS[rate]
    s, host, conn, clock, tx = session(fmt)
    assert s.send_dtmf("7Z") == 1
    while s.tick_dtmf(time.monotonic()):
        pass
    assert not s._chunks.pending  # the last tone went out with its chunk
    x = np.concatenate([fmt.codec.decode(p) for p in payloads(conn)])[:rate // 10].astype(np.float64)
    spec = np.abs(np.fft.rfft(x * np.hanning(len(x))))
    freqs = np.fft.rfftfreq(len(x), 1 / rate)

    def power(f: float) -> float:
        return float(spec[np.abs(freqs - f) < 15].max())

    lo, hi = dtmf.FREQS["7"]
    assert min(power(lo), power(hi)) > 10 * max(power(697), power(1477))


# -- malformed input ------------------------------------------------------------------------


@pytest.mark.parametrize(("bad", "code"), [
    ("{not json", 1007), ("[1]", 1007), (b"\x00", 1003), ('{"event":"media","media":{"payload":""}}', 1008),
    ('{"event":"start"}', 1007),
    ('{"event":"start","stream_sid":"s","start":{"media_format":{"encoding":"audio/x-mulaw"}}}', 1003),
    ('{"event":"start","stream_sid":"s","start":{"media_format":{"sample_rate":"44100"}}}', 1003),
])
def test_malformed_before_the_call_closes_at_once(bad, code) -> None:
    s, host, conn, clock, tx = session(start=False)
    feed(s, bad)
    assert conn.closed and conn.close_code == code and s.call is None and host.call is None


# the malformed messages of Twilio's message set (Telnyx's table), with more than 1 s of 8 kHz L16
EXOTEL_BAD = {**TELNYX_BAD, "media_too_large": (exotel.BotStream("s").media(b"\x00" * 16002).decode(), 1009)}


@pytest.mark.parametrize("bad", list(EXOTEL_BAD))
def test_mid_call_malformed_is_counted_dropped_then_the_budget_closes(bad) -> None:
    s, host, conn, clock, tx = session(fault_max=20, fault_window_s=10.0)
    msg, code = EXOTEL_BAD[bad]
    for _ in range(20):
        feed(s, msg)
        clock.t += 0.01
        feed(s, media(tx, PCM.astype("<i2").tobytes()))
    assert not conn.closed and host.counters[f"ws_malformed_{bad}"] == 20 and len(host.audio) == 20
    feed(s, msg)
    reason = BUDGET_REASON.format(21, 10)
    assert (conn.close_code, conn.close_reason) == (code, reason) and s.call.end_reason == reason


def test_an_odd_payload_is_bad_media_and_unknown_events_are_never_charged() -> None:
    s, host, conn, clock, tx = session(hangup_on_error=True)
    for _ in range(3):
        feed(s, '{"event":"future_event"}')
        feed(s, tx.start())
        feed(s, tx.connected())
    assert not conn.closed and s.call.stats.malformed == 6
    assert host.counters["ws_malformed_unknown_event"] == 3 and host.counters["ws_malformed_duplicate_start"] == 3
    feed(s, media(tx, b"\x00\x01\x02"))
    assert (conn.close_code, conn.close_reason) == (1007, "L16 payload of odd length")


# -- the handshake ----------------------------------------------------------------------------


def auth(path: str = "/exotel", headers: Any = None, **cfg: Any) -> Any:
    """``exotel_auth`` of a request (``headers``: a dict, or pairs to repeat one) on a ``[websocket]`` of ``cfg``."""
    return ws_auth.exotel_auth(WebSocketConfig.from_section(cfg), ROUTE, path, Headers(headers or {}))


EXOTEL_ONLY = [{"path": "/exotel", "protocol": "exotel", "agent": "echo"}]


def test_without_a_secret_only_a_loopback_or_lab_listener_lets_exotel_in() -> None:
    assert auth() is ws_auth.UNCONFIGURED  # loopback is not trusted by default
    assert auth(trust_loopback=True) is ws_auth.OPEN
    with pytest.raises(ConfigError, match="native_secret"):  # refused at start, naming the key
        auth(host="0.0.0.0", routes=EXOTEL_ONLY)
    assert auth(host="0.0.0.0", routes=EXOTEL_ONLY, allow_unauthenticated=True) is ws_auth.OPEN
    cfg = WebSocketConfig.from_section({"host": "0.0.0.0", "routes": EXOTEL_ONLY, "allow_unauthenticated": True})
    assert cfg.missing_credentials() == [("native_secret", "exotel")]


def test_the_basic_password_is_the_native_secret_or_a_signed_token_for_the_agent() -> None:
    secret = "s" * 32

    def basic(password: str, user: str = "API_KEY") -> dict[str, str]:
        return {"Authorization": exotel.basic_header(user, password)}

    assert auth(headers=basic(secret), native_secret=secret) is ws_auth.OPEN
    assert auth(headers=basic(secret, user=""), native_secret=secret) is ws_auth.OPEN  # the user name is free
    assert auth(f"/exotel?sample-rate=16000&token={secret}", native_secret=secret) is ws_auth.OPEN
    tok = ws_auth.mint_token(secret, "echo", 60, {"tenant": "a"})
    assert auth(headers=basic(tok), native_secret=secret) == Grant({"tenant": "a"})
    assert auth(headers=basic(ws_auth.mint_token(secret, "sales", 60)), native_secret=secret) is ws_auth.WRONG_AGENT
    expired = native.sign_token(secret, "echo", int(time.time()) - 5)
    assert auth(headers=basic(expired), native_secret=secret) is ws_auth.EXPIRED_TOKEN
    for bad in ({}, basic("nope"), basic("", user=secret), {"Authorization": f"Bearer {secret}"},
                {"Authorization": "Basic @@@"}):
        assert auth(headers=bad, native_secret=secret) is ws_auth.BAD_TOKEN, bad
    repeated = [("Authorization", basic(secret)["Authorization"])] * 2
    assert auth(headers=repeated, native_secret=secret) is ws_auth.BAD_TOKEN
    # the header, when sent, is the credential: a query token does not rescue a bad one
    assert auth(f"/exotel?token={secret}", headers=basic("nope"), native_secret=secret) is ws_auth.BAD_TOKEN
