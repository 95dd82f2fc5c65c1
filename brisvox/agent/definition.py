"""Agent definitions: ``configs/agents/*.toml`` parsed, validated and checked offline.

Owns the parsing of an agent file, validated by the one config validator
(:mod:`brisvox.agent.file_model`, which also generates ``brisvox/config/agent.schema.json``
for editors), and the
offline check ``brisvoxd check FILE`` runs (:func:`check_agent_file`):

* Every problem names its position: the dotted key and the LINE of the
  offending key in the file (found by :func:`key_lines`, a small scanner of
  the TOML text, since ``tomllib`` keeps no positions).
* Keys are never read from the file: a provider leg names the environment
  variable (``api_key_env = "OPENAI_API_KEY"``; each provider has a default
  variable) and any ``api_key``/``key``/``token``/``secret``/``password`` key
  is refused by the schema. The check reports an unset variable as a
  warning (offline: no key needed to check a file); :func:`resolve_key` reads
  it (or the systemd credential of that name) when a call is built.
* Fail closed: a tool listed in ``tools`` that nothing provides (the built-in
  telephony tools, or a ``tool_modules`` entry ``package.module:function``
  returning ``(ToolSpec, tool)`` pairs) is an ERROR naming its line and what
  would provide it; ``confirm_tools`` must be a subset of ``tools`` and name
  SideEffect tools; ``transfer_call`` and ``warm_transfer`` need ``transfer_targets`` (an
  ERROR: the file is refused, since an open transfer is toll fraud one prompt injection away)
  and every flow ``transfer`` / ``warm_transfer`` action's target must be listed there;
  ``[warm_transfer]``'s template names known fields only and its ``hold_audio`` is a readable
  mono 16-bit WAV of bounded size (relative to the agent file); ``transfer_call`` goes
  through the confirmation gate unless ``confirm_transfer = false``; a scripted LLM's rules must compile; ``[speculation]`` needs an LLM
  (each leg) that streams (:data:`~brisvox.providers.registry.STREAMING_LLM`), the error
  naming the leg's ``provider`` key; ``[dtmf]`` must build (its ``text`` shows the entry).

The parsed :class:`AgentDef` is frozen; the registry
(:mod:`brisvox.providers.registry`, which owns the provider legs,
:class:`ProviderDef`, and the table of known providers) builds a call's
providers from its legs, :mod:`brisvox.agent.tool_engine.loader` its tools, and
:func:`actor_config` maps it onto the call actor's
:class:`~brisvox.agent.host.actor.ActorConfig`. The definition lives next to the
agent that runs it: it imports the providers' registry, never the other way
round, and the supervisor reaches it only through a function-level import
(``brisvox.agent.host.config.check_referenced_agents``).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from brisvox.agent.file_model import NO_SECRETS, SECRET_KEYS, AgentFile, json_schema
from brisvox.agent.flows.definition import FlowDef, check_flow, parse_flow
from brisvox.agent.host.amd_screen import AmdConfig
from brisvox.agent.host.warm_transfer import WarmConfig
from brisvox.agent.link.config import LinkConfig, check_link
from brisvox.config.errors import ConfigError
from brisvox.config.lines import key_lines, line_of
from brisvox.config.schema import failures, from_table
from brisvox.outbound.webhooks.config import AgentWebhook
from brisvox.providers.registry import (
    KEY_OPTIONAL,
    LOCAL,
    PROVIDERS,
    STREAMING_LLM,
    ProviderDef,
    leg_problems,
    resolve_key,
    unknown_options,
)

if TYPE_CHECKING:
    from brisvox.agent.host.actor import ActorConfig

__all__ = ["KEY_OPTIONAL", "LOCAL", "PROVIDERS", "ProviderDef", "resolve_key", "AgentDef", "AgentDefError",
           "Problem", "check_agent_file", "check_main", "is_agent_file", "load_agent", "actor_config", "parse",
           "key_lines", "line_of", "schema", "read"]

# `[audio] denoise` when the file does not say: chosen by `python -m bench denoise` (docs/BENCHMARKS.md)
DEFAULT_DENOISE = "off"


class AgentDefError(ConfigError):
    """A problem of an agent file: ``key`` dotted path, ``line`` 1-based (0: unknown)."""


@dataclass(frozen=True, slots=True)
class Problem:
    severity: str  # "error" | "warning"
    key: str
    line: int
    message: str

    def render(self, path: str) -> str:
        return f"{path}:{self.line}: {self.severity}: {self.key}: {self.message}"


@dataclass(frozen=True, slots=True)
class AgentDef:
    name: str
    path: str
    system_prompt: str
    stt: ProviderDef | None  # None: a speech-to-speech agent (``s2s``)
    llm: ProviderDef | None
    tts: ProviderDef  # an S2S agent's fallback voice
    language: str = "en"
    voice: str = ""
    greeting: str = ""
    tools: tuple[str, ...] = ()
    confirm_tools: tuple[str, ...] = ()
    tool_modules: tuple[str, ...] = ()
    transfer_targets: tuple[str, ...] = ()
    confirm_transfer: bool = True  # transfer_call goes through the confirmation gate (off: confirm_transfer = false)
    filler: Mapping[str, Any] = field(default_factory=dict)
    interruption: Mapping[str, Any] = field(default_factory=dict)
    turn: Mapping[str, Any] = field(default_factory=dict)
    speculation: Mapping[str, Any] = field(default_factory=dict)
    window: Mapping[str, Any] = field(default_factory=dict)  # [window]: the request window and its summary
    dtmf: Mapping[str, Any] = field(default_factory=dict)  # [dtmf]: keypad entries (pipeline/cascade/dtmf.py)
    recording: Mapping[str, Any] = field(default_factory=dict)  # [recording]: enabled, path (call_build.py)
    s2s: ProviderDef | None = None  # a speech-to-speech provider replaces stt and llm (docs/S2S.md)
    s2s_settings: Mapping[str, Any] = field(default_factory=dict)  # turn_detection, g711_passthrough, ...
    flow: FlowDef | None = None  # the conversation's flow (brisvox/agent/flows/), None: free conversation
    agent_link: LinkConfig | None = None  # [agent_link]: the agent service (docs/AGENT_PROTOCOL.md)
    amd: AmdConfig = field(default_factory=AmdConfig)  # [amd]: answering-machine detection (host/amd_screen.py)
    webhooks: tuple[AgentWebhook, ...] = ()  # [[webhooks]]: where this agent's call events go (docs/PROTOCOL.md)
    warm_transfer: WarmConfig = field(default_factory=WarmConfig)  # [warm_transfer]: host/warm_transfer.py
    denoise: str = DEFAULT_DENOISE  # [audio] denoise: noise suppression in the worker (workers/denoise.py)

    def legs(self) -> list[tuple[str, ProviderDef]]:
        """(stage, leg) of every stage the agent has."""
        return [(n, p) for n in ("stt", "llm", "tts", "s2s") if (p := getattr(self, n)) is not None]

    def needs_worker_jobs(self) -> bool:
        return any(leg.provider in LOCAL for _, p in self.legs() for leg in p.legs())


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    """The agent file's JSON Schema (generated from :mod:`brisvox.agent.file_model`)."""
    return json_schema()


