"""RTP packets, the jitter buffer (reorder, loss, duplicates, SSRC change, gaps), the sender's
sequence/timestamp/marker rules, RFC 4733 DTMF both ways, and the gateway config sections."""

from __future__ import annotations

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway import dtmf, rtp
from brisvox.gateway.config import GatewayConfig, SipConfig, WebSocketConfig


def pkt(seq: int, ts: int | None = None, ssrc: int = 1, pt: int = 0, n: int = 160, marker: bool = False):
    return rtp.parse(rtp.build(pt, marker, seq & 0xFFFF, (seq * 160 if ts is None else ts) & 0xFFFFFFFF,
                               ssrc, bytes([seq & 0xFF]) * n))


def seqs(out):
    return [p.seq for _, p in out]


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


def test_in_order_packets_pass_without_delay():
    jb = rtp.JitterBuffer(depth=4)
    for i in range(100, 110):
        out = jb.push(pkt(i), i * 0.02)
        assert seqs(out) == [i] and out[0][0] == 0


def test_reordering_within_the_window_is_repaired():
    jb = rtp.JitterBuffer(depth=4)
    got = []
    for s in (1, 2, 4, 3, 5, 7, 6):
        got += seqs(jb.push(pkt(s), 0.0))
    assert got == [1, 2, 3, 4, 5, 6, 7]
    assert jb.stats.lost == 0 and jb.stats.reordered == 2


def test_loss_is_declared_after_the_window_and_filled_with_the_timestamp_gap():
    jb = rtp.JitterBuffer(depth=3, max_wait=0.06)
    out = jb.push(pkt(1), 0.0) + jb.push(pkt(3), 0.02)
    assert seqs(out) == [1]
    assert jb.poll(0.05) == []
    late = jb.poll(0.09)
    assert seqs(late) == [3] and late[0][0] == 160  # 20 ms of silence for the lost packet
    assert jb.stats.lost == 1
    assert jb.push(pkt(2), 0.1) == [] and jb.stats.late == 1
    # too many held packets: skip forward at once
    out = []
    for s in (5, 6, 7, 8):
        out += jb.push(pkt(s), 0.2)
    assert seqs(out) == [5, 6, 7, 8] and jb.stats.lost == 2 and jb.stats.overflow == 1


def test_duplicates_wraparound_ssrc_change_and_restart():
    jb = rtp.JitterBuffer(depth=4)
    out = []
    for s in (65534, 65535, 0, 0, 1):
        out += jb.push(pkt(s), 0.0)
    assert seqs(out) == [65534, 65535, 0, 1] and jb.stats.late + jb.stats.duplicate == 1
    out = jb.push(pkt(5000, ts=1, ssrc=2), 0.1)
    assert seqs(out) == [5000] and jb.stats.ssrc_changes == 1 and out[0][0] == 0
    out = jb.push(pkt(40000, ts=100000, ssrc=2), 0.2)  # a far jump: restart, not 35000 losses
    assert seqs(out) == [40000] and jb.stats.lost == 0
    assert out[0][0] == 8000  # the gap is capped at max_gap


def test_silence_suppression_gap_from_timestamps():
    jb = rtp.JitterBuffer()
    jb.push(pkt(1, ts=1000), 0.0)
    out = jb.push(pkt(2, ts=1000 + 160 + 800, marker=True), 0.12)
    assert out[0][0] == 800


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


def test_config_sections_validate_and_name_keys():
    assert SipConfig.from_section({}).port == 5060
    assert WebSocketConfig.from_section({}).route("/twilio").protocol == "twilio"
    assert WebSocketConfig.from_section({}).route("/ws/echo").agent == "echo"
    assert WebSocketConfig.from_section({}).route("/other") is None
    for cls, table, key in [
        (GatewayConfig, {"max_calls": 0}, "gateway.max_calls"),
        (GatewayConfig, {"nope": 1}, "gateway.nope"),
        (SipConfig, {"allow": ["not-a-net"]}, "sip.allow[0]"),
        (SipConfig, {"codecs": ["G729"]}, "sip.codecs[0]"),
        (SipConfig, {"port": "5060"}, "sip.port"),
        (WebSocketConfig, {"routes": [{"path": "x", "protocol": "twilio"}]}, "websocket.routes[0].path"),
        (WebSocketConfig, {"routes": [{"path": "/x", "protocol": "sip"}]}, "websocket.routes[0].protocol"),
        (WebSocketConfig, {"native_rates": [11025]}, "websocket.native_rates[0]"),
    ]:
        with pytest.raises(ConfigError) as e:
            cls.from_section(table)
        assert e.value.key == key
