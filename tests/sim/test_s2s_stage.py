"""The S2S stage on virtual time: the production S2sCallActor in the simulator with the scripted provider."""

from __future__ import annotations

from orjson import loads as orjson_loads

from brisvox.agent.conversation.context import AssistantMessage, UserMessage
from brisvox.agent.conversation.playout_book import PlayoutConfig
from brisvox.agent.host.actor import ActorConfig
from brisvox.agent.pipeline.s2s.machine import S2sTurnConfig
from brisvox.agent.pipeline.s2s.stage import S2sStageConfig
from brisvox.providers.s2s.scripted import S2sCall, S2sReply, ScriptedS2s
from brisvox.sim.harness import SimCall, oracle_mismatches, simulate
from brisvox.sim.sim_tools import SimTools
from brisvox.sim.vloop import run_virtual
from brisvox.sim.world import Utter

LONG = ("one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty")


def s2s_cfg(detection: str = "provider", **kw) -> ActorConfig:
    kw.setdefault("reconnect_backoff", 0.1)
    kw.setdefault("fallback_line", "sorry goodbye now")
    return ActorConfig(playout=PlayoutConfig(lead_margin=0.0),
                       s2s=S2sStageConfig(turn=S2sTurnConfig(turn_detection=detection), **kw))


def run(steps, replies, detection="provider", registry=None, **prov):
    holder = {}

    def make(vocab):
        holder["p"] = ScriptedS2s(vocab, replies, **prov)
        return holder["p"]

    res = run_virtual(lambda: simulate(SimCall(steps=steps, llm=[], s2s=make, actor=s2s_cfg(detection),
                                               registry=registry)))
    return res, holder["p"]


def msgs(res):
    return [(type(m).__name__, getattr(m, "content", getattr(m, "text", ""))) for m in res.actor.context]


def test_one_turn_is_heard_whole_and_recorded():
    res, p = run([Utter("hello there", at=0.5)], [S2sReply("hi how can i help")])
    assert p.probe.user_turns == ["hello there"]
    ctx = list(res.actor.context)
    assert isinstance(ctx[0], UserMessage) and ctx[0].content == "hello there"
    assert isinstance(ctx[1], AssistantMessage) and ctx[1].text == "hi how can i help"
    wire = res.platform.wire
    assert [w for u in wire.order for w in wire.heard_words(u)] == "hi how can i help".split()
    assert res.live_tasks_after == 0 and not res.stray_tasks
    assert oracle_mismatches(res) == []


def _heard(res):
    wire = res.platform.wire
    return [w for u in wire.order for w in wire.heard_words(u)]


def test_a_barge_in_cuts_the_answer_truncates_the_provider_at_the_heard_position_and_the_context_agrees():
    res, p = run([Utter("tell me a story", at=0.5), Utter("stop please", after_bot_words=5)],
                 [S2sReply(LONG), S2sReply("okay i stopped")])
    st = res.actor.s2s.st
    assert st.barge_ins == 1 and p.probe.cancels >= 1
    wire = res.platform.wire
    assert wire.frames_after_clear == []
    assert oracle_mismatches(res) == []
    (item, ms, heard), = p.probe.truncates
    first = wire.utts[wire.order[0]]
    heard_words = wire.heard_words(wire.order[0])
    assert 5 <= len(heard_words) < 20
    # the provider is told what the caller heard: the context's cut text, at the book's position
    cut = [m for m in res.actor.context if isinstance(m, AssistantMessage)][0]
    assert cut.text == heard == " ".join(heard_words)
    assert abs(ms - first.released * 1000 / 8000) <= 20
    assert [m.content for m in res.actor.context if isinstance(m, UserMessage)] == ["tell me a story", "stop please"]
    assert _heard(res)[-3:] == ["okay", "i", "stopped"]
    assert res.live_tasks_after == 0


def test_audio_the_provider_sends_after_a_cancel_never_reaches_the_wire():
    res, p = run([Utter("tell me a story", at=0.5), Utter("stop please", after_bot_words=4)],
                 [S2sReply(LONG), S2sReply("fine")], late_audio=True)
    assert p.probe.late_audio_sent >= 1
    assert "stale" not in _heard(res)
    assert res.actor.s2s.st.counts.get("stale_audio", 0) >= 1
    assert res.platform.wire.frames_after_clear == []


