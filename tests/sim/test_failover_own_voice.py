"""A failover speaks with the secondary's own voice and model, on virtual time.

The agent file is parsed and checked (:func:`brisvox.agent.definition.load_agent`), the
call's config comes from it (:func:`~brisvox.agent.definition.actor_config`: the session
configs carry the primary's voice, model and language) and every stage is built by the
registry (:func:`brisvox.providers.registry.build`, the resilience layer with both legs).
Each leg is the real adapter the registry makes for it (its own defaults), standing over a
sim fake: at every connect it records what that adapter would use, ``config.X or
adapter.X`` (the rule every adapter follows), and the fake speaks or transcribes. Turn 1 is
served by the primary; during turn 2 the primary dies mid-call and stays down:

* TTS: ElevenLabs (voice ``21m00Tcm4TlvDq8ikWAM``) fails over to espeak-ng with no voice of
  its own in the file: the re-spoken answer is heard (its words on the wire, its text sent
  to the secondary's fake) and espeak-ng connected with its own default voice ``en-us``,
  a voice it has, not the ElevenLabs id (which makes espeak-ng exit 1 without a sound).
* STT: Deepgram ``nova-2-phonecall`` in ``en-US`` fails over to a Deepgram leg with its own
  ``model`` and ``language``: the secondary transcribes the caller's words with them.
* LLM: a request failed by the primary before content is answered by the secondary, with
  its own model (an LLM request carries no model: the adapter's).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from brisvox.agent.definition import actor_config, load_agent
from brisvox.providers import registry
from brisvox.providers import resilience as layer_pkg
from brisvox.providers.base import LlmError, ProviderError, SttConfig, Transcript
from brisvox.providers.resilience import Resilience
from brisvox.providers.seeded_fakes import FakeTts, LlmScript, Say
from brisvox.sim import harness
from brisvox.sim.fakes import FakeStt
from brisvox.sim.harness import SimCall, default_actor_config
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter
from tests.sim.failover_kit import conversation, layered

ANSWER1, ANSWER2 = "It is noon right now.", "You are very welcome."
ENV = {"DEEPGRAM_API_KEY": "k", "OPENAI_API_KEY": "k", "ELEVENLABS_API_KEY": "k", "ANTHROPIC_API_KEY": "k"}

AGENT = """
name = "own_voice"
system_prompt = "You are brief."
language = "en"

[stt]
provider = "deepgram"
model = "nova-2-phonecall"
[stt.secondary]
provider = "deepgram"
base_url = "wss://eu.api.deepgram.com"

[llm]
provider = "openai"
model = "gpt-4.1-mini"
[llm.secondary]
provider = "anthropic"

