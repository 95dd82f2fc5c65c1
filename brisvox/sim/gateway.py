"""The simulator's gateway: the real playout gate on virtual time, one call, in-memory rings.

Owns what the simulated gateway does with the bot's audio: it releases 20 ms
(one tick's worth) of the ``out`` ring per tick to the :class:`~brisvox.sim.world.Wire`
and drives the SAME :class:`~brisvox.playout.gate.PlayoutGate` the real
gateway drives (``brisvox/gateway/core/playout_commands.py``), so every sim scenario runs
the real semantics of Clear, lazy Clear, Pause/Resume, utterance starts,
marks and release reports. Only the execution of the gate's actions is the
sim's: a cut raises the MemRing's floor, Cleared and MarkPlayed go to the
actor (Cleared after ``cleared_delay``, or never with ``drop_cleared``), a
mark sent to the peer is echoed at once by the simulated client (never with
``echo_marks`` off; the cut ones also after a Clear with
``echo_marks_on_clear``, which the gate swallows like the real gateway).

Invariants:

* The gate decides; this module never releases what the gate refuses
  (``releasable_from``) and never releases during a hold.
* The release position reported to the actor (Playback, every
  ``playback_every`` ticks) is the gate's, and only after something was
  released since the last report, as the real gateway's Playback.
* While ``sending`` is off (the call held, or in early media) nothing is released
  and the position stands, as the real pacer does for a leg that cannot send.
* ``pause_log`` records every Pause-related step with the release position
  at that moment; ``clear_log`` every Cleared with its final position.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from brisvox.playout import gate as G
from brisvox.sim.memring import MemRing

if TYPE_CHECKING:
    from brisvox.sim.world import Wire, WorldConfig

TICK = 0.02

_PAUSE_KINDS = {"pauses": "pause", "pauses_repeated": "pause", "pauses_stale": "stale",
                "resumes": "resume", "resumes_unpaused": "resume_unpaused",
                "pauses_cleared": "cleared", "pauses_superseded": "superseded"}


class SimGateway:
    """See the module docstring. ``actor``: anything with ``on_cleared``, ``on_mark_played``
    and ``on_playback`` (the call actor)."""

    def __init__(self, cfg: WorldConfig, out: MemRing, wire: Wire) -> None:
        self.cfg = cfg
        self.out = out
        self.wire = wire
        self.actor: Any = None
        self.gate = G.PlayoutGate(G.Counts(), max_marks=64, pause_max_s=cfg.pause_max)
        self.read_pos = 0  # the reader: may run ahead of the gate's release position by a skip
        self.out_utts: list[tuple[int, int, int]] = []  # (out_pos, utt, epoch)
        self.counters: dict[str, int] = {}
        self.clear_log: list[tuple[float, int, int]] = []  # (t, epoch, final position)
        self.pause_log: list[tuple[float, str, int, int]] = []  # (t, kind, epoch, release position)
        self.clear_wall_ns: list[int] = []
        self.stale_samples = 0
        self.max_unreleased = 0  # out samples written but not released, at most (ring lead)
        self.ticks = 0
        self.sending = True  # False while the call is not answered (held, early media): nothing is released
        self._epoch_of_step = 0
        self._handlers: dict[type, Callable[[Any], None]] = {
            G.Count: self._count, G.CutRing: self._cut, G.SendCleared: self._cleared,
            G.SendMark: self._send_mark, G.MarkPlayed: self._mark_played,
            G.StopSpurt: _nothing, G.ClearTransport: _nothing, G.ForgetAnnouncement: _nothing,
            G.StartUtterance: _nothing, G.Hold: _nothing, G.Kick: _nothing,
        }

    # -- inputs (frames from the actor and the worker) --------------------------------------

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _run(self, actions: Any) -> None:
        for a in actions:
            self._handlers[type(a)](a)

    def clear(self, epoch: int, sent_ns: int, lazy: bool) -> None:
        """Clear(epoch): epochs <= ``epoch`` are dead (the ipc protocol)."""
        if len(self.clear_wall_ns) < 256:
            self.clear_wall_ns.append(time.monotonic_ns())
        self.wire.clears.append((self._now(), epoch + 1))
        self._epoch_of_step = epoch
        self._run(self.gate.handle(G.ClearIn(epoch, self.read_pos, self.out.write_pos, sent_ns, lazy)))

    def pause(self, epoch: int) -> None:
        self._epoch_of_step = epoch
        self._run(self.gate.handle(G.PauseIn(epoch, self._now())))

    def resume(self, epoch: int) -> None:
        self._epoch_of_step = epoch
        self._run(self.gate.handle(G.ResumeIn(epoch)))

    def mark(self, name: str, position: int) -> None:
        self._run(self.gate.handle(G.MarkIn(name, position)))

    def utterance(self, utt: int, epoch: int, out_pos: int) -> None:
        """The worker's OutUtterance."""
        self.out_utts.append((out_pos, utt, epoch))
        self._epoch_of_step = epoch
        self._run(self.gate.handle(G.UtteranceIn(epoch, out_pos)))

    # -- actions ----------------------------------------------------------------------------

    def _count(self, a: G.Count) -> None:
        self.counters[a.name] = self.counters.get(a.name, 0) + 1
        kind = _PAUSE_KINDS.get(a.name)
        if kind is not None:
            self.pause_log.append((self._now(), kind, self._epoch_of_step, self.gate.release_pos))

    def _cut(self, a: G.CutRing) -> None:
        self.out.cut(a.position)

    def _cleared(self, a: G.SendCleared) -> None:
        now = self._now()
        self.clear_log.append((now, a.epoch, a.position))
        if self.cfg.echo_marks_on_clear:  # a client that echoes cut marks: the gate swallows them
            for name in a.marks:
                self._run(self.gate.handle(G.EchoIn(name)))
        if not self.cfg.drop_cleared:
            asyncio.get_running_loop().call_later(self.cfg.cleared_delay, self.actor.on_cleared,
                                                  a.epoch, a.position, list(a.marks))

    def _send_mark(self, a: G.SendMark) -> None:
        if self.cfg.echo_marks:  # the simulated client echoes a mark when it plays its frame
            self._run(self.gate.handle(G.EchoIn(a.name)))

    def _mark_played(self, a: G.MarkPlayed) -> None:
        self.wire.marks.append((self._now(), a.name))
        self.actor.on_mark_played(a.name)

    # -- the tick ---------------------------------------------------------------------------

    def _utt_at(self, pos: int) -> tuple[int, int, int] | None:
        for rec in reversed(self.out_utts):
            if rec[0] <= pos:
                return rec
        return None

    def tick(self, now: float) -> None:
        out, gate = self.out, self.gate
        n_left = int(self.cfg.call_rate * TICK) if self.sending else 0  # held: the leg cannot send
        if gate.held is not None:
            held_epoch = gate.held[0]
            if gate.hold(now) == G.HELD:
                n_left = 0  # held: nothing released, the position stays
            else:
                self.pause_log.append((now, "expired", held_epoch, gate.release_pos))
        pos = max(self.read_pos, out.floor)
        w = out.write_pos
        self.max_unreleased = max(self.max_unreleased, w - gate.release_pos)
        released = False
        while n_left > 0:
            start = gate.releasable_from(pos)
            if start < 0:
                break  # after a Clear: nothing until an utterance of a newer epoch starts
            if start > pos:
                skip = min(start, w) - pos
                self.stale_samples += max(0, skip)
                pos += max(0, skip)
                if pos < start:
                    break
            if pos >= w:
                break
            rec = self._utt_at(pos)
            nxt = next((r[0] for r in self.out_utts if r[0] > pos), w)
            end = min(w, nxt, pos + n_left)
            r = out.read_range(pos, end)
            if not gate.playing:
                gate.spurt_start(time.monotonic_ns())  # the clock of the Clear's sent_ns
            if rec is not None and len(r.samples):
                self.wire.receive(now, rec[1], rec[2], r.samples)
            n_left -= end - pos
            pos = end
            released = True
            self._run(gate.released(pos, by_echo=True))
        self.read_pos = pos
        if not released and gate.playing and n_left > 0:
            gate.spurt_end()
        if not released and gate.marks and not gate.playing:
            self._run(gate.due_marks(by_echo=True))
        if len(self.out_utts) > 64:
            self.out_utts = [x for x in self.out_utts if x[0] >= pos - 8000 * 60][-64:]
        if self.ticks % self.cfg.playback_every == 0:
            p = gate.report()
            if p is not None:
                self.actor.on_playback(p)
        self.ticks += 1


def _nothing(a: object) -> None:
    """The sim's pacing releases on its ticks only: nothing to do for the pacer's actions."""
