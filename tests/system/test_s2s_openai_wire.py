"""The OpenAI Realtime speech-to-speech adapter against a loopback server speaking the Realtime
event protocol (:mod:`bench.harness.s2s_openai`): real sockets, real time, small timeouts.

What the tests prove: the set-up ``session.update`` (instructions, voice, tools, both turn
detection modes, μ-law passthrough) and the URL/credentials; the history replayed in order;
caller audio intact and in order, and ``user_ended`` = commit (after all queued audio) +
``response.create``; responses mapped to the contract's events in order (audio, transcript,
done with status and tokens); exactly one S2sToolCall per call, also when the done events are
reordered or missing; tool results on the wire without a ``response.create``; cancel only
for a response in flight (also one not announced yet), truncation's wire shape, audio of a
cancelled response passed on; a non-fatal error, a fatal one, a cut socket (one S2sClosed,
then ``closed``); set-up timeouts and rejections; garbage counted and survived; a stalled
socket drops caller audio without blocking. The live variant runs with BRISVOX_LIVE_TESTS=1
and OPENAI_API_KEY.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import numpy as np
import pytest

from bench.harness.s2s_openai import FakeRealtime, Scripted, ScriptedCall
from brisvox.providers.base import ProviderError
from brisvox.providers.s2s.base import (
    S2sAudio,
    S2sClosed,
    S2sConfig,
    S2sError,
    S2sEvent,
    S2sInputTranscript,
    S2sItem,
    S2sOutputTranscript,
    S2sProvider,
    S2sResponseDone,
    S2sResponseStarted,
    S2sSession,
    S2sSpeechStarted,
    S2sSpeechStopped,
    S2sTool,
    S2sToolCall,
    S2sToolResult,
)
from brisvox.providers.s2s.openai_realtime import OpenAiRealtime, OpenAiRealtimeSession

pytestmark = pytest.mark.timeout(30)

T = TypeVar("T")
BRISVOX = S2sConfig(turn_detection="brisvox")
TOOL = S2sTool("book_table", "Book a table.", {"type": "object", "properties": {"people": {"type": "integer"}}})


def run(main: Callable[[], Coroutine[Any, Any, T]], limit: float = 5.0) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(main(), limit)

    return asyncio.run(bounded())


async def opened(srv: FakeRealtime, config: S2sConfig = BRISVOX, timeout: float = 2.0,  # noqa: ASYNC109
                 **kw: Any) -> tuple[OpenAiRealtimeSession, AsyncIterator[S2sEvent]]:
    s = await OpenAiRealtime("sk-test", base_url=srv.url + "/v1/realtime", **kw).connect(config, timeout)
    return s, s.events().__aiter__()


async def until(it: AsyncIterator[S2sEvent], done: Callable[[S2sEvent], bool], limit: float = 2.0) -> list[S2sEvent]:
    """The events up to and including the first one ``done`` accepts."""
    out: list[S2sEvent] = []

    async def go() -> None:
        async for ev in it:
            out.append(ev)
            if done(ev):
                return
        raise AssertionError(f"the events ended first: {out}")

    await asyncio.wait_for(go(), limit)
    return out


async def drain(it: AsyncIterator[S2sEvent], limit: float = 2.0) -> list[S2sEvent]:
    """Every event until the iterator ends."""
    out: list[S2sEvent] = []

    async def go() -> None:
        async for ev in it:
            out.append(ev)

    await asyncio.wait_for(go(), limit)
    return out


def is_done(ev: S2sEvent) -> bool:
    return isinstance(ev, S2sResponseDone)


def done_of(evs: list[S2sEvent]) -> S2sResponseDone:
    """The last event, which must be the response's end."""
    assert isinstance(evs[-1], S2sResponseDone), evs[-1]
    return evs[-1]