# -- parsing -------------------------------------------------------------------------------------


def _leg(d: Mapping[str, Any], language: str, voice: str = "") -> ProviderDef:
    """One leg and its secondary, each with its own settings: ``language`` (the agent's) and
    ``voice`` (the agent's top-level one) are the primary's fallbacks; a secondary falls back
    to the agent's language and to its provider's own voice and model, never the primary's."""
    sec = d.get("secondary")
    return ProviderDef(provider=str(d["provider"]), model=str(d.get("model", "")),
                       voice=str(d.get("voice", "") or voice), language=str(d.get("language", "") or language),
                       base_url=str(d.get("base_url", "")), api_key_env=str(d.get("api_key_env", "")),
                       options=dict(d.get("options", {})),
                       secondary=_leg(sec, language) if isinstance(sec, dict) else None)


def parse(data: Mapping[str, Any], path: str) -> AgentDef:
    lang, voice = str(data.get("language", "en")), str(data.get("voice", ""))
    return AgentDef(
        name=str(data.get("name") or Path(path).stem), path=path, system_prompt=str(data["system_prompt"]),
        stt=_leg(data["stt"], lang) if "stt" in data else None,
        llm=_leg(data["llm"], "") if "llm" in data else None,
        tts=_leg(data["tts"], lang, voice),
        language=str(data.get("language", "en")), voice=str(data.get("voice", "")),
        greeting=str(data.get("greeting", "")), tools=tuple(data.get("tools", ())),
        confirm_tools=tuple(data.get("confirm_tools", ())), tool_modules=tuple(data.get("tool_modules", ())),
        transfer_targets=tuple(data.get("transfer_targets", ())),
        confirm_transfer=bool(data.get("confirm_transfer", True)), filler=dict(data.get("filler", {})),
        interruption=dict(data.get("interruption", {})), turn=dict(data.get("turn", {})),
        speculation=dict(data.get("speculation", {})), window=dict(data.get("window", {})), dtmf=dict(data.get("dtmf", {})),
        recording=dict(data.get("recording", {})),
        s2s=_leg(data["s2s"], lang) if "s2s" in data else None,
        flow=parse_flow(data["flow"]) if "flow" in data else None,
        agent_link=LinkConfig.from_table(data["agent_link"]) if "agent_link" in data else None,
        s2s_settings={k: v for k, v in data.get("s2s", {}).items() if k in S2S_SETTINGS},
        amd=AmdConfig.from_table(data.get("amd", {})),
        warm_transfer=WarmConfig.from_table(data.get("warm_transfer", {})),
        denoise=str((data.get("audio") or {}).get("denoise") or DEFAULT_DENOISE),
        webhooks=tuple(from_table(AgentWebhook, h, f"webhooks[{i}]") for i, h in enumerate(data.get("webhooks") or ())),
    )


