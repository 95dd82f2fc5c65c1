"""The agent process's sections of ``brisvoxd.toml``: ``[agents]`` and ``[calls]``.

Owns their keys, defaults and bounds (docs/CONFIGURATION.md describes them),
and :meth:`AgentsConfig.actor_config`, which turns them into the call actor's
:class:`~brisvox.agent.host.actor.ActorConfig`. Imported by the supervisor when it
loads the config (before it forks), so it imports nothing heavy at module
level.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from brisvox.config.errors import ConfigError
from brisvox.config.schema import from_table, section

if TYPE_CHECKING:
    from brisvox.agent.host.actor import ActorConfig

# early analysis runs at the VAD's falling event, which only a [vad] fall_delay_ms > 0 sends
NO_FALLING = ("needs the workers' [vad] fall_delay_ms > 0 (it is 0: the VAD sends no falling event and the "
              "early analysis never runs): set [vad] fall_delay_ms (e.g. 100, below min_silence_ms)")
AGENT_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
BUILTIN_AGENTS = Path(__file__).resolve().parents[3] / "configs" / "agents"  # the checkout's agent files
ECHO = "echo"  # the gateway's built-in line-test agent: no file


def timing_problems(final_wait_ms: int, settle_wait_ms: int) -> list[tuple[str, str]]:
    """The pipeline's timing rules on ``[agents]``, with the fixed bounds they must fit:
    ``timeouts.finalize > final_wait`` (the STT stage answers an unanswered Finalize
    itself at 3 s and replaces the session: the turn must give up on a final before) and
    ``settle_wait <= analysis_job / 2`` (the runner bounds the whole played-text pass by
    ``analysis_job``, 1 s: a settle wait that reached it would answer Keep and leave
    unheard text in the context). ``(key, message)`` per broken rule."""
    from brisvox.agent.pipeline.llm.policy import LlmRunnerConfig
    from brisvox.providers.base import ProviderTimeouts

    finalize = round(ProviderTimeouts().finalize * 1000)
    half = round(LlmRunnerConfig().analysis_job * 1000) // 2
    out: list[tuple[str, str]] = []
    if final_wait_ms >= finalize:
        out.append(("final_wait_ms", f"{final_wait_ms} is not below the STT Finalize timeout ({finalize} ms, fixed): "
                    f"the rule finalize > final_wait lets a turn give up on a final before the STT session is "
                    f"replaced; set final_wait_ms below {finalize} (default 1500)"))
    if settle_wait_ms > half:
        out.append(("settle_wait_ms", f"{settle_wait_ms} is above analysis_job / 2 ({half} ms; the runner bounds the "
                    f"whole played-text pass by {2 * half} ms): the rule settle_wait <= analysis_job / 2 keeps the "
                    f"pass inside it; set settle_wait_ms to {half} or less (default 250)"))
    return out


@section
class AgentsConfig:
    """``[agents]``: what every call actor of an agent process runs with."""

    max_calls: int = Field(default=256, ge=1, le=10_000)  # per agent process; CallStart beyond it is refused "full"
    providers: Literal["definitions", "scripted"] = "definitions"  # agent files | scripted fakes
    default_agent: str = "local"  # definitions: the agent a route or SIP user named "default" gets
    script: str = ""  # scripted providers: a JSON script file ("" = built-in demo lines)
    agents_dir: str = ""  # definitions: where <agent>.toml files live ("" = see agents_path())
    system_prompt: str = "You are a helpful voice assistant on a phone call. Answer briefly."
    silence_ms: int = Field(default=450, ge=50, le=10_000)  # end of turn after this silence (fixed policy)
    smart_turn: bool = True  # ask the worker's Smart Turn model at each pause
    fallback_silence_ms: int = Field(default=1500, ge=100, le=10_000)  # with Smart Turn: end anyway after this
    smart_turn_timeout_ms: int = Field(default=1000, ge=50, le=10_000)  # a verdict later than this is not waited for
    # analyse at the VAD's "falling" event and reuse the verdict at the stop of the same fall
    # (needs the workers' [vad] fall_delay_ms > 0; without falling events it changes nothing)
    early_smart_turn: bool = False
    # ask the STT for the final at the VAD's "falling" event, so it is ready when the stop comes;
    # the stop of the same fall sends no second Finalize (same need: [vad] fall_delay_ms > 0)
    early_finalize: bool = False
    interruption: Literal["recommended", "off"] = "recommended"
    final_wait_ms: int = Field(default=1500, ge=0, le=10_000)  # finals gate: wait this long for owed STT finals
    response_deadline_s: float = Field(default=20.0, ge=1.0, le=600.0)  # backstop: a turn that never sounds
    lead_margin_ms: int = Field(default=100, ge=0, le=2000)  # client buffer assumed at a barge-in
    settle_wait_ms: int = Field(default=250, ge=0, le=2000)  # wait for the final position after a barge-in
    max_tool_rounds: int = Field(default=6, ge=1, le=32)
    filler_delay_ms: int = Field(default=1200, ge=0, le=30_000)  # speak a filler when a tool takes longer
    first_token_timeout_s: float = Field(default=8.0, ge=0.5, le=120.0)
    idle_timeout_s: float = Field(default=15.0, ge=0.5, le=600.0)
    max_ahead_ms: int = Field(default=2000, ge=100, le=30_000)  # TTS audio written ahead of playout at most
    mark_timeout_s: float = Field(default=10.0, ge=0.5, le=120.0)
    stop_timeout_s: float = Field(default=3.0, ge=0.1, le=60.0)  # hang-up: stages get this long to finish

    def __post_init__(self) -> None:
        if not AGENT_NAME.match(self.default_agent) or self.default_agent in ("default", "echo"):
            raise ConfigError("default_agent", f"invalid agent name {self.default_agent!r} "
                              "(letters, digits, _ and -; not 'default' or 'echo')")
        for key, msg in timing_problems(self.final_wait_ms, self.settle_wait_ms):
            raise ConfigError(key, msg)

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> AgentsConfig:
        return from_table(cls, table, where)

    def agents_path(self, config_path: str | None) -> Path:
        """The folder of the agent files: ``agents_dir``; else ``agents/`` next to the
        daemon config file when it exists; else the checkout's ``configs/agents``."""
        if self.agents_dir:
            return Path(self.agents_dir).expanduser()
        if config_path:
            near = Path(config_path).resolve().parent / "agents"
            if near.is_dir():
                return near
        return BUILTIN_AGENTS

    def agent_name(self, name: str) -> str:
        """The agent file a call for ``name`` runs: "default" (or "") is ``default_agent``."""
        return self.default_agent if name in ("", "default") else name

    def actor_config(self, tts_rate: int = 24000) -> ActorConfig:
        from dataclasses import replace

        from brisvox.agent.conversation.playout_book import PlayoutConfig
        from brisvox.agent.host.actor import ActorConfig
        from brisvox.agent.pipeline.cascade.tts_ring_writer import TtsRingWriterConfig
        from brisvox.agent.pipeline.cascade.turn_machine import InterruptionConfig, TurnConfig
        from brisvox.agent.tool_engine.filler import FillerConfig

        base = ActorConfig()
        icfg = InterruptionConfig.off() if self.interruption == "off" else InterruptionConfig.recommended()
        turn = TurnConfig(
            silence=self.silence_ms / 1000,
            smart_turn=self.smart_turn,
            fallback_silence=self.fallback_silence_ms / 1000,
            early_analysis=self.early_smart_turn,
            interruption=icfg,
        )
        to = replace(base.llm.timeouts, llm_first_token=self.first_token_timeout_s, llm_idle=self.idle_timeout_s)
        return replace(
            base,
            # the one extension of a turn with no text lasts until the STT stage's own Finalize answer
            turn=replace(base.turn, turn=turn, final_wait=self.final_wait_ms / 1000,
                         late_final_wait=max(0.0, base.stt.timeouts.finalize - self.final_wait_ms / 1000),
                         response_deadline=self.response_deadline_s,
                         # a verdict later than the fallback could not end the turn anyway
                         analysis_timeout=min(self.smart_turn_timeout_ms, self.fallback_silence_ms - 50) / 1000),
            stt=replace(base.stt, early_finalize=self.early_finalize),
            llm=replace(
                base.llm,
                system_prompt=self.system_prompt,
                max_tool_rounds=self.max_tool_rounds,
                filler=FillerConfig(enabled=self.filler_delay_ms > 0, delay=self.filler_delay_ms / 1000),
                timeouts=to,
            ),
            # ask the TTS for the ring's rate: a provider that can produce it needs no resampling
            tts=replace(base.tts, ring_rate=tts_rate, tts=replace(base.tts.tts, sample_rate=tts_rate)),
            out=TtsRingWriterConfig(max_ahead=self.max_ahead_ms / 1000, mark_timeout=self.mark_timeout_s),
            playout=PlayoutConfig(lead_margin=self.lead_margin_ms / 1000, settle_wait=self.settle_wait_ms / 1000),
            stop_timeout=self.stop_timeout_s,
        )


