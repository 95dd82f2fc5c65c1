"""The agent process's sections of ``brisvoxd.toml``: ``[agents]`` and ``[calls]``.

Owns their keys, defaults and bounds (docs/CONFIGURATION.md describes them),
and :meth:`AgentsConfig.actor_config`, which turns them into the call actor's
:class:`~brisvox.agent.actor.ActorConfig`. Imported by the supervisor when it
loads the config (before it forks), so it imports nothing heavy at module
level.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brisvox.config.schema import from_table, opt

if TYPE_CHECKING:
    from brisvox.agent.actor import ActorConfig


@dataclass(frozen=True, slots=True)
class AgentsConfig:
    """``[agents]``: what every call actor of an agent process runs with."""

    max_calls: int = opt(100, min=1, max=10_000)  # per agent process; CallStart beyond it is refused "full"
    providers: str = opt("scripted", choices=("scripted", "definitions"))  # scripted fakes | agent definitions
    script: str = ""  # scripted providers: a JSON script file ("" = built-in demo lines)
    agents_dir: str = ""  # definitions: where <agent>.toml files live ("" = <config dir>/agents)
    system_prompt: str = "You are a helpful voice assistant on a phone call. Answer briefly."
    silence_ms: int = opt(450, min=50, max=10_000)  # end of turn after this silence (fixed policy)
    smart_turn: bool = True  # ask the worker's Smart Turn model at each pause
    fallback_silence_ms: int = opt(1500, min=100, max=10_000)  # with Smart Turn: end anyway after this
    interruption: str = opt("recommended", choices=("recommended", "off"))
    final_wait_ms: int = opt(1500, min=0, max=10_000)  # finals gate: wait this long for owed STT finals
    response_deadline_s: float = opt(20.0, min=1.0, max=600.0)  # backstop: a turn that never sounds
    lead_margin_ms: int = opt(100, min=0, max=2000)  # client buffer assumed at a barge-in
    settle_wait_ms: int = opt(250, min=0, max=2000)  # wait for the final position after a barge-in
    max_tool_rounds: int = opt(6, min=1, max=32)
    filler_delay_ms: int = opt(1200, min=0, max=30_000)  # speak a filler when a tool takes longer
    llm_retries: int = opt(1, min=0, max=5)
    first_token_timeout_s: float = opt(8.0, min=0.5, max=120.0)
    idle_timeout_s: float = opt(15.0, min=0.5, max=600.0)
    max_ahead_ms: int = opt(2000, min=100, max=30_000)  # TTS audio written ahead of playout at most
    mark_timeout_s: float = opt(10.0, min=0.5, max=120.0)
    stop_timeout_s: float = opt(3.0, min=0.1, max=60.0)  # hang-up: stages get this long to finish

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> AgentsConfig:
        return from_table(cls, table, where)

    def actor_config(self, tts_rate: int = 24000) -> ActorConfig:
        from dataclasses import replace

        from brisvox.agent.actor import ActorConfig
        from brisvox.agent.playout import PlayoutConfig
        from brisvox.agent.tool_filler import FillerConfig
        from brisvox.agent.transport_out import TransportOutConfig
        from brisvox.agent.turn_machine import InterruptionConfig, TurnConfig

        base = ActorConfig()
        icfg = InterruptionConfig.off() if self.interruption == "off" else InterruptionConfig.recommended()
        turn = TurnConfig(
            silence=self.silence_ms / 1000,
            smart_turn=self.smart_turn,
            fallback_silence=self.fallback_silence_ms / 1000,
            interruption=icfg,
        )
        to = replace(base.llm.timeouts, llm_first_token=self.first_token_timeout_s, llm_idle=self.idle_timeout_s)
        return replace(
            base,
            turn=replace(base.turn, turn=turn, final_wait=self.final_wait_ms / 1000,
                         response_deadline=self.response_deadline_s),
            llm=replace(
                base.llm,
                system_prompt=self.system_prompt,
                retries=self.llm_retries,
                max_tool_rounds=self.max_tool_rounds,
                filler=FillerConfig(enabled=self.filler_delay_ms > 0, delay=self.filler_delay_ms / 1000),
                timeouts=to,
            ),
            tts=replace(base.tts, ring_rate=tts_rate),
            out=TransportOutConfig(max_ahead=self.max_ahead_ms / 1000, mark_timeout=self.mark_timeout_s),
            playout=PlayoutConfig(lead_margin=self.lead_margin_ms / 1000, settle_wait=self.settle_wait_ms / 1000),
            stop_timeout=self.stop_timeout_s,
        )


@dataclass(frozen=True, slots=True)
class CallsConfig:
    """``[calls]``: the call records written at hang-up."""

    records: bool = True  # write one JSON record per call
    path: str = ""  # a directory (one file per call) or a .jsonl file; "" = <state_dir>/calls
    keep_days: int = opt(30, min=0, max=3650)  # records older than this are deleted at start (0 = keep)

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> CallsConfig:
        return from_table(cls, table, where)
