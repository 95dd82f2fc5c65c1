"""Provider name -> factory: a call's STT, LLM and TTS built from its agent definition.

Owns the provider legs of an agent file (:class:`ProviderDef`, one per
``[stt]``/``[llm]``/``[tts]`` table and its ``secondary``), the table of
known providers (:data:`PROVIDERS`: stage and default key variable), the
mapping from a leg to an adapter instance, and the options each provider
accepts (:data:`OPTIONS`; an unknown option is a :class:`ProviderError` here
and an error of ``brisvoxd check``). The agent definition itself
(:mod:`brisvox.agent.definition`) builds on these; this module imports
nothing of it (:func:`build_call` takes anything with the three legs).

* Keys come from the environment (:func:`resolve_key`), else from the systemd
  credential of the variable's name (``LoadCredential=OPENAI_API_KEY:...``,
  :func:`brisvox.config.secrets.credential`), read when the call is built; a
  missing key raises ``auth`` naming the variable.
* Local providers (``local_whisper``, ``local_llm``, ``local_piper``) need the
  call's :class:`~brisvox.providers.worker_jobs.JobChannel` (the agent
  process's worker client) in the :class:`CallEnv`.
* Every stage of a call (:func:`build_call`) is wrapped in the resilience
  layer (:mod:`brisvox.providers.resilience`), with the leg's ``secondary``
  when it has one, each leg connecting with its own voice, model and language
  (:func:`brisvox.providers.resilience.leg_own`): a blip of a single provider is recovered for every agent
  (retries within the call's and the process's budget, mid-call recovery),
  and a leg with a secondary fails over to it; a process-wide breaker per
  provider leg. :func:`build` alone wraps only a leg with a secondary.
* HTTP adapters share one client per origin (:mod:`brisvox.providers.http`)
  whatever the call: building a provider per call costs no connection.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from brisvox.clock import CLOCK, Clock
from brisvox.providers.base import LlmProvider, ProviderError, SttProvider, TtsProvider
from brisvox.providers.s2s.base import S2sProvider
from brisvox.providers.worker_jobs import JobChannel

# provider -> (stage, default key variable or "" when no key is needed)
PROVIDERS: dict[str, tuple[str, str]] = {
    "local_whisper": ("stt", ""), "deepgram": ("stt", "DEEPGRAM_API_KEY"), "scripted_stt": ("stt", ""),
    "local_llm": ("llm", ""), "scripted": ("llm", ""), "openai": ("llm", "OPENAI_API_KEY"),
    "ollama": ("llm", ""), "vllm": ("llm", "VLLM_API_KEY"), "openrouter": ("llm", "OPENROUTER_API_KEY"),
    "groq": ("llm", "GROQ_API_KEY"), "openai_compatible": ("llm", "OPENAI_COMPATIBLE_API_KEY"),
    "anthropic": ("llm", "ANTHROPIC_API_KEY"), "gemini": ("llm", "GEMINI_API_KEY"),
    "local_piper": ("tts", ""), "espeak": ("tts", ""), "cartesia": ("tts", "CARTESIA_API_KEY"),
    "elevenlabs": ("tts", "ELEVENLABS_API_KEY"), "openai_tts": ("tts", "OPENAI_API_KEY"), "scripted_tts": ("tts", ""),
    "openai_realtime": ("s2s", "OPENAI_API_KEY"), "gemini_live": ("s2s", "GEMINI_API_KEY"),
}
KEY_OPTIONAL = {"vllm", "openai_compatible", "ollama"}  # servers that may run without a key
# LLM providers whose stream yields the answer as it is generated and stops the generation
# when it is closed early: the ones a speculative start may use (a discarded speculation
# closes its stream; a provider answering in one piece would gain nothing and bill it all).
# Every shipped LLM adapter streams; an adapter that cannot must not be listed here.
STREAMING_LLM = frozenset({"local_llm", "scripted", "openai", "ollama", "vllm", "openrouter", "groq",
                           "openai_compatible", "anthropic", "gemini"})
LOCAL = {"local_whisper", "local_llm", "local_piper"}  # run as jobs in an inference worker


@dataclass(frozen=True, slots=True)
class ProviderDef:
    """One provider leg of a stage: its own model, voice and language (as the agent file
    resolves them: ``voice``/``language`` of the primary fall back to the agent's, a
    secondary's ``voice`` and ``model`` to its provider's own defaults), its options."""

    provider: str
    model: str = ""
    voice: str = ""
    language: str = ""
    base_url: str = ""
    api_key_env: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    secondary: ProviderDef | None = None

    @property
    def key_env(self) -> str:
        return self.api_key_env or PROVIDERS.get(self.provider, ("", ""))[1]

    def legs(self) -> list[ProviderDef]:
        return [self] + ([self.secondary] if self.secondary else [])


def resolve_key(leg: ProviderDef, env: Mapping[str, str] | None = None) -> str | None:
    """The leg's key: its variable in ``env`` (default os.environ), else the credential of that name."""
    from brisvox.config.secrets import credential

    env = os.environ if env is None else env
    var = leg.key_env
    return (env.get(var) or credential(var, env)) if var else None


