"""S2sCallActor: a call whose agent names a speech-to-speech provider (docs/S2S.md).

The :class:`~brisvox.agent.host.actor.CallActor` with the S2S chain
(:data:`~brisvox.agent.pipeline.chain.S2S_CHAIN`: ``pump -> s2s -> out``):
everything the host and the gateway see is the same (the pump, the playout
reports, the hang-up, the record, the stage supervision); what differs is
bound here:

* the pump delivers audio and VAD events into the S2S stage (no turn driver
  takes the in16 position: the stage needs none);
* the context and the tool records are the S2S stage's;
* the stage supervisor speaks no apology (no TTS stage: the S2S stage speaks
  its own fallback line when its session cannot be restored);
* DTMF is counted and not delivered (keypad input into an S2S session is
  not built yet: docs/S2S.md);
* there are no speculation counters (the provider answers by itself).
"""

from __future__ import annotations

from typing import Any

from brisvox.agent.conversation.context import Context
from brisvox.agent.host.actor import CallActor, _stage
from brisvox.agent.pipeline.cascade.tts_ring_writer import TtsRingWriter
from brisvox.agent.pipeline.chain import S2S_CHAIN
from brisvox.agent.pipeline.s2s.stage import S2sStage
from brisvox.agent.pipeline.stage.base import Stage


class S2sCallActor(CallActor):
    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("chain", S2S_CHAIN)
        kw.setdefault("stt", None)
        kw.setdefault("llm", None)
        super().__init__(*args, **kw)

    def _bind(self, named: dict[str, Stage]) -> None:
        self.s2s = _stage(named, "s2s", S2sStage)
        self.out = _stage(named, "out", TtsRingWriter)
        self.speaker = None
        self.entry = self.s2s.inbox
        self._audio_end = None

    @property
    def context(self) -> Context:
        return self.s2s.ctx

    def on_dtmf(self, digit: str) -> None:
        self.pump.dtmf += 1  # counted, not delivered to the provider

    def idle(self) -> bool:
        m = self.s2s.machine
        return m.closed or not m.bot_active

    def interrupts(self) -> int:
        return self.s2s.st.barge_ins

    def decided_epoch(self) -> int:
        return max(self.s2s.machine.epoch, self.s2s.machine.floor)

    def tool_records(self) -> list[Any]:
        return [_Rec(**r) for r in self.s2s.tools.records]

    def speculation_stats(self) -> dict[str, float]:
        return {}


class _Rec:
    __slots__ = ("epoch", "call_id", "name", "outcome", "duration_ms")

    def __init__(self, epoch: int, call_id: str, name: str, outcome: str, duration_ms: float) -> None:
        self.epoch = epoch
        self.call_id = call_id
        self.name = name
        self.outcome = outcome
        self.duration_ms = duration_ms
