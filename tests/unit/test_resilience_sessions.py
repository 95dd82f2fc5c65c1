"""The resilient STT and TTS sessions on virtual time, over controllable provider sessions.

* STT window: never more than 4 s; a speech_final empties it; a final segment
  keeps the 1 s tail before it, so a final lagging its audio by 300 ms loses
  nothing on a recovery (the variant without the tail does lose the lag).
* STT Finalize accounting: a Finalize the dead session owed is sent again
  after the replay and answered to the stage exactly once; with nothing
  owed, no Finalize goes to the new session.
* TTS: an unstarted utterance is re-spoken (text and flush) on the new
  session; a partly heard one ends the session's events (the stage's rule);
  a cancelled id's late text and flush are dropped across a recovery and no
  event of it follows its TtsCancelled; the idle refresh connects at exactly
  80 % of the idle limit and swaps only while nothing is in flight.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from brisvox.providers.base import (
    ProviderError,
    SttClosed,
    SttConfig,
    Transcript,
    TtsAudio,
    TtsCancelled,
    TtsClosed,
    TtsConfig,
    TtsFlushed,
)
from brisvox.providers.resilience import Resilience, ResilienceConfig, ResilientStt, ResilientTts
from brisvox.providers.scripted_session import EventQueue
from brisvox.sim.vloop import run_virtual

CHUNK = 320  # 20 ms at 16 kHz


class SttSess:
    name = "sess"

    def __init__(self) -> None:
        self.audio: list[bytes] = []
        self.finalizes = 0
        self.q = EventQueue((SttClosed,))
        self.closed = False

    async def send_audio(self, pcm: bytes, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        self.audio.append(pcm)

    async def finalize(self, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        self.finalizes += 1

    def events(self) -> Any:
        return self.q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self.closed = True
        self.q.push(SttClosed(""))

    def die(self) -> None:
        self.closed = True
        self.q.push(SttClosed("died"))


class SttProv:
    name = "p"

    def __init__(self) -> None:
        self.sessions: list[SttSess] = []

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    async def connect(self, config: SttConfig, timeout: float) -> SttSess:  # noqa: ASYNC109
        await asyncio.sleep(0.05)
        s = SttSess()
        self.sessions.append(s)
        return s


def chunk(i: int) -> bytes:
    return np.full(CHUNK, i + 1, dtype=np.int16).tobytes()  # chunk i carries its own number


def ids(audio: list[bytes]) -> list[int]:
    return [int(np.frombuffer(a, dtype=np.int16)[0]) - 1 for a in audio]


async def stream(s: Any, first: int, n: int) -> None:
    for i in range(first, first + n):
        await s.send_audio(chunk(i), 2.0)
        await asyncio.sleep(0.02)


def test_the_window_never_holds_more_than_4_s_and_a_speech_final_empties_it() -> None:
    async def main() -> list[Any]:
        prov = SttProv()
        s = await ResilientStt(prov, resilience=Resilience()).connect(SttConfig(), 5.0)
        most = 0
        for i in range(500):  # 10 s without a final
            await s.send_audio(chunk(i), 2.0)
            await asyncio.sleep(0.02)
            most = max(most, s.window.samples)
        out: list[Any] = [most, s.window.ms]
        prov.sessions[0].q.push(Transcript("done", True, speech_final=True))
        await asyncio.sleep(0.01)
        out.append(s.window.samples)
        await s.close(0.1)
        return out

    assert run_virtual(main) == [64000, 4000, 0]


@pytest.mark.parametrize("tail,keeps_lag", [(1.0, True), (0.0, False)], ids=["tail", "broken-no-tail"])
def test_a_final_lagging_its_audio_by_300_ms_loses_nothing_on_a_recovery(tail: float, keeps_lag: bool) -> None:
    """Chunks 0-49 (1 s) are the first words; their final arrives after chunk 64 (1.3 s), then
    the session dies at 1.5 s. The replay must include chunks 50-64, the 300 ms lag."""

    async def main() -> list[int]:
        prov = SttProv()
        w = ResilientStt(prov, resilience=Resilience(ResilienceConfig(stt_replay_tail=tail)))
        s = await w.connect(SttConfig(), 5.0)
        await stream(s, 0, 65)
        prov.sessions[0].q.push(Transcript("first words", True, start=0.0, end=1.0))
        await stream(s, 65, 10)
        prov.sessions[0].die()
        await asyncio.sleep(0.2)
        replayed = ids(prov.sessions[1].audio)
        await s.close(0.1)
        assert w.stats()["recoveries"] == 1
        return replayed

    replayed = run_virtual(main)
    assert replayed == sorted(replayed) and replayed[-1] == 74  # in order, up to the death
    assert (set(range(50, 65)) <= set(replayed)) is keeps_lag
    if keeps_lag:
        # the 1 s tail before the final was read: it is read once chunk 65 went out (the
        # audio goes straight to the provider session), so 50 chunks back is chunk 16
        assert replayed[0] <= 16


def test_an_owed_finalize_is_sent_again_and_answered_to_the_stage_once() -> None:
    async def main() -> list[Any]:
        prov = SttProv()
        s = await ResilientStt(prov, resilience=Resilience()).connect(SttConfig(), 5.0)
        got: list[Any] = []

        async def read() -> None:
            async for ev in s.events():
                got.append(ev)

        r = asyncio.ensure_future(read())
        await stream(s, 0, 20)
        await s.finalize(2.0)
        await asyncio.sleep(0.01)
        first = prov.sessions[0]
        first.die()  # before it answered
        await asyncio.sleep(0.2)
        second = prov.sessions[1]
        out: list[Any] = [first.finalizes, second.finalizes, ids(second.audio) == list(range(20))]
        second.q.push(Transcript("hello", True, speech_final=True, from_finalize=True))
        await asyncio.sleep(0.01)
        out.append([(e.text, e.from_finalize) for e in got])
        await stream(s, 20, 5)  # nothing owed now: a later death replays without a Finalize
        second.die()
        await asyncio.sleep(0.2)
        out.append(prov.sessions[2].finalizes)
        await s.close(0.1)
        r.cancel()
        return out

    assert run_virtual(main) == [1, 1, True, [("hello", True)], 0]


# --- TTS ---------------------------------------------------------------------------------


class TtsSess:
    sample_rate = 24000

    def __init__(self) -> None:
        self.texts: list[tuple[int, str, bool]] = []
        self.flushes: list[int] = []
        self.cancels: list[int] = []
        self.q = EventQueue((TtsClosed,))
        self.closed = False

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        self.texts.append((context, text, continue_))

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        if self.closed:
            raise ProviderError("closed")
        self.flushes.append(context)

    def cancel(self, context: int) -> None:
        self.cancels.append(context)
        self.q.push(TtsCancelled(context))

    def events(self) -> Any:
        return self.q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self.closed = True
        self.q.push(TtsClosed(""))

    def die(self) -> None:
        self.closed = True
        self.q.push(TtsClosed("died"))


class TtsProv:
    name = "t"

    def __init__(self, idle: float | None = None) -> None:
        self.sessions: list[TtsSess] = []
        self.connects: list[float] = []
        self.idle = idle

    def idle_limit(self) -> float | None:
        return self.idle

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        return None

    async def connect(self, config: TtsConfig, timeout: float) -> TtsSess:  # noqa: ASYNC109
        self.connects.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.05)
        s = TtsSess()
        self.sessions.append(s)
        return s


async def reader(s: Any, got: list[Any]) -> None:
    async for ev in s.events():
        got.append(ev)


def test_an_unstarted_utterance_is_respoken_and_a_partly_heard_one_fails_the_session() -> None:
    async def main() -> list[Any]:
        prov = TtsProv()
        w = ResilientTts(prov, resilience=Resilience())
        s = await w.connect(TtsConfig(), 5.0)
        got: list[Any] = []
        r = asyncio.ensure_future(reader(s, got))
        await s.send_text(1, "Hello", continue_=False, timeout=2.0)
        await s.send_text(1, " there.", continue_=True, timeout=2.0)
        await s.flush(1, 2.0)
        prov.sessions[0].die()  # no audio yet
        await asyncio.sleep(0.2)
        second = prov.sessions[1]
        out: list[Any] = [list(second.texts), list(second.flushes), w.stats()["respoken"]]
        second.q.push(TtsAudio(1, b"\0\0"))
        await s.send_text(2, "More", continue_=False, timeout=2.0)
        second.q.push(TtsAudio(2, b"\0\0"))  # utterance 2 partly heard
        await asyncio.sleep(0.01)
        second.die()
        await asyncio.sleep(0.2)
        out += [len(prov.sessions), type(got[-1]).__name__, got[-1].error]
        r.cancel()
        await s.close(0.1)
        return out

    assert run_virtual(main) == [[(1, "Hello", False), (1, " there.", True)], [1], 1, 2, "TtsClosed", "died"]


def test_a_cancelled_id_stays_dropped_across_a_recovery_and_the_refresh_still_comes() -> None:
    async def main() -> list[Any]:
        prov = TtsProv(idle=10.0)
        w = ResilientTts(prov, resilience=Resilience())
        s = await w.connect(TtsConfig(), 5.0)
        got: list[Any] = []
        r = asyncio.ensure_future(reader(s, got))
        await s.send_text(1, "Hello", continue_=False, timeout=2.0)
        s.cancel(1)  # barge-in
        prov.sessions[0].die()
        await asyncio.sleep(0.2)
        await s.send_text(1, " late", continue_=True, timeout=2.0)  # read after its cancel
        await s.flush(1, 2.0)
        prov.sessions[1].q.push(TtsAudio(1, b"\0\0"))  # a stray event of the cancelled id
        await asyncio.sleep(12.0)
        ctx1 = [type(e).__name__ for e in got if getattr(e, "context", None) == 1]
        out = [prov.sessions[1].texts, prov.sessions[1].flushes, ctx1, w.stats()["late_dropped"],
               w.stats()["refreshes"], len(prov.sessions)]
        r.cancel()
        await s.close(0.1)
        return out

    assert run_virtual(main) == [[], [], ["TtsCancelled"], 2, 1, 3]


def test_the_idle_refresh_connects_at_80_percent_and_swaps_only_when_idle() -> None:
    async def main() -> list[Any]:
        prov = TtsProv(idle=10.0)
        w = ResilientTts(prov, resilience=Resilience())
        t0 = asyncio.get_running_loop().time()
        s = await w.connect(TtsConfig(), 5.0)
        t1 = asyncio.get_running_loop().time()
        got: list[Any] = []
        r = asyncio.ensure_future(reader(s, got))
        await asyncio.sleep(8.5 - (t1 - t0))  # the refresh connected at 8.05, swapped at once
        out: list[Any] = [round(prov.connects[1] - t1, 6), w.stats()["refreshes"], prov.sessions[0].closed]
        # the next refresh starts at 8.10 + 8 (idle since the swap); an utterance starts
        # before it completes: the new session waits as a standby until the utterance ends
        await asyncio.sleep(16.12 - 8.5)
        await s.send_text(7, "Hi", continue_=False, timeout=2.0)
        await asyncio.sleep(0.1)
        out += [round(prov.connects[2] - t1, 6), w.stats()["refreshes"], s.inner is prov.sessions[1]]
        prov.sessions[1].q.push(TtsAudio(7, b"\0\0"))
        prov.sessions[1].q.push(TtsFlushed(7))
        await asyncio.sleep(0.01)
        out += [w.stats()["refreshes"], s.inner is prov.sessions[2], [type(e).__name__ for e in got]]
        r.cancel()
        await s.close(0.1)
        return out

    assert run_virtual(main) == [8.0, 1, True, 16.05, 1, True, 2, True, ["TtsAudio", "TtsFlushed"]]


# --- TTS: the events are handed on in the consumer's task ----------------------------------


class StuckTtsSess(TtsSess):
    """A session whose close does not end its events (a socket whose close handshake hangs)
    and whose sends can be made to hang."""

    def __init__(self) -> None:
        super().__init__()
        self.hang = False

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        if self.hang:
            await asyncio.get_running_loop().create_future()  # never answers
        await super().send_text(context, text, continue_=continue_, timeout=timeout)

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self.closed = True


class StuckTtsProv(TtsProv):
    async def connect(self, config: TtsConfig, timeout: float) -> TtsSess:  # noqa: ASYNC109
        self.connects.append(asyncio.get_running_loop().time())
        await asyncio.sleep(0.05)
        s = StuckTtsSess()
        self.sessions.append(s)
        return s


def test_audio_reaches_the_consumer_in_its_own_task_with_no_wrapper_task_between() -> None:
    """The old design had a reader task per session (``tts-resilience-reader``) that pushed
    each event into a queue of the wrapper's: an event reached the consumer one loop turn
    after the provider pushed it. Now the consumer runs after that one turn itself."""

    async def main() -> list[Any]:
        prov = TtsProv()
        s = await ResilientTts(prov, resilience=Resilience()).connect(TtsConfig(), 5.0)
        got: list[Any] = []
        seen: list[str] = []

        async def consume() -> None:
            async for ev in s.events():
                seen.append(asyncio.current_task().get_name())  # type: ignore[union-attr]
                got.append(ev)

        r = asyncio.get_running_loop().create_task(consume(), name="consumer")
        await s.send_text(1, "Hi", continue_=False, timeout=2.0)
        await asyncio.sleep(0.01)
        names = sorted(t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("tts-"))
        turns = []
        for i in range(3):
            prov.sessions[0].q.push(TtsAudio(1, b"\0\0"))
            await asyncio.sleep(0)  # one loop turn: the consumer's wakeup runs before ours
            turns.append(len(got) == i + 1)
        await s.close(0.1)
        await asyncio.sleep(0)
        out = [names, turns, set(seen), [type(e).__name__ for e in got], r.done()]
        return out

    assert run_virtual(main) == [["tts-resilience"], [True, True, True], {"consumer"},
                                 ["TtsAudio", "TtsAudio", "TtsAudio", "TtsClosed"], True]


def test_a_hung_send_recovers_at_the_send_timeout_though_the_dead_session_never_ends() -> None:
    """The send hangs and closing the session does not end its events: the consumer's wait
    is ended at the failure, and a cancel during the recovery (a side event) reaches it."""

    async def main() -> list[Any]:
        prov = StuckTtsProv()
        w = ResilientTts(prov, resilience=Resilience())
        s = await w.connect(TtsConfig(), 5.0)
        got: list[Any] = []
        r = asyncio.ensure_future(reader(s, got))
        await s.send_text(1, "Hello", continue_=False, timeout=2.0)
        prov.sessions[0].hang = True
        t0 = asyncio.get_running_loop().time()
        await s.send_text(2, "There", continue_=False, timeout=2.0)  # hangs 1.5 s, then fails
        failed_after = round(asyncio.get_running_loop().time() - t0, 6)
        s.cancel(1)  # after the failed send: the wrapper answers it (a side event)
        await asyncio.sleep(0.2)
        second = prov.sessions[1]
        out: list[Any] = [failed_after, len(prov.sessions), second.texts, w.stats()["recoveries"],
                          [(type(e).__name__, e.context) for e in got]]
        second.q.push(TtsAudio(2, b"\0\0"))
        await asyncio.sleep(0)
        out.append(type(got[-1]).__name__)
        await s.close(0.1)
        await asyncio.sleep(0)
        out += [type(got[-1]).__name__, got[-1].error, sum(isinstance(e, TtsClosed) for e in got), r.done()]
        return out

    assert run_virtual(main) == [1.5, 2, [(2, "There", False)], 1, [("TtsCancelled", 1)], "TtsAudio",
                                 "TtsClosed", "", 1, True]


def test_a_swap_moves_the_consumer_on_though_the_old_session_never_ends() -> None:
    async def main() -> list[Any]:
        prov = StuckTtsProv(idle=10.0)
        w = ResilientTts(prov, resilience=Resilience())
        s = await w.connect(TtsConfig(), 5.0)
        got: list[Any] = []
        r = asyncio.ensure_future(reader(s, got))
        await asyncio.sleep(8.2)  # the refresh swapped at 8.05; the old session's close ended nothing
        out: list[Any] = [w.stats()["refreshes"], s.inner is prov.sessions[1], prov.sessions[0].closed]
        await s.send_text(3, "Hi", continue_=False, timeout=2.0)
        prov.sessions[1].q.push(TtsAudio(3, b"\0\0"))
        await asyncio.sleep(0)
        out.append([(type(e).__name__, e.context) for e in got])
        await s.close(0.1)  # the new session's close ends nothing either: the consumer still ends
        await asyncio.sleep(0)
        out += [[type(e).__name__ for e in got], r.done(), w.stats()["recoveries"]]
        return out

    assert run_virtual(main) == [1, True, True, [("TtsAudio", 3)], ["TtsAudio", "TtsClosed"], True, 0]


def test_close_ends_the_events_once_during_a_recovery_and_before_the_first_iteration() -> None:
    async def main() -> list[Any]:
        prov = TtsProv()
        w = ResilientTts(prov, resilience=Resilience())
        s = await w.connect(TtsConfig(), 5.0)
        got: list[Any] = []
        r = asyncio.ensure_future(reader(s, got))
        await s.send_text(1, "Hello", continue_=False, timeout=2.0)
        prov.sessions[0].die()
        await asyncio.sleep(0.01)  # the recovery's connect takes 50 ms
        recovering = s.recovering
        await s.close(0.1)
        await asyncio.sleep(0.1)
        out: list[Any] = [recovering, [(type(e).__name__, e.error) for e in got], r.done(),
                          w.stats()["recoveries"], w.stats()["recovery_failures"], len(prov.sessions)]
        again: list[Any] = []
        await reader(s, again)  # the events ended: nothing more
        s2 = await w.connect(TtsConfig(), 5.0)
        await s2.close(0.1)
        late: list[Any] = []
        await reader(s2, late)  # closed before anyone iterated: one TtsClosed("")
        out += [again, [(type(e).__name__, e.error) for e in late]]
        return out

    assert run_virtual(main) == [True, [("TtsClosed", "")], True, 0, 0, 1, [], [("TtsClosed", "")]]