def test_brisvox_turn_detection_commits_the_turn_and_asks_for_the_answer():
    res, p = run([Utter("hello there", at=0.5), Utter("and again", after_bot_done=0.5)],
                 [S2sReply("first answer"), S2sReply("second answer")], detection="brisvox")
    assert p.probe.user_turns == ["hello there", "and again"]
    assert res.actor.s2s.st.turns_committed == 2
    assert _heard(res) == "first answer second answer".split()
    turns = res.record["turns"]
    assert len(turns) == 2 and all(t["response_ms"] is not None for t in turns)


def test_a_backchannel_holds_the_bot_and_it_plays_on():
    res, p = run([Utter("tell me a story", at=0.5), Utter("mhm", after_bot_words=4)],
                 [S2sReply(LONG)], detection="brisvox")
    st = res.actor.s2s.st
    assert st.pauses == 1 and st.resumes == 1 and st.barge_ins == 0
    assert _heard(res) == LONG.split()


def _tools(book_seconds=0.5):
    t = SimTools(book_seconds=book_seconds)
    return t, t.registry


def test_s1_three_calls_of_one_response_run_together_results_in_call_order_then_one_response():
    tools, reg = _tools()
    calls = (S2sCall("get_weather", {"city": "Paris"}), S2sCall("get_weather", {"city": "Rome"}),
             S2sCall("get_weather", {"city": "Oslo"}))
    res, p = run([Utter("weather in three cities", at=0.5)],
                 [S2sReply("let me look", calls=calls), S2sReply("all sunny")], registry=reg)
    assert tools.bodies["get_weather"] == 3
    (batch,) = p.probe.tool_results
    assert [orjson_loads(r.output)["city"] for r in batch] == ["Paris", "Rome", "Oslo"]
    assert [r.call_id for r in batch] == [f"call_{i}" for i in (2, 3, 4)]  # the provider's ids, in call order
    assert p.probe.create_responses == 1
    assert _heard(res) == "let me look all sunny".split()
    kinds = [type(m).__name__ for m in res.actor.context]
    assert kinds == ["UserMessage", "AssistantMessage", "ToolMessage", "ToolMessage", "ToolMessage",
                     "AssistantMessage"]
    assert res.record["tools"] and len(res.record["tools"]) == 3


def test_s2_a_three_round_chain_one_result_and_one_response_per_round():
    tools, reg = _tools()
    res, p = run([Utter("plan my evening", at=0.5)],
                 [S2sReply("", calls=(S2sCall("get_weather", {"city": "A"}),)),
                  S2sReply("", calls=(S2sCall("get_weather", {"city": "B"}),)),
                  S2sReply("", calls=(S2sCall("get_weather", {"city": "C"}),)),
                  S2sReply("done planning")], registry=reg)
    assert [len(b) for b in p.probe.tool_results] == [1, 1, 1]
    assert p.probe.create_responses == 3
    assert _heard(res) == ["done", "planning"]
    # one user turn: every round of the chain is one bot epoch
    assert res.actor.s2s.machine.epoch == 1


def test_s3_a_repeated_booking_is_answered_already_done():
    tools, reg = _tools()
    book = S2sCall("book_table", {"name": "Ada", "people": 2})
    res, p = run([Utter("book a table for two", at=0.5)],
                 [S2sReply("", calls=(book,)), S2sReply("", calls=(book,)), S2sReply("booked")], registry=reg)
    assert tools.bodies["book_table"] == 1
    second = orjson_loads(p.probe.tool_results[1][0].output)
    assert second.get("error") == "already_done"


def test_a_barge_in_during_the_tool_phase_runs_the_booking_exactly_once():
    tools, reg = _tools(book_seconds=2.0)
    book = S2sCall("book_table", {"name": "Ada", "people": 2})
    res, p = run([Utter("book a table for two", at=0.5), Utter("hello are you there", after_bot_words=5),
                  Utter("is it booked", after_bot_done=1.5)],
                 [S2sReply("one moment please while i book it", calls=(book,)), S2sReply("still here"),
                  S2sReply("yes it is")], registry=reg)
    st = res.actor.s2s.stats()
    assert tools.bodies["book_table"] == 1 and st["barge_ins"] == 1 and st["tool_phases_cut"] == 1
    # the cut call is closed "interrupted" on both sides, and its outcome follows exactly once as a note
    (closed,) = p.probe.tool_results
    assert closed[0].call_id == "call_2" and orjson_loads(closed[0].output)["error"] == "interrupted"
    assert st["late_notes"] == 1 and len(p.probe.notes) == 1 and "BK-1001" in p.probe.notes[0]
    notes = [m for m in res.actor.context if type(m).__name__ == "SystemMessage"]
    assert len(notes) == 1 and "BK-1001" in notes[0].content
    assert res.actor.context.is_valid()
    assert _heard(res)[-3:] == ["yes", "it", "is"]
    assert res.live_tasks_after == 0