class CallLegs(Protocol):
    """The three provider legs of a call (an :class:`~brisvox.agent.definition.AgentDef`)."""

    @property
    def stt(self) -> ProviderDef | None: ...

    @property
    def llm(self) -> ProviderDef | None: ...

    @property
    def tts(self) -> ProviderDef: ...

    @property
    def s2s(self) -> ProviderDef | None: ...


@dataclass(frozen=True, slots=True)
class CallEnv:
    """What a call's providers may need besides their definition."""

    call_id: str
    channel: JobChannel | None = None
    clock: Clock = CLOCK
    env: Mapping[str, str] | None = None  # None: os.environ


COMMON_HTTP = {"connect_timeout", "read_timeout", "max_response_bytes", "max_event_bytes", "max_seconds", "headers"}
OPTIONS: dict[str, set[str]] = {
    "local_whisper": {"max_tokens", "preroll", "job_timeout", "queue_deadline", "max_span", "early"},
    "scripted_stt": {"timing_file", "final_ms", "interim_ms", "interim_delay_ms", "text", "interim_lag_words"},
    "deepgram": {"endpointing", "keepalive_interval", "smart_format", "punctuate", "diarize", "numerals",
                 "filler_words", "utterance_end_ms", "vad_events", "keyterm", "keywords"},
    "local_llm": {"max_tokens", "temperature", "repeat_penalty", "seed", "max_context_chars", "request_timeout"},
    "scripted": {"rules", "fallback", "first_token_ms", "token_ms", "timing_file"},
    "anthropic": COMMON_HTTP | {"max_tokens", "thinking", "top_p", "top_k", "metadata"},
    "gemini": COMMON_HTTP | {"thinking_budget", "generationConfig", "safetySettings"},
    "local_piper": {"job_timeout", "request_timeout"},
    "scripted_tts": {"timing_file", "first_audio_ms", "answer_ms", "chunk_ms", "lead_ms"},
    "espeak": {"wpm", "binary", "timeout"},
    "cartesia": {"version", "sample_rate", "speed", "emotion"},
    "elevenlabs": {"sample_rate", "inactivity_timeout", "voice_settings"},
    "openai_tts": {"instructions", "connect_timeout", "read_timeout"},
    # passed to the session as S2sConfig.extra: OpenAI's server VAD settings and transcription model,
    # Gemini setup fields merged into its setup message
    "openai_realtime": {"vad", "transcription_model"},
    "gemini_live": {"generationConfig", "realtimeInputConfig", "contextWindowCompression"},
}
for _p in ("openai", "ollama", "vllm", "openrouter", "groq", "openai_compatible"):
    OPTIONS[_p] = COMMON_HTTP | {"reasoning_effort", "max_tokens", "top_p", "seed", "parallel_tool_calls",
                                 "frequency_penalty", "presence_penalty", "preset", "user", "stop"}


# network providers: the shape of a voice id or model name each accepts (offline: no request)
_ID = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,199}$"
SHAPES: dict[tuple[str, str], tuple[str, str]] = {
    ("elevenlabs", "voice"): (r"^[A-Za-z0-9]{20}$", "an ElevenLabs voice id: 20 letters and digits"),
    ("elevenlabs", "model"): (r"^eleven_[a-z0-9_]{1,60}$", "an ElevenLabs model id such as eleven_flash_v2_5"),
    ("cartesia", "voice"): (r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
                            "a Cartesia voice id: a UUID"),
    ("cartesia", "model"): (r"^sonic[a-z0-9-]{0,60}$", "a Cartesia model such as sonic-2"),
    ("openai_tts", "voice"): (r"^[a-z]{2,20}$", "an OpenAI voice name such as alloy"),
    ("openai_tts", "model"): (r"^[a-z0-9.-]*tts[a-z0-9.-]*$", "an OpenAI speech model such as gpt-4o-mini-tts"),
    ("openai_realtime", "voice"): (r"^[a-z]{2,20}$", "an OpenAI voice name such as marin"),
    ("gemini_live", "voice"): (r"^[A-Z][a-z]{1,20}$", "a Gemini prebuilt voice name such as Puck"),
    ("deepgram", "model"): (r"^[a-z0-9][a-z0-9._-]{0,63}$", "a Deepgram model such as nova-3"),
    **{(p, "model"): (_ID, "a model name without spaces")
       for p in ("openai", "ollama", "vllm", "openrouter", "groq", "openai_compatible", "anthropic", "gemini",
                 "openai_realtime", "gemini_live")},
}
# providers that take no voice (an STT or LLM leg has no voice key at all) and no model
NO_VOICE = frozenset({"scripted_tts"})
NO_MODEL = frozenset({"scripted_tts", "scripted_stt", "scripted", "espeak", "local_piper"})
# LLM adapters that offer the model no tools (brisvox.providers.local_llm): after a failover to one,
# a request that offers tools is answered by the resilience layer (providers/resilience/llm.py)
TOOLLESS_LLM = frozenset({"local_llm"})


