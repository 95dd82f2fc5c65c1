"""bench/loadgen/wire.py: the pre-encoded media frames are exactly the wire module's messages, masked.

Every frame is parsed back with the websockets library's own server-side
parser (which checks the masking bit and unmasks), and the text compared
byte for byte with what ``brisvox.wire.twilio.TwilioStream.media`` builds for
the same call state; counters are shared with the other messages of the call.
(How bot messages are read is tests/unit/test_wire_twilio.py.)
"""

from __future__ import annotations

import base64
import os

import pytest
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from bench.loadgen import wire
from brisvox.wire.twilio import TwilioStream


def parse_frames(data: bytes) -> list[Frame]:
    """Frames as a WebSocket server parses them (mask required)."""
    reader = StreamReader()
    reader.feed_data(data)
    out = []
    while reader.buffer:
        gen = Frame.parse(reader.read_exact, mask=True, max_size=2**20)
        try:
            next(gen)
        except StopIteration as stop:
            out.append(stop.value)
            continue
        raise AssertionError("incomplete frame")
    return out


# ids: the random key must not name the test (pytest-xdist workers each collect it and must agree)
@pytest.mark.parametrize("key", [b"\x00\x00\x00\x00", b"\x01\x02\x03\x04", os.urandom(4)],
                         ids=["zeros", "ramp", "random"])
def test_media_frames_unmask_to_exactly_the_old_messages(key: bytes) -> None:
    lines = [[base64.b64encode(os.urandom(160)).decode() for _ in range(7)] for _ in range(2)]
    shared = [wire.encode_payloads(frames, key) for frames in lines]  # once per line, for every caller
    for index in (0, 7, 123456):
        new, old = wire.WireStream(index, key), TwilioStream(index)
        assert new.start() == old.start()  # counters move together from the first message on
        # 150 frames: sequence numbers and timestamps cross 1, 2, 3 and 4 digits, so the
        # payload and the tail start at every offset modulo 4
        for i in range(150):
            if i % 40 == 39:
                assert new.mark(f"m{i}") == old.mark(f"m{i}")
            p = shared[i % 2][i % 7]
            data = new.media_frame(p)
            (frame,) = parse_frames(data)
            assert frame.opcode is Opcode.TEXT and frame.fin
            assert frame.data == old.media(lines[i % 2][i % 7]).encode()
        assert new.stop() == old.stop()


def test_the_same_payload_object_serves_every_caller() -> None:
    key = wire.new_key()
    payload = wire.MediaPayload(base64.b64encode(bytes(range(160))).decode(), key)
    a, b = wire.WireStream(1, key), wire.WireStream(2, key)
    b.media_frame(payload)  # b is one frame ahead: different offsets for the same payload
    fa, fb = parse_frames(a.media_frame(payload))[0], parse_frames(b.media_frame(payload))[0]
    assert TwilioStream(1).media(payload.b64).encode() == fa.data
    ref = TwilioStream(2)
    ref.media(payload.b64)
    assert ref.media(payload.b64).encode() == fb.data