S2S_SETTINGS = ("turn_detection", "g711_passthrough", "max_reconnects", "fallback_line")


S2S_NOT = ("flow", "filler", "window", "amd")  # sections of the cascaded pipeline an S2S agent cannot honour


def _schema_problems(data: Any, lines: Mapping[str, int]) -> list[Problem]:
    """The file checked against :class:`~brisvox.agent.file_model.AgentFile` (the one validator)."""
    out: list[Problem] = []
    for parts, msg in failures(AgentFile, data)[1]:
        if msg.startswith("unknown key") and parts and parts[-1] in SECRET_KEYS:
            msg = NO_SECRETS
        key = ".".join(map(str, parts)) or "(file)"
        out.append(Problem("error", key, line_of(lines, parts), msg))
    return out


def read(path: str | os.PathLike[str]) -> tuple[Any, dict[str, int], list[Problem]]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        return None, {}, [Problem("error", "(file)", 0, f"cannot read: {e.strerror or e}")]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"line (\d+)", str(e))
        return None, {}, [Problem("error", "(syntax)", int(m.group(1)) if m else 0, str(e))]
    return data, key_lines(text), []


def check_agent_file(path: str | os.PathLike[str], env: Mapping[str, str] | None = None,
                     load_modules: bool = True, fall_delay_ms: int | None = None,
                     ) -> tuple[AgentDef | None, list[Problem]]:
    """Validate an agent file offline. Returns the definition (None if unusable) and every problem.
    ``fall_delay_ms``: the workers' ``[vad] fall_delay_ms`` when a daemon config is known
    (``[turn] early_analysis`` needs it above 0), None when the file is checked alone."""
    env = os.environ if env is None else env
    data, lines, problems = read(path)
    if data is None:
        return None, problems
    problems = _schema_problems(data, lines)
    if problems:
        return None, problems
    agent = parse(data, str(path))
    for stage, stage_leg in agent.legs():
        for i, leg in enumerate(stage_leg.legs()):
            where = [stage] if i == 0 else [stage, "secondary"]
            var = leg.key_env
            if var and leg.provider not in KEY_OPTIONAL and not resolve_key(leg, env):
                problems.append(Problem("warning", ".".join([*where, "api_key_env"]),
                                        line_of(lines, [*where, "api_key_env"]) or line_of(lines, where),
                                        f"{var} is not set: calls with this agent will fail to start {stage}"))
            if leg.provider == "scripted":
                problems.extend(_check_rules(leg, where, lines))
            for sev, what, msg in leg_problems(stage, leg):
                key = [*where, what]
                if what == "voice" and stage == "tts" and i == 0 and "voice" not in data["tts"] and agent.voice:
                    key = ["voice"]  # the primary's voice is the agent's top-level one
                elif what == "language" and not _has(data, key):
                    key = ["language"]  # the leg took the agent's language
                problems.append(Problem(sev, ".".join(key), line_of(lines, key) or line_of(lines, where), msg))
            if "timing_file" in leg.options:
                problems.extend(_check_timing(leg, where, lines))
            for opt_name in unknown_options(leg):
                problems.append(Problem("error", ".".join([*where, "options", opt_name]),
                                        line_of(lines, [*where, "options", opt_name]),
                                        f"unknown option for {leg.provider}"))
    problems.extend(_check_tools(agent, lines, load_modules))
    problems.extend(_check_settings(agent, lines, fall_delay_ms))
    if agent.flow is not None:
        problems.extend(Problem("error", p.key, line_of(lines, p.key.split(".")), p.message)
                        for p in check_flow(agent.flow, agent.tools))
    problems.extend(_check_speculation(agent, lines))
    problems.extend(_check_dtmf(agent, lines))
    if agent.amd.enabled:  # what its actions need: a message to leave, the flow node to enter
        problems.extend(Problem("error", k, line_of(lines, k.split(".")), msg) for k, msg in
                        agent.amd.problems(frozenset(agent.flow.nodes) if agent.flow is not None else None))
    if agent.s2s is not None:  # what the cascaded runner does: an S2S call has no runner to do it
        problems.extend(Problem("error", k, line_of(lines, [k]), f"[{k}] does not apply to a speech-to-speech agent "
                                "(the model hears and speaks itself): remove it") for k in S2S_NOT if k in data)
    problems.extend(Problem(sev, f"agent_link.{k}", line_of(lines, ["agent_link", k]), msg)
                    for sev, k, msg in (check_link(data["agent_link"], env) if "agent_link" in data else ()))
    problems.extend(_check_webhooks(agent, lines, env))
    problems.extend(_check_warm(agent, data, lines))
    return agent, problems


