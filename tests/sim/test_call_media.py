"""The call's media state on virtual time, through the production actor (the sim's gateway
releases nothing while the call is not answered, as the SIP leg sends nothing then):

* held mid-reply: the reply is cut where the caller stopped hearing it (the context keeps
  exactly that: the played-text oracle), no barge-in is counted, the music on hold reaches
  the VAD but opens no turn and nothing is played; taken off hold the bot says nothing
  until the caller speaks, whose turn is then answered;
* held while a SideEffect tool runs: the tool completes, once, and its result reaches the
  model as a note at the caller's next turn;
* early media (a dialled call before its answer): the far end's announcement reaches the
  VAD, no turn, no greeting, nothing played; at the answer the greeting plays, then the
  conversation is ordinary;
* answered all along (a plain call): no media change, the record says so.
"""

from __future__ import annotations

from brisvox.agent.conversation.context import AssistantMessage, SystemMessage, UserMessage
from brisvox.providers.seeded_fakes import Call, LlmScript, Say
from brisvox.sim.harness import SimCall, oracle_mismatches, simulate
from brisvox.sim.sim_tools import SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Media, Utter

LONG = (
    "Well, there are many things to say about that. The first is that the weather today is quite "
    "nice, with a light breeze from the west. The second is that tomorrow will be colder, so bring "
    "a jacket if you go out in the evening."
)
MUSIC = "la la la da da la la la da da la la"  # music on hold, as words the VAD and a STT would take
GREETING = "Hello, this is the brisvox test line calling about your booking."


def window(res, start: str, end: str) -> tuple[float, float]:
    """The times of the first ``start`` and the following ``end`` media step."""
    log = res.platform.media_log
    t0 = next(t for t, s in log if s == start)
    t1 = next(t for t, s in log if s == end and t >= t0)
    return t0, t1


def clean(res) -> None:
    assert oracle_mismatches(res) == []
    res.actor.context.validate()
    assert res.platform.stale_tts_after_clear == 0 and res.platform.wire.frames_after_clear == []
    assert res.live_tasks_after == 0 and res.stray_tasks == []


def test_a_hold_mid_reply_cuts_it_and_nothing_is_said_until_the_caller_speaks():
    call = SimCall(
        steps=[
            Utter("what is the weather like", at=0.5),
            Media("held", after_bot_words=6),
            Utter(MUSIC, after=0.4),
            Utter(MUSIC, after=0.3),
            Media("answered", after=1.5),
            Utter("sorry I am back now", after=2.0),
        ],
        llm=[LlmScript((Say(LONG),)), LlmScript((Say("No problem, welcome back."),))],
    )
    res = run_virtual(lambda: simulate(call))
    clean(res)
    driver = res.actor.driver.st
    assert driver.media_cuts == 1 and res.interrupts == 0  # a hold is not a barge-in
    assert res.actor.runner.st.turns == 2  # the music opened no turn
    pump = res.actor.stats()["pump"]
    assert pump["media_muted_events"] >= 2 and pump["vad_starts"] >= 3  # the VAD heard the music
    texts = res.assistant_texts()
    assert len(texts) == 2 and 0 < len(texts[0]) < len(LONG) and LONG.startswith(texts[0].rstrip(".,"))
    assert texts[1] == "No problem, welcome back."
    users = [m.content for m in res.actor.context if isinstance(m, UserMessage)]
    assert users == ["what is the weather like", "sorry I am back now"]
    held, back = window(res, "held", "answered")
    wire = res.platform.wire
    assert not [t for t in wire.word_times if held + 0.021 < t < back]  # nothing played while held
    back_utt = res.platform.caller.spoken[-1]
    later = [u for u in wire.utts.values() if u.first_t is not None and u.first_t > held]
    assert later and all(u.first_t >= back_utt.end_t for u in later)  # silent until the caller spoke
    media = res.record["media"]
    assert media["initial"] == "answered" and media["state"] == "answered" and media["holds"] == 1
    assert [c["state"] for c in media["changes"]] == ["held", "answered"]
    assert abs(media["held_s"] - (back - held)) < 0.05


