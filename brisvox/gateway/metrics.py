"""Counters of the gateway: per call, totals, and the pacer's timing histograms.

Owns the names of every gateway metric and their aggregation for
``rt.report()`` (the supervisor turns the stats dict into ``/metrics``).

Invariants: counters only grow; a call's counters are folded into the
totals when the call ends, so totals stay right after the call table has
forgotten the call; histograms are fixed arrays (no allocation per sample).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


@dataclass(slots=True)
class CallStats:
    """Per-call counters (exported live for active calls, folded into totals at end)."""

    packets_in: int = 0
    packets_out: int = 0
    bytes_in: int = 0
    frames_out: int = 0
    samples_in: int = 0
    samples_out: int = 0
    late_frames: int = 0  # released more than one frame after its due time
    underruns: int = 0  # the out ring ran dry mid-stream and audio resumed soon after
    lost: int = 0  # RTP packets declared lost by the jitter buffer
    late_packets: int = 0  # RTP packets that arrived after their slot was played
    reordered: int = 0
    duplicates: int = 0
    ssrc_changes: int = 0
    jitter_ms: float = 0.0  # RFC 3550 interarrival jitter of the received stream (gauge)
    clears: int = 0
    stale_samples: int = 0  # out-ring samples refused by the epoch ledger after a Clear
    marks: int = 0
    marks_played: int = 0
    marks_cleared: int = 0
    marks_refused: int = 0
    dtmf_in: int = 0
    dtmf_out: int = 0
    send_dropped: int = 0  # outbound frames dropped (slow WebSocket peer)
    malformed: int = 0  # bad messages on this call's connection
    ring_lost: int = 0  # out-ring samples overwritten before the pacer read them
    rtp_foreign_dropped: int = 0  # RTP packets from a source other than the call's latch (SIP)
    srtp_dropped: int = 0  # SRTP packets refused: auth failure, replay, malformed, SSRC limit (SIP)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


CALL_COUNTER_NAMES = tuple(f.name for f in fields(CallStats) if f.name != "jitter_ms")

# The WebSocket listener's flood counters (brisvox/gateway/ws/: half_open, listener, inbound),
# exported from the start at 0 so that an alert on their rate needs no first occurrence:
# connections reset at accept time (a source over max_half_open_per_source; the oldest half-open
# one at max_half_open), accept() errors (and those of them for want of descriptors), and the
# connections closed 1008 over a per-second budget or with their send buffer full at a ping.
WS_FLOOD_COUNTERS = (
    "ws_dropped_half_open_source",
    "ws_evicted_half_open",
    "ws_accept_errors",
    "ws_accept_errors_fd",
    "ws_closed_frame_rate",
    "ws_closed_byte_rate",
    "ws_closed_control_rate",
    "ws_closed_send_buffer",
)


class Histogram:
    """Fixed-bucket histogram in ``step`` units up to ``limit`` (the last bucket is overflow)."""

    __slots__ = ("step", "counts", "n", "_nb")

    def __init__(self, step: float, limit: float) -> None:
        self.step = step
        self._nb = int(limit / step) + 1
        self.counts = np.zeros(self._nb, dtype=np.int64)
        self.n = 0

    def add(self, value: float) -> None:
        i = int(value / self.step)
        if i >= self._nb:
            i = self._nb - 1
        elif i < 0:
            i = 0
        self.counts[i] += 1
        self.n += 1

    def quantile(self, q: float) -> float:
        if self.n == 0:
            return 0.0
        target = q * self.n
        c = np.cumsum(self.counts)
        i = int(np.searchsorted(c, target, side="left"))
        return (i + 1) * self.step  # upper edge of the bucket

    def reset(self) -> None:
        self.counts[:] = 0
        self.n = 0


class GatewayMetrics:
    """Totals of the gateway plus the timing histograms."""

    def __init__(self) -> None:
        self.counters: dict[str, int] = {}
        self.ended = CallStats()
        # pacer: deviation of consecutive release intervals from the frame period (ms)
        self.release_jitter = Histogram(0.05, 50.0)
        # pacer tick lateness (ms)
        self.tick_late = Histogram(0.05, 50.0)
        # Clear: from the frame's send stamp (agent) to the cut, and from its arrival here (ms)
        self.clear_latency = Histogram(0.01, 20.0)
        self.clear_local = Histogram(0.001, 2.0)

    def inc(self, name: str, n: int = 1) -> None:
        self.counters[name] = self.counters.get(name, 0) + n

    def fold(self, stats: CallStats) -> None:
        e = self.ended
        for name in CALL_COUNTER_NAMES:
            setattr(e, name, getattr(e, name) + getattr(stats, name))

    def snapshot(self, live: list[CallStats]) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in CALL_COUNTER_NAMES:
            out[f"call_{name}_total"] = getattr(self.ended, name) + sum(getattr(s, name) for s in live)
        for k, v in self.counters.items():
            out[k] = v
        out["release_jitter_p50_ms"] = self.release_jitter.quantile(0.5)
        out["release_jitter_p99_ms"] = self.release_jitter.quantile(0.99)
        out["tick_late_p99_ms"] = self.tick_late.quantile(0.99)
        out["clear_latency_p99_ms"] = self.clear_latency.quantile(0.99)
        out["clear_local_p99_ms"] = self.clear_local.quantile(0.99)
        return out
