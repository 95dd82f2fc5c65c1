"""brisvox/gateway/sip/jitter.py (reorder, loss, duplicates, SSRC change, gaps) and the gateway
config sections."""

from __future__ import annotations

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import GatewayConfig, SipConfig, WebSocketConfig
from brisvox.gateway.sip.jitter import JitterBuffer
from brisvox.wire import rtp


def pkt(seq: int, ts: int | None = None, ssrc: int = 1, pt: int = 0, n: int = 160, marker: bool = False):
    return rtp.parse(rtp.build(pt, marker, seq & 0xFFFF, (seq * 160 if ts is None else ts) & 0xFFFFFFFF,
                               ssrc, bytes([seq & 0xFF]) * n))


def seqs(out):
    return [p.seq for _, p in out]


def test_in_order_packets_pass_without_delay():
    jb = JitterBuffer(depth=4)
    for i in range(100, 110):
        out = jb.push(pkt(i), i * 0.02)
        assert seqs(out) == [i] and out[0][0] == 0


def test_reordering_within_the_window_is_repaired():
    jb = JitterBuffer(depth=4)
    got = []
    for s in (1, 2, 4, 3, 5, 7, 6):
        got += seqs(jb.push(pkt(s), 0.0))
    assert got == [1, 2, 3, 4, 5, 6, 7]
    assert jb.stats.lost == 0 and jb.stats.reordered == 2


def test_loss_is_declared_after_the_window_and_filled_with_the_timestamp_gap():
    jb = JitterBuffer(depth=3, max_wait=0.06)
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
    jb = JitterBuffer(depth=4)
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
    jb = JitterBuffer()
    jb.push(pkt(1, ts=1000), 0.0)
    out = jb.push(pkt(2, ts=1000 + 160 + 800, marker=True), 0.12)
    assert out[0][0] == 800


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