def leg_problems(stage: str, leg: ProviderDef) -> list[tuple[str, str, str]]:
    """What this leg's provider cannot use, offline: ``(severity, field, message)`` for its
    ``voice``, ``model`` and ``language``. espeak-ng's voices are the ones it lists, the local
    providers' the models the workers install; network providers are checked for shape."""
    import re

    out: list[tuple[str, str, str]] = []
    p = leg.provider
    if leg.voice and p in NO_VOICE:
        out.append(("error", "voice", f"{p} has no voices: remove voice"))
    if leg.model and p in NO_MODEL:
        out.append(("error", "model", f"{p} takes no model: remove model"))
    if p == "espeak":
        from brisvox.providers.espeak import DEFAULT_VOICE, usable_voice

        binary = str(leg.options.get("binary", "espeak-ng"))
        ok = usable_voice(leg.voice or DEFAULT_VOICE, binary)
        if ok is None:
            out.append(("warning", "voice", f"{binary} is not installed (Debian package espeak-ng): "
                        "this leg cannot speak and its voice cannot be checked"))
        elif not ok:
            out.append(("error", "voice", f"espeak-ng has no voice {leg.voice!r}: use one of `espeak-ng --voices` "
                        f"(a language code such as {DEFAULT_VOICE}), or remove voice for {DEFAULT_VOICE}"))
    elif p == "local_piper":
        from brisvox.providers.local_piper import VOICES

        if leg.voice and leg.voice not in VOICES:
            out.append(("error", "voice", f"local_piper has no voice {leg.voice!r} (it has: {', '.join(VOICES)}): "
                        "remove voice"))
    elif p == "local_whisper":
        from brisvox.providers.local_whisper import LANGUAGES
        from brisvox.providers.local_whisper import MODELS as WHISPER_MODELS

        if leg.model and leg.model not in WHISPER_MODELS:
            out.append(("error", "model", f"unknown local_whisper model {leg.model!r} "
                        f"(known: {', '.join(WHISPER_MODELS)}): remove model"))
        if leg.language and leg.language.split("-")[0] not in LANGUAGES:
            out.append(("error", "language", f"local_whisper ({', '.join(WHISPER_MODELS)}) transcribes "
                        f"{', '.join(LANGUAGES)} only, not {leg.language!r}: set language, or use another STT"))
    elif p == "local_llm":
        from brisvox.providers.local_llm import MODELS as LLM_MODELS

        if leg.model and leg.model not in LLM_MODELS:
            out.append(("error", "model", f"unknown local model {leg.model!r} (known: {', '.join(LLM_MODELS)})"))
    for what in ("voice", "model"):
        value = getattr(leg, what)
        shape = SHAPES.get((p, what))
        if value and shape is not None and not re.fullmatch(shape[0], value):
            out.append(("error", what, f"{value!r} is not {shape[1]} ({p} cannot use it)"))
    return out


def unknown_options(leg: ProviderDef) -> list[str]:
    allowed = OPTIONS.get(leg.provider, set())
    return sorted(k for k in leg.options if k not in allowed)


def _opts(leg: ProviderDef, *keys: str) -> dict[str, Any]:
    return {k: leg.options[k] for k in keys if k in leg.options}


def _key(leg: ProviderDef, env: CallEnv, required: bool = True) -> str | None:
    key = resolve_key(leg, env.env)
    if required and not key:
        raise ProviderError("auth", f"{leg.provider}: set {leg.key_env} in the environment "
                            "(or as a systemd credential)", retryable=False)
    return key


def _channel(leg: ProviderDef, env: CallEnv) -> JobChannel:
    if env.channel is None:
        raise ProviderError("connect", f"{leg.provider} runs in an inference worker: no worker client", retryable=False)
    return env.channel