def _check_warm(agent: AgentDef, data: Mapping[str, Any], lines: Mapping[str, int]) -> list[Problem]:
    """``[warm_transfer]``: its template and hold audio; a table nothing uses is a warning."""
    used = "warm_transfer" in agent.tools or any(w == "warm_transfer" for w, _ in _flow_transfers(agent, True))
    out = [Problem("error", k, line_of(lines, k.split(".")), msg)
           for k, msg in agent.warm_transfer.problems(Path(agent.path).resolve().parent)]
    if used and agent.s2s is not None:
        out.append(Problem("error", "tools", line_of(lines, ["tools"]), "warm_transfer needs a cascaded agent "
                           "([stt] and [llm]): a speech-to-speech call cannot hold the caller yet"))
    if "warm_transfer" in data and not used:
        out.append(Problem("warning", "warm_transfer", line_of(lines, ["warm_transfer"]),
                           "[warm_transfer] without warm_transfer in tools or a flow action: it changes nothing"))
    return out


def _check_webhooks(agent: AgentDef, lines: Mapping[str, int], env: Mapping[str, str]) -> list[Problem]:
    """``[[webhooks]]``: each URL's target (a private address without ``allow_private`` is an
    error), given once; a secret source that cannot be read here is a warning (offline)."""
    from brisvox.outbound.webhooks.config import url_problems

    out: list[Problem] = []
    seen: set[str] = set()
    for i, hook in enumerate(agent.webhooks):
        where: list[str | int] = ["webhooks", i]
        line = line_of(lines, [*where, "url"]) or line_of(lines, where)
        if hook.url in seen:
            out.append(Problem("error", f"webhooks[{i}].url", line, f"{hook.url[:80]!r} is given twice"))
        seen.add(hook.url)
        errors, warnings = url_problems(hook.url, hook.allow_private)
        out += [Problem("error", f"webhooks[{i}].url", line, m) for m in errors]
        out += [Problem("warning", f"webhooks[{i}].url", line, m) for m in warnings]
        try:
            hook.resolve_secret(f"webhooks[{i}]", env)
        except ConfigError as e:
            out.append(Problem("warning", e.key, line_of(lines, where), f"{e.message}: this webhook's events will "
                               "not be signed and are given up"))
    return out


