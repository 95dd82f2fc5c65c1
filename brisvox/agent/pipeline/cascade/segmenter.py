"""Segmenter and SegmenterStage: LLM text deltas -> raw text chunks for the TTS.

Owns where the streamed text of a round is cut into TTS chunks:

* Each chunk is the RAW slice ``stream[prev_end:cut]`` (leading whitespace
  included), so the concatenation of all chunks of a round is byte-identical
  to the round's text with its trailing whitespace trimmed: sent text is a
  prefix of the assistant message by construction, and a played-text cut
  never fails with ``not_a_prefix``.
* The first chunk of a round is cut after ``first_min_words`` complete words
  (latency); later chunks at sentence ends, at clause marks once the chunk
  has ``clause_min_chars``, or at the first word end past ``max_chunk_chars``.
* A new stream starts at every LlmResponseStarted, Flush, LlmResponseEnded
  and Interrupt. Memory bound: past ``raw_cap`` bytes of uncut text (a
  whitespace flood, a giant token) the stage cuts as a Flush would; nothing
  is dropped (a whitespace-only chunk goes out too, the TTS stage records it
  as sent text without speaking it).
* A fixed line (``LlmText.clip``: a filler) is one chunk of its own, never
  split: the TTS stage plays it from its pre-rendered clip.

DropStale.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import (
    Flush,
    Interrupt,
    LlmResponseEnded,
    LlmResponseStarted,
    LlmText,
    PipelineFrame,
    TextChunk,
)

_WORD = re.compile(r"\S+")
_SENTENCE_END = ".!?…。"
_CLAUSE = ",;:—–"


@dataclass(frozen=True, slots=True)
class SegmenterConfig:
    first_min_words: int = 3
    clause_min_chars: int = 40
    max_chunk_chars: int = 200
    raw_cap: int = 16000


class Segmenter:
    """Cuts one stream of text; :meth:`push` and :meth:`finish` return raw slices."""

    __slots__ = ("cfg", "buf", "first", "overflows")

    def __init__(self, cfg: SegmenterConfig | None = None) -> None:
        self.cfg = cfg or SegmenterConfig()
        self.buf = ""
        self.first = True
        self.overflows = 0

    def reset(self) -> None:
        self.buf = ""
        self.first = True

    def push(self, text: str) -> list[str]:
        self.buf += text
        out: list[str] = []
        while True:
            cut = self._find_cut()
            if cut is None:
                break
            out.append(self.buf[:cut])
            self.buf = self.buf[cut:]
            self.first = False
        if len(self.buf) > self.cfg.raw_cap:
            self.overflows += 1
            out.append(self.buf)
            self.buf = ""
            self.first = False
        return out

    def _find_cut(self) -> int | None:
        buf = self.buf
        cfg = self.cfg
        n = len(buf)
        words = 0
        for m in _WORD.finditer(buf):
            e = m.end()
            if e >= n:
                return None  # the word may continue in the next delta
            words += 1
            w = m.group()
            if self.first and words >= cfg.first_min_words:
                return e
            if w[-1] in _SENTENCE_END:
                return e
            if w[-1] in _CLAUSE and e >= cfg.clause_min_chars:
                return e
            if e >= cfg.max_chunk_chars:
                return e
        return None

    def finish(self) -> str | None:
        """The rest of the stream (trailing whitespace trimmed), or None if blank."""
        rest = self.buf.rstrip()
        self.buf = ""
        self.first = True
        return rest if rest.strip() else None


class SegmenterStage(Stage):
    DROP_STALE = True

    def __init__(self, call: CallContext, cfg: SegmenterConfig, inbox: Inbox) -> None:
        super().__init__(call, cfg, inbox)
        self.seg = Segmenter(cfg)
        self._round = 0
        self.chunks = 0

    async def _finish(self, epoch: int) -> None:
        rest = self.seg.finish()
        if rest is not None:
            self.chunks += 1
            await self.send(TextChunk(epoch, self._round, rest, last=True))

    async def process(self, frame: PipelineFrame) -> None:
        if isinstance(frame, LlmText):
            if frame.clip:  # a fixed line: one chunk of its own, never split (its clip's key)
                await self._finish(frame.epoch)
                self._round = frame.round
                self.chunks += 1
                await self.send(TextChunk(frame.epoch, frame.round, frame.text, last=True, clip=True))
                return
            self._round = frame.round
            for c in self.seg.push(frame.text):
                self.chunks += 1
                await self.send(TextChunk(frame.epoch, frame.round, c))
            return
        if isinstance(frame, LlmResponseStarted):
            await self._finish(frame.epoch)
            self._round = frame.round
        elif isinstance(frame, Flush | LlmResponseEnded):
            await self._finish(frame.epoch)
        elif isinstance(frame, Interrupt):
            self.seg.reset()
        await self.send(frame)

    async def on_new_epoch(self, epoch: int) -> None:
        self.seg.reset()

    def stats(self) -> dict[str, int]:
        d = super().stats()
        d.update({"chunks": self.chunks, "overflow_finishes": self.seg.overflows})
        return d
