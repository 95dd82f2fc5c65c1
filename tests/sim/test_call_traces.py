"""A simulated call's OpenTelemetry trace (the SDK's in-memory exporter): the call span, its
turns parented to it, STT / LLM / TTS / tool spans under the turns, the call id on every span,
and neither a transcript nor a tool argument in any attribute; the same hang-up feeds the
process's latency histograms (``call_metrics.METRICS``)."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from brisvox.agent.host import tracing
from brisvox.agent.host.call_metrics import METRICS
from brisvox.agent.tool_engine.registry import ToolContext, ToolKind, ToolRegistry, ToolSpec
from brisvox.config.daemon import parse_config
from brisvox.config.errors import ConfigError
from brisvox.providers.seeded_fakes import Call, LlmScript, Say
from brisvox.sim.harness import SimCall, simulate
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

SECRET_ARG = "xyzzy-4111-1111"
SAID = "book me a table for two"
REPLY = "Your table is booked for eight."


def registry() -> ToolRegistry:
    async def book(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
        return {"ok": True, "ref": "R-77"}

    r = ToolRegistry()
    r.register(ToolSpec("book", "Book a table.", {"type": "object"}, ToolKind.SIDE_EFFECT), book)
    return r


@pytest.fixture
def spans():
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    tracing.use_provider(provider)
    try:
        yield exp
    finally:
        tracing.use_provider(None)


def test_a_call_makes_one_trace_of_call_turn_and_request_spans(spans):
    before = METRICS.snapshot()
    res = run_virtual(lambda: simulate(SimCall(
        steps=[Utter(SAID, at=0.5)],
        llm=[LlmScript((Call("book", {"card": SECRET_ARG}),)), LlmScript((Say(REPLY),))],
        registry=lambda: registry())))
    cid = res.actor.call_id
    after = METRICS.snapshot()  # the hang-up fed the process's histograms too
    for name in ("turn_latency", "llm_first_token", "tts_first_audio"):
        assert after["hist"][name]["count"] > before["hist"][name]["count"], name
    reason = res.record["end_reason"]
    assert after["end_reasons"][reason] == before["end_reasons"].get(reason, 0) + 1
    got = spans.get_finished_spans()
    by_name: dict[str, list[Any]] = {}
    for s in got:
        by_name.setdefault(s.name, []).append(s)
    assert set(by_name) >= {"call", "turn", "stt", "llm", "tts", "tool"}, sorted(by_name)
    (call,) = by_name["call"]
    assert call.parent is None
    assert call.attributes["brisvox.end_reason"] == res.record["end_reason"]
    trace_id = call.context.trace_id
    assert all(s.context.trace_id == trace_id for s in got)  # one trace per call
    assert all(s.attributes["brisvox.call_id"] == cid for s in got)
    turn_ids = set()
    for t in by_name["turn"]:
        assert t.parent.span_id == call.context.span_id
        assert call.start_time <= t.start_time <= t.end_time <= call.end_time
        turn_ids.add(t.context.span_id)
    for name in ("stt", "llm", "tts", "tool"):
        for s in by_name[name]:
            assert s.parent.span_id in turn_ids, name
            assert s.start_time <= s.end_time
    assert len(by_name["llm"]) >= 2  # the tool round and the answer's round
    (tool,) = by_name["tool"]
    assert tool.attributes["brisvox.tool.name"] == "book"
    assert tool.attributes["brisvox.tool.outcome"] == "ok"
    # no transcript, reply, tool argument or tool result in any attribute
    for s in got:
        for k, v in s.attributes.items():
            text = str(v)
            for secret in (SECRET_ARG, SAID, REPLY, "R-77", "table"):
                assert secret not in text, (s.name, k, v)


def test_tracing_off_makes_no_spans(spans):
    tracing.use_provider(None)
    run_virtual(lambda: simulate(SimCall(steps=[Utter("hello", at=0.5)], llm=[LlmScript((Say("Hi."),))])))
    assert spans.get_finished_spans() == ()
    assert not tracing.enabled()


def test_the_tracing_section_is_validated_and_defaults_to_none():
    cfg = parse_config({}).section("tracing")
    assert (cfg.exporter, cfg.sample_ratio) == ("none", 1.0)
    got = parse_config({"tracing": {"exporter": "otlp", "endpoint": "http://127.0.0.1:4318/v1/traces",
                                    "sample_ratio": 0.25}}).section("tracing")
    assert (got.exporter, got.sample_ratio) == ("otlp", 0.25)
    for bad in ({"exporter": "jaeger"}, {"sample_ratio": 2.0}, {"endpont": "x"}):
        with pytest.raises(ConfigError):
            parse_config({"tracing": bad})
    tracing.configure(got)  # the OTLP exporter builds (nothing is sent until a span ends)
    assert tracing.enabled()
    tracing.configure(cfg)
    assert not tracing.enabled()
