"""Playout commands: the gateway feeds each call's PlayoutGate and executes its actions.

Owns :class:`PlayoutCommands`, the collaborator of the gateway core that turns what
an agent (or the echo agent) and a worker say about the bot's audio (Clear,
lazy Clear, Pause/Resume, OutUtterance, Mark, a peer's mark echo) into inputs
of the call's :class:`~brisvox.playout.gate.PlayoutGate` (the semantics, all
of them: read its module docstring), and executes the actions the gate
returns through one dispatch table (:meth:`PlayoutCommands.gate_action_handlers`):
ring cuts, the transport's clear, Cleared and MarkPlayed to the agent, marks
sent to a peer that echoes them, and the pacer's part (hold, stop the
talkspurt, release the first frame of an utterance now).

Invariants (of the execution; the semantics are the gate's):

* A frame's inputs are applied and their actions executed in the callback
  that read it: nothing queued runs before a Clear, and the first frame of a
  response goes out in the callback that read its OutUtterance (or the Clear
  that found it already announced), not at the pacer's next tick.
* Actions run in the order the gate returns them (the ring is cut and the
  transport cleared before Cleared leaves).
* Pause/Resume and marks of a call that is not active change the gate only:
  nothing is released before the call is active (the call's
  :class:`~brisvox.gateway.core.call_machine.CallMachine` says), and the
  transport is told to clear only while its side is up.

It holds what it executes with (the pacer, the links, the metrics) and
reads nothing else of the core.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from brisvox.gateway.core.call_machine import ACTIVE
from brisvox.gateway.core.calls import Call
from brisvox.gateway.core.pacer import Pacer
from brisvox.gateway.metrics import GatewayMetrics
from brisvox.playout import gate as G
from ipc import frames as F
from ipc.links import Links

ActionHandler = Callable[[Call, Any], None]


class PlayoutCommands:
    """Gate inputs in, gate actions out (see the module docstring)."""

    def __init__(self, metrics: GatewayMetrics, pacer: Pacer, links: Links) -> None:
        self.metrics = metrics
        self.pacer = pacer
        self.links = links
        self.gate_actions = self.gate_action_handlers()

    # -- inputs -------------------------------------------------------------------------

    def apply_clear(self, call: Call, epoch: int, sent_ns: int = 0, arrival_ns: int = 0,
                    lazy: bool = False) -> None:
        """Clear(epoch) read at ``arrival_ns`` (0: now), sent by the agent at ``sent_ns``;
        ``lazy``: a new response's Clear, not a barge-in (see ``ipc.frames.Clear``)."""
        t_in = arrival_ns or time.monotonic_ns()
        actions = call.gate.handle(G.ClearIn(epoch, call.out_reader.position, call.out_ring.write_pos,
                                             sent_ns, lazy))
        for a in actions:
            if type(a) is G.SendCleared and a.cut:
                applied = time.monotonic_ns()
                self.metrics.clear_local.add((applied - t_in) / 1e6)
                if sent_ns > 0:
                    self.metrics.clear_latency.add((applied - sent_ns) / 1e6)
            self.gate_actions[type(a)](call, a)

    def apply_pause(self, call: Call, epoch: int) -> None:
        """Hold the bot's audio of live epoch ``epoch``."""
        self.run_actions(call, call.gate.handle(G.PauseIn(epoch, self.pacer.now())))

    def apply_resume(self, call: Call, epoch: int) -> None:
        """Release the held audio of ``epoch`` from the held position."""
        self.run_actions(call, call.gate.handle(G.ResumeIn(epoch)))

    def note_utterance(self, call: Call, epoch: int, out_pos: int) -> None:
        """An utterance of ``epoch`` starts at ``out_pos`` in the out ring (OutUtterance)."""
        self.run_actions(call, call.gate.handle(G.UtteranceIn(epoch, out_pos)))

    def add_mark(self, call: Call, name: str, position: int) -> None:
        self.run_actions(call, call.gate.handle(G.MarkIn(name, position)))

    def mark_echo(self, call: Call, name: str) -> None:
        """A peer that echoes marks (Twilio) played ``name``."""
        self.run_actions(call, call.gate.handle(G.EchoIn(name)))

    # -- actions --------------------------------------------------------------------------

    def run_actions(self, call: Call, actions: Sequence[G.Action]) -> None:
        handlers = self.gate_actions
        for a in actions:
            handlers[type(a)](call, a)

    def gate_action_handlers(self) -> dict[type, ActionHandler]:
        """What the gateway does for each action a gate returns."""
        return {
            G.Count: self._count,
            G.CutRing: self._cut_ring,
            G.StopSpurt: lambda call, a: self.pacer.stop_spurt(call),
            G.ClearTransport: self._clear_transport,
            G.SendCleared: self._send_cleared,
            G.ForgetAnnouncement: lambda call, a: self.pacer.forget_announcement(call),
            G.StartUtterance: self._start_utterance,
            G.Hold: lambda call, a: self.pacer.hold(call, a.ended_spurt),
            G.Kick: self._kick,
            G.SendMark: self._send_mark,
            G.MarkPlayed: self._mark_played,
        }

    def _count(self, call: Call, a: G.Count) -> None:
        self.metrics.inc(a.name)

    def _cut_ring(self, call: Call, a: G.CutRing) -> None:
        call.out_ring.cut(a.position)

    def _clear_transport(self, call: Call, a: G.ClearTransport) -> None:
        if call.leg is not None and not call.machine.transport_done:
            call.leg.send_clear()

    def _start_utterance(self, call: Call, a: G.StartUtterance) -> None:
        if call.machine.state == ACTIVE:
            self.pacer.utterance(call)

    def _kick(self, call: Call, a: G.Kick) -> None:
        if call.machine.state == ACTIVE:
            self.pacer.kick(call)

    def _send_mark(self, call: Call, a: G.SendMark) -> None:
        if call.leg is not None:
            call.leg.send_mark(a.name)

    def _send_cleared(self, call: Call, a: G.SendCleared) -> None:
        marks = list(a.marks)
        if call.builtin is not None:
            call.builtin.on_cleared(a.epoch, a.position, marks)
        elif call.agent_proc:
            self.links.send(call.agent_proc, F.Cleared(
                call_id=call.call_id, epoch=a.epoch, position=a.position,
                applied_ns=time.monotonic_ns(), marks=marks or None))

    def _mark_played(self, call: Call, a: G.MarkPlayed) -> None:
        if call.builtin is not None:
            call.builtin.on_mark_played(a.name, a.position)
        elif call.agent_proc:
            self.links.send(call.agent_proc, F.MarkPlayed(call_id=call.call_id, name=a.name,
                                                          position=a.position, played_ns=time.monotonic_ns()))