def test_a_session_that_dies_mid_answer_is_reconnected_with_the_conversation_so_far():
    res, p = run([Utter("hello there", at=0.5), Utter("are you back", after=3.0)],
                 [S2sReply("first answer here"), S2sReply("lost words"), S2sReply("yes i am back")],
                 die_at_response=2)
    st = res.actor.s2s.st
    assert st.session_errors == 1 and st.reconnects == 1 and p.probe.connects == 2
    history = p.probe.configs[1].history
    assert [(i.kind, i.text) for i in history] == [("user", "hello there"), ("assistant", "first answer here"),
                                                   ("user", "are you back")]
    assert p.probe.create_responses == 1  # the unanswered turn is answered by the new session
    assert "lost" not in _heard(res) and _heard(res)[-4:] == ["yes", "i", "am", "back"]
    assert res.live_tasks_after == 0


def test_a_refused_reconnect_speaks_the_fallback_line_and_hangs_up():
    res, p = run([Utter("hello there", at=0.5), Utter("again", after_bot_done=0.5)],
                 [S2sReply("first answer here")], die_at_response=2, refuse_after=1)
    st = res.actor.s2s.st
    assert p.probe.connects == 1 + 3 and st.reconnects == 0 and st.reconnect_failures == 3
    assert st.fallback_spoken == 1
    assert _heard(res)[-3:] == ["sorry", "goodbye", "now"]
    hangups = [f for f in res.platform.sent if type(f).__name__ == "Hangup"]
    assert len(hangups) == 1 and hangups[0].reason == "s2s_failed"
    assert res.live_tasks_after == 0


def test_each_cut_item_is_truncated_once_across_two_barge_ins():
    res, p = run([Utter("tell me a story", at=0.5), Utter("stop please", after_bot_words=4),
                  Utter("again please", after_bot_done=0.5), Utter("no stop", after_bot_words=4)],
                 [S2sReply(LONG), S2sReply("okay"), S2sReply(LONG), S2sReply("fine")])
    assert res.actor.s2s.st.barge_ins == 2
    assert [t[0] for t in p.probe.truncates] == ["item_1", "item_3"]
    assert oracle_mismatches(res) == []


def test_s4_an_invalid_argument_gets_a_structured_error_and_the_corrected_call_runs():
    tools, reg = _tools()
    res, p = run([Utter("book a table", at=0.5)],
                 [S2sReply("", calls=(S2sCall("book_table", {"people": 2}),)),
                  S2sReply("", calls=(S2sCall("book_table", {"name": "Ada", "people": 2}),)),
                  S2sReply("booked for ada")], registry=reg)
    first, second = (orjson_loads(b[0].output) for b in p.probe.tool_results)
    assert first["error"] == "invalid_arguments" and "schema" in first["detail"]
    assert second.get("booked") is True
    assert tools.bodies["book_table"] == 1
    assert _heard(res) == ["booked", "for", "ada"]


def test_s6_a_booking_cut_by_a_barge_in_is_not_run_again_when_the_model_repeats_it():
    tools, reg = _tools(book_seconds=2.0)
    book = S2sCall("book_table", {"name": "Ada", "people": 2})
    res, p = run([Utter("book a table for two", at=0.5), Utter("hello are you there", after_bot_words=5)],
                 [S2sReply("one moment please while i book it", calls=(book,)),
                  S2sReply("", calls=(book,)), S2sReply("it is booked")], registry=reg)
    assert res.actor.s2s.st.barge_ins == 1
    assert tools.bodies["book_table"] == 1  # the repeat is answered from the first run, never run again
    repeat = orjson_loads(p.probe.tool_results[-1][0].output)
    assert repeat["error"] == "already_reported"  # its outcome reached the model as a note before
    assert len(p.probe.notes) == 1 and "BK-1001" in p.probe.notes[0]
    assert res.actor.context.is_valid()
    assert _heard(res)[-3:] == ["it", "is", "booked"]