def _check_settings(agent: AgentDef, lines: Mapping[str, int], fall_delay_ms: int | None) -> list[Problem]:
    """Settings that would be accepted and do nothing: ``[filler] per_tool`` with ``delay``
    (each tool's own delay replaces the fixed one), ``[turn] early_analysis`` without
    the VAD's falling events (``[vad] fall_delay_ms`` 0) or without Smart Turn,
    ``[turn] early_finalize`` without falling events."""
    from brisvox.agent.host.config import NO_FALLING
    from brisvox.providers.registry import TOOLLESS_LLM

    out: list[Problem] = []
    offered = list(agent.tools) + ([f.name for n in agent.flow.nodes.values() for f in n.functions]
                                   if agent.flow is not None else [])
    for i, leg in enumerate(agent.llm.legs() if agent.llm is not None and offered else ()):
        if leg.provider in TOOLLESS_LLM:
            where = ["llm", "provider"] if i == 0 else ["llm", "secondary", "provider"]
            what = ("its tools are never offered to it, so it cannot " if i == 0 else
                    "after a failover to it a turn that offers tools is answered that it cannot be done now "
                    "(no tool runs), so the agent cannot ")
            out.append(Problem("warning", ".".join(where), line_of(lines, where),
                               f"{leg.provider} cannot call tools: {what}use {', '.join(offered[:4])}"
                               f"{' ...' if len(offered) > 4 else ''}; use an LLM that calls tools "
                               "(openai, anthropic, gemini, ...)"))
    if agent.filler.get("per_tool") and "delay" in agent.filler:
        out.append(Problem("error", "filler.delay", line_of(lines, ["filler", "delay"]),
                           "per_tool = true takes each tool's own delay, so delay would be ignored: "
                           "remove delay, or set per_tool = false"))
    if agent.turn.get("early_analysis"):
        key, line = "turn.early_analysis", line_of(lines, ["turn", "early_analysis"])
        if agent.turn.get("smart_turn") is False:
            out.append(Problem("error", key, line, "early analysis is a Smart Turn analysis: with "
                               "smart_turn = false it never runs; remove early_analysis"))
        elif fall_delay_ms == 0:
            out.append(Problem("error", key, line, f"{NO_FALLING}; or remove early_analysis"))
        elif fall_delay_ms is None:
            out.append(Problem("warning", key, line, "needs the workers' [vad] fall_delay_ms > 0 (default 0: "
                               "then it never runs); `brisvoxd check` of the daemon config checks it"))
    if agent.turn.get("early_finalize"):
        key, line = "turn.early_finalize", line_of(lines, ["turn", "early_finalize"])
        if fall_delay_ms == 0:
            out.append(Problem("error", key, line, f"{NO_FALLING}; or remove early_finalize"))
        elif fall_delay_ms is None:
            out.append(Problem("warning", key, line, "needs the workers' [vad] fall_delay_ms > 0 (default 0: "
                               "then the stop finalizes as without it); `brisvoxd check` of the daemon "
                               "config checks it"))
    return out


def _has(data: Mapping[str, Any], key: list[str]) -> bool:
    for k in key:
        if not isinstance(data, Mapping) or k not in data:
            return False
        data = data[k]
    return True


def _check_dtmf(agent: AgentDef, lines: Mapping[str, int]) -> list[Problem]:
    """``[dtmf]`` builds (its ``text`` formats); an S2S agent gets no keypad entries yet."""
    from brisvox.agent.pipeline.cascade.dtmf import KeypadConfig

    if not agent.dtmf:
        return []
    try:
        KeypadConfig.from_table(dict(agent.dtmf))
    except ValueError as e:
        key, _, msg = str(e).partition(": ")
        return [Problem("error", f"dtmf.{key}", line_of(lines, ["dtmf", key]), msg)]
    if agent.s2s is not None:
        return [Problem("warning", "dtmf", line_of(lines, ["dtmf"]),
                        "a speech-to-speech call counts key presses but does not deliver them yet")]
    return []


def _check_speculation(agent: AgentDef, lines: Mapping[str, int]) -> list[Problem]:
    """Speculation needs a streaming LLM on every leg (a secondary may answer the request)."""
    from brisvox.agent.pipeline.speculation.policy import SpeculationConfig

    try:
        cfg = SpeculationConfig.from_table(agent.speculation)
    except ValueError as e:
        key, _, msg = str(e).partition(": ")
        return [Problem("error", f"speculation.{key}", line_of(lines, ["speculation", key]), msg)]
    if not cfg.enabled:
        return []
    if agent.llm is None:
        return [Problem("error", "speculation.enabled", line_of(lines, ["speculation", "enabled"]),
                        "a speech-to-speech agent has no LLM to start early: remove [speculation]")]
    out: list[Problem] = []
    for i, leg in enumerate(agent.llm.legs()):
        if leg.provider not in STREAMING_LLM:
            where = ["llm", "provider"] if i == 0 else ["llm", "secondary", "provider"]
            out.append(Problem("error", ".".join(where), line_of(lines, where),
                               f"{leg.provider} cannot stream: speculation.enabled needs a streaming LLM "
                               f"(set speculation.enabled = false, or use one of {', '.join(sorted(STREAMING_LLM))})"))
    return out


