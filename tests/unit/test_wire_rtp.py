"""brisvox/wire/rtp.py and dtmf.py: RTP packets (CSRC, extension, padding, refusals), the
sender's sequence/timestamp/marker rules, RFC 4733 DTMF both ways and the in-band tones."""

from __future__ import annotations

import pytest

from brisvox.wire import dtmf, rtp


def test_packet_round_trip_with_csrc_extension_padding():
    raw = bytearray(rtp.build(8, True, 65535, 4294967295, 0xDEADBEEF, b"\x01" * 10))
    p = rtp.parse(bytes(raw))
    assert (p.payload_type, p.marker, p.seq, p.timestamp, p.ssrc, p.payload) == (8, True, 65535, 4294967295,
                                                                                    0xDEADBEEF, b"\x01" * 10)
    # CSRC count 1, extension of one word, 2 bytes of padding
    hdr = bytes([0x80 | 0x20 | 0x10 | 1]) + raw[1:12] + b"\x00\x00\x00\x07" + b"\xbe\xde\x00\x01" + b"abcd"
    p2 = rtp.parse(hdr + b"PAY" + b"\x00\x02")
    assert p2.payload == b"PAY"
    for bad in (b"\x80\x00", b"\x40" + raw[1:], hdr + b"\x00\xff"):
        with pytest.raises(rtp.RtpError):
            rtp.parse(bad)


def test_sender_sequence_timestamp_marker():
    s = rtp.RtpSender()
    s.seq, s.ts = 65535, 4294967200
    h1 = rtp.parse(s.next_header(0, 160, 1.0) + b"x")
    h2 = rtp.parse(s.next_header(0, 160, 1.02) + b"x")
    assert h1.marker and not h2.marker
    assert (h1.seq, h2.seq) == (65535, 0) and h2.timestamp == (h1.timestamp + 160) & 0xFFFFFFFF
    s.end_spurt()
    h3 = rtp.parse(s.next_header(0, 160, 1.54) + b"x")  # 0.5 s pause after the frame sent at 1.02
    assert h3.marker and h3.timestamp == (h2.timestamp + 160 + 4000) & 0xFFFFFFFF
    assert h3.ssrc == h1.ssrc and h3.seq == 1


def test_dtmf_sender_schedule_and_receiver_dedup():
    tx = dtmf.EventSender(digit_ms=100, gap_ms=40)
    assert tx.add("1#x") == 1
    pkts = []
    ts = 0
    while tx.active and len(pkts) < 100:
        pkts.append(tx.next_packet(ts))
        ts += 160
    events = [p for p in pkts if p is not None]
    first = events[:8]
    assert first[0][1] and not any(m for _, m, _ in first[1:])
    assert [dtmf.decode_event(p)[3] for p, _, _ in first[:5]] == [160, 320, 480, 640, 800]
    assert [dtmf.decode_event(p)[1] for p, _, _ in first[5:8]] == [True] * 3
    assert len({t for _, _, t in first}) == 1
    rx = dtmf.EventReceiver()
    digits = [rx.on_packet(t, p) for p, _, t in events]
    assert [d.digit for d in digits if d] == ["1", "#"]
    assert [d.duration_ms for d in digits if d] == [100, 100]
    assert rx.on_packet(5, b"\x01") is None and rx.bad == 1


def test_inband_tone_has_the_two_frequencies():
    import numpy as np

    t = dtmf.tone("5", 100).astype(float)
    spec = np.abs(np.fft.rfft(t))
    freqs = np.fft.rfftfreq(len(t), 1 / 8000)
    top = sorted(freqs[np.argsort(spec)[-2:]])
    assert abs(top[0] - 770) < 15 and abs(top[1] - 1336) < 15
