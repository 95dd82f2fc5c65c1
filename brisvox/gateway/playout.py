"""Playout commands: Clear, lazy Clear, Pause/Resume, marks and utterance starts.

Owns :class:`PlayoutCommands`, the part of the gateway core that applies
what an agent (or the echo agent) says about the bot's audio already in the
call's ``out`` ring: where an utterance of an epoch starts (OutUtterance),
Clear (cut and close the epoch gate), Pause/Resume (hold the release
position), marks (pending, sent to a peer that echoes them, played). The
pacer (:mod:`brisvox.gateway.pacer`) does the releasing; this module decides
what may be released.

Invariants:

* A Clear is applied in the callback that read it (:meth:`PlayoutCommands.apply_clear`):
  stop releasing (close the epoch gate), tell the transport (Twilio
  ``clear`` / stop RTP audio), answer Cleared with the final release
  position and the marks the cut discarded. Nothing queued runs before it.
* Epoch ledger: after Clear(E) nothing is released from the out ring before
  the start of an utterance of an epoch > E (OutUtterance), and everything in
  between is counted as stale. The ring is cut at the release position (or
  at the newer utterance's start when it is already known), never at the
  write position: the worker may already have written the newer epoch's
  first audio while its OutUtterance is still on the way, and the utterance
  start, not the moment the Clear was read, says where the stale audio ends.
  A Clear read after the newer epoch's audio already started releasing
  (its OutUtterance overtook the Clear) stops nothing: no cut, no transport
  clear, no marks discarded (they are the newer epoch's or already played).
  The same holds for a lazy Clear (a new response's, not a barge-in's) read
  after a talkspurt started from a dry ring after the Clear was sent, before
  that response's OutUtterance arrived.
* Pause / Resume (a barge-in candidate holds the bot's audio,
  :meth:`PlayoutCommands.apply_pause`): applied in the callback that read the frame, so the
  next tick releases nothing; the release position stays (the held audio
  stays in the out ring, nothing is cut). A hold ends with Resume (release
  goes on from the held position), a Clear (Cleared carries the held
  position: exactly what was played), an utterance of a newer epoch, or
  ``pause_max_ms`` (the pacer; counted). A Pause of a dead epoch (at or
  below the last Clear, or older than an announced utterance) and a
  Resume of an epoch that is not held are ignored and counted.
* The first frame of a response goes out in the callback that read its
  OutUtterance (or the Clear that found that utterance already announced),
  not at the pacer's next tick.
* At most ``max_marks`` marks are pending per call (more are refused and
  counted); after a Clear, echoes of the marks the cut discarded are
  swallowed (they were reported in Cleared).
"""

from __future__ import annotations

import time

from brisvox.gateway.calls import Call, PendingMark
from brisvox.gateway.config import GatewayConfig
from brisvox.gateway.metrics import GatewayMetrics
from brisvox.gateway.pacer import Pacer
from ipc import frames as F
from ipc.links import Links