def _check_rules(leg: ProviderDef, where: list[str], lines: Mapping[str, int]) -> list[Problem]:
    out: list[Problem] = []
    rules = leg.options.get("rules", [])
    if not isinstance(rules, list):
        return [Problem("error", ".".join([*where, "options", "rules"]), line_of(lines, [*where, "options", "rules"]),
                        "rules must be an array of tables")]
    for i, r in enumerate(rules):
        key = [*where, "options", "rules", i]
        if not isinstance(r, dict) or "match" not in r:
            out.append(Problem("error", ".".join(map(str, key)), line_of(lines, key), "a rule needs match"))
            continue
        try:
            re.compile(str(r["match"]))
        except re.error as e:
            out.append(Problem("error", ".".join(map(str, [*key, "match"])), line_of(lines, [*key, "match"]),
                               f"bad regular expression: {e}"))
    return out


def _check_timing(leg: ProviderDef, where: list[str], lines: Mapping[str, int]) -> list[Problem]:
    """A scripted leg's ``timing_file`` must be readable when it names a file."""
    from brisvox.providers.base import ProviderError
    from brisvox.providers.scripted_speech import read_timing, timing_path

    key = [*where, "options", "timing_file"]
    raw = str(leg.options["timing_file"])
    path = timing_path(raw)
    if path is None:
        unset = [v for v in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", raw) if not os.environ.get(v)]
        what = f"{', '.join(unset)} is not set" if unset else f"{raw!r} names no file"
        return [Problem("warning", ".".join(key), line_of(lines, key),
                        f"{what}: the built-in scripted timing applies")]
    try:
        read_timing(path)
    except ProviderError as e:
        return [Problem("error", ".".join(key), line_of(lines, key), e.detail)]
    return []


def _check_tools(agent: AgentDef, lines: Mapping[str, int], load_modules: bool) -> list[Problem]:
    from brisvox.agent.tool_engine.loader import NO_TRANSFER_TARGETS, ToolSetupError, provided_tools

    out: list[Problem] = []
    try:
        base = str(Path(agent.path).resolve().parent)
        provided = provided_tools(agent.tool_modules, base) if load_modules else {}
    except ToolSetupError as e:
        i = agent.tool_modules.index(e.module) if e.module in agent.tool_modules else 0
        return [Problem("error", f"tool_modules.{i}", line_of(lines, ["tool_modules"]), str(e))]
    for name in agent.tools:
        if load_modules and name not in provided:
            out.append(Problem("error", "tools", line_of(lines, ["tools"]),
                               f"tool {name!r} is not provided by anything: add the module that defines it to "
                               f"tool_modules (package.module:function), or use a built-in "
                               f"(end_call, send_dtmf, transfer_call); a call without its tools would answer wrongly"))
    for name in agent.confirm_tools:
        if name not in agent.tools:
            out.append(Problem("error", "confirm_tools", line_of(lines, ["confirm_tools"]),
                               f"{name!r} is not in tools"))
        elif name in provided and not provided[name].side_effect:
            out.append(Problem("error", "confirm_tools", line_of(lines, ["confirm_tools"]),
                               f"{name!r} is ReadOnly: only SideEffect tools take a confirmation"))
    if any(n in agent.tools for n in ("transfer_call", "warm_transfer")) and not agent.transfer_targets:
        out.append(Problem("error", "tools", line_of(lines, ["tools"]), NO_TRANSFER_TARGETS))
    for where, target in _flow_transfers(agent):
        if target not in agent.transfer_targets:
            out.append(Problem("error", where, line_of(lines, where.split(".")) or line_of(lines, ["flow"]),
                               f"the flow transfers to {target!r}, which is not in transfer_targets"))
    if "confirm_transfer" in lines and not any(n in agent.tools for n in ("transfer_call", "warm_transfer")):
        out.append(Problem("warning", "confirm_transfer", line_of(lines, ["confirm_transfer"]),
                           "confirm_transfer without transfer_call or warm_transfer in tools: it changes nothing"))
    return out


def _flow_transfers(agent: AgentDef, kind: bool = False) -> list[tuple[str, str]]:
    """(dotted key of the node's actions, target) of every transfer action (blind or warm) of
    the agent's flow; ``kind``: (``transfer`` | ``warm_transfer``, target) instead."""
    if agent.flow is None:
        return []
    return [(("warm_transfer" if a.warm_transfer else "transfer") if kind else f"flow.nodes.{name}.{side}",
             a.transfer or a.warm_transfer) for name, n in agent.flow.nodes.items()
            for side, acts in (("pre_actions", n.pre_actions), ("post_actions", n.post_actions))
            for a in acts if a.transfer or a.warm_transfer]


def load_agent(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> AgentDef:
    """Parse and check; raises :class:`AgentDefError` on the first error (warnings pass)."""
    agent, problems = check_agent_file(path, env)
    for p in problems:
        if p.severity == "error":
            raise AgentDefError(p.key, p.message, str(path), p.line)
    assert agent is not None
    return agent


def check_main(path: str, env: Mapping[str, str] | None = None, out: Any = None) -> int:
    """``brisvoxd check AGENT.toml``: print every problem with its line; 0 ok, 2 errors."""
    import sys

    out = out or sys.stdout
    agent, problems = check_agent_file(path, env)
    for p in problems:
        print(p.render(path), file=out)
    errors = sum(1 for p in problems if p.severity == "error")
    if errors or agent is None:
        print(f"{path}: {errors} error(s)", file=out)
        return 2
    stages = ", ".join(f"{n} {p.provider}" for n, p in agent.legs())
    print(f"{path}: ok (agent {agent.name}: {stages}; tools: {', '.join(agent.tools) or 'none'})", file=out)
    return 0


def is_agent_file(path: str | os.PathLike[str]) -> bool:
    """True if ``path`` looks like an agent definition (has system_prompt and [llm] or [s2s])."""
    data, _, _ = read(path)
    return isinstance(data, dict) and "system_prompt" in data and ("llm" in data or "s2s" in data)


def actor_config(agent: AgentDef, base: ActorConfig | None = None) -> ActorConfig:
    """The call actor's :class:`~brisvox.agent.host.actor.ActorConfig` with this agent's settings:
    system prompt, filler, interruption and turn policy, speculation (the runner's and the
    turn driver's, one config), keypad entries (``[dtmf]``), STT language/model, TTS voice/model.
    Unset keys keep ``base``'s values (default: ``ActorConfig()``)."""
    from dataclasses import fields, replace

    from brisvox.agent.host.actor import ActorConfig
    from brisvox.agent.pipeline.cascade.dtmf import KeypadConfig
    from brisvox.agent.pipeline.cascade.turn_machine import InterruptionConfig, TurnConfig
    from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
    from brisvox.agent.tool_engine.filler import FillerConfig

    cfg = base or ActorConfig()

    def pick(cls: type, table: Mapping[str, Any], skip: tuple[str, ...] = ()) -> dict[str, Any]:
        names = {f.name for f in fields(cls)}
        return {k: v for k, v in table.items() if k in names and k not in skip}

    fill = dict(agent.filler)
    phrases = tuple(fill.pop("phrases", ()) or cfg.llm.filler_phrases)
    filler = replace(cfg.llm.filler, **pick(FillerConfig, fill))
    spec = SpeculationConfig.from_table(agent.speculation) if agent.speculation else cfg.llm.speculation
    llm = replace(cfg.llm, system_prompt=agent.system_prompt, filler=filler, filler_phrases=phrases,
                  speculation=spec)
    llm = _window_config(agent, llm)
    inter = dict(agent.interruption)
    if "backchannels" in inter:
        inter["backchannels"] = frozenset(str(b).lower() for b in inter["backchannels"])
    interruption = replace(cfg.turn.turn.interruption, **pick(InterruptionConfig, inter))
    turn = replace(cfg.turn.turn, interruption=interruption, **pick(TurnConfig, agent.turn, ("interruption",)))
    # the call's session configs carry the primary's settings; each leg of the resilience layer
    # connects with its own in their place (brisvox.providers.resilience.leg_own)
    early_fin = agent.turn.get("early_finalize")
    stt = replace(cfg.stt, early_finalize=cfg.stt.early_finalize if early_fin is None else bool(early_fin),
                  stt=replace(cfg.stt.stt, language=agent.stt.language if agent.stt else agent.language,
                                       model=agent.stt.model if agent.stt is not None else ""))
    tts = replace(cfg.tts, clip_scope=agent.name,  # the agent's filler clips are shared by its calls
                  tts=replace(cfg.tts.tts, language=agent.tts.language, model=agent.tts.model,
                              voice=agent.tts.voice))
    keypad = KeypadConfig.from_table(dict(agent.dtmf)) if agent.dtmf else cfg.turn.keypad
    out = replace(cfg, llm=llm, turn=replace(cfg.turn, turn=turn, speculation=spec, keypad=keypad), stt=stt, tts=tts)
    return out if agent.s2s is None else replace(out, s2s=_s2s_config(agent, out, turn))


PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]{0,63})\s*\}\}")


