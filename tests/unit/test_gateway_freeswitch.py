"""The mod_audio_stream leg (brisvox.gateway.carriers.freeswitch) and its handshake check, against a recording host.

* the metadata admits the call at the URL's rate with its parameters, id
  and numbers; audio before it and a metadata that is not a JSON object close at once;
* the caller's binary L16 reaches the call; the bot's audio goes out in
  ``streamAudio`` chunks of 3.2 KB or more (multiples of 320 bytes), the
  rest at the end of the talkspurt; a Clear drops the kept chunk and sends
  ``{"type":"clear"}``; the agent's hang-up flushes, sends ``{"type":"hangup"}``, closes;
* the handler's ``dtmf`` reaches the agent; unknown types are counted, never
  charged; malformed messages are charged to the fault budget;
* ``freeswitch_auth``: ``Authorization: Bearer`` or ``?token=`` is the native secret.
"""

from __future__ import annotations

import base64
from types import SimpleNamespace
from typing import Any

import numpy as np
import orjson
import pytest
from websockets.datastructures import Headers

from brisvox.gateway.carriers.freeswitch import TRANSFER_REASON, FreeSwitchSession
from brisvox.gateway.config import WebSocketConfig, WsRoute
from brisvox.gateway.ws import auth as ws_auth
from brisvox.gateway.ws.auth import Grant
from brisvox.wire import audio_stream as fs
from tests.unit.test_gateway_telnyx import RecordingHost, feed
from tests.unit.test_gateway_ws_faults import BUDGET_REASON, Clock, Conn

ROUTE = WsRoute("/freeswitch", "freeswitch", "echo")


def session(path: str = "/freeswitch", start: bool = True, **websocket: Any) -> tuple[FreeSwitchSession, RecordingHost,
                                                                                         Conn, fs.FreeSwitchStream]:
    host, conn = RecordingHost(**websocket), Conn()
    conn.request = SimpleNamespace(path=path)  # type: ignore[attr-defined]
    s = FreeSwitchSession(host, conn, ROUTE)  # type: ignore[arg-type]
    s.clock = Clock()
    tx = fs.FreeSwitchStream(params={"caller": "+331", "called": "3000", "lang": "fr"})
    if start:
        feed(s, tx.metadata())
        assert s.call is not None and not conn.closed
    return s, host, conn, tx


def audio_out(conn: Conn) -> list[bytes]:
    return [base64.b64decode(m["data"]["audioData"]) for m in map(orjson.loads, conn.texts)
            if m.get("type") == "streamAudio"]


def test_the_metadata_admits_the_call_at_the_urls_rate() -> None:
    s, host, conn, tx = session("/freeswitch?sample-rate=16000&token=x")
    assert host.rates == [16000] and s.call.transport_ids == {"uuid": tx.uuid}
    assert s.call.params == {"uuid": tx.uuid, "caller": "+331", "called": "3000", "lang": "fr"}
    assert (s.call.caller, s.call.called) == ("+331", "3000")
    pcm = np.arange(320, dtype=np.int16)
    feed(s, pcm.astype("<i2").tobytes())
    assert np.array_equal(host.audio[-1], pcm)


def test_the_bots_audio_in_chunks_clear_and_hangup() -> None:
    s, host, conn, tx = session()
    frame = np.full(160, 1000, np.int16)
    for _ in range(12):
        assert s.send_audio(frame, 0.0)
    assert [len(c) for c in audio_out(conn)] == [3200]  # 10 frames: the first chunk
    s.end_spurt()  # the rest, 2 frames: 640 bytes, a multiple of 320
    assert [len(c) for c in audio_out(conn)] == [3200, 640] and s.call.stats.packets_out == 2
    s.send_audio(frame, 0.0)
    s.send_clear()
    s.end_spurt()
    assert conn.texts[-1] == fs.CLEAR and len(audio_out(conn)) == 2  # the kept frame was dropped
    s.send_audio(frame, 0.0)
    s.hangup("agent done")
    assert [len(c) for c in audio_out(conn)] == [3200, 640, 320] and conn.texts[-1] == fs.HANGUP
    assert (conn.close_code, conn.close_reason) == (1000, "agent done")


def test_dtmf_unknown_types_and_the_fault_budget() -> None:
    s, host, conn, tx = session(fault_max=3, fault_window_s=10.0)
    feed(s, tx.dtmf("5"))
    feed(s, '{"type":"something_new"}')
    assert host.digits == ["5"] and host.counters == {"ws_malformed_unknown_event": 1} and s.call.stats.malformed == 1
    for m in ("{x", b"\x01", '{"type":"dtmf","digit":"Z"}'):
        feed(s, m)
    assert not conn.closed
    feed(s, "[]")
    assert (conn.close_code, conn.close_reason) == (1007, BUDGET_REASON.format(4, 10))
    done: list[tuple[bool, str]] = []
    s.transfer("x", lambda ok, why: done.append((ok, why)))
    assert done == [(False, TRANSFER_REASON)]


@pytest.mark.parametrize(("path", "msg", "code", "kind"), [
    ("/freeswitch", "{x", 1007, "bad_json"),
    ("/freeswitch", "[1]", 1007, "bad_message"),
    ("/freeswitch", b"\x00" * 320, 1008, "media_before_start"),
    ("/freeswitch?sample-rate=44100", '{"uuid":"a"}', 1003, "bad_media_format"),
])
def test_malformed_before_the_call_closes_at_once(path: str, msg: str | bytes, code: int, kind: str) -> None:
    s, host, conn, tx = session(path, start=False)
    feed(s, msg)
    assert conn.close_code == code and host.counters == {f"ws_malformed_{kind}": 1} and s.call is None


def test_auth_bearer_or_query_token() -> None:
    only = [{"path": "/freeswitch", "protocol": "freeswitch", "agent": "echo"}]
    cfg = WebSocketConfig.from_section({"native_secret": "s3", "host": "0.0.0.0", "routes": only})
    assert isinstance(ws_auth.freeswitch_auth(cfg, ROUTE, "/freeswitch", Headers({"Authorization": "Bearer s3"})), Grant)
    assert isinstance(ws_auth.freeswitch_auth(cfg, ROUTE, "/freeswitch?token=s3", Headers()), Grant)
    assert ws_auth.freeswitch_auth(cfg, ROUTE, "/freeswitch?token=no", Headers()) == ws_auth.BAD_TOKEN
    assert ws_auth.freeswitch_auth(cfg, ROUTE, "/freeswitch", Headers()) == ws_auth.BAD_TOKEN
    lab = WebSocketConfig.from_section({"host": "127.0.0.1", "trust_loopback": False, "routes": only})
    assert ws_auth.freeswitch_auth(lab, ROUTE, "/freeswitch", Headers()) == ws_auth.UNCONFIGURED