def _check(leg: ProviderDef) -> None:
    bad = unknown_options(leg)
    if bad:
        raise ProviderError("bad_request", f"{leg.provider}: unknown option(s) {', '.join(bad)}", retryable=False)


# -- STT --------------------------------------------------------------------------------------------


def _stt(leg: ProviderDef, env: CallEnv) -> SttProvider:
    _check(leg)
    if leg.provider == "local_whisper":
        from brisvox.providers.local_whisper import LocalWhisperStt

        return LocalWhisperStt(_channel(leg, env), env.call_id,
                               **_opts(leg, "max_tokens", "preroll", "job_timeout", "queue_deadline", "max_span",
                                     "early"))
    if leg.provider == "scripted_stt":
        from brisvox.providers.scripted_speech import ScriptedStt, timing

        t = timing(leg.options)
        return ScriptedStt(final_ms=t.final_ms, clock=env.clock,
                           **_opts(leg, "interim_ms", "interim_delay_ms", "text", "interim_lag_words"))
    if leg.provider == "deepgram":
        from brisvox.providers.deepgram import DeepgramStt

        o = dict(leg.options)
        kw: dict[str, Any] = {}
        if "endpointing" in o:
            kw["endpointing_ms"] = int(o.pop("endpointing"))
        if "keepalive_interval" in o:
            kw["keepalive_interval"] = float(o.pop("keepalive_interval"))
        return DeepgramStt(_key(leg, env), model=leg.model or "nova-3",
                           base_url=leg.base_url or "wss://api.deepgram.com", options=o, **kw)
    raise ProviderError("bad_request", f"unknown STT provider {leg.provider!r}", retryable=False)


# -- LLM --------------------------------------------------------------------------------------------


def _llm(leg: ProviderDef, env: CallEnv) -> LlmProvider:
    _check(leg)
    p = leg.provider
    o = dict(leg.options)
    http = {k: o.pop(k) for k in list(o) if k in COMMON_HTTP}
    if p == "local_llm":
        from brisvox.providers.local_llm import LocalLlm

        return LocalLlm(_channel(leg, env), env.call_id, model=leg.model, **o)
    if p == "scripted":
        from brisvox.providers.scripted_llm import ScriptedLlm

        if "timing_file" in o:  # the workload's first token and answer (explicit options still win)
            from brisvox.providers.scripted_speech import timing

            t = timing({"timing_file": o.pop("timing_file")})
            o.setdefault("first_token_ms", t.first_token_ms)
            o.setdefault("fallback", t.answer_text)
        return ScriptedLlm(o.pop("rules", []), clock=env.clock, **o)
    if p in ("openai", "ollama", "vllm", "openrouter", "groq", "openai_compatible"):
        from brisvox.providers.openai_compat import PRESETS, OpenAiCompatLlm

        preset = str(o.pop("preset", p if p != "openai_compatible" else "vllm"))
        if p == "openai_compatible" and not leg.base_url:
            raise ProviderError("bad_request", "openai_compatible needs base_url", retryable=False)
        key = _key(leg, env, required=PRESETS[preset].key_required)
        effort = o.pop("reasoning_effort", None)
        return OpenAiCompatLlm(leg.model or "gpt-4.1-mini", preset=preset, base_url=leg.base_url or None,
                               api_key=key, reasoning_effort=effort, options=o, name=p, **http)
    if p == "anthropic":
        from brisvox.providers.anthropic import AnthropicLlm

        mt = int(o.pop("max_tokens", 1024))
        return AnthropicLlm(leg.model or "claude-3-5-haiku-latest", api_key=_key(leg, env),
                            base_url=leg.base_url or "https://api.anthropic.com", max_tokens=mt, options=o, **http)
    if p == "gemini":
        from brisvox.providers.gemini import GeminiLlm

        return GeminiLlm(leg.model or "gemini-2.5-flash", api_key=_key(leg, env),
                         base_url=leg.base_url or "https://generativelanguage.googleapis.com", options=o, **http)
    raise ProviderError("bad_request", f"unknown LLM provider {p!r}", retryable=False)


# -- TTS --------------------------------------------------------------------------------------------


