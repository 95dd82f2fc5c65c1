"""The scenario suite s01-s11 (docs/TESTING.md) and the played-text cases.

Owns the scripts: each ``sNN()`` returns ``(SimCall, tools)`` where ``tools``
is the :class:`~brisvox.sim.sim_tools.SimTools` instance (or None) whose body
counters the checks read. ``docs/TESTING.md`` says what each one checks.

* s01 one turn, answered in full
* s02 barge-in in the middle of an answer, then a new turn
* s03 three consecutive turns without barge-in (each must reach the wire)
* s04 resume: a pause shorter than the end-of-turn silence is one turn
* s05 STT session dies mid-utterance (synthetic final, promoted interim), recovers
* s06 LLM failure (the request; the simulator's LLM has no resilience layer, the runner
  no retry), no invented speech; the next turn is answered
* s07 a non-word sound (cough) is an empty turn: no request; then a real turn
* s08 a tool turn: text, ReadOnly tool, text
* s09 a backchannel while the bot speaks: vetoed, the answer plays whole
* s10 barge-in during a SideEffect tool (after the filler): runs once, late note next turn
* s11 the caller hangs up while the bot speaks: the context is cut at hang-up
"""

from __future__ import annotations

import random
from collections.abc import Callable

from brisvox.providers.seeded_fakes import Call, Fail, LlmScript, Say
from brisvox.sim.fakes import SttFault
from brisvox.sim.harness import SimCall
from brisvox.sim.sim_tools import SimTools
from brisvox.sim.world import HangUp, Utter

LONG = (
    "Well, there are many things to say about that. The first is that the weather today is quite "
    "nice, with a light breeze from the west. The second is that tomorrow will be colder, so bring "
    "a jacket if you go out in the evening."
)
MEDIUM = "Sure, I can help with that. Tell me what you need and I will take care of it for you."


def s01() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[Utter("hello there how are you", at=0.5)],
        llm=[LlmScript((Say("I am fine, thank you for asking. How can I help you today?"),))],
    ), None


def s02() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[
            Utter("what is the weather like", at=0.5),
            Utter("wait stop please", after_bot=1.5),
            Utter("and tomorrow", after_bot_done=0.8),
        ],
        llm=[
            LlmScript((Say(LONG),)),
            LlmScript((Say("Sorry. Go ahead."),)),
            LlmScript((Say("Colder tomorrow."),)),
        ],
    ), None


def s03() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[
            Utter("first question please", at=0.5),
            Utter("second question now", after_bot_done=0.6),
            Utter("third and last one", after_bot_done=0.6),
        ],
        llm=[
            LlmScript((Say("This is the first answer."),)),
            LlmScript((Say("This is the second answer."),)),
            LlmScript((Say("And this is the third answer."),)),
        ],
    ), None


def s04() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[Utter("I would like to book", at=0.5), Utter("a table for two tonight", after=0.3)],
        llm=[LlmScript((Say("Of course, a table for two tonight."),))],
    ), None


def s05() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[
            Utter("can you hear me now my friend", at=0.5),
            Utter("and now a second question", after_bot_done=1.5),
        ],
        llm=[LlmScript((Say("Yes, I can hear you."),)), LlmScript((Say("Second answer here."),))],
        stt_faults=[SttFault(die_after_audio=1.9)],
    ), None


def s06() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[Utter("tell me something", at=0.5), Utter("are you there", after=4.0)],
        llm=[LlmScript((Fail("server"),)), LlmScript((Say("Yes, I am here."),))],
    ), None


def s07() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[Utter("", noise=0.4, at=0.5), Utter("hello is anyone there", after=2.0)],
        llm=[LlmScript((Say("Yes, hello."),))],
    ), None


def s08() -> tuple[SimCall, SimTools | None]:
    tools = SimTools()
    return SimCall(
        steps=[Utter("what is the weather in paris", at=0.5)],
        llm=[
            LlmScript((Say("Let me check that for you."), Call("get_weather", {"city": "Paris"}))),
            LlmScript((Say("It is sunny in Paris today."),)),
        ],
        registry=tools.registry,
    ), tools


def s09() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[Utter("tell me about the weather", at=0.5), Utter("uh-huh", after_bot=2.0)],
        llm=[LlmScript((Say(LONG),))],
    ), None


def s10() -> tuple[SimCall, SimTools | None]:
    tools = SimTools(book_seconds=4.0)
    return SimCall(
        steps=[
            Utter("book a table for kaya", at=0.5),
            Utter("actually never mind that", after_bot_words=6),
            Utter("so is it booked", after_bot_done=1.0),
        ],
        llm=[
            LlmScript((Say("Okay, booking it now."), Call("book_table", {"name": "Kaya", "people": 2}))),
            LlmScript((Say("Alright."),)),
            LlmScript((Say("Yes, it is booked."),)),
        ],
        registry=tools.registry,
    ), tools


def s11() -> tuple[SimCall, SimTools | None]:
    return SimCall(
        steps=[Utter("tell me a long story", at=0.5), HangUp(at=4.2)],
        llm=[LlmScript((Say(LONG),))],
    ), None


SCENARIOS: dict[str, Callable[[], tuple[SimCall, SimTools | None]]] = {
    "s01": s01,
    "s02": s02,
    "s03": s03,
    "s04": s04,
    "s05": s05,
    "s06": s06,
    "s07": s07,
    "s08": s08,
    "s09": s09,
    "s10": s10,
    "s11": s11,
}

# interrupt counts every run must show (0 for s06 and s09: no barge-in; 1 for s02 and s10)
EXPECTED_INTERRUPTS = {"s01": 0, "s02": 1, "s03": 0, "s04": 0, "s05": 0, "s06": 0, "s07": 0, "s08": 0, "s09": 0, "s10": 1, "s11": 0}
# user turns that reach the LLM
EXPECTED_TURNS = {"s01": 1, "s02": 3, "s03": 3, "s04": 1, "s05": 2, "s06": 2, "s07": 1, "s08": 1, "s09": 1, "s10": 3, "s11": 1}

_WORDS = (
    "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar "
    "papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu one two three four five"
).split()


def played_text_case(seed: int) -> SimCall:
    """One of the seeded barge-in cases: a random answer cut at a random moment."""
    rng = random.Random(seed)
    sentences = []
    for _ in range(rng.randint(2, 4)):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 10))]
        words[0] = words[0].capitalize()
        punct = rng.choice([".", ".", "!", "?"])
        if rng.random() < 0.5 and len(words) > 4:
            words[2] += ","
        sentences.append(" ".join(words) + punct)
    answer = " ".join(sentences)
    return SimCall(
        steps=[
            Utter("tell me the words", at=0.5),
            Utter("stop right there", after_bot=rng.uniform(0.3, 3.5)),
            Utter("thanks", after_bot_done=0.8),
        ],
        llm=[LlmScript((Say(answer),)), LlmScript((Say("Okay."),)), LlmScript((Say("Bye."),))],
        seed=seed,
        max_time=40.0,
    )
