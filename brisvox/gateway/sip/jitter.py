"""The RTP receive jitter buffer of one SIP leg: reorder, loss and gap accounting.

Owns the reordering and loss accounting of a received stream; the packet
format is :mod:`brisvox.wire.rtp`.

Invariants (:class:`JitterBuffer`):

* Output is in sequence order with no added delay while packets arrive in
  order: a packet that is the next expected one goes out at once. Only an
  early packet (a gap before it) waits, at most ``depth`` packets or
  ``max_wait`` seconds; then the missing ones are declared lost.
* Every output carries the number of silence samples to insert before it,
  from the RTP timestamps (loss, or a sender pausing in silence), capped at
  ``max_gap`` so a long hold does not write minutes of zeros; positions in the
  ``in`` ring therefore follow the caller's timeline.
* A late packet (sequence already played out) or a duplicate is dropped and
  counted; an SSRC change flushes what is buffered and restarts the stream.
* Bounded: at most ``depth`` packets are held (the per-call buffer limit).
"""

from __future__ import annotations

from dataclasses import dataclass

from brisvox.wire.rtp import RtpPacket, seq_delta, ts_delta


@dataclass(slots=True)
class JitterStats:
    received: int = 0
    played: int = 0
    lost: int = 0
    late: int = 0
    duplicate: int = 0
    reordered: int = 0
    overflow: int = 0
    ssrc_changes: int = 0
    gap_samples: int = 0
    jitter_samples: float = 0.0  # RFC 3550 interarrival jitter estimate


class JitterBuffer:
    """Reorders one received stream; see the module invariants.

    ``push`` and ``poll`` return a list of ``(gap_samples, packet)``: insert
    ``gap_samples`` of silence, then the packet's payload.
    """

    __slots__ = ("depth", "max_wait", "max_gap", "clock_rate", "stats", "_expected", "_ssrc",
                 "_next_ts", "_held", "_held_since", "_transit")

    def __init__(self, depth: int = 3, max_wait: float = 0.06, max_gap: int = 8000, clock_rate: int = 8000) -> None:
        self.depth = max(1, depth)
        self.max_wait = max_wait
        self.max_gap = max_gap
        self.clock_rate = clock_rate
        self.stats = JitterStats()
        self._expected = -1
        self._ssrc = -1
        self._next_ts = -1
        self._held: dict[int, RtpPacket] = {}
        self._held_since = 0.0
        self._transit: float | None = None

    @property
    def held(self) -> int:
        return len(self._held)

    def push(self, pkt: RtpPacket, now: float) -> list[tuple[int, RtpPacket]]:
        st = self.stats
        st.received += 1
        self._update_jitter(pkt.timestamp, now)
        out: list[tuple[int, RtpPacket]] = []
        if pkt.ssrc != self._ssrc:
            if self._ssrc != -1:
                st.ssrc_changes += 1
                self._flush_all(out)
                self._next_ts = -1
                self._transit = None
            self._ssrc = pkt.ssrc
            self._expected = pkt.seq
        d = seq_delta(pkt.seq, self._expected)
        if d == 0:
            self._emit(pkt, out)
            self._drain(out)
            return out
        if d < 0:
            if -d > 1000:  # the sender restarted its sequence: resync
                self._flush_all(out)
                self._expected = pkt.seq
                self._emit(pkt, out)
                return out
            if pkt.seq in self._held:
                st.duplicate += 1
            else:
                st.late += 1
            return out
        if d > 1000:  # a jump far ahead: treat as a restart, not as 1000 losses
            self._flush_all(out)
            self._expected = pkt.seq
            self._emit(pkt, out)
            return out
        if pkt.seq in self._held:
            st.duplicate += 1
            return out
        if not self._held:
            self._held_since = now
        self._held[pkt.seq] = pkt
        st.reordered += 1
        if len(self._held) > self.depth:
            st.overflow += 1
            self._skip_to_first_held(out)
        return out

    def poll(self, now: float) -> list[tuple[int, RtpPacket]]:
        """Release held packets whose wait expired (called by the pacer tick)."""
        out: list[tuple[int, RtpPacket]] = []
        if self._held and now - self._held_since >= self.max_wait:
            self._skip_to_first_held(out)
        return out

    # -- internals ----------------------------------------------------------

    def _update_jitter(self, ts: int, now: float) -> None:
        transit = now * self.clock_rate - ts
        if self._transit is not None:
            d = abs(transit - self._transit)
            if d < self.clock_rate:  # ignore timestamp jumps (new talkspurt after a restart)
                self.stats.jitter_samples += (d - self.stats.jitter_samples) / 16.0
        self._transit = transit

    def _emit(self, pkt: RtpPacket, out: list[tuple[int, RtpPacket]]) -> None:
        gap = 0
        if self._next_ts != -1 and pkt.payload_type in (0, 8):
            d = ts_delta(pkt.timestamp, self._next_ts)
            if d > 0:
                gap = min(d, self.max_gap)
                self.stats.gap_samples += gap
        if pkt.payload_type in (0, 8):  # G.711: one byte per sample
            self._next_ts = (pkt.timestamp + len(pkt.payload)) & 0xFFFFFFFF
        self._expected = (pkt.seq + 1) & 0xFFFF
        self.stats.played += 1
        out.append((gap, pkt))

    def _drain(self, out: list[tuple[int, RtpPacket]]) -> None:
        held = self._held
        while held:
            pkt = held.pop(self._expected, None)
            if pkt is None:
                break
            self._emit(pkt, out)

    def _skip_to_first_held(self, out: list[tuple[int, RtpPacket]]) -> None:
        if not self._held:
            return
        first = min(self._held, key=lambda s: seq_delta(s, self._expected))
        self.stats.lost += seq_delta(first, self._expected)
        self._expected = first
        self._drain(out)

    def _flush_all(self, out: list[tuple[int, RtpPacket]]) -> None:
        while self._held:
            self._skip_to_first_held(out)
