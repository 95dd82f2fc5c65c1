"""The call pipeline declared once, as data, and its assembly.

Owns :data:`CHAIN`, the ordered list of stage specs every assembler builds
from (:class:`~brisvox.agent.host.actor.CallActor` in the agent process, the
simulator harness, ``bench/bench_actor.py`` through the harness):

    pump -> stt -> turn -> llm -> segmenter -> tts -> out

Each :class:`StageSpec` names the stage (its inbox and its key in the stats
and the call record), its class, the selector of its config from the
:class:`~brisvox.agent.pipeline.call_config.ChainConfig` (the call actor's
:class:`~brisvox.agent.host.actor.ActorConfig` is one), its inbox shape, what is truly
its own (:class:`CallParts`: a provider, the tool engine, a starting
context) and the upstream frames routed to it by type.

* Inbox shapes (:class:`~brisvox.agent.pipeline.call_config.QueueConfig`): input 8 data
  frames (lossy, drop-oldest), user 8 (lossless), bot 32, sink 4; system
  lanes 32.
* Upstream: BotStarted and BotEnded go to the turn driver (the sole epoch
  authority), from TtsRingWriter and the LLM runner, through the call's
  :class:`~brisvox.agent.pipeline.stage.call_context.UpstreamRouter`.
* :func:`assemble` builds every stage as ``cls(call, config, inbox, **own)``
  in chain order, binds the upstream routes and pipes each stage into the
  next. A test replaces one stage's class with :func:`with_stage`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from brisvox.agent.conversation.context import Context
from brisvox.agent.flows.manager import FlowManager
from brisvox.agent.pipeline.call_config import ChainConfig, QueueConfig
from brisvox.agent.pipeline.cascade.segmenter import SegmenterStage
from brisvox.agent.pipeline.cascade.stt_stage import SttStage
from brisvox.agent.pipeline.cascade.tts_ring_writer import TtsRingWriter
from brisvox.agent.pipeline.cascade.tts_stage import TtsStage, TtsStageConfig
from brisvox.agent.pipeline.cascade.turn_driver import TurnDriver
from brisvox.agent.pipeline.llm.runner import LlmRunner
from brisvox.agent.pipeline.s2s.stage import S2sStage
from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import BotEnded, BotStarted, PipelineFrame
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.providers.base import LlmProvider, SttProvider, TtsProvider
from brisvox.providers.s2s.base import S2sProvider


@dataclass(frozen=True, slots=True)
class CallParts:
    """What stages take that is truly their own (not shared through the CallContext)."""

    stt: SttProvider | None
    llm: LlmProvider | None
    tts: TtsProvider | None
    engine: ToolEngine | None = None
    context: Context | None = None
    s2s: S2sProvider | None = None  # the speech-to-speech provider of an S2S chain (``tts``: its fallback voice)
    flow: FlowManager | None = None  # the conversation's flow (the LLM runner drives it)


@dataclass(frozen=True, slots=True)
class InboxShape:
    """``lane``: the :class:`QueueConfig` field giving the data capacity; system lanes
    take ``QueueConfig.system``."""

    lane: str
    lossy: bool = False

    def build(self, name: str, q: QueueConfig) -> Inbox:
        return Inbox(name, int(getattr(q, self.lane)), lossy=self.lossy, sys_cap=q.system)


def _need(provider: Any, stage: str) -> Any:
    if provider is None:
        raise ValueError(f"the chain's {stage} stage needs a provider")
    return provider


def _nothing(parts: CallParts) -> dict[str, Any]:
    return {}


@dataclass(frozen=True, slots=True)
class StageSpec:
    name: str
    cls: Callable[..., Stage]
    config: Callable[[ChainConfig, CallContext], object]
    inbox: InboxShape
    own: Callable[[CallParts], dict[str, Any]] = _nothing
    upstream: tuple[type[PipelineFrame], ...] = ()


def tts_config(cfg: ChainConfig, call: CallContext) -> TtsStageConfig:
    """The TTS stage converts to the call's tts ring rate."""
    t = cfg.tts
    return t if t.ring_rate == call.tts_rate else replace(t, ring_rate=call.tts_rate)


CHAIN: tuple[StageSpec, ...] = (
    StageSpec("stt", SttStage, lambda c, _: c.stt, InboxShape("input", lossy=True),
              own=lambda p: {"provider": _need(p.stt, "stt")}),
    StageSpec("turn", TurnDriver, lambda c, _: c.turn, InboxShape("user"),
              upstream=(BotStarted, BotEnded)),
    StageSpec("llm", LlmRunner, lambda c, _: c.llm, InboxShape("bot"),
              own=lambda p: {"provider": _need(p.llm, "llm"), "engine": p.engine, "context": p.context,
                             **({"flow": p.flow} if p.flow is not None else {})}),
    StageSpec("segmenter", SegmenterStage, lambda c, _: c.segmenter, InboxShape("bot")),
    StageSpec("tts", TtsStage, tts_config, InboxShape("bot"),
              own=lambda p: {"provider": _need(p.tts, "tts")}),
    StageSpec("out", TtsRingWriter, lambda c, _: c.out, InboxShape("sink")),
)


def _s2s_own(p: CallParts) -> dict[str, Any]:
    if p.s2s is None:
        raise ValueError("an S2S chain needs a speech-to-speech provider (CallParts.s2s)")
    return {"provider": p.s2s, "engine": p.engine, "context": p.context, "fallback_tts": p.tts}


# A speech-to-speech call: the model hears the caller and speaks itself (docs/S2S.md).
S2S_CHAIN: tuple[StageSpec, ...] = (
    StageSpec("s2s", S2sStage, lambda c, _: c.s2s, InboxShape("input", lossy=True), own=_s2s_own,
              upstream=(BotStarted, BotEnded)),
    StageSpec("out", TtsRingWriter, lambda c, _: c.out, InboxShape("sink")),
)


def with_stage(chain: Sequence[StageSpec], name: str, cls: Callable[..., Stage]) -> tuple[StageSpec, ...]:
    """``chain`` with the class of stage ``name`` replaced (tests, benches)."""
    if all(s.name != name for s in chain):
        raise KeyError(name)
    return tuple(replace(s, cls=cls) if s.name == name else s for s in chain)


def assemble(chain: Sequence[StageSpec], call: CallContext, cfg: ChainConfig, parts: CallParts) -> list[Stage]:
    """Every stage of ``chain``, in order, routed upstream and piped into the next."""
    stages: list[Stage] = []
    for spec in chain:
        stage = spec.cls(call, spec.config(cfg, call), spec.inbox.build(spec.name, cfg.queues), **spec.own(parts))
        if spec.upstream:
            call.upstream.bind(spec.upstream, stage.inbox)
        stages.append(stage)
    for a, b in zip(stages, stages[1:], strict=False):
        a.pipe(b)
    return stages