def test_a_side_effect_tool_in_flight_when_held_completes_once():
    tools = SimTools(book_seconds=3.0)
    call = SimCall(
        steps=[
            Utter("book a table for kaya", at=0.5),
            Media("held", after_bot_words=4),
            Media("answered", after=5.0),
            Utter("so is it booked", after=1.0),
        ],
        llm=[
            LlmScript((Say("Okay, booking it now."), Call("book_table", {"name": "Kaya", "people": 2}))),
            LlmScript((Say("Yes, it is booked."),)),
        ],
        registry=tools.registry,
    )
    res = run_virtual(lambda: simulate(call))
    clean(res)
    assert res.actor.driver.st.media_cuts == 1
    assert tools.bodies["book_table"] == 1 and tools.bookings == ["BK-1001"]  # it completed, once
    notes = [m for m in res.actor.context if isinstance(m, SystemMessage) and "Late tool result" in m.content]
    assert len(notes) == 1 and "BK-1001" in notes[0].content
    assert res.assistant_texts()[-1] == "Yes, it is booked."
    held, back = window(res, "held", "answered")
    assert not [t for t in res.platform.wire.word_times if held + 0.021 < t < back]


def test_early_media_opens_no_turn_and_the_greeting_waits_for_the_answer():
    call = SimCall(
        steps=[
            Utter("the number you have dialled is being connected please hold", at=0.3),
            Media("answered", after=1.0),
            Utter("yes speaking who is this", after_bot_done=0.5),
        ],
        llm=[LlmScript((Say("This is the booking service, confirming tonight."),))],
        greeting=GREETING,
        media="early",
    )
    res = run_virtual(lambda: simulate(call))
    clean(res)
    pump = res.actor.stats()["pump"]
    assert pump["vad_starts"] >= 2 and pump["media_muted_events"] >= 2  # the announcement reached the VAD
    answered = res.platform.media_log[0][0]
    wire = res.platform.wire
    assert wire.word_times and min(wire.word_times) >= answered  # nothing played before the answer
    msgs = list(res.actor.context)
    assert isinstance(msgs[1], AssistantMessage) and msgs[1].text == GREETING  # greeted at the answer
    users = [m.content for m in msgs if isinstance(m, UserMessage)]
    assert users == ["yes speaking who is this"]  # the announcement was no turn
    assert res.actor.driver.st.greetings == 1 and res.actor.runner.st.turns == 1
    media = res.record["media"]
    assert media["initial"] == "early" and [c["state"] for c in media["changes"]] == ["answered"]


def test_a_call_answered_all_along_records_no_change():
    call = SimCall(steps=[Utter("hello there", at=0.5)], llm=[LlmScript((Say("Hello."),))])
    res = run_virtual(lambda: simulate(call))
    clean(res)
    st = res.actor.driver.st
    assert st.media_changes == 0 and st.media_cuts == 0 and st.media_muted == 0
    assert res.record["media"] == {"initial": "answered", "state": "answered", "changes": [], "holds": 0,
                                   "held_s": 0.0}


def test_a_hold_cuts_a_speech_to_speech_answer_and_the_provider_hears_no_music():
    from brisvox.agent.conversation.playout_book import PlayoutConfig
    from brisvox.agent.host.actor import ActorConfig
    from brisvox.agent.pipeline.s2s.machine import S2sTurnConfig
    from brisvox.agent.pipeline.s2s.stage import S2sStageConfig
    from brisvox.providers.s2s.scripted import S2sReply, ScriptedS2s

    holder = {}

    def make(vocab):
        holder["p"] = ScriptedS2s(vocab, [S2sReply("one two three four five six seven eight nine ten eleven "
                                                   "twelve thirteen fourteen fifteen sixteen"), S2sReply("welcome back")])
        return holder["p"]

    cfg = ActorConfig(playout=PlayoutConfig(lead_margin=0.0),
                      s2s=S2sStageConfig(turn=S2sTurnConfig(turn_detection="provider"), reconnect_backoff=0.1))
    call = SimCall(steps=[Utter("tell me a story", at=0.5), Media("held", after_bot_words=4),
                          Utter(MUSIC, after=0.4), Media("answered", after=1.5),
                          Utter("i am back", after=1.5)],
                   llm=[], s2s=make, actor=cfg)
    res = run_virtual(lambda: simulate(call))
    p = holder["p"]
    st = res.actor.s2s.st
    assert st.media_cuts == 1 and st.barge_ins == 0 and p.probe.cancels >= 1
    assert p.probe.user_turns == ["tell me a story", "i am back"]  # the music never reached the provider
    assert oracle_mismatches(res) == [] and res.platform.wire.frames_after_clear == []
    held, back = window(res, "held", "answered")
    assert not [t for t in res.platform.wire.word_times if held + 0.021 < t < back]
    cut = [m for m in res.actor.context if isinstance(m, AssistantMessage)]
    assert 0 < len(cut[0].text.split()) < 16 and cut[-1].text == "welcome back"
    assert res.live_tasks_after == 0 and res.stray_tasks == []