@section
class CallsConfig:
    """``[calls]``: the call records written at hang-up."""

    records: bool = True  # write one JSON record per call
    path: str = ""  # a directory (one file per call) or a .jsonl file; "" = <state_dir>/calls
    keep_days: int = Field(default=30, ge=0, le=3650)  # records older than this are deleted at start (0 = keep)

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> CallsConfig:
        return from_table(cls, table, where)


# -- the agent files a daemon config names -----------------------------------------------------


def referenced_agents(cfg: Any) -> list[tuple[str, str]]:
    """``(config key, agent name)`` for every agent file the daemon config ``cfg``
    names (enabled WebSocket routes and the agents they list for
    ``<route>/<name>``, the SIP default agent and users, the AudioSocket agent), with "default"
    resolved to ``[agents] default_agent``; the built-in echo agent has no
    file and is left out. Empty when ``[agents] providers`` is not
    "definitions". A WebSocket route reaches no agent it does not list."""
    agents = cfg.section("agents")
    if agents.providers != "definitions":
        return []
    out: list[tuple[str, str]] = []
    ws = cfg.section("websocket")
    if ws.enabled:
        for i, r in enumerate(ws.routes):
            out.append((f"websocket.routes[{i}].agent", r.agent))
            out += [(f"websocket.routes[{i}].agents[{j}]", name) for j, name in enumerate(r.agents)]
    sip = cfg.section("sip")
    if sip.enabled:
        out.append(("sip.default_agent", sip.default_agent))
        for user, name in sorted(sip.user_agents.items()):
            out.append((f"sip.users.{user}", name))
    audiosocket = cfg.section("audiosocket")
    if audiosocket.enabled:
        out.append(("audiosocket.agent", audiosocket.agent))
    resolved: list[tuple[str, str]] = []
    for key, name in out:
        if name == ECHO:
            continue
        if name in ("", "default"):
            key, name = f"{key} -> agents.default_agent", agents.default_agent
        resolved.append((key, name))
    return resolved