[tts]
provider = "elevenlabs"
model = "eleven_flash_v2_5"
voice = "21m00Tcm4TlvDq8ikWAM"
[tts.secondary]
provider = "espeak"
"""


class Recorded:
    """One leg: the registry's real adapter for it (``real``, never contacted) over a sim
    fake. ``used``: what the adapter would use at each connect (``config.X or real.X``)."""

    def __init__(self, real: Any, fake: Any) -> None:
        self.real, self.fake = real, fake
        self.name = real.name
        self.down = False
        self.kill_at_text: int | None = None  # TTS: die at the first text of this utterance (1-based)
        self.kill_after_interim = False  # STT: die at the first interim after a final, then stay down
        self.fail_from = 0  # LLM: this request (1-based) and every later one fail before content
        self.used: list[dict[str, str]] = []
        self.streams = 0

    def idle_limit(self) -> float | None:
        return None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.fake.warm(timeout)

    async def connect(self, config: Any, timeout: float) -> Any:  # noqa: ASYNC109
        self.used.append({k: getattr(config, k) or getattr(self.real, k, "")
                          for k in ("voice", "model", "language") if hasattr(config, k)})
        if self.down:
            await asyncio.sleep(0.05)
            raise ProviderError("connect", "refused (outage)")
        s = await self.fake.connect(config, timeout)
        if self.kill_at_text is not None:
            self._arm_tts(s)
        if isinstance(config, SttConfig):
            return _DiesAfterInterim(s, self)  # once kill_after_interim is set
        return s

    def _arm_tts(self, s: Any) -> None:
        orig, n = s.send_text, [0]

        async def send_text(context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
            await orig(context, text, continue_=continue_, timeout=timeout)
            n[0] += not continue_
            if n[0] == self.kill_at_text and not continue_:
                self.down = True
                s._die("died")  # before this utterance's first audio (the fake waits 80-160 ms)

        s.send_text = send_text

    def stream(self, request: Any) -> Any:
        self.streams += 1
        self.used.append({"model": self.real.model})
        if self.down or 0 < self.fail_from <= self.streams:
            return _Error()
        return self.fake.stream(request)


class _DiesAfterInterim:
    def __init__(self, inner: Any, leg: Recorded) -> None:
        self.inner, self.leg = inner, leg

    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        await self.inner.send_audio(pcm, timeout)

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.inner.finalize(timeout)

    async def events(self) -> AsyncIterator[Any]:
        finals = 0
        async for ev in self.inner.events():
            yield ev
            if isinstance(ev, Transcript):
                finals += ev.is_final
                if not ev.is_final and finals and self.leg.kill_after_interim:
                    self.leg.kill_after_interim, self.leg.down = False, True
                    self.inner._die("died")

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        await self.inner.close(timeout)


class _Error:
    def __aiter__(self) -> _Error:
        return self

    async def __anext__(self) -> Any:
        await asyncio.sleep(0.3)
        if getattr(self, "done", False):
            raise StopAsyncIteration
        self.done = True
        return LlmError("server", "HTTP 503")

    async def aclose(self) -> None:
        self.done = True


def agent_file(tmp_path: Path, text: str = AGENT) -> Any:
    p = tmp_path / "own_voice.toml"
    p.write_text(text, encoding="utf-8")
    return load_agent(p, env=ENV)


def run_call(agent: Any, fault: str) -> tuple[Any, dict[str, tuple[Recorded, Recorded]]]:
    legs: dict[str, tuple[Recorded, Recorded]] = {}
    env = registry.CallEnv("sim1", env=ENV)

    def layer(stt: Any, llm: Any, tts: Any) -> tuple[Any, Any, Any]:
        fakes = {"stt": (stt, FakeStt(stt.vocab, seed=11)), "llm": (llm, llm),
                 "tts": (tts, FakeTts(tts.vocab, seed=12, rate=tts.rate))}
        res, real_wrap = Resilience(), layer_pkg.wrap
        out = []
        for stage in ("stt", "llm", "tts"):
            made: list[Recorded] = []
            real_factory = registry.FACTORIES[stage]

            def factory(leg: Any, e: Any, real_factory: Any = real_factory, made: list[Recorded] = made,
                        stage: str = stage) -> Recorded:
                rec = Recorded(real_factory(leg, e), fakes[stage][len(made)])
                made.append(rec)
                return rec

            registry.FACTORIES[stage] = factory
            layer_pkg.wrap = lambda *a, **kw: real_wrap(*a, **kw, resilience=res)  # this call's breakers
            try:
                wrapped = registry.build(stage, getattr(agent, stage), env, resilient=True)
            finally:
                registry.FACTORIES[stage] = real_factory
                layer_pkg.wrap = real_wrap
            legs[stage] = (made[0], made[1])
            out.append(wrapped)
        prim = legs[fault][0]
        if fault == "tts":
            prim.kill_at_text = 2  # turn 2's answer, then stay down
        elif fault == "stt":
            prim.kill_after_interim = True  # the first interim after turn 1's final, then stay down
        else:
            prim.fail_from = 2  # turn 2's request fails before content, and every later one
        return out[0], out[1], out[2]

    call = SimCall(steps=[Utter("what time is it please", at=0.5), Utter("thanks a lot", after_bot_done=1.0)],
                   llm=[LlmScript((Say(ANSWER1),)), LlmScript((Say(ANSWER2),))], quiet=6.0,
                   actor=actor_config(agent, default_actor_config()))

    async def main() -> Any:
        with layered(layer):
            return await harness.simulate(call)

    return run_virtual(main), legs


def _answered_whole(res: Any) -> None:
    msgs, words = conversation(res)
    assert [m for _, m in msgs] == ["what time is it please", ANSWER1, "thanks a lot", ANSWER2]
    assert words == (ANSWER1 + " " + ANSWER2).split()
    assert res.live_tasks_after == 0 and res.stray_tasks == []


@pytest.fixture
def agent(tmp_path: Path) -> Any:
    return agent_file(tmp_path)


OWN_LANGUAGES = AGENT.replace('model = "nova-2-phonecall"\n', 'model = "nova-2-phonecall"\nlanguage = "en-US"\n').replace(
    'base_url = "wss://eu.api.deepgram.com"\n', 'base_url = "wss://eu.api.deepgram.com"\nmodel = "nova-3"\nlanguage = "en-GB"\n')


def test_the_call_config_carries_the_primarys_settings(agent: Any) -> None:
    cfg = actor_config(agent, default_actor_config())
    assert (cfg.tts.tts.voice, cfg.tts.tts.model) == ("21m00Tcm4TlvDq8ikWAM", "eleven_flash_v2_5")
    assert (cfg.stt.stt.model, cfg.stt.stt.language) == ("nova-2-phonecall", "en")


def test_a_tts_failover_speaks_with_the_secondarys_own_voice(agent: Any) -> None:
    res, legs = run_call(agent, "tts")
    _answered_whole(res)
    prim, sec = legs["tts"]
    assert prim.used[0] == {"voice": "21m00Tcm4TlvDq8ikWAM", "model": "eleven_flash_v2_5", "language": "en"}
    assert sec.used and all(u["voice"] == "en-us" for u in sec.used), sec.used
    assert "21m00Tcm4TlvDq8ikWAM" not in {u["voice"] for u in sec.used}
    # the secondary spoke turn 2 (the caller heard its audio: the words above are on the wire)
    assert [t for _, t in sec.fake.probe.texts if t.strip()] and \
        " ".join(t for _, t in sec.fake.probe.texts).split() == ANSWER2.split()
    assert res.actor.tts.provider.stats()["respoken"] == 1


@pytest.mark.parametrize("own", [False, True], ids=["defaults", "own-settings"])
def test_an_stt_failover_transcribes_with_the_secondarys_own_model_and_language(tmp_path: Path, own: bool) -> None:
    """Without settings of its own the secondary Deepgram leg uses Deepgram's default model
    (nova-3) and the agent's language, never the primary's model; with them, its own."""
    res, legs = run_call(agent_file(tmp_path, OWN_LANGUAGES if own else AGENT), "stt")
    _answered_whole(res)
    prim, sec = legs["stt"]
    assert prim.used[0] == {"model": "nova-2-phonecall", "language": "en-US" if own else "en"}
    want = {"model": "nova-3", "language": "en-GB" if own else "en"}
    assert sec.used and all(u == want for u in sec.used), sec.used
    assert res.actor.stt.provider.stats()["recoveries"] == 1
    assert sec.fake.probe.sessions >= 1


def test_an_llm_failover_answers_with_the_secondarys_own_model(agent: Any) -> None:
    res, legs = run_call(agent, "llm")
    _answered_whole(res)
    prim, sec = legs["llm"]
    assert {u["model"] for u in prim.used} == {"gpt-4.1-mini"}
    assert sec.used == [{"model": "claude-3-5-haiku-latest"}]  # the anthropic adapter's default
    assert res.actor.runner.provider.stats()["failovers"] == 1
