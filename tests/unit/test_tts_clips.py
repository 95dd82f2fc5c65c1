"""Pre-rendered filler clips: the cache's bounds and scopes, the capture's bounds, and the TTS
stage's clip rounds on virtual time (rendered once, then played from memory with no provider
request, in order with the provider's audio, cut by a barge-in like any utterance)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from brisvox.agent.pipeline.cascade.tts_clips import (
    MAX_CACHE_BYTES,
    MAX_CLIP_SECONDS,
    MAX_CLIPS,
    MAX_SCOPES,
    Capture,
    Clip,
    ClipCache,
    cache_for,
    forget_shared,
    voice_key,
)
from brisvox.agent.pipeline.cascade.tts_stage import TtsStage, TtsStageConfig
from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    AudioOut,
    Flush,
    Interrupt,
    LlmResponseEnded,
    LlmResponseStarted,
    PipelineFrame,
    Start,
    Stop,
    TextChunk,
    TtsEnded,
)
from brisvox.clock import CLOCK
from brisvox.providers.base import TtsAudio, TtsClosed, TtsConfig, TtsFlushed, TtsWord
from brisvox.providers.scripted_session import EventQueue
from brisvox.sim.vloop import run_virtual

RATE = 24000
FILLER = "one moment please"
WORDS = (("one", 0.0, 0.3), ("moment", 0.3, 0.7), ("please", 0.7, 1.0))


def clip(text: str, seconds: float = 1.0) -> Clip:
    pcm = np.full(int(RATE * seconds), 7, dtype=np.int16)
    pcm.setflags(write=False)
    return Clip(text, pcm, WORDS, RATE)


# -- the cache -----------------------------------------------------------------------------------


def test_the_cache_keeps_at_most_32_clips_least_recently_used_first_out():
    c = ClipCache()
    for i in range(MAX_CLIPS):
        c.put(clip(f"p{i}"))
    assert c.get("p0") is not None  # p0 is now the most recently used
    c.put(clip("new"))
    assert len(c) == MAX_CLIPS == 32
    assert c.get("p1") is None and c.get("p0") is not None and c.get("new") is not None
    assert (c.st.stored, c.st.evicted, c.st.hits, c.st.misses) == (33, 1, 3, 1)
    assert c.bytes() == 32 * RATE * 2


def test_the_cache_keeps_at_most_2_mib_of_audio():
    c = ClipCache()
    for i in range(4):
        c.put(clip(f"long{i}", seconds=MAX_CLIP_SECONDS))  # 384 KB each
    assert len(c) == 4 and c.bytes() == 4 * int(RATE * MAX_CLIP_SECONDS) * 2
    for i in range(4, 6):
        c.put(clip(f"long{i}", seconds=MAX_CLIP_SECONDS))
    assert len(c) == 5 and c.bytes() <= MAX_CACHE_BYTES and c.get("long0") is None  # the oldest went
    c.put(clip("long5", seconds=MAX_CLIP_SECONDS))  # the same line again replaces it
    assert len(c) == 5 and c.st.evicted == 1


def test_a_named_scope_is_shared_per_voice_and_rate_an_unnamed_one_never():
    forget_shared()
    v = voice_key("cartesia", "anna", "sonic", "en", 1.0, {}, RATE)
    a = cache_for("agent-a", v)
    assert cache_for("agent-a", v) is a
    assert cache_for("agent-b", v) is not a
    assert cache_for("agent-a", voice_key("cartesia", "bob", "sonic", "en", 1.0, {}, RATE)) is not a
    assert cache_for("agent-a", voice_key("cartesia", "anna", "sonic", "en", 1.0, {}, 16000)) is not a
    assert cache_for("agent-a", voice_key("cartesia", "anna", "sonic", "en", 1.2, {}, RATE)) is not a
    assert cache_for("", v) is not cache_for("", v)
    for i in range(MAX_SCOPES):
        cache_for(f"many-{i}", v)
    assert cache_for("agent-a", v) is not a  # evicted: 16 scopes at most
    forget_shared()


def test_a_capture_longer_than_the_bound_keeps_nothing():
    cap = Capture(FILLER, RATE)
    cap.audio(np.zeros(int(RATE * MAX_CLIP_SECONDS), dtype=np.int16))
    assert cap.clip() is not None
    cap.audio(np.zeros(1, dtype=np.int16))
    assert cap.spoiled and cap.clip() is None and cap.pcm == []
    assert Capture(FILLER, RATE).clip() is None  # no audio: no clip


# -- the TTS stage --------------------------------------------------------------------------------


class Session:
    sample_rate = RATE

    def __init__(self) -> None:
        self.q = EventQueue((TtsClosed,))
        self.texts: list[tuple[int, str]] = []
        self.flushes: list[int] = []
        self.cancels: list[int] = []

    async def send_text(self, context: int, text: str, *, continue_: bool, timeout: float) -> None:  # noqa: ASYNC109
        self.texts.append((context, text))

    async def flush(self, context: int, timeout: float) -> None:  # noqa: ASYNC109
        self.flushes.append(context)

    def cancel(self, context: int) -> None:
        self.cancels.append(context)

    def events(self) -> Any:
        return self.q.iterate()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109
        self.q.push(TtsClosed(""))

    def speak(self, ctx: int, seconds: float, words: tuple[tuple[str, float, float], ...] = ()) -> None:
        for w in words:
            self.q.push(TtsWord(ctx, *w))
        n = int(RATE * 0.2)
        for _ in range(round(seconds / 0.2)):
            self.q.push(TtsAudio(ctx, np.full(n, ctx, dtype=np.int16).tobytes()))
        self.q.push(TtsFlushed(ctx))


class Provider:
    name = "probe-tts"

    def __init__(self) -> None:
        self.session = Session()
        self.connects = 0

    def idle_limit(self) -> float | None:
        return None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        pass

    async def connect(self, config: TtsConfig, timeout: float) -> Session:  # noqa: ASYNC109
        self.connects += 1
        return self.session


class SlowSink(Stage):
    """Takes one frame per ``every`` seconds (``every`` > 0: a back-pressured writer with a
    2-frame inbox), records them."""

    def __init__(self, call: CallContext, every: float) -> None:
        super().__init__(call, None, Inbox("sink", 2 if every else 1024, sys_cap=64))
        self.every = every
        self.frames: list[PipelineFrame] = []

    async def process(self, frame: PipelineFrame) -> None:
        self.frames.append(frame)
        if isinstance(frame, AudioOut):
            await CLOCK.sleep(self.every)

    def audio(self) -> list[tuple[int, int]]:
        """(utterance, samples) per AudioOut, in arrival order, runs merged."""
        out: list[tuple[int, int]] = []
        for f in self.frames:
            if isinstance(f, AudioOut):
                if out and out[-1][0] == f.utterance:
                    out[-1] = (f.utterance, out[-1][1] + len(f.samples))
                else:
                    out.append((f.utterance, len(f.samples)))
        return out


async def settle(dt: float = 0.0) -> None:
    await asyncio.sleep(dt)
    for _ in range(5):
        await asyncio.sleep(0)


def line(epoch: int, rnd: int, text: str, clip: bool = False) -> list[PipelineFrame]:
    return [LlmResponseStarted(epoch, rnd), TextChunk(epoch, rnd, text, last=True, clip=clip), Flush(epoch, rnd)]


class StageRig:
    def __init__(self, every: float = 0.0) -> None:
        self.call = CallContext.detached("clips", call_rate=8000, tts_rate=RATE, clock=CLOCK)
        self.provider = Provider()
        self.stage = TtsStage(self.call, TtsStageConfig(ring_rate=RATE), Inbox("tts", 64, sys_cap=32), self.provider)
        self.sink = SlowSink(self.call, every)
        self.stage.pipe(self.sink)

    @property
    def session(self) -> Session:
        return self.provider.session

    def put(self, frames: list[PipelineFrame]) -> None:
        for f in frames:
            self.stage.inbox.put_nowait(f)

    async def __aenter__(self) -> StageRig:
        self.stage.start()
        self.sink.start()
        self.put([Start()])
        await settle(0.1)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.put([Stop("test")])
        await settle(0.1)
        await self.call.tasks.close()

    async def render_first(self) -> None:
        """Epoch 1: the filler's first use, rendered by the provider and kept."""
        self.put(line(1, 0, FILLER, clip=True))
        await settle(0.05)
        self.session.speak(1, 1.0, WORDS)
        self.put([LlmResponseEnded(1)])
        await settle(1.0)


