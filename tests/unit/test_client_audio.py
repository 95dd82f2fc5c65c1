"""brisvox/client: the playout recorder, line speech bounds, target resolution and the text
report (the Twilio messages and mu-law are tests/unit/test_wire_twilio.py and test_wire_g711.py)."""

from __future__ import annotations

import numpy as np
import pytest

from brisvox.client.call_cli import resolve
from brisvox.client.recorder import PlayoutRecorder
from brisvox.client.report import render
from brisvox.client.sip import parse_target
from brisvox.client.speech import make_line, speech_bounds
from brisvox.client.transport import TransportError

RATE = 8000
F = 160


def frame(v: int) -> np.ndarray:
    return np.full(F, v, np.int16)


# -- recorder ---------------------------------------------------------------------------


def test_frames_play_at_their_arrival_and_a_late_one_after_a_gap_of_silence() -> None:
    r = PlayoutRecorder(RATE, t0=10.0)
    r.on_audio(frame(1), 10.0)
    r.on_audio(frame(2), 10.02)
    r.on_audio(frame(3), 10.045)  # 5 ms of jitter: played right after the previous frame
    r.on_audio(frame(4), 10.5)  # after a pause: silence in between, aligned to the clock
    x = r.track()
    assert list(x[:3 * F:F]) == [1, 2, 3]
    assert np.all(x[3 * F:4000] == 0)
    assert np.all(x[4000:4000 + F] == 4)
    assert len(x) == 4000 + F


def test_a_burst_queues_and_a_clear_drops_what_had_not_played() -> None:
    r = PlayoutRecorder(RATE, t0=0.0)
    for v in range(1, 11):  # 200 ms of audio arriving at once
        r.on_audio(frame(v), 1.0)
    assert r.n == 8000 + 10 * F
    r.on_clear(1.05)  # 50 ms of it played
    assert r.n == 8000 + 400
    assert r.cut_samples == 10 * F - 400
    assert r.segment(1.0, 1.05).tolist() == [1] * F + [2] * F + [3] * 80
    r.on_clear(1.2)  # nothing buffered any more: nothing to drop
    assert r.n == 8000 + 400


def test_track_until_pads_to_the_end_of_the_call() -> None:
    r = PlayoutRecorder(RATE, t0=0.0)
    r.on_audio(frame(7), 0.0)
    assert len(r.track(until=1.0)) == RATE


# -- lines, targets, report -----------------------------------------------------------------


def test_speech_bounds_skip_leading_and_trailing_silence() -> None:
    x = np.concatenate([np.zeros(800, np.int16), np.full(1600, 3000, np.int16), np.zeros(480, np.int16)])
    assert speech_bounds(x, RATE) == (800, 2400)
    assert speech_bounds(np.zeros(1000, np.int16), RATE) == (0, 0)
    ln = make_line("x", x, RATE, text="hello")
    assert (ln.speech_start, ln.speech_end, ln.text) == (800, 2400, "hello")


@pytest.mark.parametrize(("target", "protocol", "agent", "want"), [
    ("ws://127.0.0.1:8765/ws", "auto", "", ("native", "ws://127.0.0.1:8765/ws")),
    ("ws://127.0.0.1:8765/ws", "auto", "local", ("native", "ws://127.0.0.1:8765/ws/local")),
    ("ws://h:1/twilio", "auto", "sales", ("twilio", "ws://h:1/twilio/sales")),
    ("127.0.0.1:8765", "twilio", "", ("twilio", "ws://127.0.0.1:8765/twilio")),
    ("sip:local@127.0.0.1:5060", "auto", "", ("sip", "sip:local@127.0.0.1:5060")),
])
def test_resolve_targets(target: str, protocol: str, agent: str, want: tuple[str, str]) -> None:
    assert resolve(target, protocol, agent) == want


def test_sip_targets() -> None:
    assert parse_target("sip:local@127.0.0.1:5090") == ("sip:local@127.0.0.1:5090", ("127.0.0.1", 5090))
    assert parse_target("127.0.0.1") == ("sip:default@127.0.0.1:5060", ("127.0.0.1", 5060))
    assert parse_target("sip:x@127.0.0.1", agent="booking")[0] == "sip:booking@127.0.0.1:5060"
    with pytest.raises(TransportError):
        parse_target("http://nope")


def test_render_prints_one_block_per_turn() -> None:
    res = {"protocol": "native", "target": "ws://x/ws", "call_id": "c1", "ids": {}, "end_reason": "hung up",
           "duration_s": 9.0, "recording": "bot.wav", "bot_dtmf": [], "turns": [
               {"index": 1, "kind": "line", "label": "Hi", "caller": "Hi", "bot": "Hello there.",
                "latency_ms": 812, "unanswered": False, "barged": True, "stop_ms": 240, "clear": True},
               {"index": 2, "kind": "press", "label": "DTMF 5", "caller": "", "bot": "",
                "latency_ms": None, "unanswered": True, "barged": False, "stop_ms": None, "clear": False}]}
    text = render(res)
    assert "turn 1\n  caller: Hi\n  bot:    Hello there. [interrupted]" in text
    assert "caller stopped -> first bot audio 812 ms" in text
    assert "bot audio stopped 240 ms after the caller started talking (clear received)" in text
    assert "caller: pressed 5" in text and "(no audible reaction)" in text
    assert text.splitlines()[-1].startswith("ended: hung up after 9.0 s; latency min/max 812/812 ms")
