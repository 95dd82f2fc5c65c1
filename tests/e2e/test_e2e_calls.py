"""brisvoxd end to end with the local models, called from outside like a user would.

Each test starts its own daemon (:class:`tests.e2e.e2e_daemon.E2EDaemon`:
a temp config and folder, one worker, one agent process, the shipped
``local`` agent -- Whisper tiny.en, the default local LLM, Piper -- and a scripted
booking agent; ports picked by the gateway), killed by process group with
its shared memory swept when the test ends, pass or fail. Every call is
placed by a real peer: ``brisvox call`` (run as the CLI) or baresip. What
each test proves:

* ``test_websocket_call_gets_an_english_answer``: a native WebSocket call to
  the local agent; the bot's audio, recorded at the client and transcribed
  back with Whisper, is English; the call record (``brisvox calls show ID``
  with the daemon's config, i.e. from its state dir) holds the caller's
  question (Whisper in the worker) and the answer.
* ``test_sip_call_from_baresip``: a real SIP UA (baresip, aufile source,
  sndfile dump of what it received) calls the local agent; its recording of
  the bot transcribes to English; the record says SIP and has the turn.
* ``test_sip_call_dtmf_reaches_the_agent``: ``brisvox call`` over SIP speaks,
  then presses 5 (RFC 4733); the digit is in the call record (actor pump,
  turn driver and LLM runner counted it), and the answer is English.
* ``test_barge_in_stops_the_bot_and_the_context_holds_what_was_heard``: over
  Twilio Media Streams, the caller talks over the local agent's long answer:
  the bot's audio stops at the client within 300 ms of the caller's first
  loud sample (the client's ``stop_ms``: the barge-in candidate holds the
  audio at once, though local Whisper gives no interims and the guard
  confirms the barge-in only after ``max_backchannel``), and within 300 ms
  of the agent's barge-in decision (the record's ``t_interrupted``, on the
  same host monotonic clock as the client); the client gets the clear, and
  the next turn's context (the record's conversation) holds the cut answer,
  matching the words the client heard, then the barge-in line.
* ``test_booking_happens_once_across_a_barge_in``: the scripted LLM calls the
  side-effect tool ``book_table`` (its first booking slowed to 3 s) and the
  caller barges in while it runs, then asks again (the LLM issues the same
  call again): the store created exactly one booking (its own counter), no
  tool call ran twice, the booking reached the context exactly once (the
  late-result note), and the cut first answer in the context is a prefix of
  the scripted text matching what the client heard.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from brisvox.agent.host.call_record import read_records
from tests.e2e.e2e_daemon import (
    BOOK_FIRST,
    E2EDaemon,
    brisvox_call,
    heard_what_was_said,
    is_english,
    is_speech,
    missing_prerequisite,
    words,
)
from tests.system.gateway_harness import free_port, rtp_range

# serial: local Whisper, LLM and Piper answer a real-time call within deadlines; starved of CPU by the
# parallel pass they mishear or answer late (fresh clones, 2026-12-03)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600), pytest.mark.serial]

SPEECH_TO_STOP_MS = 300  # required: the caller starts talking -> bot audio stopped at the client
DECISION_TO_STOP_MS = 300  # and from the agent's barge-in decision



def asked_the_question(text: str) -> bool:
    """The caller's "What is the capital of France?" reached the agent's context. Whisper tiny
    may mishear a word of it (over G.711 it once heard "the cap of a look, friends"): judged by
    word overlap, not by one word."""
    return len(set(words(text.lower())) & {"what", "is", "the", "capital", "of", "france"}) >= 3

@pytest.fixture
def daemon():
    why = missing_prerequisite()
    if why:
        pytest.skip(why)
    d = E2EDaemon()
    try:
        d.start()
        yield d
    finally:
        d.close()


@pytest.fixture
def tmp():
    p = Path(tempfile.mkdtemp(prefix="bvc", dir="/tmp"))
    try:
        yield p
    finally:
        shutil.rmtree(p, ignore_errors=True)


def dialogue(record: dict) -> list[dict]:
    """The record's conversation from the caller's first words on (a greeting, if the
    agent has one, comes before them)."""
    conv = record["conversation"]
    first = next((i for i, m in enumerate(conv) if m["role"] == "user"), len(conv))
    return conv[first:]


def user_and_assistant(record: dict) -> tuple[list[str], list[str]]:
    conv = dialogue(record)
    return ([m["content"] for m in conv if m["role"] == "user"],
            [m["text"] for m in conv if m["role"] == "assistant"])


def caller_turns(res: dict) -> list[dict]:
    """The client's turns without the bot's greeting (turn 0), if there was one."""
    return [t for t in res["turns"] if t["kind"] != "greeting"]


def record_turn(rec: dict, n: int) -> dict:
    """The record's latency row of the caller's ``n``-th turn (0-based; greetings skipped)."""
    rows = [t for t in rec["turns"] if t.get("t_turn_end") is not None]
    return rows[n]


def test_websocket_call_gets_an_english_answer(daemon, tmp):
    res, printed = brisvox_call(f"ws://127.0.0.1:{daemon.ws_port}/ws", "--agent", "local",
                                "--say", "What is the capital of France?", "--record", str(tmp / "bot.wav"),
                                tmp=tmp, daemon=daemon, steps=1)
    (turn,) = caller_turns(res)
    assert not turn["unanswered"], printed
    assert turn["latency_ms"] is not None and turn["latency_ms"] > 0
    assert is_english(turn["bot"]), printed
    assert "turn 1\n  caller: What is the capital of France?\n  bot:    " in printed
    assert "latency: caller stopped -> first bot audio" in printed
    from brisvox.client.speech import read_wav

    assert is_speech(read_wav(tmp / "bot.wav", 8000), 8000), "the bot's audio is not speech"
    daemon.record(res)  # written at hang-up
    rec = daemon.calls_show(res["call_id"])  # the state dir comes from the daemon's config
    users, answers = user_and_assistant(rec)
    assert rec["call_id"] == res["call_id"]
    assert rec["transport"] == "native" and rec["agent"] == "local"
    # the caller's words were transcribed and reached the LLM request (the context is the request)
    assert len(users) == 1 and asked_the_question(users[0]), users
    assert len(answers) == 1 and answers[0].strip()
    # what the record says the bot answered is what the caller heard
    assert heard_what_was_said(answers[0], turn["bot"]), (answers[0], turn["bot"])
    assert record_turn(rec, 0)["response_ms"] is not None


BARESIP_CONFIG = """\
module_path		/usr/lib/baresip/modules
poll_method		epoll
sip_listen		127.0.0.1:{sip_port}
call_local_timeout	30
audio_buffer		20-160
audio_source		aufile,{source}
audio_alert		aufile,{source}
ausrc_srate		8000
auplay_srate		8000
ausrc_channels		1
auplay_channels		1
rtp_ports		{rtp_lo}-{rtp_hi}
snd_path		{dump}
module			g711.so
module			aufile.so
module			sndfile.so
module_tmp		account.so
module_app		menu.so
"""


@pytest.mark.serial  # the bot's answer must reach baresip within the 8 s its file lasts
def test_sip_call_from_baresip(daemon, tmp):
    if shutil.which("baresip") is None:
        pytest.skip("baresip is not installed (Debian package baresip-core)")
    from brisvox.client.speech import Voice, pad, read_wav, write_wav
    from brisvox.client.transcribe import Transcriber

    voice = Voice("auto")
    try:
        question = voice.synthesize("What is the capital of France?", 8000)
    finally:
        voice.close()
    src = tmp / "question.wav"
    write_wav(src, pad(question, 8000, 0.5, 8.0), 8000)  # baresip hangs up at the end of the file
    dump = tmp / "dump"
    dump.mkdir()
    lo, hi = rtp_range(20)
    (tmp / "config").write_text(BARESIP_CONFIG.format(sip_port=free_port(), source=src, rtp_lo=lo, rtp_hi=hi,
                                                      dump=dump))
    (tmp / "accounts").write_text("<sip:caller@127.0.0.1>;regint=0\n")
    (tmp / "contacts").write_text("")
    before = {r["call_id"] for r in read_records(daemon.records_dir)}
    out = run_baresip(tmp, f"sip:local@127.0.0.1:{daemon.sip_port}")
    assert "Call established" in out and "terminated" in out, out[-3000:]
    decoded = sorted(dump.glob("dump-*-dec.wav"))
    assert decoded, out[-3000:]
    heard = read_wav(decoded[-1], 8000)
    assert is_speech(heard, 8000), "baresip received no speech"  # the bot spoke
    text = Transcriber().text(heard, 8000)
    assert is_english(text), text
    rec = _new_sip_record(daemon, before)
    assert rec["agent"] == "local"
    users, answers = user_and_assistant(rec)
    assert len(users) >= 1 and asked_the_question(users[0]), users
    assert answers and answers[0].strip()
    assert heard_what_was_said(answers[0], text), (answers[0], text)


def run_baresip(conf: Path, uri: str, limit_s: float = 40.0) -> str:
    """Dial ``uri`` with baresip; stop it (by pid) once the call has ended; return its output."""
    log = conf / "baresip.log"
    with open(log, "wb") as f:
        p = subprocess.Popen(["baresip", "-f", str(conf), "-e", f"/dial {uri}", "-t", str(int(limit_s))],
                             stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline and p.poll() is None:
            if b"terminated" in log.read_bytes():
                break
            time.sleep(0.2)
    finally:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
    return log.read_text(errors="replace")


def _new_sip_record(daemon, before: set[str]) -> dict:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rows = [r for r in read_records(daemon.records_dir) if r["call_id"] not in before and r["transport"] == "sip"]
        if rows:
            return rows[-1]
        time.sleep(0.2)
    raise AssertionError(f"no new SIP call record\n{daemon.logs()}")


def test_sip_call_dtmf_reaches_the_agent(daemon, tmp):
    res, printed = brisvox_call(f"sip:local@127.0.0.1:{daemon.sip_port}",
                                "--say", "Hello, can you hear me?", "--press", "5", tmp=tmp, daemon=daemon, steps=2)
    line, press = caller_turns(res)
    assert not line["unanswered"] and is_english(line["bot"]), printed
    assert press["kind"] == "press" and "caller: pressed 5" in printed
    assert res["stats"]["dtmf_packets"] >= 5
    rec = daemon.record(res)
    assert rec["transport"] == "sip" and rec["end_reason"] == "bye"
    st = rec["stats"]
    assert st["pump"]["dtmf"] == 1  # the actor got the digit from the gateway
    assert st["turn"]["dtmf"] == 1  # the turn driver re-tagged it with its epoch
    assert st["llm"]["dtmf"] == 1  # ... and it reached the LLM runner


@pytest.mark.serial  # bot audio stopped within 300 ms
def test_barge_in_stops_the_bot_and_the_context_holds_what_was_heard(daemon, tmp):
    res, printed = brisvox_call(f"ws://127.0.0.1:{daemon.ws_port}/twilio", "--agent", "local",
                                "--say", "Tell me a long story about a brave knight and a dragon.",
                                "--barge-in", "1.0",
                                "--say", "Stop please and tell me what two plus two is", tmp=tmp, daemon=daemon, steps=2)
    first, second = caller_turns(res)
    assert first["barged"], printed
    assert first["clear"], f"no clear reached the client\n{printed}"
    assert first["stop_ms"] is not None and first["stop_ms"] >= 0, \
        f"the bot's answer had ended before the barge-in; nothing was tested\n{printed}"
    # the requirement, measured at the client: caller's speech start -> bot audio stopped
    print(f"barge-in: bot audio stopped at the client {first['stop_ms']:.0f} ms after the caller started")
    assert first["stop_ms"] <= SPEECH_TO_STOP_MS, (first["stop_ms"], printed)
    rec = daemon.record(res)
    assert rec["stats"]["turn"]["interrupts"] == 1
    assert rec["stats"]["turn"]["output_pauses"] >= 1  # held at the candidate's start, then cut
    t_int = record_turn(rec, 0)["t_interrupted"]
    assert record_turn(rec, 0)["interrupted"] and t_int is not None
    stopped = res["t0_monotonic"] + first["bot_end_s"]
    decision_to_stop_ms = (stopped - t_int) * 1000
    assert decision_to_stop_ms <= DECISION_TO_STOP_MS, (decision_to_stop_ms, printed)
    users, answers = user_and_assistant(rec)
    # the second user turn is the caller's second line (Whisper tiny may mishear any one
    # word of it, e.g. "two plus two" as "to plus do": judge by word overlap)
    second = set(words(users[1].lower().replace("2", "two"))) if len(users) == 2 else set()
    assert len(users) == 2 and len(second & {"stop", "please", "tell", "what", "two", "plus"}) >= 3, users
    cut = words(answers[0])
    heard = words(first["bot"])
    assert len(answers) == 2
    # the context keeps what the caller heard: the cut answer's words are the words the
    # client received before the stop (Whisper on the client's recording), +-3 for the
    # word being spoken at the cut and recognition slips
    assert abs(len(cut) - len(heard)) <= 3, (answers[0], first["bot"])
    assert len(set(cut[:3]) & set(heard[:4])) >= 1, (answers[0], first["bot"])


@pytest.mark.serial  # bot audio stopped within 300 ms of the decision
def test_booking_happens_once_across_a_barge_in(daemon, tmp):
    res, printed = brisvox_call(f"ws://127.0.0.1:{daemon.ws_port}/ws", "--agent", "booking_e2e",
                                "--say", "I would like to book a table, please.",
                                "--barge-in", "1.5",
                                "--say", "Wait a moment I have a question first",
                                "--say", "Please book the table for me.", tmp=tmp, daemon=daemon, steps=3)
    first, second, third = caller_turns(res)
    assert first["barged"] and first["clear"], printed
    assert not second["unanswered"] and not third["unanswered"], printed
    rec = daemon.record(res)
    assert record_turn(rec, 0)["interrupted"]
    t_int = record_turn(rec, 0)["t_interrupted"]
    assert (res["t0_monotonic"] + first["bot_end_s"] - t_int) * 1000 <= DECISION_TO_STOP_MS
    # the barge-in came while the first booking was still running (it takes 3 s): the engine
    # answered that call "interrupted" and let it finish
    book = [t for t in rec["tools"] if t["name"] == "book_table"]
    users = [m.get("content") for m in dialogue(rec) if m["role"] == "user"]
    assert len(book) == 2 and book[0]["outcome"] == "interrupted", (rec["tools"], users)
    # the store's own counter: one booking, across the barge-in and the caller asking again
    state = daemon.booking()
    assert state["writes"] == 1, state
    assert len(state["bookings"]) == 1 and state["bookings"][0]["name"] == "Anna"
    keys = [r["key"] for r in state["runs"]]
    assert len(keys) == len(set(keys)), f"a tool call ran twice: {state['runs']}"
    assert state["runs"][0]["already_booked"] is False
    assert all(r["already_booked"] for r in state["runs"][1:])  # any later run found the booking
    # ... and its result reached the context exactly once
    conv = dialogue(rec)
    texts = [m.get("content") or m.get("text") or "" for m in conv]
    assert sum(t.count("BK-1001") for t in texts) == 1, conv
    # the first answer was cut where the caller talked over it: a strict prefix of the script,
    # matching the words the client heard before the stop (+-3)
    assistant = [m for m in conv if m["role"] == "assistant"]
    cut = words(assistant[0]["text"])
    full = words(BOOK_FIRST)
    assert 0 < len(cut) < len(full) and cut == full[: len(cut)], assistant[0]["text"]
    heard = words(first["bot"])
    assert abs(len(cut) - len(heard)) <= 3, (assistant[0]["text"], first["bot"])
    # the confirmation (the round after the tool) reached the caller
    assert "forward to seeing you" in third["bot"].lower(), printed
