"""The tool scenarios S1-S4 through the S2S stage over BOTH real adapters and their loopback vendors.

(The same scenarios ``tests/system/test_providers_tool_scenarios.py`` runs on the LLM adapters.)

The production :class:`S2sStage` with its ToolEngine drives :class:`OpenAiRealtime` against
``FakeRealtime`` and :class:`GeminiLive` against ``FakeGeminiLive`` over real sockets, with
brisvox's turn detection (a VAD start, half a second of speech, a VAD stop: the stage commits
and the vendor answers from its script). Asserted on the vendor's own log: what the model was
answered, in which order and shape, and how many responses were asked for.

* S1: three calls of one response run together; three results in call order, one response asked.
* S2: a three-round chain: one result and one continuation per round.
* S3: a repeated booking in a later round of the turn is answered ``already_done``; one booking.
* S4: an invalid argument gets a structured error; the corrected call runs once.

(S5, the filler, does not apply: an S2S model speaks its own "one moment"; S6, a barge-in during
a booking, is ``tests/sim/test_s2s_stage.py``'s, where the caller's audio and the playout exist.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson
import pytest

from bench.harness import s2s_gemini as G
from bench.harness import s2s_openai as O
from brisvox.agent.pipeline.s2s.machine import S2sTurnConfig
from brisvox.agent.pipeline.s2s.stage import S2sStage, S2sStageConfig
from brisvox.agent.pipeline.stage.base import Inbox
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioFrame,
    Start,
    Stop,
    UserStartedSpeaking,
    UserStoppedSpeaking,
)
from brisvox.agent.tool_engine.engine import ToolEngine
from brisvox.providers.s2s.gemini_live import GeminiLive
from brisvox.providers.s2s.openai_realtime import OpenAiRealtime
from brisvox.sim.sim_tools import SimTools

pytestmark = pytest.mark.system

WEATHER = [("get_weather", {"city": c}) for c in ("Paris", "Rome", "Oslo")]
BOOK = ("book_table", {"name": "Ada", "people": 2})


def openai_fake(rounds: list[list[tuple[str, dict[str, Any]]]], final: str) -> O.FakeRealtime:
    script = tuple(O.Scripted(audio_ms=0, calls=tuple(O.ScriptedCall(n, orjson.dumps(a).decode()) for n, a in r))
                   for r in rounds) + (O.Scripted(audio_ms=200, transcript=final),)
    return O.FakeRealtime(script=script)


def gemini_fake(rounds: list[list[tuple[str, dict[str, Any]]]], final: str) -> G.FakeGeminiLive:
    parts = tuple(G.Say(calls=tuple((f"c{i}.{j}", n, a) for j, (n, a) in enumerate(r))) for i, r in enumerate(rounds))
    return G.FakeGeminiLive(script=(parts + (G.Say(audio_ms=200, text=final),),))


def results(kind: str, fake: Any) -> list[list[dict[str, Any]]]:
    """The tool outputs the vendor got, one list per delivery, each output as JSON."""
    if kind == "openai":
        items = [e["item"] for e in fake.log.of("conversation.item.create")
                 if e.get("item", {}).get("type") == "function_call_output"]
        return [[orjson.loads(i["output"])] for i in items]  # one item per result (the protocol's shape)
    return [[r["response"] for r in tr["functionResponses"]] for tr in fake.log.tool_responses]


async def scenario(kind: str, rounds: list[list[tuple[str, dict[str, Any]]]], final: str,
                   check: Callable[[Any, S2sStage], bool]) -> tuple[Any, S2sStage, SimTools]:
    tools = SimTools(book_seconds=0.1)
    fake = openai_fake(rounds, final) if kind == "openai" else gemini_fake(rounds, final)
    async with fake:
        provider = (OpenAiRealtime("k", base_url=f"{fake.url}/v1/realtime") if kind == "openai"
                    else GeminiLive("k", base_url=fake.url))
        call = CallContext.detached(call_rate=8000, tts_rate=24000)
        engine = ToolEngine(tools.registry(), "scenario", call.clock)
        cfg = S2sStageConfig(turn=S2sTurnConfig(turn_detection="brisvox", smart_turn=False, silence=0.1))
        stage = S2sStage(call, cfg, Inbox("s2s", 64, lossy=True), provider=provider, engine=engine)
        stage.start()
        stage.inbox.put_nowait(Start())
        await until(lambda: stage.session is not None, "the session")
        loop = asyncio.get_running_loop()
        stage.inbox.put_nowait(UserStartedSpeaking(loop.time(), 0))
        loud = np.full(320, 3000, dtype=np.int16)
        for i in range(25):  # half a second of speech, 20 ms frames
            stage.inbox.put_nowait(AudioFrame(i * 320, loud, False))
            await asyncio.sleep(0.02)
        stage.inbox.put_nowait(UserStoppedSpeaking(loop.time(), 25 * 320))
        await until(lambda: check(fake, stage), "the scenario's end")
        stage.inbox.put_nowait(Stop())
        assert stage.task is not None
        await asyncio.wait_for(stage.task, 3)
        await call.tasks.close()
        await engine.aclose(1.0)
    return fake, stage, tools


async def until(cond: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():  # noqa: ASYNC110 - polling the state under test is the point
            await asyncio.sleep(0.01)


def final_heard(stage: S2sStage, text: str) -> bool:
    return any(getattr(m, "text", "") == text for m in stage.ctx)


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_s1_three_calls_run_together_results_in_call_order_one_response(kind: str) -> None:
    fake, stage, tools = run(scenario(kind, [WEATHER], "all sunny", lambda f, s: final_heard(s, "all sunny")))
    got = results(kind, fake)
    cities = [r["city"] for batch in got for r in batch]
    assert cities == ["Paris", "Rome", "Oslo"] and tools.bodies["get_weather"] == 3
    if kind == "gemini":
        assert len(fake.log.tool_responses) == 1  # one toolResponse with the three, in call order
    else:
        assert len(fake.log.of("response.create")) == 2  # the turn's, then ONE after the three results
    assert stage.tools.stats()["tool_phases"] == 1


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_s2_a_three_round_chain_one_result_and_one_continuation_per_round(kind: str) -> None:
    rounds = [[("get_weather", {"city": c})] for c in ("A", "B", "C")]
    fake, stage, tools = run(scenario(kind, rounds, "done planning", lambda f, s: final_heard(s, "done planning")))
    assert [[r["city"] for r in b] for b in results(kind, fake)] == [["A"], ["B"], ["C"]]
    if kind == "openai":
        assert len(fake.log.of("response.create")) == 4
    assert stage.tools.stats()["tool_phases"] == 3 and stage.machine.epoch == 1  # one turn: one epoch


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_s3_a_repeated_booking_is_answered_already_done(kind: str) -> None:
    fake, stage, tools = run(scenario(kind, [[BOOK], [BOOK]], "booked", lambda f, s: final_heard(s, "booked")))
    first, second = (b[0] for b in results(kind, fake))
    assert first["ref"] == "BK-1001" and second["error"] == "already_done"
    assert tools.bodies["book_table"] == 1


@pytest.mark.parametrize("kind", ["openai", "gemini"])
def test_s4_an_invalid_argument_is_answered_and_the_corrected_call_runs_once(kind: str) -> None:
    bad = ("book_table", {"people": 2})
    fake, stage, tools = run(scenario(kind, [[bad], [BOOK]], "booked", lambda f, s: final_heard(s, "booked")))
    first, second = (b[0] for b in results(kind, fake))
    assert first["error"] == "invalid_arguments" and second["ref"] == "BK-1001"
    assert tools.bodies["book_table"] == 1
    assert stage.ctx.is_valid()