def pcm(ms: int, value: int, rate: int = 24000) -> bytes:
    return np.full(rate * ms // 1000, value, dtype=np.int16).tobytes()


async def wait_log(cond: Callable[[], bool], limit: float = 1.0) -> None:
    for _ in range(int(limit / 0.01)):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the fake never saw it")


# -- set-up ----------------------------------------------------------------------------------


def test_setup_provider_mode_session_update() -> None:
    async def main() -> tuple[FakeRealtime, S2sSession]:
        async with FakeRealtime() as srv:
            cfg = S2sConfig(instructions="Be brief.", voice="marin", tools=(TOOL,), turn_detection="provider")
            s, _ = await opened(srv, cfg, model="gpt-realtime-test")
            await s.close(1.0)
            return srv, s

    srv, s = run(main)
    assert srv.log.paths[0] == "/v1/realtime?model=gpt-realtime-test"
    assert srv.log.headers[0]["authorization"] == "Bearer sk-test" and "openai-beta" not in srv.log.headers[0]
    assert srv.log.types[0] == "session.update"
    sess = srv.log.session
    assert sess["type"] == "realtime" and sess["instructions"] == "Be brief." and sess["output_modalities"] == ["audio"]
    assert sess["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert sess["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert sess["audio"]["input"]["transcription"]["model"]
    assert sess["audio"]["output"] == {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"}
    assert sess["tools"] == [{"type": "function", "name": "book_table", "description": "Book a table.",
                              "parameters": dict(TOOL.parameters)}] and sess["tool_choice"] == "auto"
    assert (s.input_rate, s.input_encoding, s.output_rate, s.supports_truncate) == (24000, "pcm16", 24000, True)
    assert isinstance(s, S2sSession) and isinstance(OpenAiRealtime("k"), S2sProvider)


def test_setup_brisvox_mode_with_g711_passthrough() -> None:
    async def main() -> tuple[FakeRealtime, S2sSession]:
        async with FakeRealtime() as srv:
            s, _ = await opened(srv, S2sConfig(turn_detection="brisvox", g711_passthrough=True))
            await s.close(1.0)
            return srv, s

    srv, s = run(main)
    assert srv.log.session["audio"]["input"]["turn_detection"] is None
    assert srv.log.session["audio"]["input"]["format"] == {"type": "audio/pcmu"}
    assert srv.log.session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert (s.input_rate, s.input_encoding, s.output_rate) == (8000, "g711_ulaw", 24000)


def test_history_replayed_in_order_after_the_setup() -> None:
    history = (S2sItem("user", "A table for two."), S2sItem("assistant", "For when?"),
               S2sItem("user", ""),  # nothing said: not replayed
               S2sItem("tool_call", call_id="c1", name="book_table", arguments='{"people": 2}'),
               S2sItem("tool_result", call_id="c1", name="book_table", output='{"ok": true}'))

    async def main() -> FakeRealtime:
        async with FakeRealtime() as srv:
            s, _ = await opened(srv, S2sConfig(turn_detection="brisvox", history=history))
            await wait_log(lambda: len(srv.log.of("conversation.item.create")) == 4)
            await s.close(1.0)
            return srv

    srv = run(main)
    assert srv.log.types == ["session.update"] + ["conversation.item.create"] * 4
    assert [e["item"] for e in srv.log.of("conversation.item.create")] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "A table for two."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "For when?"}]},
        {"type": "function_call", "call_id": "c1", "name": "book_table", "arguments": '{"people": 2}'},
        {"type": "function_call_output", "call_id": "c1", "output": '{"ok": true}'},
    ]


def test_slow_first_answer_within_the_timeout_works() -> None:
    async def main() -> float:
        async with FakeRealtime("slow_first", slow_first_s=0.3) as srv:
            t0 = time.monotonic()
            s, _ = await opened(srv, timeout=1.5)
            took = time.monotonic() - t0
            await s.close(1.0)
            return took

    assert 0.3 <= run(main) < 1.5


@pytest.mark.serial_light  # times out within 0.45-1.0 s
def test_never_answered_setup_times_out_within_the_connect_timeout() -> None:
    async def main() -> tuple[ProviderError, float]:
        async with FakeRealtime("silent") as srv:
            t0 = time.monotonic()
            with pytest.raises(ProviderError) as e:
                await opened(srv, timeout=0.5)
            return e.value, time.monotonic() - t0

    err, took = run(main)
    assert err.kind == "timeout" and 0.45 <= took < 1.0


