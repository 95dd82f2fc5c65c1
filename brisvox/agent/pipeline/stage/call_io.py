"""The small interfaces a call actor uses to reach the world outside its process.

Owns the seam between the pipeline and its transport:
the same actor runs in the agent process over shared-memory rings and ZeroMQ
frames, and in the simulation over in-memory rings and a simulated
gateway/worker on virtual time.

* :class:`AudioSource`: the call's ``in16`` ring (16 kHz caller audio the
  worker wrote). The shm implementation is :class:`ipc.ring.Ring` itself; the
  sim's is :class:`brisvox.sim.memring.MemRing`. Only ``read_range`` and
  ``write_pos`` are used.
* :class:`AudioSink`: the call's ``tts`` ring (synthesized audio at the TTS
  rate, one writer: this actor). Only ``write`` and ``write_pos`` are used.
* :class:`GatewayLink` and :class:`WorkerLink`: control frames out of the
  actor (``ipc/frames.py``): ``to_gateway`` (Clear, Pause, Resume, Mark,
  Hangup, SendDtmf, Transfer) and ``to_worker`` (TtsUtterance, TtsCut) are
  non-blocking fire-and-forget sends (a full socket is counted by the
  implementation, never awaited); ``smart_turn`` (worker) is the one
  request/reply (job lane), bounded by ``timeout``. The stages see the two
  halves separately (:class:`~brisvox.agent.pipeline.stage.call_context.CallContext`);
  :class:`CallLink` is both, what a host hands the actor.

Frames INTO the actor (worker ticks, OutUtterance, Playback, Cleared,
MarkPlayed, Dtmf, CallEnd) are delivered by the host calling the actor's
``on_*`` methods (see ``brisvox/agent/host/actor.py``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ipc.frames import Frame
from ipc.ring import ReadResult


class AudioSource(Protocol):
    @property
    def write_pos(self) -> int: ...

    def read_range(self, start: int, end: int) -> ReadResult: ...


class AudioSink(Protocol):
    @property
    def write_pos(self) -> int: ...

    def write(self, samples: np.ndarray) -> int: ...


class GatewayLink(Protocol):
    def to_gateway(self, frame: Frame) -> None: ...


class WorkerLink(Protocol):
    def to_worker(self, frame: Frame) -> None: ...

    async def smart_turn(self, end_pos: int, timeout: float) -> float | None:  # noqa: ASYNC109
        """Probability that the turn is complete at in16 position ``end_pos``;
        None when the analysis failed, expired or no worker is available."""
        ...


class CallLink(GatewayLink, WorkerLink, Protocol):
    """Both halves: the gateway's and the worker's (one object in the agent process and the sim)."""
