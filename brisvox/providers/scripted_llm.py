"""ScriptedLlm: a DETERMINISTIC, rule-based stand-in for a language model (tests and demos).

This is not a model. It maps the caller's last utterance to a scripted
answer so the whole pipeline (tools included) can be demonstrated and tested
with no key and no model. Each :class:`ScriptRule` has a case-insensitive
regular expression searched in the last user message, and ``steps``: step
*k* is used when *k* tool rounds of this turn already came back. A step
speaks ``reply`` and/or issues ``tools`` (parallel calls of one response).
Texts and string arguments are ``str.format`` templates with the match's
named groups, ``{text}`` (the utterance) and ``r`` (the parsed results of
the previous round: ``{r[0][temp]}``). The first matching rule wins; a turn
with no matching rule gets ``fallback``.

Streaming: the reply is sent word by word as TextDeltas (after
``first_token_ms``, then ``token_ms`` per word, on the injected clock), tool
arguments in two fragments (so assembly is exercised), then Usage and Done.

Agent file form (``[llm] provider = "scripted"``)::

    [[llm.options.rules]]
    match = "weather in (?P<city>[a-z]+)"
    steps = [{ tools = [{ name = "get_weather", arguments = { city = "{city}" } }] },
             { reply = "It is {r[0][temp]} degrees in {city}." }]
"""

from __future__ import annotations

import re
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from brisvox.clock import CLOCK, Clock
from brisvox.providers.base import (
    Done,
    LlmEvent,
    LlmMessage,
    LlmRequest,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from brisvox.providers.llm_stream import GeneratedStream


@dataclass(frozen=True, slots=True)
class ScriptCall:
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ScriptStep:
    reply: str = ""
    tools: tuple[ScriptCall, ...] = ()


@dataclass(frozen=True, slots=True)
class ScriptRule:
    match: str
    steps: tuple[ScriptStep, ...]

    @staticmethod
    def parse(d: Mapping[str, Any]) -> ScriptRule:
        steps_raw = d.get("steps")
        if steps_raw is None:
            steps_raw = [{"reply": d.get("reply", ""), "tools": d.get("tools", [])}]
            if d.get("then"):
                steps_raw.append({"reply": d["then"]})
        steps = tuple(
            ScriptStep(str(s.get("reply", "")),
                       tuple(ScriptCall(str(c["name"]), dict(c.get("arguments", {}))) for c in s.get("tools", [])))
            for s in steps_raw
        )
        re.compile(str(d["match"]))
        return ScriptRule(str(d["match"]), steps)


class _Fmt(dict[str, Any]):
    def __missing__(self, key: str) -> str:
        return "{" + key + "}"


def _fill(template: str, values: Mapping[str, Any]) -> str:
    try:
        return template.format_map(_Fmt(values))
    except (KeyError, IndexError, ValueError, AttributeError, TypeError):
        return template


def _fill_args(v: Any, values: Mapping[str, Any]) -> Any:
    if isinstance(v, str):
        return _fill(v, values)
    if isinstance(v, dict):
        return {k: _fill_args(x, values) for k, x in v.items()}
    if isinstance(v, list):
        return [_fill_args(x, values) for x in v]
    return v


def _result(text: str) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


class ScriptedLlm:
    """The scripted stand-in; ``requests`` records every request it was sent (tests)."""

    def __init__(self, rules: Sequence[ScriptRule | Mapping[str, Any]] = (), *, fallback: str = "Sorry, I can only follow my script.",
                 first_token_ms: float = 0.0, token_ms: float = 0.0, clock: Clock = CLOCK,
                 name: str = "scripted") -> None:
        self.name = name
        self.rules = [r if isinstance(r, ScriptRule) else ScriptRule.parse(r) for r in rules]
        self._compiled = [re.compile(r.match, re.IGNORECASE) for r in self.rules]
        self.fallback = fallback
        self.first_token = first_token_ms / 1000.0
        self.per_token = token_ms / 1000.0
        self.clock = clock
        self.requests: list[LlmRequest] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    def stream(self, request: LlmRequest) -> GeneratedStream:
        self.requests.append(request)
        return GeneratedStream(self.name, self._events(request))

    def plan(self, messages: Sequence[LlmMessage]) -> ScriptStep:
        """The step this request answers with (pure)."""
        u = max((i for i, m in enumerate(messages) if m.role == "user"), default=-1)
        text = messages[u].text if u >= 0 else ""
        after = messages[u + 1:] if u >= 0 else []
        rounds = sum(1 for m in after if m.role == "assistant" and m.tool_calls)
        last: list[Any] = []
        if after and after[-1].role == "tool":
            j = len(after) - 1
            while j >= 0 and after[j].role == "tool":
                j -= 1
            last = [_result(m.text) for m in after[j + 1:]]
        for rule, rx in zip(self.rules, self._compiled, strict=True):
            m = rx.search(text)
            if m is None:
                continue
            values: dict[str, Any] = {k: v or "" for k, v in m.groupdict().items()}
            values["text"] = text
            values["r"] = last
            step = rule.steps[min(rounds, len(rule.steps) - 1)] if rounds < len(rule.steps) else ScriptStep()
            return ScriptStep(_fill(step.reply, values),
                              tuple(ScriptCall(c.name, _fill_args(dict(c.arguments), values)) for c in step.tools))
        return ScriptStep(self.fallback if rounds == 0 else "")

    async def _events(self, request: LlmRequest) -> AsyncGenerator[LlmEvent, None]:
        step = self.plan(request.messages)
        if self.first_token:
            await self.clock.sleep(self.first_token)
        words = step.reply.split(" ") if step.reply else []
        for i, w in enumerate(words):
            if i and self.per_token:
                await self.clock.sleep(self.per_token)
            yield TextDelta(w if i == len(words) - 1 else w + " ")
        for i, c in enumerate(step.tools):
            raw = orjson.dumps(dict(c.arguments)).decode()
            half = len(raw) // 2
            yield ToolCallDelta(i, id=f"scripted_{i}", name=c.name, arguments=raw[:half])
            yield ToolCallDelta(i, arguments=raw[half:])
        yield Usage(sum(len(m.text) for m in request.messages) // 4, len(words))
        yield Done("tool_calls" if step.tools else "stop")