@pytest.mark.parametrize("mode,kind", [("reject", "auth"), ("setup_auth", "auth"), ("setup_error", "bad_request")])
def test_rejected_setup(mode: str, kind: str) -> None:
    async def main() -> ProviderError:
        async with FakeRealtime(mode) as srv:
            with pytest.raises(ProviderError) as e:
                await opened(srv, timeout=1.0)
            return e.value

    err = run(main)
    assert err.kind == kind and not err.retryable


# -- audio in, turns ---------------------------------------------------------------------------


def test_audio_intact_and_user_ended_commits_after_it() -> None:
    chunks = [pcm(20, 100 + i) for i in range(30)]

    async def main() -> tuple[FakeRealtime, list[S2sEvent]]:
        async with FakeRealtime(script=(Scripted(audio_ms=200, transcript="Sure."),)) as srv:
            s, it = await opened(srv)
            await s.user_started(1.0)
            for c in chunks:
                s.send_audio(c)
            await s.user_ended(1.0)  # right after the last chunk: it must still precede the commit
            evs = await until(it, is_done)
            await s.close(1.0)
            return srv, evs

    srv, evs = run(main)
    assert bytes(srv.log.audio) == b"".join(chunks)
    assert srv.log.audio_at_commit == [len(b"".join(chunks))]
    assert srv.log.types[1:] == ["input_audio_buffer.append"] * 30 + ["input_audio_buffer.commit", "response.create"]
    assert evs[0] == S2sInputTranscript("book", final=False)
    assert S2sInputTranscript("book a table for two", final=True) in evs
    start = evs.index(S2sResponseStarted("resp_1"))
    assert [type(e) for e in evs[start:]] == [S2sResponseStarted, S2sAudio, S2sOutputTranscript, S2sAudio,
                                              S2sResponseDone]


