"""Playout semantics of a call, as pure state machines (no I/O, no clock reads).

* :mod:`brisvox.playout.gate`: the gateway side, one :class:`~brisvox.playout.gate.PlayoutGate`
  per call: Clear, lazy Clear, Pause/Resume, utterance starts, marks and the
  release position. The real gateway (``brisvox/gateway``) and the
  simulator's gateway (``brisvox/sim``) both drive this one class.
* :mod:`brisvox.playout.ledger`: the agent side, one :class:`~brisvox.playout.ledger.EpochLedger`
  per call: which epochs are dead, what Clear/TtsCut/Pause/Resume that
  implies on the wire, and the release floor the gateway's reports build.

Both follow the house style of the turn machine: ``handle(input) -> actions``;
the caller executes the actions (ring cuts, frames, transport calls).
This package imports nothing but the standard library.
"""
