"""CallAmd's transcripts during screening (brisvox/agent/host/call_amd.py) on a virtual loop: with
a transcriber the AmdStart asks the detector to wait for words, the opening so far is
transcribed one job at a time while the screen detects, each text goes to the worker as an
AmdHear, and it all stops at the verdict, at the close, or when the worker has no STT; the
JobTranscriber turns the worker's answers into text, "" or None."""

from __future__ import annotations

import asyncio
from typing import Any

from brisvox.agent.host.amd_screen import AmdConfig
from brisvox.agent.host.call_amd import HEAR_EVERY_S, HEAR_FIRST_S, CallAmd, JobTranscriber
from brisvox.clock import LoopClock
from brisvox.providers.base import ProviderError
from brisvox.sim.vloop import run_virtual
from ipc.frames import AmdHear, AmdStart, ErrorReply, SttJob, SttJobResult
from ipc.tick_events import AmdVerdictEvent

MENU = "Thank you for calling Acme. For sales, press one."


class Host:
    """The actor seam: in16 advances with the (virtual) clock from t=0; frames are kept."""

    call_id = "c1"

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.events: list[Any] = []

    def in16_pos(self) -> int:
        return round(asyncio.get_running_loop().time() * 16000)

    def spawn(self, coro: Any, name: str) -> Any:
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.append(t)
        return t

    def to_worker(self, frame: Any) -> None:
        self.sent.append((asyncio.get_running_loop().time(), frame))

    def converse(self, note: str, node: str) -> None:
        self.events.append(("converse", note))

    def speak(self, text: str) -> None:
        self.events.append(("speak", text))

    def hang_up_after_playout(self, reason: str) -> None:
        self.events.append(("hang_up", reason))

    def amd_event(self, data: Any) -> None:
        self.events.append(("amd", data["verdict"]))


class Stt:
    """A transcriber that takes ``took`` seconds and answers ``text`` (None: no model)."""

    def __init__(self, text: str | None, took: float = 0.3) -> None:
        self.text, self.took = text, took
        self.spans: list[tuple[int, int]] = []

    async def __call__(self, start: int, end: int) -> str | None:
        self.spans.append((start, end))
        await asyncio.sleep(self.took)
        return self.text


def _screen(stt: Stt | None, cfg: AmdConfig, verdict_at: float = 2.5) -> tuple[Host, CallAmd]:
    async def main() -> tuple[Host, CallAmd]:
        host = Host()
        amd = CallAmd(host, cfg, LoopClock())
        if stt is not None:
            amd.listen_with(stt)
        amd.answered()
        await asyncio.sleep(verdict_at)
        amd.on_event(AmdVerdictEvent(call_id="c1", pos=0, ns=0, verdict="ivr", confidence=0.99, ms=2496,
                                     rule="cue"), asyncio.get_running_loop().time())
        await asyncio.sleep(3.0)
        amd.close()
        await asyncio.sleep(0)
        return host, amd

    return run_virtual(main)


def test_the_opening_is_transcribed_while_detecting_and_each_text_goes_to_the_worker() -> None:
    stt = Stt(MENU)
    host, amd = _screen(stt, AmdConfig(enabled=True), verdict_at=2.45)
    start = host.sent[0][1]
    assert isinstance(start, AmdStart) and start.transcripts and start.in16_pos == 0
    hears = [(t, f) for t, f in host.sent if isinstance(f, AmdHear)]
    assert hears and all(f.text == MENU and f.call_id == "c1" for _, f in hears)
    # one job at a time, every HEAR_EVERY_S + its own time, always from the answer to now
    assert all(s == 0 for s, _ in stt.spans) and [e for _, e in stt.spans] == sorted({e for _, e in stt.spans})
    # 1.2 s (done at 1.5), 1.9 s (2.2), 2.6 s (2.9: after the verdict at 2.45)
    step = HEAR_EVERY_S + stt.took
    assert [e for _, e in stt.spans] == [round(16000 * (HEAR_FIRST_S + k * step)) for k in range(3)]
    assert [round(t, 6) for t, _ in hears] == [round(HEAR_FIRST_S + stt.took + k * step, 6) for k in range(2)]
    assert [f.end_pos for _, f in hears] == [e for _, e in stt.spans][:2]  # the third came after the verdict
    assert amd.heard == len(hears) and all(t.done() for t in host.tasks)
    assert ("amd", "ivr") in host.events


def test_no_transcriber_or_transcripts_off_is_cadence_alone() -> None:
    for stt, cfg in ((None, AmdConfig(enabled=True)), (Stt(MENU), AmdConfig(enabled=True, transcripts=False))):
        host, _ = _screen(stt, cfg)
        frames = [f for _, f in host.sent]
        assert len(frames) == 1 and isinstance(frames[0], AmdStart) and not frames[0].transcripts
        assert stt is None or stt.spans == []


def test_a_worker_without_stt_stops_the_transcribing_and_silence_sends_nothing() -> None:
    none = Stt(None)
    host, amd = _screen(none, AmdConfig(enabled=True))
    assert len(none.spans) == 1 and not any(isinstance(f, AmdHear) for _, f in host.sent)
    quiet = Stt("  ")
    host, amd = _screen(quiet, AmdConfig(enabled=True))
    assert len(quiet.spans) > 1 and amd.heard == 0 and amd.hear_failed == len(quiet.spans)
    assert not any(isinstance(f, AmdHear) for _, f in host.sent)


def test_a_transcription_slower_than_its_bound_is_dropped() -> None:
    slow = Stt(MENU, took=5.0)
    host, amd = _screen(slow, AmdConfig(enabled=True), verdict_at=4.0)
    assert len(slow.spans) >= 1 and amd.heard == 0  # each cut at HEAR_TIMEOUT_S, the loop goes on
    assert all(t.done() for t in host.tasks)


class Channel:
    def __init__(self, reply: Any) -> None:
        self.reply = reply
        self.jobs: list[SttJob] = []

    async def request(self, frame: SttJob, timeout: float) -> Any:  # noqa: ASYNC109
        self.jobs.append(frame)
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


def test_the_job_transcriber_maps_the_workers_answers() -> None:
    async def main() -> list[str | None]:
        out = []
        for reply in (SttJobResult(call_id="c1", text=MENU, start_pos=0, end_pos=16000, queued_us=1, took_us=2),
                      ErrorReply(kind="busy"), ErrorReply(kind="unsupported"), ProviderError("timeout", "late")):
            ch = Channel(reply)
            out.append(await JobTranscriber(ch, "c1")(0, 16000))
            assert ch.jobs[0].call_id == "c1" and (ch.jobs[0].start_pos, ch.jobs[0].end_pos) == (0, 16000)
        return out

    assert run_virtual(main) == [MENU, "", None, ""]
