"""The format of an agent file (``configs/agents/*.toml``) as config sections: the one validator.

Owns every key an agent file may hold, its type, bounds and format, declared with the same
mechanism as every section of ``brisvoxd.toml`` (:func:`brisvox.config.schema.section`: pydantic
v2 dataclasses, strict, unknown keys refused). :mod:`brisvox.agent.definition` validates a file
with :data:`AgentFile` and reports each failure with its dotted key and line;
``brisvox/config/agent.schema.json`` (JSON Schema 2020-12, for editor completion) is generated
from these classes by ``python -m brisvox.agent.file_model`` and a unit test keeps it equal.

Invariants:

* A cascaded agent has ``[stt]`` and ``[llm]``; a speech-to-speech agent has ``[s2s]`` and
  neither of them; both have ``[tts]`` (:meth:`AgentFile.__post_init__`).
* A provider leg never holds a key: ``api_key``/``key``/``token``/``secret``/``password`` are
  refused in the leg and in its ``options`` (:data:`SECRET_KEYS`); ``api_key_env`` names the
  environment variable instead.
* A leg's ``provider`` is one the registry knows for its stage
  (:data:`brisvox.providers.registry.PROVIDERS`).
* What the file cannot say on its own (a tool nothing provides, rules that do not compile, an
  unset key variable, ``transfer_call`` without ``transfer_targets``) is checked afterwards by
  :func:`brisvox.agent.definition.check_agent_file`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, TypeAdapter, field_validator
from pydantic.json_schema import GenerateJsonSchema

from brisvox.config.errors import ConfigError
from brisvox.config.schema import section
from brisvox.outbound.webhooks.config import AgentWebhook
from brisvox.providers.registry import PROVIDERS

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "config" / "agent.schema.json"
SECRET_KEYS = ("api_key", "key", "token", "secret", "password")
NO_SECRETS = "keys are never read from the file: name the environment variable with api_key_env"
S2S_OR_CASCADE = ("an agent has [stt] and [llm], or a speech-to-speech [s2s] instead of both (the model hears "
                  "and answers itself); [tts] in every case")

NAME = r"^[A-Za-z0-9_-]{1,64}$"
Name = Annotated[str, Field(pattern=NAME)]
TRANSFER_TARGET = Annotated[str, Field(pattern=r"^(\+?[0-9]{3,15}|sips?:[^\s]{3,200})$")]


UNIQUE: dict[str, Any] = {"uniqueItems": True}  # what _unique_items checks, for editors
KEYLESS: dict[str, Any] = {"not": {"anyOf": [{"required": [k]} for k in SECRET_KEYS]}}  # what _no_secrets checks


def _providers(stage: str) -> tuple[str, ...]:
    return tuple(name for name, (s, _) in PROVIDERS.items() if s == stage)


def _no_secrets(table: dict[str, Any]) -> dict[str, Any]:
    for k in SECRET_KEYS:
        if k in table:
            raise ConfigError(k, NO_SECRETS)
    return table


def _provider(stage: str, name: str) -> str:
    known = _providers(stage)
    if name not in known:
        raise ConfigError("", f"unknown provider {name!r}; known: {', '.join(known)}")
    return name


# -- provider legs -------------------------------------------------------------------------------
# Every field but the required ones is "X | None = None": absent means the pipeline's own default
# (docs/CONFIGURATION.md), which the parsed definition applies; TOML has no null to write.


def _enum(stage: str) -> Any:
    """A leg's ``provider``: the stage's providers (an enum in the JSON Schema, for completion)."""
    return Field(min_length=1, json_schema_extra={"enum": list(_providers(stage))})


@section
class _Leg:
    STAGE: ClassVar[str] = ""  # each leg's stage: its provider must be one the registry knows there
    provider: str
    model: str | None = Field(default=None, max_length=200)
    base_url: str | None = Field(default=None, pattern=r"^(https?|wss?)://[^\s]+$")
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Z_][A-Z0-9_]{0,127}$")
    options: dict[str, Any] | None = Field(default=None, json_schema_extra=KEYLESS)  # docs/PROVIDERS.md

    @field_validator("options")
    @classmethod
    def _options(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return v if v is None else _no_secrets(v)

    @field_validator("provider")
    @classmethod
    def _known(cls, v: str) -> str:
        return _provider(cls.STAGE, v)


LANGUAGE = r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})?$"


@section
class SttSecondary(_Leg):
    STAGE: ClassVar[str] = "stt"
    provider: Annotated[str, _enum("stt")]
    language: str | None = Field(default=None, pattern=LANGUAGE)  # default: the agent's language


@section
class SttLeg(SttSecondary):
    """``[stt]``: speech to text."""

    secondary: SttSecondary | None = None


@section
class LlmSecondary(_Leg):
    STAGE: ClassVar[str] = "llm"
    provider: Annotated[str, _enum("llm")]


@section
class LlmLeg(LlmSecondary):
    """``[llm]``: the language model."""

    secondary: LlmSecondary | None = None


@section
class TtsSecondary(_Leg):
    STAGE: ClassVar[str] = "tts"
    provider: Annotated[str, _enum("tts")]
    voice: str | None = Field(default=None, max_length=200)
    language: str | None = Field(default=None, pattern=LANGUAGE)  # default: the agent's language


@section
class TtsLeg(TtsSecondary):
    """``[tts]``: text to speech (a speech-to-speech agent's fallback voice)."""

    secondary: TtsSecondary | None = None


@section
class S2sLeg(_Leg):
    """``[s2s]``: a speech-to-speech model replaces ``[stt]`` and ``[llm]`` (docs/S2S.md)."""

    STAGE: ClassVar[str] = "s2s"
    provider: Annotated[str, _enum("s2s")]
    voice: str | None = Field(default=None, max_length=200)
    turn_detection: Literal["provider", "brisvox"] | None = None
    g711_passthrough: bool | None = None
    max_reconnects: int | None = Field(default=None, ge=0, le=10)
    fallback_line: str | None = Field(default=None, max_length=500)


# -- the pipeline's sections --------------------------------------------------------------------

Short = Annotated[str, Field(min_length=1, max_length=200)]


@section
class Window:
    """``[window]``: the LLM request window and its summary."""

    max_tokens: int | None = Field(default=None, ge=0, le=2_000_000)
    max_turns: int | None = Field(default=None, ge=1, le=10_000)
    tool_result_floor_tokens: int | None = Field(default=None, ge=48, le=100_000)
    summary: Literal["off", "agent"] | None = None
    summary_timeout: float | None = Field(default=None, gt=0, le=60)
    summary_max_tokens: int | None = Field(default=None, ge=50, le=8000)


@section
class AgentLink:
    """``[agent_link]``: the agent service a call dials (docs/AGENT_PROTOCOL.md)."""

    url: Annotated[str, Field(pattern=r"^wss?://[^\s/?#]+(/[^\s]*)?$", max_length=2000)]
    secret_env: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")]
    required: bool | None = None
    connect_timeout: float | None = Field(default=None, gt=0, le=30)
    side_effect_wait: float | None = Field(default=None, gt=0, le=120)
    allow_dial: bool | None = None
    dial_targets: tuple[Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[!-~]+$")], ...] | None = (
        Field(default=None, max_length=256))


@section
class Filler:
    """``[filler]``: what the bot says while a tool runs."""

    enabled: bool | None = None
    delay: float | None = Field(default=None, ge=0, le=30)
    per_tool: bool | None = None
    clips: bool | None = None
    phrases: tuple[Short, ...] | None = Field(default=None, max_length=32)


@section
class Interruption:
    """``[interruption]``: when the caller's speech stops the bot."""

    enabled: bool | None = None
    min_speech: float | None = Field(default=None, ge=0, le=5)
    max_backchannel: float | None = Field(default=None, ge=0, le=5)
    echo_window: float | None = Field(default=None, ge=0, le=2)
    pause_on_candidate: bool | None = None
    backchannels: tuple[Annotated[str, Field(min_length=1, max_length=40)], ...] | None = Field(default=None, max_length=128)


@section
class Turn:
    """``[turn]``: end-of-turn detection."""

    silence: float | None = Field(default=None, ge=0.1, le=5)
    smart_turn: bool | None = None
    early_analysis: bool | None = None
    early_finalize: bool | None = None
    fallback_silence: float | None = Field(default=None, ge=0.1, le=10)
    complete_threshold: float | None = Field(default=None, ge=0, le=1)


@section
class Speculation:
    """``[speculation]``: start the LLM before the turn is certain to have ended."""

    enabled: bool | None = None
    on_partial: bool | None = None
    partial_stable_for: float | None = Field(default=None, ge=0, le=2)
    max_per_turn: int | None = Field(default=None, ge=1, le=16)
    max_age: float | None = Field(default=None, gt=0, le=30)
    max_buffered_events: int | None = Field(default=None, ge=1, le=4096)


@section
class Recording:
    """``[recording]``: a stereo WAV per call (docs/SECURITY.md, privacy)."""

    enabled: bool | None = None
    path: str | None = Field(default=None, pattern=r"^(/|~)", max_length=1024)


@section
class Dtmf:
    """``[dtmf]``: keypad entries (brisvox/agent/pipeline/cascade/dtmf.py)."""

    inter_digit_timeout: float | None = Field(default=None, ge=0.05, le=30)
    terminator: Literal["", "#", "*", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "A", "B", "C", "D"] | None = None
    max_digits: int | None = Field(default=None, ge=0, le=32)
    text: str | None = Field(default=None, min_length=1, max_length=500)


DenoiseMode = Literal["off", "rnnoise", "deepfilter"]


@section
class Audio:
    """``[audio]``: what the worker does to the caller's audio before the VAD and the STT (docs/PROVIDERS.md)."""

    denoise: DenoiseMode | None = None  # default: brisvox.agent.definition.DEFAULT_DENOISE


AmdAction = Annotated[str, Field(pattern=r"^(continue|hang_up|leave_message|node:[A-Za-z0-9_-]{1,64})$")]


@section
class Amd:
    """``[amd]``: answering-machine detection on dialled calls (docs/OUTBOUND.md)."""

    enabled: bool | None = None
    max_wait_ms: int | None = Field(default=None, ge=500, le=10_000)
    on_human: AmdAction | None = None
    on_machine: AmdAction | None = None
    on_ivr: AmdAction | None = None
    on_fax: AmdAction | None = None
    on_uncertain: AmdAction | None = None
    message: str | None = Field(default=None, min_length=1, max_length=1000)
    beep_wait_ms: int | None = Field(default=None, ge=0, le=60_000)
    transcripts: bool | None = None


Line = Annotated[str, Field(max_length=500)]


@section
class WarmTransfer:
    """``[warm_transfer]``: the ``warm_transfer`` tool and flow action (docs/TOOLS.md)."""

    hold_message: Line | None = None
    hold_audio: str | None = Field(default=None, min_length=1, max_length=1024)  # a mono 16-bit WAV
    timeout_s: float | None = Field(default=None, ge=5, le=300)
    accept: Literal["confirm", "after_summary"] | None = None
    summary: Literal["llm", "template"] | None = None
    summary_template: str | None = Field(default=None, min_length=1, max_length=1000)
    summary_max_chars: int | None = Field(default=None, ge=40, le=1000)
    summary_timeout_s: float | None = Field(default=None, gt=0, le=20)
    via: Literal["sip", "twilio"] | None = None
    trunk: Name | None = None
    consult_agent: Name | None = None
    consult_prompt: Line | None = None
    verdict_timeout_s: float | None = Field(default=None, ge=2, le=120)
    no_answer_message: Line | None = None
    busy_message: Line | None = None
    declined_message: Line | None = None
    failed_message: Line | None = None
    bridge_lost_message: Line | None = None


# -- flows (brisvox/agent/flows/) -----------------------------------------------------------------

@section
class FlowAction:
    """One pre- or post-action of a node: say a line, end the call, transfer (blind or warm), or run a tool."""

    say: str | None = Field(default=None, min_length=1, max_length=1000)
    end_call: bool | None = None
    transfer: TRANSFER_TARGET | None = None
    warm_transfer: TRANSFER_TARGET | None = None
    reason: str | None = Field(default=None, max_length=200)  # a warm transfer's reason (its summary's)
    tool: Name | None = None
    args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if all(getattr(self, k) is None for k in ("say", "end_call", "transfer", "warm_transfer", "tool", "args")):
            raise ConfigError("", "an action needs one of say, end_call, transfer, warm_transfer, tool")


@section
class FlowFunction:
    """A function the node's LLM may call to move on."""

    name: Name
    description: str | None = Field(default=None, max_length=1000)
    parameters: dict[str, Any] | None = None
    next: Name | None = None


Keypad = Annotated[str, Field(pattern=r"^[0-9*#]{1,16}$")]


@section
class FlowNode:
    """One node of a flow."""

    task: Annotated[str, Field(max_length=8000)]
    role: str | None = Field(default=None, max_length=8000)
    tools: tuple[Name, ...] | None = Field(default=None, max_length=32, json_schema_extra=UNIQUE)
    functions: tuple[FlowFunction, ...] | None = Field(default=None, max_length=16)
    next_on: dict[str, Name] | None = Field(default=None, max_length=32)
    on_keypad: dict[Keypad, Name] | None = Field(default=None, max_length=32)
    pre_actions: tuple[FlowAction, ...] | None = Field(default=None, max_length=8)
    post_actions: tuple[FlowAction, ...] | None = Field(default=None, max_length=8)
    context: Literal["append", "reset", "reset_with_summary"] | None = None

    @field_validator("tools")
    @classmethod
    def _unique(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return _unique_items(v)


@section
class Flow:
    """``[flow]``: the conversation's nodes (docs/FLOWS.md)."""

    start: Name
    nodes: Annotated[dict[Name, FlowNode], Field(min_length=1, max_length=64)]
    role: str | None = Field(default=None, max_length=8000)
    max_transitions: int | None = Field(default=None, ge=1, le=1000)
    fallback_line: str | None = Field(default=None, min_length=1, max_length=500)


# -- the file ---------------------------------------------------------------------------------

def _unique_items(v: tuple[str, ...] | None) -> tuple[str, ...] | None:
    if v is not None:
        for i, x in enumerate(v):
            if x in v[:i]:
                raise ConfigError(f"[{i}]", f"{x!r} is listed twice")
    return v


ToolModule = Annotated[str, Field(pattern=r"^([A-Za-z_][A-Za-z0-9_.]*|[^:\s]+\.py):[A-Za-z_][A-Za-z0-9_]*$")]


@section
class AgentFile:
    """An agent file: its prompt, its providers, its tools and the pipeline's sections."""

    system_prompt: Annotated[str, Field(min_length=1, max_length=32768)]
    tts: TtsLeg
    name: Name | None = None
    description: str | None = Field(default=None, max_length=500)
    language: str | None = Field(default=None, pattern=LANGUAGE)
    voice: str | None = Field(default=None, max_length=200)
    greeting: str | None = Field(default=None, max_length=1000)
    tools: tuple[Name, ...] | None = Field(default=None, max_length=64, json_schema_extra=UNIQUE)
    confirm_tools: tuple[Name, ...] | None = Field(default=None, max_length=64, json_schema_extra=UNIQUE)
    tool_modules: tuple[ToolModule, ...] | None = Field(default=None, max_length=16, json_schema_extra=UNIQUE)
    transfer_targets: tuple[TRANSFER_TARGET, ...] | None = Field(default=None, max_length=64)
    confirm_transfer: bool | None = None  # default true: transfer_call waits for the caller's yes (docs/TOOLS.md)
    stt: SttLeg | None = None
    llm: LlmLeg | None = None
    s2s: S2sLeg | None = None
    flow: Flow | None = None
    window: Window | None = None
    agent_link: AgentLink | None = None
    filler: Filler | None = None
    interruption: Interruption | None = None
    turn: Turn | None = None
    speculation: Speculation | None = None
    recording: Recording | None = None
    dtmf: Dtmf | None = None
    amd: Amd | None = None
    warm_transfer: WarmTransfer | None = None
    audio: Audio | None = None
    # [[webhooks]]: this agent's calls' events (brisvox/outbound/webhooks/config.py; secret_env/_file/_credential)
    webhooks: tuple[AgentWebhook, ...] | None = Field(default=None, max_length=16)

    @field_validator("tools", "confirm_tools", "tool_modules")
    @classmethod
    def _unique(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return _unique_items(v)

    @field_validator("confirm_tools")
    @classmethod
    def _not_the_confirmation(cls, v: tuple[str, ...] | None) -> tuple[str, ...] | None:
        for i, x in enumerate(v or ()):
            if x == "confirm_pending":
                raise ConfigError(f"[{i}]", "confirm_pending is the confirmation tool itself")
        return v

    def __post_init__(self) -> None:
        cascade, s2s = self.stt is not None and self.llm is not None, self.s2s is not None
        if s2s and (self.stt is not None or self.llm is not None):
            raise ConfigError("s2s", S2S_OR_CASCADE)
        if not s2s and not cascade:
            raise ConfigError("", S2S_OR_CASCADE)


# -- the JSON Schema for editors -------------------------------------------------------------------

class _FileSchema(GenerateJsonSchema):
    """TOML has no null and the defaults are the pipeline's: optional keys are shown as their type."""

    def nullable_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: Any) -> Any:
        return self.generate_inner(schema["schema"])


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an agent file, generated from :class:`AgentFile`."""
    body = TypeAdapter(AgentFile).json_schema(schema_generator=_FileSchema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://brisvox.invalid/schemas/agent.schema.json",
            "title": "brisvox agent definition (configs/agents/*.toml)",
            "$comment": "generated by `python -m brisvox.agent.file_model` from brisvox/agent/file_model.py; "
                        "do not edit",
            **{k: v for k, v in body.items() if k != "title"},
            # the cascade-or-s2s rule of AgentFile.__post_init__, for editors
            "oneOf": [{"required": ["stt", "llm"], "not": {"required": ["s2s"]}},
                      {"required": ["s2s"], "not": {"anyOf": [{"required": ["stt"]}, {"required": ["llm"]}]}}]}


def render() -> str:
    return json.dumps(json_schema(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write (default) or ``--check`` brisvox/config/agent.schema.json."""
    args = sys.argv[1:] if argv is None else argv
    text = render()
    if "--check" in args:
        same = SCHEMA_PATH.is_file() and SCHEMA_PATH.read_text(encoding="utf-8") == text
        print(f"{SCHEMA_PATH}: {'up to date' if same else 'stale: run python -m brisvox.agent.file_model'}")
        return 0 if same else 1
    SCHEMA_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
