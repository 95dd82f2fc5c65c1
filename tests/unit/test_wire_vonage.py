"""Vonage Voice API WebSocket messages (brisvox.wire.vonage), against the vendor's documented examples.

The fixtures are the examples of Vonage's Voice API guide "WebSockets"
(developer.vonage.com/en/voice/voice-api/concepts/websockets, as kept in
github.com/Nexmo/nexmo-developer ``_documentation/en/voice/voice-api/concepts/websockets.md``)
and, for ``clear`` / ``notify``, of the AsyncAPI description generated from that page
(github.com/api-evangelist/vonage ``asyncapi/vonage-asyncapi.yml``), copied as data:

* ``websocket:connected`` reads as documented (the content-type, the NCCO's
  headers at the top level as the call's parameters, nested ones dropped
  and counted); every other content-type is refused with 1003;
* binary audio is 20 ms of little-endian L16: 320 bytes at 8 kHz, 640 at
  16 kHz; an odd length or more than 1 s is refused; the bot's audio is cut
  into whole 20 ms messages, the tail padded;
* ``websocket:dtmf``, ``websocket:notify``, the bot's ``clear`` and
  ``notify`` are the documented shapes; the client's reader reads them back;
* what the client sends as Vonage parses as the gateway parses Vonage.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
import pytest

from brisvox.client.vonage import VonageTransport
from brisvox.wire import plivo, vonage
from brisvox.wire.mediastream import L16LE, StreamError

# "First message": the generic example and the one the connect example results in
DOC_CONNECTED = {"event": "websocket:connected", "content-type": "audio/l16;rate=16000",
                 "prop1": "value1", "prop2": "value2"}
DOC_CONNECTED_HEADERS = {"event": "websocket:connected", "content-type": "audio/l16;rate=16000",
                         "language": "en-GB", "caller-id": "447700900123"}
# "Connecting to a WebSocket": the NCCO endpoint's headers (nested values among them), as they arrive
DOC_NCCO_HEADERS = {"name": "J Doe", "age": 40,
                    "address": {"line_1": "Apartment 14", "line_2": "123 Example Street", "city": "New York City"},
                    "system_roles": [183493, 1038492, 22], "enable_auditing": False}
# "JSON DTMF messages"
DOC_DTMF = {"event": "websocket:dtmf", "digit": "5", "duration": 260}
# the AsyncAPI document's examples (ClearCommand, WebsocketClearedEvent, NotifyCommand, WebsocketNotifyEvent)
DOC_CLEAR = {"action": "clear"}
DOC_CLEARED = {"event": "websocket:cleared"}
DOC_NOTIFY = {"action": "notify", "payload": {"customKey": "customValue"}}
DOC_NOTIFIED = {"event": "websocket:notify", "payload": {"customKey": "customValue"}}


def refusal(fn: Any, *args: Any) -> tuple[str, int]:
    with pytest.raises(StreamError) as e:
        fn(*args)
    return e.value.kind, e.value.code


# -- Vonage -> bot --------------------------------------------------------------------------


def test_the_connected_event_reads_as_documented() -> None:
    c = vonage.parse_connected(DOC_CONNECTED)
    assert c.fmt == vonage.Format(16000) and c.params == {"prop1": "value1", "prop2": "value2"}
    assert c.dropped == 0 and c.ids == {} and c.stream_id == "" and c.numbers == ("", "")
    c = vonage.parse_connected(DOC_CONNECTED_HEADERS)
    assert c.params == {"language": "en-GB", "caller-id": "447700900123"}
    assert vonage.parse_connected({"event": "websocket:connected", "content-type": "audio/l16;rate=8000"}) == \
        vonage.Connected(vonage.Format(8000), None, 0)


def test_the_ncco_headers_are_the_calls_parameters_nested_ones_dropped_and_counted() -> None:
    c = vonage.parse_connected({**DOC_CONNECTED, **DOC_NCCO_HEADERS})
    assert c.params == {"prop1": "value1", "prop2": "value2", "name": "J Doe", "age": "40",
                        "enable_auditing": "false"}
    assert c.dropped == 2  # address (an object), system_roles (a list)


def test_the_answer_webhooks_ids_and_numbers_passed_as_headers() -> None:
    uuid, conv = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab", "CON-aaaaaaaa-bbbb-cccc-dddd-0123456789ab"
    c = vonage.parse_connected({**DOC_CONNECTED, "uuid": uuid, "conversation_uuid": conv,
                                "from": "447700900000", "to": "442079460000"})
    assert c.ids == {"uuid": uuid, "conversation_uuid": conv} and c.stream_id == uuid
    assert c.numbers == ("447700900000", "442079460000")
    c = vonage.parse_connected({**DOC_CONNECTED, "uuid": "u" * 200, "conversation_uuid": 7})
    assert c.ids == {"conversation_uuid": "7"}  # an id too long for one is still a parameter
    assert c.params == {"prop1": "value1", "prop2": "value2", "uuid": "u" * 200, "conversation_uuid": "7"}
    c = vonage.parse_connected({**DOC_CONNECTED, "from": "+1\r\nX: 1", "to": "x" * 300})
    assert c.numbers == ("", "") and c.dropped == 2


@pytest.mark.parametrize(("ct", "rate"), [
    ("audio/l16;rate=16000", 16000), ("audio/l16;rate=8000", 8000), ("Audio/L16; rate=8000", 8000),
])
def test_the_two_documented_content_types(ct: str, rate: int) -> None:
    fmt = vonage.parse_format(ct)
    assert fmt.rate == rate and fmt.content_type == f"audio/l16;rate={rate}"


@pytest.mark.parametrize("ct", [
    "audio/l16;rate=24000", "audio/l16;rate=44100", "audio/l16", "audio/pcmu;rate=8000",
    "audio/l16;rate=16000;rate=8000", "", None, 16000, ["audio/l16;rate=16000"],
])
def test_every_other_content_type_is_refused_with_1003(ct: Any) -> None:
    assert refusal(vonage.parse_connected, {"event": "websocket:connected", "content-type": ct}) == \
        ("bad_media_format", 1003)
    assert refusal(vonage.parse_connected, {"event": "websocket:connected"}) == ("bad_media_format", 1003)


@pytest.mark.parametrize(("rate", "size"), [(8000, 320), (16000, 640)])  # "Binary audio messages": the table
def test_a_message_is_20_ms_of_little_endian_l16(rate: int, size: int) -> None:
    fmt = vonage.Format(rate)
    pcm = (np.arange(fmt.frame) * 97 - 15000).astype(np.int16)
    (msg,) = list(fmt.frames(pcm))
    assert len(msg) == size == fmt.frame * 2 and msg == pcm.astype("<i2").tobytes()
    assert np.array_equal(fmt.decode(msg), pcm)


def test_the_bots_audio_is_cut_into_whole_messages_the_tail_padded() -> None:
    fmt = vonage.Format(8000)
    pcm = np.arange(1, 161 + 50, dtype=np.int16)
    msgs = list(fmt.frames(pcm))
    assert [len(m) for m in msgs] == [320, 320]
    assert np.array_equal(fmt.decode(msgs[0]), pcm[:160])
    assert np.array_equal(fmt.decode(msgs[1]), np.concatenate([pcm[160:], np.zeros(110, np.int16)]))
    assert list(fmt.frames(np.zeros(0, np.int16))) == []


def test_an_odd_or_over_a_second_frame_is_refused() -> None:
    fmt = vonage.Format(16000)
    assert fmt.max_bytes == 32000
    assert refusal(fmt.decode, b"\x00\x01\x02") == ("bad_media", 1007)
    assert refusal(fmt.decode, bytes(32002)) == ("media_too_large", 1009)
    assert len(fmt.decode(bytes(32000))) == 16000 and len(fmt.decode(b"")) == 0


def test_l16_is_little_endian_both_ways_and_plivo_shares_the_codec() -> None:
    pcm = np.array([0, 1, -2, 1000, -32768, 32767], np.int16)
    wire = b"\x00\x00\x01\x00\xfe\xff\xe8\x03\x00\x80\xff\x7f"
    assert L16LE.encode(pcm).tobytes() == wire and np.array_equal(L16LE.decode(wire), pcm)
    out = np.empty(len(pcm), "<i2")
    assert L16LE.encode(pcm, out=out) is out and out.tobytes() == wire
    assert refusal(L16LE.decode, b"\x00") == ("bad_media", 1007)
    l16 = plivo.Format(plivo.L16, 16000)
    assert l16.encode(pcm) == wire and np.array_equal(l16.decode(wire), pcm)


def test_dtmf_reads_as_documented() -> None:
    assert vonage.dtmf_event(DOC_DTMF) == ("5", 260)
    for digit in "0123456789*#":
        assert vonage.dtmf_event({**DOC_DTMF, "digit": digit}) == (digit, 260)
    assert vonage.dtmf_event({**DOC_DTMF, "digit": "a"}) == ("A", 260)
    for duration in (None, "260", -1, 60001, 2.5, True):
        assert vonage.dtmf_event({**DOC_DTMF, "duration": duration}) == ("5", 0)
    for digit in ("Z", "55", "", 5, None):
        assert refusal(vonage.dtmf_event, {**DOC_DTMF, "digit": digit}) == ("bad_dtmf", 1007)


def test_a_notify_is_answered_with_its_payload_and_a_mark_is_read_back() -> None:
    assert vonage.bot_event(DOC_NOTIFY) == ("notify", DOC_NOTIFY["payload"])
    assert orjson.loads(vonage.VonageStream.notified(DOC_NOTIFY["payload"])) == DOC_NOTIFIED
    assert vonage.notify_name({"event": "websocket:notify", "payload": {"mark": "m1"}}) == "m1"
    for bad in (DOC_NOTIFIED, {"event": "websocket:notify"}, {"event": "websocket:notify", "payload": "m1"},
                {"event": "websocket:notify", "payload": {"mark": 7}}):
        assert refusal(vonage.notify_name, bad) == ("bad_mark", 1007)


# -- bot -> Vonage --------------------------------------------------------------------------


def test_the_bots_messages_are_the_documented_shapes() -> None:
    assert vonage.CLEAR == orjson.dumps(DOC_CLEAR)
    assert vonage.bot_event(orjson.loads(vonage.CLEAR)) == ("clear", None)
    assert orjson.loads(vonage.VonageStream.cleared()) == DOC_CLEARED
    for name in ("brisvox-end-3-1", 'a "quoted" \\ name\n\t\x01', "é✓"):
        assert vonage.notify(name) == orjson.dumps({"action": "notify", "payload": {"mark": name}})
        event, payload = vonage.bot_event(orjson.loads(vonage.notify(name)))
        assert event == "notify" and vonage.notify_name(orjson.loads(vonage.VonageStream.notified(payload))) == name
    for bad in ({"action": "notify"}, {"action": "notify", "payload": [1]}, None, [1]):
        assert vonage.bot_event(bad) == ("invalid", None)
    assert vonage.bot_event({"action": "other"}) == ("other", None)
    assert vonage.bot_event({}) == ("other", None)


# -- what the client sends as Vonage ---------------------------------------------------------


class FakeWs:
    def __init__(self) -> None:
        self.sent: list[str | bytes] = []

    async def send(self, m: str | bytes) -> None:
        self.sent.append(m)


def test_the_client_plays_vonage_as_the_gateway_parses_it() -> None:
    t = VonageTransport("ws://x/vonage", {"lang": "en"}, rate=8000, token="tok", caller="+1555", called="+1666")
    (hello,) = t.hello()
    c = vonage.parse_connected(orjson.loads(hello))
    assert (c.fmt.rate, c.numbers, c.ids) == (8000, ("+1555", "+1666"), t.ids)
    assert c.params == {"lang": "en", "from": "+1555", "to": "+1666", "uuid": t.ids["uuid"]}
    assert t.headers == {"Authorization": "Bearer tok"} and t.bye() is None
    assert vonage.dtmf_event(orjson.loads(t.stream.dtmf("#"))) == ("#", 260)
    with pytest.raises(ValueError, match="24000"):
        VonageTransport("ws://x/vonage", rate=24000)

    async def go() -> None:
        ws = FakeWs()
        t.ws = ws
        got: list[Any] = []
        t._events.on_audio = lambda pcm, now: got.append(pcm)
        t._events.on_clear = lambda now: got.append("clear")
        await t.on_message(np.arange(160, dtype="<i2").tobytes(), 0.0)
        await t.on_message(b"\x01", 0.0)
        await t.on_message(vonage.CLEAR.decode(), 0.0)
        await t.on_message(vonage.notify("m1").decode(), 0.0)
        await t.on_message("{not json", 0.0)
        assert np.array_equal(got[0], np.arange(160)) and got[1] == "clear" and t.invalid == 2
        assert [orjson.loads(m) for m in ws.sent] == [DOC_CLEARED, {"event": "websocket:notify",
                                                                   "payload": {"mark": "m1"}}]
        ws.sent.clear()
        await t.send_audio(np.ones(320, np.int16))  # 40 ms: two messages
        assert [len(m) for m in ws.sent] == [320, 320]

    asyncio.run(go())