def check_referenced_agents(cfg: Any) -> tuple[list[str], list[str]]:
    """Validate every agent file :func:`referenced_agents` names, offline
    (:func:`brisvox.agent.definition.check_agent_file`). Returns (errors,
    warnings), each one line naming the agent file, its line and key, and the
    daemon config key that references it."""
    from brisvox.agent.definition import check_agent_file

    agents = cfg.section("agents")
    base = agents.agents_path(getattr(cfg, "path", None))
    fall = int(cfg.section("vad").fall_delay_ms)
    errors: list[str] = []
    warnings: list[str] = []
    if agents.early_smart_turn and agents.smart_turn and fall == 0:
        errors.append(f"agents.early_smart_turn: {NO_FALLING}; or set agents.early_smart_turn = false")
    if agents.early_finalize and fall == 0:
        errors.append(f"agents.early_finalize: {NO_FALLING}; or set agents.early_finalize = false")
    seen: dict[str, str] = {}
    for key, name in referenced_agents(cfg):
        if name in seen:
            continue
        seen[name] = key
        path = base / f"{name}.toml"
        if not path.is_file():
            errors.append(f"{key}: agent {name!r}: no agent file {path} (set agents.agents_dir, "
                          f"or add the file)")
            continue
        _, problems = check_agent_file(path, fall_delay_ms=fall)
        for p in problems:
            line = f"{p.render(str(path))} (agent {name!r}, referenced by {key})"
            (errors if p.severity == "error" else warnings).append(line)
    return errors, warnings