def test_response_events_in_order_with_tokens() -> None:
    async def main() -> list[S2sEvent]:
        async with FakeRealtime(script=(Scripted(audio_ms=300, transcript="Hello there caller",
                                                 input_tokens=77, output_tokens=33),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            evs = await until(it, is_done)
            await s.close(1.0)
            return evs

    evs = run(main)
    assert evs[0] == S2sResponseStarted("resp_1") and evs[-1] == S2sResponseDone("resp_1", "completed", 77, 33)
    kinds = [type(e).__name__ for e in evs[1:-1]]
    assert kinds == ["S2sAudio", "S2sOutputTranscript"] * 3  # the fake interleaves them
    audio = [e for e in evs if isinstance(e, S2sAudio)]
    assert all(e.response_id == "resp_1" and e.item_id == "item_1" for e in audio)
    assert [np.frombuffer(e.pcm, dtype=np.int16)[0] for e in audio] == [100, 200, 300]
    assert sum(len(e.pcm) for e in audio) == 300 * 24 * 2
    assert "".join(e.text for e in evs if isinstance(e, S2sOutputTranscript)) == "Hello there caller"


@pytest.mark.parametrize("status", ["incomplete", "failed"])
def test_response_done_status_passed_on(status: str) -> None:
    async def main() -> list[S2sEvent]:
        async with FakeRealtime(script=(Scripted(audio_ms=100, status=status, input_tokens=5, output_tokens=1),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            evs = await until(it, is_done)
            await s.close(1.0)
            return evs

    assert run(main)[-1] == S2sResponseDone("resp_1", status, 5, 1)


def test_provider_vad_turn_and_barge_in() -> None:
    cfg = S2sConfig(turn_detection="provider", extra={"vad": {"silence_duration_ms": 200}})

    async def main() -> tuple[list[S2sEvent], list[S2sEvent]]:
        script = (Scripted(audio_ms=2000, transcript="A long answer", realtime=True),)
        async with FakeRealtime(script=script) as srv:
            s, it = await opened(srv, cfg)
            for _ in range(10):
                s.send_audio(pcm(40, 3000))
            for _ in range(6):
                s.send_audio(pcm(40, 0))
            first = await until(it, lambda e: isinstance(e, S2sAudio))
            s.send_audio(pcm(40, 3000))  # the caller speaks over the answer
            second = await until(it, is_done)
            await s.close(1.0)
            return first, second

    first, second = run(main)
    assert first[0] == S2sSpeechStarted(0) and first[1] == S2sSpeechStopped(600)
    assert S2sInputTranscript("book a table for two", True) in first
    assert S2sResponseStarted("resp_1") in first
    assert S2sSpeechStarted(640) in second and done_of(second).status == "cancelled"


# -- tools -------------------------------------------------------------------------------------

CALLS = (ScriptedCall("book_table", '{"people": 2, "time": "19:00"}'),
         ScriptedCall("send_sms", '{"to": "+4412345", "text": "Booked"}'))


@pytest.mark.parametrize("mode,dropped", [("", 0), ("reorder", 2), ("deltas_only", 0)])
def test_one_tool_call_per_call_id(mode: str, dropped: int) -> None:
    async def main() -> tuple[list[S2sEvent], int]:
        async with FakeRealtime(mode, script=(Scripted(audio_ms=0, calls=CALLS),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            evs = await until(it, is_done)
            await s.close(1.0)
            return evs, s.dropped

    evs, n_dropped = run(main)
    calls = [e for e in evs if isinstance(e, S2sToolCall)]
    assert calls == [S2sToolCall("resp_1", "call_1_0", "book_table", CALLS[0].arguments),
                     S2sToolCall("resp_1", "call_1_1", "send_sms", CALLS[1].arguments)]
    assert isinstance(evs[-1], S2sResponseDone) and n_dropped == dropped


def test_tool_results_on_the_wire_then_the_script_continues() -> None:
    async def main() -> tuple[FakeRealtime, list[str], list[S2sEvent]]:
        script = (Scripted(audio_ms=0, calls=CALLS), Scripted(audio_ms=100, transcript="Booked."))
        async with FakeRealtime(script=script) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            await until(it, is_done)
            await s.send_tool_results([S2sToolResult("call_1_0", "book_table", '{"ok": true}'),
                                       S2sToolResult("call_1_1", "send_sms", '{"sent": 1}')], 1.0)
            await wait_log(lambda: len(srv.log.of("conversation.item.create")) == 2)
            await asyncio.sleep(0.05)  # nothing else follows the results
            before = srv.log.types
            await s.create_response(1.0)
            evs = await until(it, is_done)
            await s.close(1.0)
            return srv, before, evs

    srv, before, evs = run(main)
    assert before == ["session.update", "response.create", "conversation.item.create", "conversation.item.create"]
    assert [e["item"] for e in srv.log.of("conversation.item.create")] == [
        {"type": "function_call_output", "call_id": "call_1_0", "output": '{"ok": true}'},
        {"type": "function_call_output", "call_id": "call_1_1", "output": '{"sent": 1}'}]
    assert evs[0] == S2sResponseStarted("resp_2") and evs[-1] == S2sResponseDone("resp_2", "completed", 50, 20)
    assert "".join(e.text for e in evs if isinstance(e, S2sOutputTranscript)) == "Booked."


def test_send_note_is_a_system_item_without_a_response() -> None:
    async def main() -> FakeRealtime:
        async with FakeRealtime() as srv:
            s, _ = await opened(srv)
            await s.send_note("The SMS was sent.", 1.0)
            await s.send_note("", 1.0)  # nothing to say: nothing sent
            await wait_log(lambda: len(srv.log.events) == 2)
            await asyncio.sleep(0.05)
            await s.close(1.0)
            return srv

    srv = run(main)
    assert srv.log.types == ["session.update", "conversation.item.create"]
    assert srv.log.of("conversation.item.create")[0]["item"] == {
        "type": "message", "role": "system", "content": [{"type": "input_text", "text": "The SMS was sent."}]}


# -- barge-in ----------------------------------------------------------------------------------


def test_cancel_only_in_flight_and_truncate_wire() -> None:
    async def main() -> tuple[FakeRealtime, list[S2sEvent]]:
        async with FakeRealtime(script=(Scripted(audio_ms=1500, transcript="A long answer", realtime=True),)) as srv:
            s, it = await opened(srv)
            await s.cancel_response(1.0)  # idle: nothing goes out
            await s.create_response(1.0)
            evs = await until(it, lambda e: isinstance(e, S2sAudio))
            await s.cancel_response(1.0)
            await s.cancel_response(1.0)  # already cancelling: not sent twice
            evs += await until(it, is_done)
            await s.cancel_response(1.0)  # done: idle again
            await s.truncate("item_1", 120, "A", 1.0)
            await wait_log(lambda: bool(srv.log.of("conversation.item.truncate")))
            await s.close(1.0)
            return srv, evs

    srv, evs = run(main)
    assert srv.log.of("response.cancel") == [{"type": "response.cancel", "response_id": "resp_1"}]
    assert srv.log.types.index("response.create") < srv.log.types.index("response.cancel")
    assert srv.log.of("conversation.item.truncate") == [
        {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 120}]
    assert evs[-1] == S2sResponseDone("resp_1", "cancelled", 8, 2)


def test_cancel_of_a_response_not_announced_yet() -> None:
    async def main() -> tuple[FakeRealtime, list[S2sEvent]]:
        async with FakeRealtime(script=(Scripted(audio_ms=1500, realtime=True),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            await s.cancel_response(1.0)  # before response.created: sent when it arrives
            evs = await until(it, is_done)
            await s.close(1.0)
            return srv, evs

    srv, evs = run(main)
    assert srv.log.of("response.cancel") == [{"type": "response.cancel", "response_id": "resp_1"}]
    assert evs[0] == S2sResponseStarted("resp_1") and done_of(evs).status == "cancelled"


def test_audio_after_cancel_is_passed_on() -> None:
    async def main() -> list[S2sEvent]:
        async with FakeRealtime("after_cancel", script=(Scripted(audio_ms=1500, realtime=True),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            await until(it, lambda e: isinstance(e, S2sAudio))
            await s.cancel_response(1.0)
            evs = await until(it, is_done)
            await s.close(1.0)
            return evs

    evs = run(main)
    late = [e for e in evs if isinstance(e, S2sAudio) and np.frombuffer(e.pcm, dtype=np.int16)[0] >= 7000]
    assert len(late) == 3 and all(e.response_id == "resp_1" for e in late)
    assert done_of(evs).status == "cancelled"


# -- errors and the end ------------------------------------------------------------------------


def test_error_event_is_not_fatal() -> None:
    async def main() -> tuple[list[S2sEvent], list[S2sEvent]]:
        async with FakeRealtime("error_mid", script=(Scripted(audio_ms=300),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            evs = await until(it, is_done)
            await s.create_response(1.0)
            more = await until(it, is_done)
            await s.close(1.0)
            return evs, more

    evs, more = run(main)
    assert S2sError("server_hiccup", "transient", fatal=False) in evs
    assert done_of(evs).status == "completed" and done_of(more).response_id == "resp_2"


def test_session_expired_ends_the_session() -> None:
    async def main() -> tuple[list[S2sEvent], ProviderError]:
        async with FakeRealtime("expire", script=(Scripted(audio_ms=300),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            evs = await drain(it)
            with pytest.raises(ProviderError) as e:
                s.send_audio(pcm(20, 1))
            await s.close(1.0)
            return evs, e.value

    evs, err = run(main)
    assert [e for e in evs if isinstance(e, S2sError)] == [
        S2sError("session_expired", "Your session hit the maximum duration of 60 minutes.", fatal=True)]
    assert isinstance(evs[-1], S2sClosed) and evs[-1].error.startswith("session_expired")
    assert sum(isinstance(e, S2sClosed) for e in evs) == 1 and err.kind == "closed"


def test_socket_cut_mid_response() -> None:
    async def main() -> tuple[list[S2sEvent], list[str]]:
        async with FakeRealtime("cut", script=(Scripted(audio_ms=600, transcript="Cut short"),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            evs = await drain(it)
            kinds: list[str] = []
            for op in (lambda: s.create_response(1.0), lambda: s.truncate("item_1", 10, "", 1.0),
                       lambda: s.send_tool_results([S2sToolResult("c", "n", "{}")], 1.0), lambda: s.user_ended(1.0)):
                with pytest.raises(ProviderError) as e:
                    await op()
                kinds.append(e.value.kind)
            with pytest.raises(ProviderError) as e:
                s.send_audio(pcm(20, 1))
            kinds.append(e.value.kind)
            await s.close(1.0)
            await s.close(1.0)
            return evs, kinds

    evs, kinds = run(main)
    closed = [e for e in evs if isinstance(e, S2sClosed)]
    assert len(closed) == 1 and closed[0].error and evs[-1] is closed[0]
    assert S2sResponseStarted("resp_1") in evs
    assert kinds == ["closed"] * 5


def test_send_after_close_raises_closed() -> None:
    async def main() -> list[S2sEvent]:
        async with FakeRealtime() as srv:
            s, it = await opened(srv)
            await s.close(1.0)
            with pytest.raises(ProviderError, match="closed"):
                s.send_audio(pcm(20, 1))
            with pytest.raises(ProviderError, match="closed"):
                await s.create_response(1.0)
            return await drain(it)

    assert run(main) == [S2sClosed("")]


@pytest.mark.parametrize("mode,dropped", [("garbage", 4), ("oversized", 1)])
def test_garbage_is_counted_and_survived(mode: str, dropped: int) -> None:
    async def main() -> tuple[list[S2sEvent], list[S2sEvent], int]:
        async with FakeRealtime(mode, script=(Scripted(audio_ms=200),)) as srv:
            s, it = await opened(srv)
            await s.create_response(1.0)
            evs = await until(it, is_done)
            await s.create_response(1.0)
            more = await until(it, is_done)
            await s.close(1.0)
            return evs, more, s.dropped

    evs, more, n = run(main)
    assert n == dropped
    assert sum(len(e.pcm) for e in evs if isinstance(e, S2sAudio)) == 200 * 24 * 2
    assert done_of(evs).status == "completed" and done_of(more).response_id == "resp_2"


def test_stalled_socket_drops_audio_without_blocking() -> None:
    second = pcm(1000, 1234)

    async def main() -> tuple[OpenAiRealtimeSession, float]:
        async with FakeRealtime("stall") as srv:
            s, _ = await opened(srv, audio_queue=8)
            worst = 0.0
            for _ in range(400):  # ~26 MB of base64: far more than the loopback buffers hold
                t0 = time.perf_counter()
                s.send_audio(second)
                worst = max(worst, time.perf_counter() - t0)
                await asyncio.sleep(0.001)
                if s.audio_dropped > 20:
                    break
            srv.resume.set()
            await s.close(1.0)
            return s, worst

    s, worst = run(main, 10.0)
    assert s.audio_dropped > 20 and worst < 0.05


# -- live --------------------------------------------------------------------------------------


def test_live_openai_realtime_answers() -> None:
    if os.environ.get("BRISVOX_LIVE_TESTS") != "1" or not os.environ.get("OPENAI_API_KEY"):
        pytest.skip("live test: set BRISVOX_LIVE_TESTS=1 and OPENAI_API_KEY to run it against OpenAI Realtime")
    key = os.environ["OPENAI_API_KEY"]
    cfg = S2sConfig(turn_detection="brisvox", instructions="Answer in one short sentence.",
                    history=(S2sItem("user", "Say hello to the brisvox test suite."),))

    async def main() -> list[S2sEvent]:
        s = await OpenAiRealtime(key).connect(cfg, 10.0)
        it = s.events().__aiter__()
        await s.create_response(5.0)
        evs = await until(it, is_done, 30.0)
        await s.close(2.0)
        return evs

    evs = run(main, 45.0)
    assert done_of(evs).status == "completed"
    assert sum(len(e.pcm) for e in evs if isinstance(e, S2sAudio)) > 24000  # > 0.5 s of audio
