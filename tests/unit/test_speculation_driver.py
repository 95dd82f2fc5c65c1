"""When the turn driver offers and withdraws speculation candidates (virtual time), and the
hit rule's normalisation and context fingerprint."""

from __future__ import annotations

import asyncio
import unicodedata
from typing import Any

import pytest

from brisvox.agent.conversation.context import AssistantMessage, Context, SystemMessage, UserMessage
from brisvox.agent.pipeline.cascade import turn_machine as tm
from brisvox.agent.pipeline.cascade.turn_driver import TurnDriver, TurnDriverConfig
from brisvox.agent.pipeline.speculation.policy import SpeculationConfig, fingerprint, normalize
from brisvox.agent.pipeline.stage.base import Inbox
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    SpeculationCandidate,
    Start,
    Stop,
    UserStartedSpeaking,
    UserStoppedSpeaking,
    UserTranscript,
    UserTurnEnded,
    UtteranceFinal,
)
from brisvox.clock import CLOCK
from brisvox.sim.vloop import run_virtual
from tests.providers_fakes.runner_rig import Sink

# -- normalisation -------------------------------------------------------------------------------


@pytest.mark.parametrize("a,b", [
    ("Book a table, please!", "book a table please"),
    ("I'd like it", "Id like it"),
    ("İstanbul", "istanbul"),
    (unicodedata.normalize("NFD", "Çok güzel şarkı"), "çok güzel şarkı"),
    (unicodedata.normalize("NFD", "café crème"), "Café Crème"),
    ("ice cream", "icecream"),
])
def test_equal_under_the_hit_rule(a, b):
    assert normalize(a) == normalize(b)


@pytest.mark.parametrize("a,b", [
    ("şu", "su"), ("café", "cafe"), ("50%", "50"), ("$50", "50"), ("₺50", "50"), ("€5", "5"),
    ("-50", "50"), ("3.5", "35"), ("10:30", "1030"), ("john.doe", "johndoe"), ("a@b", "ab"),
    ("5°", "5"), ("2×3", "23"), ("1+1", "11"), ("5′", "5"), ("a/b", "ab"), ("x=y", "xy"),
])
def test_symbols_and_accents_never_equal_their_absence(a, b):
    assert normalize(a) != normalize(b)


def test_a_mark_without_a_table_entry_is_kept():
    assert normalize("q\u0301") == "q\u0301" and normalize("q\u0301") != normalize("q")


def test_the_fingerprint_sees_growth_a_cut_and_a_changed_tail():
    ctx = Context([SystemMessage("sys"), UserMessage("hi"), AssistantMessage("Hello there, how can I help?")])
    fp = fingerprint(ctx)
    assert fingerprint(ctx.copy()) == fp
    grown = ctx.copy()
    grown.push(SystemMessage("late note"))
    cut = ctx.copy()
    cut.replace(2, AssistantMessage("Hello there"))
    assert fingerprint(grown) != fp and fingerprint(cut) != fp


def test_the_config_is_validated():
    with pytest.raises(ValueError):
        SpeculationConfig(max_buffered_events=5000)
    with pytest.raises(ValueError, match="max_buffered_events"):
        SpeculationConfig.from_table({"max_buffered_events": 0})
    with pytest.raises(ValueError, match="bogus"):
        SpeculationConfig.from_table({"bogus": 1})


# -- the driver ----------------------------------------------------------------------------------


class Driver:
    def __init__(self, spec: SpeculationConfig, silence: float = 0.45) -> None:
        self.call = CallContext.detached("drv", clock=CLOCK)
        cfg = TurnDriverConfig(turn=tm.TurnConfig(silence=silence), speculation=spec)
        self.driver = TurnDriver(self.call, cfg, Inbox("turn", 64, sys_cap=64))
        self.sink = Sink(self.call)
        self.driver.pipe(self.sink)

    async def __aenter__(self) -> Driver:
        self.driver.start()
        self.sink.start()
        self.put(Start())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.put(Stop("test"))
        await asyncio.sleep(0.01)
        await self.call.tasks.close()

    def put(self, f: Any) -> None:
        self.driver.inbox.put_nowait(f)

    def start(self) -> None:
        self.put(UserStartedSpeaking(CLOCK.now(), 0))

    def stop(self) -> None:
        self.put(UserStoppedSpeaking(CLOCK.now(), 0))

    def final(self, text: str) -> None:
        self.put(UserTranscript(text, True))
        self.put(UtteranceFinal())

    def interim(self, text: str) -> None:
        self.put(UserTranscript(text, False))

    def out(self) -> list[tuple[str, Any]]:
        rows: list[tuple[str, Any]] = []
        for f in self.sink.frames:
            if isinstance(f, SpeculationCandidate):
                rows.append(("cand", f.text))
            elif isinstance(f, UserTurnEnded):
                rows.append(("end", f.text))
        return rows


