"""Pre-rendered clips of fixed lines (fillers): synthesized once, played from memory.

Owns what a clip is, how one is captured and where the caches live:

* A :class:`Clip` is the audio (PCM16 at the tts ring rate) and the word timings of
  one fixed line as the agent's TTS voice spoke it. It is captured on first use
  (:class:`Capture`): the TTS stage renders the line through the provider as an
  ordinary utterance and keeps what came back, but stores it only when that
  provider context carried the line alone and ended cleanly (flushed, not
  cancelled, not lost, at most :data:`MAX_CLIP_SECONDS` of audio). A context
  cancelled before its flush (a barge-in while the provider still rendered it)
  stores nothing: the next use renders again. What the caller heard of the first
  rendering does not matter: the clip is what the provider produced.
* A :class:`ClipCache` maps the line's text to its clip, least recently used first
  out, at most :data:`MAX_CLIPS` clips and :data:`MAX_CACHE_BYTES` of audio (a
  filler is about 1 s: 48 KB at 24 kHz).
* Where a cache lives (:func:`cache_for`): the key is the scope, the TTS provider's
  name, the voice settings (voice, model, language, speed, extra options) and the
  ring rate, so a clip is only ever played in the voice and at the rate it was made
  with. Scope ``""`` (no agent named) gives the TTS stage a cache of its own (one
  call). A named scope (the agent's name, set by
  :func:`brisvox.agent.definition.actor_config`) selects the process-wide cache of
  that agent and voice, shared by every call of the agent process; at most
  :data:`MAX_SCOPES` such caches are kept (least recently used first out), so the
  process holds at most MAX_SCOPES x MAX_CACHE_BYTES (32 MiB) of shared clips.

Single event loop (the agent process runs every call on one loop); no locks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

MAX_CLIPS = 32
MAX_CACHE_BYTES = 2 * 1024 * 1024  # 43 s of 24 kHz audio: 32 fillers of 1.3 s
MAX_SCOPES = 16
MAX_CLIP_SECONDS = 8.0
PIECE_SECONDS = 0.1  # a clip is played in AudioOut frames of this length

Word = tuple[str, float, float]


@dataclass(frozen=True, slots=True)
class Clip:
    text: str
    pcm: np.ndarray  # int16 at ``rate``, read-only
    words: tuple[Word, ...]
    rate: int

    @property
    def seconds(self) -> float:
        return len(self.pcm) / self.rate

    def pieces(self) -> Iterator[np.ndarray]:
        n = max(1, int(self.rate * PIECE_SECONDS))
        for a in range(0, len(self.pcm), n):
            yield self.pcm[a : a + n]


@dataclass(slots=True)
class Capture:
    """A first rendering being recorded (bounded by :data:`MAX_CLIP_SECONDS`)."""

    text: str
    rate: int
    pcm: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    words: list[Word] = field(default_factory=list)
    spoiled: bool = False  # too long, or the context carried something else

    def audio(self, samples: np.ndarray) -> None:
        if self.spoiled:
            return
        self.samples += len(samples)
        if self.samples > MAX_CLIP_SECONDS * self.rate:
            self.spoiled = True
            self.pcm.clear()
            return
        self.pcm.append(samples)

    def word(self, word: str, start: float, end: float) -> None:
        if not self.spoiled and len(self.words) < 256:
            self.words.append((word, start, end))

    def clip(self) -> Clip | None:
        if self.spoiled or not self.samples:
            return None
        pcm = np.concatenate(self.pcm).astype(np.int16, copy=False)
        pcm.setflags(write=False)
        return Clip(self.text, pcm, tuple(self.words), self.rate)


@dataclass(slots=True)
class ClipStats:
    hits: int = 0
    misses: int = 0
    stored: int = 0
    evicted: int = 0


class ClipCache:
    __slots__ = ("cap", "max_bytes", "_clips", "_bytes", "st")

    def __init__(self, cap: int = MAX_CLIPS, max_bytes: int = MAX_CACHE_BYTES) -> None:
        self.cap = max(1, cap)
        self.max_bytes = max_bytes
        self._clips: OrderedDict[str, Clip] = OrderedDict()
        self._bytes = 0
        self.st = ClipStats()

    def __len__(self) -> int:
        return len(self._clips)

    def get(self, text: str) -> Clip | None:
        clip = self._clips.get(text)
        if clip is None:
            self.st.misses += 1
            return None
        self._clips.move_to_end(text)
        self.st.hits += 1
        return clip

    def put(self, clip: Clip) -> None:
        if clip.pcm.nbytes > self.max_bytes:
            return
        old = self._clips.pop(clip.text, None)
        if old is not None:
            self._bytes -= old.pcm.nbytes
        self._clips[clip.text] = clip
        self._bytes += clip.pcm.nbytes
        self.st.stored += 1
        while len(self._clips) > self.cap or self._bytes > self.max_bytes:
            _, out = self._clips.popitem(last=False)
            self._bytes -= out.pcm.nbytes
            self.st.evicted += 1

    def bytes(self) -> int:
        return self._bytes


_SHARED: OrderedDict[tuple[Any, ...], ClipCache] = OrderedDict()


def voice_key(provider: str, voice: str, model: str, language: str, speed: float,
              extra: Mapping[str, Any], rate: int) -> tuple[Any, ...]:
    return (provider, voice, model, language, float(speed), repr(sorted(extra.items())), rate)


def cache_for(scope: str, voice: tuple[Any, ...]) -> ClipCache:
    """The cache of ``scope`` (an agent) and ``voice``: a fresh private one for scope
    ``""``, else the process-wide one (created on first use, bounded)."""
    if not scope:
        return ClipCache()
    key = (scope, *voice)
    cache = _SHARED.get(key)
    if cache is None:
        cache = _SHARED[key] = ClipCache()
        while len(_SHARED) > MAX_SCOPES:
            _SHARED.popitem(last=False)
    else:
        _SHARED.move_to_end(key)
    return cache


def forget_shared() -> None:
    """Drop every process-wide cache (tests)."""
    _SHARED.clear()