def fill_placeholders(text: str, params: Mapping[str, str]) -> str:
    """``text`` with each ``{{name}}`` replaced by the call parameter ``name`` (a campaign row's
    variable, a native ``start.params`` entry, ...); a name the call does not carry, or one
    that may hold a credential (:func:`~brisvox.agent.tool_engine.call_info.secret_name`),
    becomes "". Anything else in ``text`` is kept as it is (no other syntax, no escaping)."""
    from brisvox.agent.tool_engine.call_info import secret_name, secret_value

    def one(m: re.Match[str]) -> str:
        v = params.get(m.group(1), "")
        return "" if secret_name(m.group(1)) or secret_value(v) else v

    return PLACEHOLDER.sub(one, text) if "{{" in text else text


def with_call_params(cfg: Any, params: Mapping[str, str]) -> Any:
    """The call's :class:`~brisvox.agent.host.actor.ActorConfig` with its prompt (the LLM's system
    prompt, the S2S session's instructions) filled from the call's parameters (:func:`fill_placeholders`)."""
    from dataclasses import replace

    out = replace(cfg, llm=replace(cfg.llm, system_prompt=fill_placeholders(cfg.llm.system_prompt, params)))
    s = out.s2s
    if "{{" in s.session.instructions:
        out = replace(out, s2s=replace(s, session=replace(
            s.session, instructions=fill_placeholders(s.session.instructions, params))))
    return out