async def tick(dt: float) -> None:
    await asyncio.sleep(dt)


def test_the_final_of_a_stop_is_offered_before_the_turn_ends():
    async def main():
        async with Driver(SpeculationConfig(enabled=True)) as d:
            d.start()
            d.interim("book a")
            await tick(0.5)
            d.stop()
            await tick(0.1)
            assert d.out() == []
            d.final("book a table")
            await tick(0.01)
            assert d.out() == [("cand", "book a table")]
            await tick(0.5)
            assert d.out() == [("cand", "book a table"), ("end", "book a table")]
            assert d.driver.stats()["speculations_offered"] == 1
    run_virtual(main)


def test_nothing_is_offered_when_off():
    async def main():
        async with Driver(SpeculationConfig()) as d:
            d.start()
            await tick(0.5)
            d.stop()
            d.final("book a table")
            await tick(0.6)
            assert d.out() == [("end", "book a table")]
    run_virtual(main)


def test_a_resume_withdraws_and_the_next_stop_offers_the_whole_text():
    async def main():
        async with Driver(SpeculationConfig(enabled=True)) as d:
            d.start()
            await tick(0.5)
            d.stop()
            d.final("book a table")
            await tick(0.2)
            d.start()  # resumed inside the silence
            await tick(0.4)
            d.stop()
            d.final("for two")
            await tick(0.6)
            assert d.out() == [("cand", "book a table"), ("cand", ""), ("cand", "book a table for two"),
                               ("end", "book a table for two")]
            st = d.driver.stats()
            assert (st["speculations_offered"], st["speculations_withdrawn"]) == (2, 1)
    run_virtual(main)


def test_on_partial_offers_the_interim_at_the_vad_stop():
    async def main():
        async with Driver(SpeculationConfig(enabled=True, on_partial=True)) as d:
            d.start()
            d.interim("book a table")
            await tick(0.5)
            d.stop()
            await tick(0.01)
            assert d.out() == [("cand", "book a table")]
            d.final("Book a table.")  # equal normalised: not offered again
            await tick(0.6)
            assert d.out() == [("cand", "book a table"), ("end", "Book a table.")]
    run_virtual(main)


def test_the_stable_partial_gate_waits_and_a_changed_interim_restarts_it():
    async def main():
        async with Driver(SpeculationConfig(enabled=True, on_partial=True, partial_stable_for=0.2), silence=2.0) as d:
            d.start()
            d.interim("book a")
            await tick(0.5)
            d.stop()
            await tick(0.15)
            d.interim("book a table")  # the text changed: the wait restarts
            await tick(0.15)
            assert d.out() == []
            await tick(0.1)
            assert d.out() == [("cand", "book a table")]
    run_virtual(main)


def test_the_gate_is_cancelled_by_a_resume_and_by_the_stops_own_final():
    async def main():
        async with Driver(SpeculationConfig(enabled=True, on_partial=True, partial_stable_for=0.3), silence=2.0) as d:
            d.start()
            d.interim("book a")
            await tick(0.5)
            d.stop()
            await tick(0.1)
            d.start()  # resumed: no request
            d.final("book a")  # the first stop's final, late
            await tick(0.5)
            assert d.out() == []
            d.stop()
            await tick(0.05)
            d.final("table")  # a final is never held
            await tick(0.01)
            assert d.out() == [("cand", "book a table")]
            await tick(0.5)
            assert d.out() == [("cand", "book a table")]
    run_virtual(main)


def test_max_per_turn_caps_a_stuttering_transcript():
    async def main():
        async with Driver(SpeculationConfig(enabled=True, max_per_turn=2)) as d:
            d.start()
            for i in range(4):
                await tick(0.3)
                d.stop()
                d.final(f"word{i}")
                await tick(0.1)
                d.start()
            await tick(0.3)
            d.stop()
            d.final("end")
            await tick(0.6)
            st = d.driver.stats()
            assert st["speculations_offered"] == 2 and st["speculations_capped"] == 3
            assert d.out()[-1] == ("end", "word0 word1 word2 word3 end")
    run_virtual(main)