class PlayoutCommands:
    """Clear, Pause/Resume, marks, utterance starts (see the module docstring)."""

    cfg: GatewayConfig
    metrics: GatewayMetrics
    pacer: Pacer
    links: Links
    _swallow: dict[str, set[str]]  # call_id -> names of echoed marks a Clear already reported

    def mark_echo(self, call: Call, name: str) -> None:
        """A peer that echoes marks (Twilio) played ``name``."""
        sent = call.marks_sent
        for i, m in enumerate(sent):
            if m.name == name:
                del sent[i]
                call.stats.marks_played += 1
                self._mark_played(call, m)
                return
        swallow = self._swallow.get(call.call_id)
        if swallow and name in swallow:
            swallow.discard(name)
            self.metrics.inc("marks_echo_after_clear")
        else:
            self.metrics.inc("marks_echo_unknown")


    def add_mark(self, call: Call, name: str, position: int) -> bool:
        if len(call.marks) + len(call.marks_sent) >= self.cfg.max_marks:
            call.stats.marks_refused += 1
            return False
        call.stats.marks += 1
        m = PendingMark(position, name)
        marks = call.marks
        if not marks or marks[-1].position <= position:
            marks.append(m)
        else:
            i = len(marks)
            while i > 0 and marks[i - 1].position > position:
                i -= 1
            marks.insert(i, m)
        if position <= call.release_pos and call.state == "active":
            self.pacer.kick(call)
        return True

    def apply_clear(self, call: Call, epoch: int, sent_ns: int = 0, arrival_ns: int = 0,
                    lazy: bool = False) -> None:
        """The Clear fast path (see module invariants). ``arrival_ns``: when the frame was read;
        ``lazy``: a new response's Clear, not a barge-in (see ``ipc.frames.Clear``)."""
        t_in = arrival_ns or time.monotonic_ns()
        if epoch <= call.cleared_epoch:
            self.metrics.inc("clears_repeated")
            self._send_cleared(call, epoch, [])
            return
        call.cleared_epoch = epoch
        if self.pacer.unpause(call) is not None:
            self.metrics.inc("pauses_cleared")  # the hold ends in the cut, at the held position
        ring = call.out_ring
        w = ring.write_pos
        newer = [p for e, p in call.utterances if e > epoch]
        if newer and call.release_pos > min(newer):
            # the newer epoch already plays (its OutUtterance raced ahead of this Clear, e.g.
            # the actor's lazy Clear of a new response): nothing of epochs <= ``epoch`` is left
            # to stop, and a transport clear would drop the new response's frames at the peer
            self.metrics.inc("clears_after_newer")
            call.gate_pos = max(call.gate_pos, min(newer))
            call.stats.clears += 1
            self._send_cleared(call, epoch, [], time.monotonic_ns())
            return
        if lazy and not newer and call.spurt_from_dry and sent_ns > 0 and call.spurt_ns > sent_ns:
            # the same race with the OutUtterance still on its way: the last talkspurt (playing,
            # or already run dry after a short first chunk) started from a dry ring after this
            # Clear was sent, after everything of the older epochs had been written, so it is the
            # new response's audio; cutting would send the peer a clear that drops its frames
            self.metrics.inc("clears_after_newer")
            call.stats.clears += 1
            self._send_cleared(call, epoch, [], time.monotonic_ns())
            return
        if newer:
            start = min(newer)
            ring.cut(min(w, start))
            call.gate_open = True
            call.gate_pos = max(call.gate_pos, start)
        else:
            # hold what is not released yet: the next utterance's start decides what is stale
            ring.cut(call.out_reader.position)
            call.gate_open = False
        call.playing = False
        call.partial_wait = False
        call.starved_at = -1.0
        if call.leg is not None and not call.transport_done:
            call.leg.send_clear()
        cut_marks = [m.name for m in call.marks] + [m.name for m in call.marks_sent]
        if call.marks_sent:
            sw = self._swallow.setdefault(call.call_id, set())
            if len(sw) < 256:
                sw.update(m.name for m in call.marks_sent)
        call.marks.clear()
        call.marks_sent.clear()
        call.stats.clears += 1
        call.stats.marks_cleared += len(cut_marks)
        applied = time.monotonic_ns()
        self.metrics.clear_local.add((applied - t_in) / 1e6)
        if sent_ns > 0:
            self.metrics.clear_latency.add((applied - sent_ns) / 1e6)
        self._send_cleared(call, epoch, cut_marks, applied)
        if not call.gate_open:
            self.pacer.forget_announcement(call)
        elif call.state == "active":
            # the newer epoch's utterance was announced before this Clear arrived: it starts now
            self.pacer.utterance(call)

    def apply_pause(self, call: Call, epoch: int) -> None:
        """Hold the bot's audio of live epoch ``epoch`` (see module invariants)."""
        if epoch <= call.cleared_epoch or any(e > epoch for e, _ in call.utterances):
            self.metrics.inc("pauses_stale")
            return
        held = self.pacer.paused.get(call.call_id)
        if held is not None:
            self.metrics.inc("pauses_repeated")
            if epoch > held[0]:
                self.pacer.paused[call.call_id] = (epoch, held[1])
            return
        self.metrics.inc("pauses")
        self.pacer.pause(call, epoch)

    def apply_resume(self, call: Call, epoch: int) -> None:
        """Release the held audio of ``epoch`` from the held position."""
        held = self.pacer.paused.get(call.call_id)
        if held is None or held[0] != epoch:
            self.metrics.inc("resumes_unpaused")
            return
        self.metrics.inc("resumes")
        if call.state == "active":
            self.pacer.resume(call)
        else:
            self.pacer.unpause(call)

    def _send_cleared(self, call: Call, epoch: int, marks: list[str], applied: int = 0) -> None:
        call.reported_pos = call.release_pos
        call.released_since_report = False
        if call.builtin is not None:
            call.builtin.on_cleared(epoch, call.release_pos, marks)
        elif call.agent_proc:
            self.links.send(call.agent_proc, F.Cleared(
                call_id=call.call_id, epoch=epoch, position=call.release_pos,
                applied_ns=applied or time.monotonic_ns(), marks=marks or None))

    def note_utterance(self, call: Call, epoch: int, out_pos: int) -> None:
        """An utterance of ``epoch`` starts at ``out_pos`` in the out ring (OutUtterance)."""
        call.utterances.append((epoch, out_pos))
        if epoch <= call.cleared_epoch:
            self.metrics.inc("utterances_stale")
            return
        if self.pacer.paused:
            held = self.pacer.paused.get(call.call_id)
            if held is not None and epoch > held[0]:
                self.pacer.unpause(call)  # the held epoch is over: a newer response plays
                self.metrics.inc("pauses_superseded")
        if not call.gate_open:
            call.gate_open = True
            call.gate_pos = max(call.gate_pos, out_pos)
        if call.state == "active":
            self.pacer.utterance(call)

    def _mark_played(self, call: Call, m: PendingMark) -> None:
        if call.builtin is not None:
            call.builtin.on_mark_played(m.name, m.position)
        elif call.agent_proc:
            self.links.send(call.agent_proc, F.MarkPlayed(call_id=call.call_id, name=m.name,
                                                          position=m.position, played_ns=time.monotonic_ns()))
