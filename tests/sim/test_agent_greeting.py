"""The agent file's greeting on virtual time: the bot speaks first, through the production actor.

* Played whole, it is the first assistant message of the context, before the
  caller's first turn, and the caller's turn is answered normally after it.
* The caller talking over it is a barge-in like any other: one interrupt, the
  greeting is cut in the context to what reached the wire (played-text
  oracle), no stale audio after the clear, and the caller's turn is answered.
"""

from __future__ import annotations

from brisvox.agent.conversation.context import AssistantMessage, SystemMessage, UserMessage
from brisvox.providers.seeded_fakes import LlmScript, Say
from brisvox.sim.harness import SimCall, oracle_mismatches, simulate
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

GREETING = ("Hello, thank you for calling the brisvox test line. I can book tables, tell you our "
            "opening hours and answer questions about your order. What can I do for you today?")


def _run(steps):
    call = SimCall(steps=steps, llm=[LlmScript((Say("Sure, two people tomorrow at seven."),))],
                   greeting=GREETING)
    return run_virtual(lambda: simulate(call))


def test_greeting_plays_first_then_the_caller_is_answered():
    res = _run([Utter("a table for two please", after_bot_done=0.6)])
    msgs = list(res.actor.context)
    assert isinstance(msgs[0], SystemMessage)
    assert isinstance(msgs[1], AssistantMessage) and msgs[1].text == GREETING
    assert isinstance(msgs[2], UserMessage)
    assert isinstance(msgs[3], AssistantMessage) and msgs[3].text.startswith("Sure")
    assert res.interrupts == 0
    assert res.actor.driver.st.greetings == 1 and res.actor.runner.st.greetings == 1
    assert res.llm.probe.count == 1  # the greeting is not a model request
    assert oracle_mismatches(res) == []
    assert res.live_tasks_after == 0 and res.stray_tasks == []


def test_barge_in_during_the_greeting_cuts_it_to_what_was_heard():
    res = _run([Utter("hello I would like a table for two", after_bot=1.2)])
    assert res.interrupts == 1
    assert res.platform.stale_tts_after_clear == 0
    assert res.platform.wire.frames_after_clear == []
    assert oracle_mismatches(res) == []
    texts = res.assistant_texts()
    heard = texts[0]
    assert heard and GREETING.startswith(heard.rstrip(".")) and len(heard) < len(GREETING)
    assert texts[-1].startswith("Sure")  # the caller's turn was answered after the cut
    res.actor.context.validate()
    assert res.live_tasks_after == 0 and res.stray_tasks == []