def _tts(leg: ProviderDef, env: CallEnv) -> TtsProvider:
    _check(leg)
    p = leg.provider
    o = dict(leg.options)
    if p == "local_piper":
        from brisvox.providers.local_piper import LocalPiperTts

        return LocalPiperTts(_channel(leg, env), env.call_id, **o)
    if p == "scripted_tts":
        from brisvox.providers.scripted_speech import ScriptedTts, timing

        t = timing(o)
        return ScriptedTts(first_audio_ms=t.first_audio_ms, answer_ms=t.answer_ms, chunk_ms=t.chunk_ms,
                           lead_ms=t.lead_ms, clock=env.clock)
    if p == "espeak":
        from brisvox.providers.espeak import DEFAULT_VOICE, EspeakTts

        return EspeakTts(voice=leg.voice or DEFAULT_VOICE, **o)
    if p == "cartesia":
        from brisvox.providers.cartesia import CartesiaTts

        kw = {k: o.pop(k) for k in ("version", "sample_rate") if k in o}
        return CartesiaTts(_key(leg, env), model=leg.model or "sonic-2", voice=leg.voice,
                           base_url=leg.base_url or "wss://api.cartesia.ai", options=o, **kw)
    if p == "elevenlabs":
        from brisvox.providers.elevenlabs import ElevenLabsTts

        return ElevenLabsTts(_key(leg, env), voice=leg.voice or "21m00Tcm4TlvDq8ikWAM",
                             model=leg.model or "eleven_flash_v2_5",
                             base_url=leg.base_url or "wss://api.elevenlabs.io", **o)
    if p == "openai_tts":
        from brisvox.providers.openai_tts import OpenAiTts

        return OpenAiTts(_key(leg, env), model=leg.model or "gpt-4o-mini-tts", voice=leg.voice or "alloy",
                         base_url=leg.base_url or "https://api.openai.com/v1", **o)
    raise ProviderError("bad_request", f"unknown TTS provider {p!r}", retryable=False)


def _s2s(leg: ProviderDef, env: CallEnv) -> S2sProvider:
    _check(leg)
    if leg.provider == "openai_realtime":
        from brisvox.providers.s2s.openai_realtime import DEFAULT_MODEL, DEFAULT_URL, OpenAiRealtime

        return OpenAiRealtime(_key(leg, env), model=leg.model or DEFAULT_MODEL, base_url=leg.base_url or DEFAULT_URL,
                              voice=leg.voice)
    if leg.provider == "gemini_live":
        from brisvox.providers.s2s.gemini_live import DEFAULT_MODEL as GEMINI_LIVE_MODEL
        from brisvox.providers.s2s.gemini_live import GeminiLive

        return GeminiLive(_key(leg, env), model=leg.model or GEMINI_LIVE_MODEL,
                          base_url=leg.base_url or "wss://generativelanguage.googleapis.com", voice=leg.voice)
    raise ProviderError("bad_request", f"unknown speech-to-speech provider {leg.provider!r}", retryable=False)


FACTORIES: dict[str, Callable[[ProviderDef, CallEnv], Any]] = {"stt": _stt, "llm": _llm, "tts": _tts, "s2s": _s2s}


def build(stage: str, leg: ProviderDef, env: CallEnv, *, resilient: bool | None = None) -> Any:
    """The provider for ``stage``: behind the resilience layer when ``resilient`` (None:
    only when the leg has a ``secondary``, which it then fails over to)."""
    primary = FACTORIES[stage](leg, env)
    if resilient is None:
        resilient = leg.secondary is not None
    if not resilient:
        return primary
    from brisvox.providers import resilience

    secondary = FACTORIES[stage](leg.secondary, env) if leg.secondary is not None else None
    skey = resilience.leg_key(leg.secondary) if leg.secondary is not None else ""
    own = (resilience.leg_own(stage, leg),
           resilience.leg_own(stage, leg.secondary) if leg.secondary is not None else {})
    return resilience.wrap(stage, primary, secondary, resilience.leg_key(leg), skey, own=own)


@dataclass
class CallProviders:
    stt: SttProvider | None
    llm: LlmProvider | None
    tts: TtsProvider
    notes: list[str] = field(default_factory=list)
    s2s: S2sProvider | None = None


def build_call(agent: CallLegs, env: CallEnv) -> CallProviders:
    """All providers of a call, STT, LLM and TTS each behind the resilience layer (raises
    ProviderError naming the failing leg). A speech-to-speech agent has an S2S provider
    instead of STT and LLM (its session has its own reconnect policy, docs/S2S.md) and the
    TTS as its fallback voice."""
    tts = build("tts", agent.tts, env, resilient=True)
    if agent.s2s is not None:
        return CallProviders(None, None, tts, s2s=build("s2s", agent.s2s, env, resilient=False))
    if agent.stt is None or agent.llm is None:
        raise ProviderError("bad_request", "an agent needs [stt] and [llm], or [s2s]", retryable=False)
    return CallProviders(build("stt", agent.stt, env, resilient=True), build("llm", agent.llm, env, resilient=True),
                         tts)