def test_a_filler_is_rendered_once_then_played_from_memory_in_order_with_the_provider_audio():
    async def main():
        async with StageRig() as rig:
            await rig.render_first()
            assert rig.session.texts == [(1, FILLER)] and rig.stage.st.clips_rendered == 1
            kept = rig.stage.clip_cache().get(FILLER)
            assert kept is not None and kept.words == WORDS and len(kept.pcm) == RATE
            # epoch 2: text (utterance 2), the filler (3: the clip), text (4)
            rig.put(line(2, 0, "Let me look."))
            rig.put(line(2, 1, FILLER, clip=True))
            rig.put(line(2, 2, "Found it."))
            await settle(0.05)
            # utterance 2's audio comes while the clip waits for it, utterance 4's right behind
            # it (before the clip's task ran): it waits for the clip
            rig.session.speak(2, 0.4)
            rig.session.speak(4, 0.4)
            rig.put([LlmResponseEnded(2)])
            await settle(3.0)
            assert rig.session.texts == [(1, FILLER), (2, "Let me look."), (4, "Found it.")]  # no request for 3
            assert rig.sink.audio() == [(1, RATE), (2, 9600), (3, RATE), (4, 9600)]
            assert [f for f in rig.sink.frames if isinstance(f, TtsEnded)] == [TtsEnded(1), TtsEnded(2)]
            u = rig.call.book.utts[3]
            assert (u.epoch, u.round, u.sent_text, u.words, u.tts_samples) == (2, 1, FILLER, list(WORDS), 0)
            assert rig.call.book.round(2, 1).utterance == 3
            assert (rig.stage.st.clips_played, rig.stage.st.clips_rendered, rig.stage.st.contexts) == (1, 1, 3)
    run_virtual(main)


