"""The Gemini Live S2S adapter against a loopback server speaking BidiGenerateContent
(:class:`bench.harness.s2s_gemini.FakeGeminiLive`): real sockets, binary JSON frames as Gemini
sends them, small timeouts.

What each test proves:

* set-up: model path, voice, instructions, function declarations, activity detection per
  turn-detection mode, transcription on, the resumption handle, ``extra`` merged; the key in
  ``x-goog-api-key``; the session's audio formats; the history replayed as ONE clientContent
  (``turnComplete`` false) in conversation order before ``connect`` returns.
* audio in: ``realtimeInput.audio`` with the bytes intact and ``audio/pcm;rate=16000``.
* brisvox turns: ``activityStart`` / ``activityEnd``, idempotent, cancel = activityStart
  only outside an activity; nothing on the wire in provider mode.
* a model turn -> Started, Audio, OutputTranscript, Done (usage) under minted ids, also with
  the transcript first, everything bundled, or text frames; input transcription deltas + final.
* barge-in (Gemini VAD and brisvox cancel): Interrupted then Done cancelled; audio arriving
  after ``interrupted`` keeps the cancelled ids (the stage drops it by epoch).
* tools: one S2sToolCall per function call (args JSON), also split and with a 2.5-style
  turnComplete; one toolResponse in call order; Gemini continues by itself;
  toolCallCancellation -> S2sToolCancelled.
* truncate and send_note: the documented clientContent notes (a note waits for the turn end).
* resumption: S2sResumable, a reconnect with the handle skips the replay and resumes.
* faults: goAway non-fatal; a cut / 1011 close gives exactly one S2sClosed(error), sends
  raise ``closed``; silent set-up -> ``timeout`` within the connect timeout; HTTP 403 ->
  ``auth``; a close instead of setupComplete -> ``bad_request``; garbage, unknown, bad base64
  and oversized frames counted in ``dropped`` while the turn completes.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import numpy as np
import orjson
import pytest

from bench.harness.s2s_gemini import FakeGeminiLive, Say, pcm
from brisvox.providers.convert_gemini import CALL_OPENED
from brisvox.providers.s2s.base import (
    ProviderError,
    S2sAudio,
    S2sClosed,
    S2sConfig,
    S2sError,
    S2sInputTranscript,
    S2sInterrupted,
    S2sItem,
    S2sOutputTranscript,
    S2sResponseDone,
    S2sResponseStarted,
    S2sResumable,
    S2sSession,
    S2sTool,
    S2sToolCall,
    S2sToolCancelled,
    S2sToolResult,
)
from brisvox.providers.s2s.gemini_live import API_PATH, GeminiLive, GeminiLiveSession, truncate_note

pytestmark = pytest.mark.timeout(30)

SPEECH_20MS = np.full(320, 800, dtype=np.int16).tobytes()  # 16 kHz
SILENCE_20MS = bytes(640)
SCHEMA = {"type": "object", "properties": {"date": {"type": "string"}}, "required": ["date"]}
HELLO = (Say(200, "Hello there, how can I help?"),)
LONG = (Say(2000, "This is a long answer that the caller will cut short."),)
CALLS = (("c1", "lookup", {"q": "x"}), ("c2", "book", {"n": 2}))
TOOLS = (Say(80, "Let me check.", calls=CALLS), Say(120, "Booked."))


def cfg(**kw: Any) -> S2sConfig:
    return S2sConfig(**{"turn_detection": "brisvox", **kw})


async def opened(srv: FakeGeminiLive, config: S2sConfig, timeout: float = 2.0) -> tuple[GeminiLiveSession, Any]:  # noqa: ASYNC109
    s = await GeminiLive("gk-1", base_url=srv.url).connect(config, timeout)
    return s, s.events().__aiter__()


async def take(it: Any, until: Any, limit: float = 2.0) -> list[Any]:
    """Events up to (and with) the first one ``until(ev)`` accepts (a type or a predicate)."""
    out: list[Any] = []
    pred = (lambda e: isinstance(e, until)) if isinstance(until, type) else until

    async def go() -> None:
        async for ev in it:
            out.append(ev)
            if pred(ev):
                return

    await asyncio.wait_for(go(), limit)
    return out


async def turn(s: GeminiLiveSession, speech_ms: int = 100) -> None:
    """A brisvox-mode caller turn: activityStart, speech, activityEnd."""
    await s.user_started(1.0)
    for _ in range(speech_ms // 20):
        s.send_audio(SPEECH_20MS)
    await s.user_ended(1.0)


def speak(s: GeminiLiveSession, speech_ms: int, silence_ms: int = 0) -> None:
    for _ in range(speech_ms // 20):
        s.send_audio(SPEECH_20MS)
    for _ in range(silence_ms // 20):
        s.send_audio(SILENCE_20MS)


def done(rid: str) -> Any:
    return lambda e: isinstance(e, S2sResponseDone) and e.response_id == rid


# -- set-up and history ----------------------------------------------------------------------------


def test_setup_content_in_provider_mode() -> None:
    async def main() -> tuple[FakeGeminiLive, GeminiLiveSession]:
        async with FakeGeminiLive() as srv:
            config = S2sConfig(model="gemini-x", voice="Kore", instructions="Be brief.",
                               tools=(S2sTool("book", "Book a table", SCHEMA),),
                               extra={"contextWindowCompression": {"slidingWindow": {}},
                                      "generationConfig": {"temperature": 0.4}})
            s, _ = await opened(srv, config)
            await s.close(1.0)
            return srv, s

    srv, s = asyncio.run(main())
    setup = srv.log.setups[0]
    assert setup["model"] == "models/gemini-x"
    assert setup["generationConfig"] == {"responseModalities": ["AUDIO"], "temperature": 0.4, "speechConfig": {
        "voiceConfig": {"prebuiltVoiceConfig": {"voiceName": "Kore"}}}}
    assert setup["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert setup["tools"] == [{"functionDeclarations": [
        {"name": "book", "description": "Book a table", "parametersJsonSchema": SCHEMA}]}]
    assert setup["realtimeInputConfig"] == {"automaticActivityDetection": {"disabled": False}}
    assert setup["inputAudioTranscription"] == {} and setup["outputAudioTranscription"] == {}
    assert setup["sessionResumption"] == {}
    assert setup["contextWindowCompression"] == {"slidingWindow": {}}
    assert srv.log.paths[0] == API_PATH and srv.log.headers[0]["x-goog-api-key"] == "gk-1"
    assert srv.log.kinds == ["setup"]  # no history, nothing else
    assert isinstance(s, S2sSession)
    assert (s.input_rate, s.input_encoding, s.output_rate, s.supports_truncate) == (16000, "pcm16", 24000, False)


def test_setup_in_brisvox_mode_with_a_resumption_handle() -> None:
    async def main() -> dict[str, Any]:
        async with FakeGeminiLive() as srv:
            s, _ = await opened(srv, cfg(resume_handle="hnd-9"))
            await s.close(1.0)
            return srv.log.setups[0]

    setup = asyncio.run(main())
    assert setup["model"] == "models/gemini-live-2.5-flash-preview"
    assert setup["realtimeInputConfig"] == {"automaticActivityDetection": {"disabled": True}}
    assert setup["sessionResumption"] == {"handle": "hnd-9"}
    assert "tools" not in setup and "systemInstruction" not in setup and "speechConfig" not in setup["generationConfig"]


def test_history_is_replayed_as_one_client_content_in_order() -> None:
    history = (S2sItem("assistant", "Hi, Luigi's."), S2sItem("user", "A table for two."),
               S2sItem("assistant", "Let me look."),
               S2sItem("tool_call", call_id="c7", name="lookup", arguments='{"n": 2}'),
               S2sItem("tool_result", call_id="c7", name="lookup", output='{"free": true}'),
               S2sItem("assistant", "We have a table."), S2sItem("user", "Great."))

    async def main() -> FakeGeminiLive:
        async with FakeGeminiLive() as srv:
            s, _ = await opened(srv, cfg(history=history))
            await s.close(1.0)
            return srv

    srv = asyncio.run(main())
    assert srv.log.kinds == ["setup", "clientContent"]
    assert srv.log.client_contents[0] == {"turnComplete": False, "turns": [
        {"role": "user", "parts": [{"text": CALL_OPENED}]},
        {"role": "model", "parts": [{"text": "Hi, Luigi's."}]},
        {"role": "user", "parts": [{"text": "A table for two."}]},
        {"role": "model", "parts": [{"text": "Let me look."},
                                    {"functionCall": {"name": "lookup", "args": {"n": 2}, "id": "c7"}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "lookup", "response": {"free": True}, "id": "c7"}}]},
        {"role": "model", "parts": [{"text": "We have a table."}]},
        {"role": "user", "parts": [{"text": "Great."}]}]}


# -- audio in and brisvox turns ------------------------------------------------------------------------


def test_audio_goes_out_as_realtime_input_intact() -> None:
    chunks = [bytes([i]) * 640 for i in range(1, 11)]

    async def main() -> FakeGeminiLive:
        async with FakeGeminiLive() as srv:
            s, _ = await opened(srv, cfg())
            for c in chunks:
                s.send_audio(c)
            await s.flush_audio(1.0)
            await s.close(1.0)
            return srv

    srv = asyncio.run(main())
    assert bytes(srv.log.audio) == b"".join(chunks)
    assert srv.log.audio_mimes == {"audio/pcm;rate=16000"}
    assert srv.log.kinds == ["setup"] + ["audio"] * 10


def test_activity_signals_are_idempotent() -> None:
    async def main() -> tuple[list[str], list[str]]:
        async with FakeGeminiLive() as srv:
            s, it = await opened(srv, cfg())
            await s.user_started(1.0)
            await s.user_started(1.0)  # already open: nothing
            s.send_audio(SPEECH_20MS)
            await s.user_ended(1.0)
            await s.user_ended(1.0)  # no activity: nothing
            evs = await take(it, S2sResumable)  # the empty answer to the turn (script exhausted)
            assert not any(isinstance(e, S2sResponseStarted | S2sResponseDone) for e in evs)
            await s.cancel_response(1.0)  # outside an activity: activityStart
            await s.user_started(1.0)  # already open: nothing
            await s.cancel_response(1.0)  # already open: nothing
            await s.user_ended(1.0)
            await s.close(1.0)
            brisvox = list(srv.log.kinds)
        async with FakeGeminiLive() as srv2:
            p, _ = await opened(srv2, cfg(turn_detection="provider"))
            await p.user_started(1.0)
            await p.cancel_response(1.0)
            await p.user_ended(1.0)
            await p.close(1.0)
            return brisvox, list(srv2.log.kinds)

    brisvox, provider = asyncio.run(main())
    assert brisvox == ["setup", "activityStart", "audio", "activityEnd", "activityStart", "activityEnd"]
    assert provider == ["setup"]


# -- model turns -------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,text_frames", [("", False), ("transcript_first", False), ("bundled", False),
                                              ("", True)])
def test_a_model_turn_maps_to_started_audio_transcript_done(mode: str, text_frames: bool) -> None:
    async def main() -> list[Any]:
        async with FakeGeminiLive(mode, (HELLO,), heard=("Book a table",), text_frames=text_frames) as srv:
            s, it = await opened(srv, cfg())
            await turn(s)
            evs = await take(it, S2sResponseDone)
            await s.close(1.0)
            return evs

    evs = asyncio.run(main())
    heard = [e for e in evs if isinstance(e, S2sInputTranscript)]
    assert "".join(e.text for e in heard if not e.final) == "Book a table"
    assert [e for e in heard if e.final] == [S2sInputTranscript("Book a table", True)]
    model = [e for e in evs if not isinstance(e, S2sInputTranscript)]
    assert model[0] == S2sResponseStarted("gl-r1")
    assert model[-1] == S2sResponseDone("gl-r1", "completed", 100, 5)
    body = model[1:-1]
    assert body and all(isinstance(e, S2sAudio | S2sOutputTranscript) for e in body)
    assert all((e.response_id, e.item_id) == ("gl-r1", "gl-i1") for e in body)
    assert b"".join(e.pcm for e in body if isinstance(e, S2sAudio)) == pcm(200, 1000)
    assert "".join(e.text for e in body if isinstance(e, S2sOutputTranscript)) == "Hello there, how can I help?"
    first = next(e for e in body if isinstance(e, S2sAudio | S2sOutputTranscript))
    assert isinstance(first, S2sOutputTranscript if mode == "transcript_first" else S2sAudio)


def test_gemini_vad_barge_in_interrupts_then_the_next_turn_is_a_new_response() -> None:
    async def main() -> tuple[list[Any], FakeGeminiLive]:
        async with FakeGeminiLive("", (LONG, HELLO), pace=0.01) as srv:
            s, it = await opened(srv, S2sConfig())  # provider mode: the fake's energy VAD
            speak(s, 200, 300)
            evs = await take(it, S2sAudio)
            speak(s, 100)  # the caller talks over the bot
            evs += await take(it, done("gl-r1"))
            speak(s, 0, 300)
            evs += await take(it, done("gl-r2"))
            await s.close(1.0)
            return evs, srv

    evs, srv = asyncio.run(main())
    i = evs.index(S2sInterrupted("gl-r1"))
    assert evs[i + 1] == S2sResponseDone("gl-r1", "cancelled")
    assert [e for e in evs if isinstance(e, S2sResponseStarted)] == [S2sResponseStarted("gl-r1"),
                                                                       S2sResponseStarted("gl-r2")]
    assert evs[-1] == S2sResponseDone("gl-r2", "completed", 100, 5)
    assert srv.log.interrupts == 1


@pytest.mark.parametrize("late", [False, True])
def test_brisvox_cancel_interrupts_and_late_audio_keeps_the_cancelled_ids(late: bool) -> None:
    async def main() -> tuple[list[Any], list[str]]:
        async with FakeGeminiLive("late_audio" if late else "", (LONG, HELLO), pace=0.01) as srv:
            s, it = await opened(srv, cfg())
            await turn(s)
            evs = await take(it, S2sAudio)
            await s.cancel_response(1.0)
            evs += await take(it, done("gl-r1"))
            await asyncio.sleep(0.1)  # the late chunk (if any) arrives
            await s.user_ended(1.0)
            evs += await take(it, done("gl-r2"))
            await s.close(1.0)
            return evs, srv.log.kinds

    evs, kinds = asyncio.run(main())
    i = evs.index(S2sInterrupted("gl-r1"))
    assert evs[i + 1] == S2sResponseDone("gl-r1", "cancelled")
    after = evs[i + 2:evs.index(S2sResponseStarted("gl-r2"))]
    stale = [e for e in after if isinstance(e, S2sAudio)]
    assert [(e.response_id, e.item_id, e.pcm) for e in stale] == ([("gl-r1", "gl-i1", pcm(40, 77))] if late else [])
    assert [k for k in kinds if k.startswith("activity")] == ["activityStart", "activityEnd"] * 2


# -- tools ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["", "split_tool", "tool_turn_complete"])
def test_tool_calls_results_and_the_continuation(mode: str) -> None:
    seen: set[str] = set()

    def calls_done(e: Any) -> bool:
        if isinstance(e, S2sToolCall):
            seen.add(e.call_id)
        return isinstance(e, S2sResponseDone) and seen >= {"c1", "c2"}

    async def main() -> tuple[list[Any], list[Any], FakeGeminiLive]:
        async with FakeGeminiLive(mode, (TOOLS,)) as srv:
            s, it = await opened(srv, cfg())
            await turn(s)
            evs = await take(it, calls_done)
            await s.send_tool_results([S2sToolResult("c1", "lookup", '{"ok": true}'),
                                       S2sToolResult("c2", "book", "[1, 2]")], 1.0)
            await s.create_response(1.0)  # a no-op: Gemini goes on by itself
            rest = await take(it, lambda e: isinstance(e, S2sResponseDone))
            await s.close(1.0)
            return evs, rest, srv

    evs, rest, srv = asyncio.run(main())
    calls = [e for e in evs if isinstance(e, S2sToolCall)]
    assert [(c.call_id, c.name, orjson.loads(c.arguments)) for c in calls] == [
        ("c1", "lookup", {"q": "x"}), ("c2", "book", {"n": 2})]
    for c in calls:  # every call precedes the Done of its response
        assert any(isinstance(e, S2sResponseDone) and e.response_id == c.response_id
                   for e in evs[evs.index(c):])
    if mode == "split_tool":
        assert [c.response_id for c in calls] == ["gl-r1", "gl-r2"]
    else:
        assert {c.response_id for c in calls} == {"gl-r1"}
        assert [e for e in evs if isinstance(e, S2sResponseDone)] == [S2sResponseDone("gl-r1", "completed")]
    assert srv.log.tool_responses == [{"functionResponses": [
        {"id": "c1", "name": "lookup", "response": {"ok": True}},
        {"id": "c2", "name": "book", "response": {"result": [1, 2]}}]}]
    assert [k for k in srv.log.kinds if k not in ("audio",)][-1] == "toolResponse"
    rid = rest[-1].response_id
    assert rid == ("gl-r3" if mode == "split_tool" else "gl-r2")
    assert S2sResponseStarted(rid) in rest and rest[-1] == S2sResponseDone(rid, "completed", 100, 5)
    assert b"".join(e.pcm for e in rest if isinstance(e, S2sAudio)) == pcm(120, 1000)


def test_tool_call_cancellation() -> None:
    async def main() -> list[Any]:
        async with FakeGeminiLive("", (TOOLS,)) as srv:
            s, it = await opened(srv, cfg())
            await turn(s)
            evs = await take(it, S2sResponseDone)
            await s.user_started(1.0)  # the caller speaks while the tools run
            evs += await take(it, S2sToolCancelled)
            await s.close(1.0)
            assert srv.log.cancellations == 1
            return evs

    evs = asyncio.run(main())
    assert evs[-1] == S2sToolCancelled(("c1", "c2"))


# -- notes -------------------------------------------------------------------------------------------


def test_truncate_sends_the_heard_text_note() -> None:
    async def main() -> list[dict[str, Any]]:
        async with FakeGeminiLive() as srv:
            s, _ = await opened(srv, cfg())
            await s.truncate("gl-i1", 1200, "Hello  there,\nhow", 1.0)
            await s.truncate("gl-i2", 0, "", 1.0)
            await s.close(1.0)
            return srv.log.client_contents

    contents = asyncio.run(main())
    notes = [c["turns"][0]["parts"][0]["text"] for c in contents]
    assert contents[0] == {"turns": [{"role": "user", "parts": [{"text": truncate_note("Hello there, how")}]}],
                           "turnComplete": False}
    assert '"Hello there, how"' in notes[0] and "not said" in notes[0] and notes[0].startswith("[")
    assert "none of it was said" in notes[1]


def test_send_note_waits_for_the_turn_end() -> None:
    async def main() -> tuple[list[str], list[str]]:
        async with FakeGeminiLive("", (LONG,), pace=0.01) as srv:  # ~0.5 s of streaming
            s, it = await opened(srv, cfg())
            await turn(s)
            await take(it, S2sAudio)
            await s.send_note("[The booking tool answered late: booked.]", 1.0)
            await asyncio.sleep(0.1)  # the answer is still streaming: a note sent now would be logged
            during = list(srv.log.kinds)
            await take(it, S2sResponseDone)
            await asyncio.sleep(0.1)
            await s.close(1.0)
            return during, [c["turns"][0]["parts"][0]["text"] for c in srv.log.client_contents]

    during, notes = asyncio.run(main())
    assert "clientContent" not in during
    assert notes == ["[The booking tool answered late: booked.]"]


def test_a_note_waits_for_the_tool_results_turn() -> None:
    async def main() -> list[str]:
        async with FakeGeminiLive("", (TOOLS,)) as srv:
            s, it = await opened(srv, cfg())
            await turn(s)
            await take(it, S2sResponseDone)  # the calls' response
            await s.send_note("[A note.]", 1.0)  # Gemini awaits the results: held
            await s.send_tool_results([S2sToolResult("c1", "lookup", "{}"), S2sToolResult("c2", "book", "{}")], 1.0)
            await take(it, S2sResponseDone)  # the continuation
            await asyncio.sleep(0.1)
            await s.close(1.0)
            return [k for k in srv.log.kinds if k != "audio"]

    assert asyncio.run(main())[-2:] == ["toolResponse", "clientContent"]


# -- resumption and goAway --------------------------------------------------------------------------


def test_resumption_handle_and_a_reconnect_that_skips_the_replay() -> None:
    async def main() -> tuple[list[Any], list[Any], FakeGeminiLive, str]:
        async with FakeGeminiLive("", (HELLO, HELLO)) as srv:
            s, it = await opened(srv, cfg())
            await turn(s)
            first = await take(it, S2sResumable)
            handle = s.resume_handle
            await s.close(1.0)
            history = (S2sItem("user", "Hi"), S2sItem("assistant", "Hello there, how can I help?"))
            s2, it2 = await opened(srv, cfg(resume_handle=handle, history=history))
            await turn(s2)
            second = await take(it2, S2sResponseDone)
            await s2.close(1.0)
            return first, second, srv, handle

    first, second, srv, handle = asyncio.run(main())
    assert first[-1] == S2sResumable("h1") and handle == "h1"
    assert srv.log.setups[1]["sessionResumption"] == {"handle": "h1"}
    assert srv.log.resumed == ["h1"] and srv.log.client_contents == []  # no replay
    audio = b"".join(e.pcm for e in second if isinstance(e, S2sAudio))
    assert audio == pcm(200, 1001)  # the script's second answer: the position was restored


def test_go_away_is_a_non_fatal_error() -> None:
    async def main() -> list[Any]:
        async with FakeGeminiLive("go_away", (HELLO,)) as srv:
            s, it = await opened(srv, cfg())
            evs = await take(it, S2sError)
            await turn(s)
            evs += await take(it, S2sResponseDone)
            await s.close(1.0)
            return evs

    evs = asyncio.run(main())
    assert evs[0] == S2sError("go_away", "the server ends the session in 10s", fatal=False)
    assert evs[-1] == S2sResponseDone("gl-r1", "completed", 100, 5)


# -- faults ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["cut", "error_close"])
def test_a_dead_socket_ends_with_exactly_one_closed(mode: str) -> None:
    async def main() -> tuple[list[Any], list[str]]:
        async with FakeGeminiLive(mode, (LONG,)) as srv:
            s, it = await opened(srv, cfg())
            await turn(s)
            evs: list[Any] = []

            async def drain() -> None:
                async for ev in it:
                    evs.append(ev)

            await asyncio.wait_for(drain(), 2.0)  # the iterator ends
            kinds: list[str] = []
            for call in (lambda: s.send_audio(SPEECH_20MS), lambda: s.user_started(1.0),
                         lambda: s.send_tool_results([S2sToolResult("c", "n", "{}")], 1.0)):
                try:
                    r = call()
                    if r is not None:
                        await r
                    kinds.append("none")
                except ProviderError as e:
                    kinds.append(e.kind)
            await s.close(1.0)
            await s.close(1.0)
            return evs, kinds

    evs, kinds = asyncio.run(main())
    closed = [e for e in evs if isinstance(e, S2sClosed)]
    assert len(closed) == 1 and evs[-1] is closed[0] and closed[0].error
    if mode == "error_close":
        assert closed[0].error == "closed: 1011"
    assert kinds == ["closed", "closed", "closed"]


@pytest.mark.serial_light  # times out within 0.8 s
def test_a_setup_never_answered_times_out_within_the_connect_timeout() -> None:
    async def main() -> tuple[str, float]:
        async with FakeGeminiLive("silent_setup") as srv:
            t0 = time.monotonic()
            try:
                await GeminiLive("k", base_url=srv.url).connect(cfg(), 0.5)
            except ProviderError as e:
                return e.kind, time.monotonic() - t0
            return "connected", 0.0

    kind, took = asyncio.run(main())
    assert kind == "timeout" and took < 0.8


@pytest.mark.parametrize("mode,kind", [("reject", "auth"), ("close_setup", "bad_request"),
                                       ("slow_setup", "connected")])
def test_refused_and_slow_setups(mode: str, kind: str) -> None:
    async def main() -> str:
        async with FakeGeminiLive(mode, setup_delay=0.3) as srv:
            try:
                s = await GeminiLive("k", base_url=srv.url).connect(cfg(), 1.5)
            except ProviderError as e:
                return e.kind
            await s.close(1.0)
            return "connected"

    assert asyncio.run(main()) == kind


def test_garbage_unknown_bad_base64_and_oversized_frames_are_counted_and_skipped() -> None:
    async def main() -> tuple[list[Any], int]:
        async with FakeGeminiLive("garbage,oversized", (HELLO,)) as srv:
            s, it = await opened(srv, cfg())
            await turn(s)
            evs = await take(it, S2sResponseDone)
            await s.close(1.0)
            return evs, s.dropped

    evs, dropped = asyncio.run(main())
    assert dropped == 5  # non-JSON, a JSON array, unknown keys, bad base64, > 1 MiB
    assert evs[-1] == S2sResponseDone("gl-r1", "completed", 100, 5)
    assert b"".join(e.pcm for e in evs if isinstance(e, S2sAudio)) == pcm(200, 1000)


def test_no_key_is_auth() -> None:
    with pytest.raises(ProviderError) as e:
        GeminiLive("")
    assert e.value.kind == "auth"


# -- live (the real service; skips without BRISVOX_LIVE_TESTS=1 and GEMINI_API_KEY) ------------------


def test_live_gemini_answers_a_turn() -> None:
    if os.environ.get("BRISVOX_LIVE_TESTS") != "1" or not os.environ.get("GEMINI_API_KEY"):
        pytest.skip("live test: set BRISVOX_LIVE_TESTS=1 and GEMINI_API_KEY to run it against gemini_live")
    key = os.environ["GEMINI_API_KEY"]
    model = os.environ.get("GEMINI_LIVE_MODEL", "gemini-live-2.5-flash-preview")

    async def main() -> list[Any]:
        p = GeminiLive(key, model=model)
        s = await p.connect(S2sConfig(turn_detection="brisvox", instructions="Answer in one short sentence.",
                                      history=(S2sItem("user", "Say hello."),)), 10.0)
        it = s.events().__aiter__()
        await s.user_started(5.0)
        t = np.arange(16000) / 16000.0
        tone = (np.sin(2 * np.pi * 220 * t) * 3000).astype(np.int16).tobytes()
        for i in range(0, len(tone), 640):
            s.send_audio(tone[i:i + 640])
            await asyncio.sleep(0.02)
        await s.user_ended(5.0)
        evs = await take(it, S2sResponseDone, 30.0)
        await s.close(2.0)
        return evs

    evs = asyncio.run(main())
    assert sum(len(e.pcm) for e in evs if isinstance(e, S2sAudio)) > 0