def _window_config(agent: AgentDef, llm: Any) -> Any:
    """``[window]`` onto the runner's config: the request window and its summarizer."""
    from dataclasses import replace

    win = agent.window
    if not win:
        return llm
    keys = ("max_tokens", "max_turns", "tool_result_floor_tokens")
    window = replace(llm.request.window, **{k: win[k] for k in keys if k in win})
    summary = llm.summary
    if "summary" in win:
        summary = replace(summary, provider="agent" if win["summary"] == "agent" else "")
    if "summary_timeout" in win:
        summary = replace(summary, timeout=float(win["summary_timeout"]))
    if "summary_max_tokens" in win:
        summary = replace(summary, max_tokens=int(win["summary_max_tokens"]))
    return replace(llm, request=replace(llm.request, window=window), summary=summary)


def _s2s_config(agent: AgentDef, cfg: ActorConfig, turn: Any) -> Any:
    """The S2S stage's config: the session (model, voice, instructions) and its turn policy."""
    from dataclasses import replace

    from brisvox.agent.pipeline.s2s.machine import S2sTurnConfig
    from brisvox.providers.s2s.base import S2sConfig

    leg, st = agent.s2s, agent.s2s_settings
    assert leg is not None
    session = S2sConfig(model=leg.model, voice=leg.voice or agent.voice, instructions=agent.system_prompt,
                        language=agent.language, g711_passthrough=bool(st.get("g711_passthrough", False)),
                        extra=dict(leg.options))
    t = S2sTurnConfig(turn_detection=st.get("turn_detection", "provider"), smart_turn=turn.smart_turn,
                      silence=turn.silence, interruption=turn.interruption)
    s = replace(cfg.s2s, turn=t, session=session)
    if "max_reconnects" in st:
        s = replace(s, max_reconnects=int(st["max_reconnects"]))
    if "fallback_line" in st:
        s = replace(s, fallback_line=str(st["fallback_line"]))
    return s
