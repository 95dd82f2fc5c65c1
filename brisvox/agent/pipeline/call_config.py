"""What the pipeline's assembly needs of a call's configuration.

Owns :class:`QueueConfig` (the capacities of the stages' inboxes, and of the DTMF FIFO in
front of the turn driver) and :class:`ChainConfig`, the read-only view
:func:`brisvox.agent.pipeline.chain.assemble` takes: the inbox capacities and one config
per stage of the chain. The call actor's
:class:`~brisvox.agent.host.actor.ActorConfig` (built by the agent definition, the
daemon's ``[agents]`` section and the simulator) is one; the pipeline never imports the
host.

Invariants: capacities are positive; a system lane holds ``system`` frames (Stop and
Interrupt are never dropped: :class:`~brisvox.agent.pipeline.stage.base.Inbox`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from brisvox.agent.pipeline.cascade.segmenter import SegmenterConfig
from brisvox.agent.pipeline.cascade.stt_stage import SttStageConfig
from brisvox.agent.pipeline.cascade.tts_ring_writer import TtsRingWriterConfig
from brisvox.agent.pipeline.cascade.tts_stage import TtsStageConfig
from brisvox.agent.pipeline.cascade.turn_driver import TurnDriverConfig
from brisvox.agent.pipeline.llm.policy import LlmRunnerConfig
from brisvox.agent.pipeline.s2s.stage import S2sStageConfig


@dataclass(frozen=True, slots=True)
class QueueConfig:
    input: int = 8
    user: int = 8
    bot: int = 32
    sink: int = 4
    system: int = 32
    dtmf: int = 64  # caller digits waiting for room in the turn driver's inbox (beyond: refused)


class ChainConfig(Protocol):
    """The configuration a chain is assembled with (read-only)."""

    @property
    def queues(self) -> QueueConfig: ...

    @property
    def stt(self) -> SttStageConfig: ...

    @property
    def turn(self) -> TurnDriverConfig: ...

    @property
    def llm(self) -> LlmRunnerConfig: ...

    @property
    def segmenter(self) -> SegmenterConfig: ...

    @property
    def tts(self) -> TtsStageConfig: ...

    @property
    def out(self) -> TtsRingWriterConfig: ...

    @property
    def s2s(self) -> S2sStageConfig: ...
