"""Bad provider input through the LLM runner: a counted error and the documented fallback, never a hang.

The runner (``brisvox/agent/pipeline/llm/runner.py``) makes one request per round and never
retries a failure (the resilience layer does, and it is not used here; only a request with no
event within the first-token timeout is re-issued once by the round), keeps the partial text of a
failed response in the context, invents no speech, and ends the turn (LlmResponseEnded; a
turn with no speech sends BotEnded "silent" upstream). Over the OpenAI-compatible adapter
against the loopback fake:

* garbage: ``protocol``; one request, one counted error, the turn ends silent;
* an oversized response after some text: ``oversized``, the partial text stays in
  the context;
* a never-ending stream (keep-alive comments after some text): the runner's
  idle timeout ends it; a silent server: the first-token timeout (counted), the request
  re-issued once, the second timeout ends the turn;
* a stream cut mid-way: ``closed``, the partial text kept.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from bench.harness.http_server import FakeHttpServer, Reply
from bench.harness.llm_wire import Resp, ScriptedVendor, reply_for
from brisvox.agent.conversation.context import AssistantMessage
from brisvox.agent.pipeline.stage.pipeline_frames import BotEnded
from brisvox.providers.base import ProviderTimeouts
from brisvox.providers.http import close_all
from brisvox.providers.llm_stream import STATS
from brisvox.providers.openai_compat import OpenAiCompatLlm
from tests.providers_fakes.runner_rig import Rig, ToolLog, scenario_registry

pytestmark = pytest.mark.timeout(60)
FAST = ProviderTimeouts(llm_first_token=0.6, llm_idle=0.6)


def run(reply: Any) -> tuple[Rig, ScriptedVendor, str, float]:
    sv = ScriptedVendor("openai", lambda i, b: reply)

    async def main() -> tuple[Rig, str, float]:
        async with FakeHttpServer(sv) as srv:
            p = OpenAiCompatLlm("m", preset="vllm", base_url=srv.url + "/v1")
            async with Rig(p, scenario_registry(ToolLog()), timeouts=FAST) as rig:
                t0 = asyncio.get_running_loop().time()
                spoken = await rig.turn(1, "hello", timeout=10)
                took = asyncio.get_running_loop().time() - t0
            await close_all()
        return rig, spoken, took

    rig, spoken, took = asyncio.run(main())
    return rig, sv, spoken, took


def silent_turn(rig: Rig) -> bool:
    up = []
    while True:
        f = rig.upstream._pop()
        if f is None:
            break
        up.append(f)
    return BotEnded(1, "silent") in up


def partial(rig: Rig) -> list[str]:
    return [m.text for m in rig.snapshot if isinstance(m, AssistantMessage)]


def test_garbage() -> None:
    before = STATS["error.protocol"]
    rig, sv, spoken, _ = run(Reply(200, [b"data: {{{{ garbage\n\n"]))
    # a stream the adapter cannot parse is a protocol error: the runner does not retry (nothing)
    assert len(sv.bodies) == 1 and rig.runner.st.errors == 1
    assert spoken == "" and silent_turn(rig)
    assert STATS["error.protocol"] == before + 1


def test_oversized_after_text() -> None:
    big = reply_for("openai", Resp(text=["Hello there. "] + ["x" * 1000] * 3000)).chunks
    rig, sv, spoken, _ = run(Reply(200, big))
    assert len(sv.bodies) == 1 and rig.runner.st.errors == 1
    assert spoken.startswith("Hello there.")
    assert partial(rig) and partial(rig)[0].startswith("Hello there.")


@pytest.mark.serial_light  # the idle timeout within 5 s
def test_never_ending_stream_hits_the_idle_timeout() -> None:
    head = reply_for("openai", Resp(text=["Still thinking"])).chunks[:1]
    rig, sv, spoken, took = run(Reply(200, head, forever=b": ping\n\n", forever_every=0.05))
    assert rig.runner.st.idle_timeouts == 1 and rig.runner.st.errors == 1
    assert spoken == "Still thinking" and partial(rig) == ["Still thinking"]
    assert took < 5.0


@pytest.mark.serial_light  # two first-token timeouts within 4 s
def test_silent_server_hits_the_first_token_timeout() -> None:
    r = reply_for("openai", Resp(text=["late"]))
    r.first_byte_delay = 5.0
    rig, sv, spoken, took = run(r)
    # re-issued once (the round's one retry of a silent request), then the turn ends
    assert rig.runner.st.first_token_timeouts == 2 and rig.runner.st.first_token_retries == 1
    assert len(sv.bodies) == 2
    assert spoken == "" and silent_turn(rig) and took < 4.0


def test_cut_mid_stream_keeps_the_partial_text() -> None:
    r = reply_for("openai", Resp(text=["One, ", "two, ", "three."]))
    r.cut_after = 2
    rig, sv, spoken, _ = run(r)
    assert spoken == "One, two, " and rig.runner.st.errors == 1 and len(sv.bodies) == 1
    assert partial(rig) == ["One, two, "]