def _confirm_registry(tools: SimTools):
    from brisvox.agent.tool_engine.registry import ToolKind, ToolRegistry, ToolSpec
    from brisvox.sim.sim_tools import BOOK

    def reg() -> ToolRegistry:
        r = ToolRegistry()
        r.register(ToolSpec("book_table", "Book a table.", BOOK, ToolKind.SIDE_EFFECT, timeout=5.0, confirm=True),
                   tools.book_table)
        return r

    return reg


def test_a_confirmation_needs_the_callers_next_turn():
    tools = SimTools(book_seconds=0.2)
    book = S2sCall("book_table", {"name": "Ada", "people": 2})
    confirm = S2sCall("confirm_pending", {"call_id": "t1.0"})
    res, p = run([Utter("book a table for two", at=0.5), Utter("yes please", after_bot_done=0.5)],
                 [S2sReply("", calls=(book,)),
                  S2sReply("", calls=(confirm,)),  # the model confirms on its own, in the same turn: refused
                  S2sReply("shall i book it"),
                  S2sReply("", calls=(confirm,)),  # after the caller's yes: runs
                  S2sReply("booked")], registry=_confirm_registry(tools))
    outs = [orjson_loads(b[0].output) for b in p.probe.tool_results]
    assert outs[0]["status"] == "confirmation_required" and outs[0]["call_id"] == "t1.0"
    assert outs[1]["error"] == "confirmation_refused" and "not replied" in outs[1]["detail"]
    assert outs[2].get("booked") is True
    assert tools.bodies["book_table"] == 1
    assert _heard(res)[-1] == "booked"


def test_the_caller_hanging_up_mid_answer_ends_the_session_and_leaks_nothing():
    from brisvox.sim.world import HangUp

    tools, reg = _tools(book_seconds=5.0)
    res, p = run([Utter("tell me a story", at=0.5), HangUp(at=2.0)], [S2sReply(LONG)], registry=reg)
    assert res.record["end_reason"] == "caller_hangup"
    (session,) = p.sessions
    assert session._closed  # the provider's session was closed with the call
    assert res.live_tasks_after == 0 and not res.stray_tasks
    answers = [m.text for m in res.actor.context if isinstance(m, AssistantMessage)]
    assert len(answers) == 1 and LONG.startswith(answers[0]) and len(answers[0]) < len(LONG)


def test_a_speech_to_speech_calls_tools_send_tool_called_webhooks_as_recorded():
    from brisvox.agent.host.call_hooks import CallHooks
    from brisvox.outbound.webhooks.outbox import Target

    class Writer:
        def __init__(self):
            self.got = []

        def submit(self, event, targets, on_commit=None):
            self.got.append(orjson_loads(event.body))
            return True

    w = Writer()
    hooks = CallHooks(w, {"tool.called": (Target("daemon", "https://h.example.com/"),)}, "sim1", "s2s-agent")
    tools, reg = _tools()
    calls = (S2sCall("get_weather", {"city": "Paris"}), S2sCall("get_weather", {"city": 7}))
    holder = {}

    def make(vocab):
        holder["p"] = ScriptedS2s(vocab, [S2sReply("let me look", calls=calls), S2sReply("sunny")])
        return holder["p"]

    res = run_virtual(lambda: simulate(SimCall(steps=[Utter("weather in paris", at=0.5)], llm=[], s2s=make,
                                               actor=s2s_cfg(), registry=reg, on_actor=hooks.install)))
    sent = [(e["type"], e["data"]["tool"], e["data"]["outcome"], e["data"]["tool_call_id"]) for e in w.got]
    recorded = [("tool.called", t["name"], t["outcome"], t["call_id"]) for t in res.record["tools"]]
    assert sent == recorded and len(sent) == 2, (sent, recorded)
    assert {o for _, _, o, _ in sent} == {"ok", "invalid_arguments"}
    assert all(e["data"]["call_id"] == "sim1" and e["data"]["agent"] == "s2s-agent" for e in w.got)
