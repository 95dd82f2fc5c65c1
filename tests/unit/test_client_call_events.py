"""``brisvox call --events``: the native client keeps the call's events, bounded, and prints one line each."""

from __future__ import annotations

from brisvox.client import native
from brisvox.client.call_cli import event_line
from brisvox.client.native import NativeTransport


def test_each_event_reads_as_one_line() -> None:
    assert event_line({"name": "user_turn", "epoch": 2, "text": "a table for two"}) == \
        "  [caller, turn 2] a table for two"
    assert event_line({"name": "bot_turn", "epoch": 2, "text": "At eight?"}) == "  [bot, turn 2] At eight?"
    assert event_line({"name": "turn_metrics", "epoch": 2, "voice_to_voice_ms": 612.4, "end_of_turn_ms": 301.0,
                       "llm_first_token_ms": None, "tts_first_audio_ms": 88}) == \
        "  [turn 2] voice to voice 612 ms, end of turn 301 ms, LLM first token -, TTS first audio 88 ms"
    assert event_line({"name": "tool_call", "epoch": 3, "tool": "book", "outcome": "ok"}) == \
        "  [tool, turn 3] book -> ok"
    assert event_line({"name": "something_new"}) == "  [something_new]"


def test_the_transport_asks_for_events_keeps_them_bounded_and_passes_them_on(monkeypatch) -> None:
    seen: list[dict[str, object]] = []
    t = NativeTransport("ws://127.0.0.1:1/ws", events=True, on_event=seen.append)
    assert '"events":true' in t.stream.start().replace(" ", "")
    assert '"events"' not in NativeTransport("ws://127.0.0.1:1/ws").stream.start()
    monkeypatch.setattr(native, "MAX_EVENTS", 3)
    for i in range(5):
        t._call_event({"event": "call_event", "name": "user_turn", "epoch": i, "text": "x"})
    assert [e["epoch"] for e in t.call_events] == [0, 1, 2] and seen == t.call_events
    assert "event" not in t.call_events[0]
