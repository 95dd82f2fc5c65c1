"""OpenTelemetry traces of the calls: a span per call, turn, STT/LLM/TTS request and tool call.

Owns ``[tracing]`` in ``brisvoxd.toml`` (:class:`TracingConfig`), the agent
process's tracer (:func:`configure`, :func:`use_provider` for tests) and
:func:`emit_call`, which the actor calls once at hang-up.

The spans are built at hang-up from what the call already measured: the
timeline's marks (``brisvox/agent/conversation/timeline.py``) and the tool
records, on the call clock, turned into wall-clock nanoseconds with the
hang-up's (wall, call clock) pair, so a simulated call on virtual time gets a
consistent trace too. The tree:

* ``call`` (root): ``brisvox.call_id``, ``brisvox.agent``, ``brisvox.transport``,
  ``brisvox.end_reason``, ``brisvox.turns``; from the call's start to its hang-up;
* ``turn`` (child of ``call``), one per epoch with marks: ``brisvox.epoch``,
  ``brisvox.interrupted``, the turn's latencies in ms; from its first mark
  (the caller's speech start, or the greeting's first token) to its last;
* ``stt`` (child of its turn): the caller's speech start -> the turn's STT final;
* ``llm`` (child of its turn), one per round: the request -> its first token
  (``brisvox.llm.round``);
* ``tts``: the turn's first token -> its first audio out;
* ``tool`` (child of its turn, else of the call): ``brisvox.tool.name``,
  ``brisvox.tool.call_id``, ``brisvox.tool.outcome``: its run.

Every span carries ``brisvox.call_id``. Invariants: NO span attribute holds a
transcript, a prompt, a tool's arguments or results, or a caller's number
(only ids, names, counts, outcomes and durations); with ``exporter = "none"``
(the default) there is no tracer and :func:`emit_call` returns at once (the
SDK is not even imported); an exporter that fails never reaches the call
(the SDK's batch processor exports on its own thread and drops on overflow).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from brisvox.config.errors import ConfigError
from brisvox.config.schema import from_table, section

if TYPE_CHECKING:
    from brisvox.agent.host.actor import CallActor

_TRACER: Any = None  # None: tracing off (the default)
_OWN: Any = None  # the TracerProvider configure() made (shut down when replaced)


@section
class TracingConfig:
    """``[tracing]``: where the agent processes send their call traces."""

    exporter: Literal["none", "otlp", "console"] = "none"
    # OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces; "" = the SDK's default
    # (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318)
    endpoint: str = ""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)  # of the calls (a call's spans go together)
    service_name: str = "brisvox"

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> TracingConfig:
        cfg = from_table(cls, table, where)
        if cfg.exporter == "otlp" and importlib.util.find_spec("opentelemetry.exporter.otlp") is None:
            raise ConfigError(f"{where}.exporter", "\"otlp\" needs the OTLP exporter: pip install 'brisvox[otlp]' "
                              "(opentelemetry-exporter-otlp-proto-http)")
        return cfg


def configure(cfg: TracingConfig, index: int = 0) -> None:
    """Set the process's tracer from ``[tracing]`` (nothing at all for ``"none"``)."""
    global _TRACER, _OWN
    if _OWN is not None:
        _OWN.shutdown()  # flushes what it holds
        _OWN = None
    if cfg.exporter == "none":
        _TRACER = None
        return
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

    exporter: SpanExporter
    if cfg.exporter == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=cfg.endpoint) if cfg.endpoint else OTLPSpanExporter()
    else:
        exporter = ConsoleSpanExporter()
    res = Resource.create({"service.name": cfg.service_name, "service.instance.id": f"agent-{index}"})
    provider = TracerProvider(resource=res, sampler=TraceIdRatioBased(cfg.sample_ratio))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    use_provider(provider)
    _OWN = provider


def use_provider(provider: Any) -> None:
    """Trace through ``provider`` (a TracerProvider; None turns tracing off)."""
    global _TRACER
    _TRACER = None if provider is None else provider.get_tracer("brisvox.agent")


def enabled() -> bool:
    return _TRACER is not None


def emit_call(actor: CallActor) -> None:
    """The spans of one ended call (no-op while tracing is off)."""
    tracer = _TRACER
    if tracer is None or actor.ended_at is None or actor.ended_wall is None:
        return
    from opentelemetry import trace

    off = actor.ended_wall - actor.ended_at  # wall = call clock + off

    def ns(t: float) -> int:
        return int((t + off) * 1e9)

    cid = actor.call_id
    begin = min(actor.started_at, actor.ended_at)
    root = tracer.start_span("call", start_time=ns(begin), attributes={
        "brisvox.call_id": cid, "brisvox.agent": actor.agent, "brisvox.transport": actor.transport,
        "brisvox.end_reason": actor.end_reason, "brisvox.turns": len(actor.timeline.turns)})
    root_ctx = trace.set_span_in_context(root)
    turn_ctx: dict[int, Any] = {}

    def child(name: str, parent: Any, a: float, b: float, attrs: dict[str, Any]) -> None:
        s = tracer.start_span(name, context=parent, start_time=ns(a), attributes={"brisvox.call_id": cid, **attrs})
        s.end(end_time=ns(max(a, b)))

    for t in actor.timeline.turns.values():
        marks = [m for m in (t.speech_start, t.speech_end, t.vad_stop, t.stt_final, t.turn_end,
                             *t.llm_requests, *t.llm_first_tokens, t.first_audio_out, t.interrupted_at)
                 if m is not None]
        if not marks:
            continue
        attrs: dict[str, Any] = {"brisvox.epoch": t.epoch, "brisvox.interrupted": t.interrupted_at is not None,
                                 "brisvox.llm.rounds": len(t.llm_requests)}
        if t.speech_end is not None and t.first_audio_out is not None:
            attrs["brisvox.voice_to_voice_ms"] = round((t.first_audio_out - t.speech_end) * 1000, 1)
        span = tracer.start_span("turn", context=root_ctx, start_time=ns(min(marks)),
                                 attributes={"brisvox.call_id": cid, **attrs})
        ctx = trace.set_span_in_context(span)
        turn_ctx[t.epoch] = ctx
        heard = t.speech_start if t.speech_start is not None else t.speech_end
        if heard is not None and t.stt_final is not None:
            child("stt", ctx, heard, t.stt_final, {"brisvox.epoch": t.epoch})
        for i, (req, tok) in enumerate((r.request, r.first_token) for r in t.ordered() if r.request is not None):
            child("llm", ctx, req, tok if tok is not None else req,
                  {"brisvox.epoch": t.epoch, "brisvox.llm.round": i, "brisvox.llm.first_token": tok is not None})
        tok = t.first_token()
        if tok is not None and t.first_audio_out is not None:
            child("tts", ctx, tok, t.first_audio_out, {"brisvox.epoch": t.epoch})
        span.end(end_time=ns(max(marks)))
    for r in actor.tool_records():
        at = getattr(r, "at", None)
        if at is None:
            continue
        child("tool", turn_ctx.get(r.epoch, root_ctx), at - r.duration_ms / 1000.0, at, {
            "brisvox.epoch": r.epoch, "brisvox.tool.name": r.name, "brisvox.tool.call_id": r.call_id,
            "brisvox.tool.outcome": r.outcome})
    root.end(end_time=ns(actor.ended_at))