def test_a_provider_that_answers_a_later_utterance_first_does_not_stall_a_clip():
    async def main():
        async with StageRig() as rig:
            await rig.render_first()
            rig.put(line(2, 0, "Let me look."))
            rig.put(line(2, 1, FILLER, clip=True))
            rig.put(line(2, 2, "Found it."))
            await settle(0.05)
            t0 = CLOCK.now()
            rig.session.speak(4, 0.4)  # out of order: utterance 4 before 2 (the clip waits for 2)
            await settle(0.01)
            assert rig.sink.audio()[1:] == [(3, RATE), (4, 9600)] and CLOCK.now() - t0 < 0.02
            rig.session.speak(2, 0.4)
            rig.put([LlmResponseEnded(2)])
            await settle(0.1)
            assert rig.sink.audio()[1:] == [(3, RATE), (4, 9600), (2, 9600)] and TtsEnded(2) in rig.sink.frames
    run_virtual(main)


def test_a_barge_in_stops_a_clip_without_cancelling_anything_at_the_provider():
    async def main():
        async with StageRig(every=0.05) as rig:
            await rig.render_first()
            rig.put(line(2, 0, FILLER, clip=True))
            await settle(0.2)  # about 0.2 s of the 1 s clip handed on
            rig.call.watch.bump(3)
            rig.put([Interrupt(3, 2, CLOCK.now())])
            await settle(1.0)
            # 0.1 s pieces: the sink took 5 in 0.2 s (one every 0.05 s from the first), 2 wait
            # in its inbox; the rest of the clip is never sent
            assert dict(rig.sink.audio())[2] == 7 * RATE // 10
            assert rig.session.cancels == [] and rig.stage.st.cancels == 0
            assert rig.stage._playing == set()
            # a later filler plays whole again
            rig.put(line(3, 0, FILLER, clip=True) + [LlmResponseEnded(3)])
            await settle(2.0)
            assert rig.sink.audio()[-1] == (3, RATE)
            assert TtsEnded(3) in rig.sink.frames
    run_virtual(main)


def test_a_clip_plays_while_the_tts_session_is_down():
    async def main():
        async with StageRig() as rig:
            await rig.render_first()
            await rig.session.close(1.0)
            await settle(0.1)
            assert rig.stage.session is None
            rig.put(line(2, 0, FILLER, clip=True) + [LlmResponseEnded(2)])
            await settle(0.5)
            assert rig.sink.audio()[-1] == (2, RATE) and TtsEnded(2) in rig.sink.frames
    run_virtual(main)


@pytest.mark.parametrize("cut", ["interrupt", "second_chunk"])
def test_a_first_rendering_that_is_cut_or_carries_more_is_not_kept(cut: str):
    async def main():
        async with StageRig() as rig:
            rig.put(line(1, 0, FILLER, clip=True))
            await settle(0.05)
            if cut == "interrupt":
                rig.call.watch.bump(2)
                rig.put([Interrupt(2, 1, CLOCK.now())])
                await settle(0.05)
                assert rig.session.cancels == [1]
            else:
                rig.put([TextChunk(1, 0, " and more", clip=True)])
                await settle(0.05)
            rig.session.speak(1, 1.0, WORDS)
            await settle(1.0)
            assert rig.stage.st.clips_rendered == 0 and len(rig.stage.clip_cache()) == 0
    run_virtual(main)


def test_an_agent_files_calls_share_its_clips_and_the_file_can_turn_clips_off(tmp_path):
    from brisvox.agent.definition import actor_config, load_agent

    root = Path(__file__).resolve().parents[2]
    text = (root / "configs/agents/scripted.toml").read_text()
    assert "[filler]" not in text
    path = tmp_path / "clippy.toml"
    path.write_text(text + "\n[filler]\nclips = false\n")
    agent = load_agent(path, env={})
    cfg = actor_config(agent)
    assert cfg.tts.clip_scope == agent.name and agent.name
    assert cfg.llm.filler.clips is False
    assert actor_config(load_agent(root / "configs/agents/scripted.toml", env={})).llm.filler.clips is True
