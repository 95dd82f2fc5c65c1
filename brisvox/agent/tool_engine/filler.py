"""The filler policy: when a tool round says "one moment" and which phrase.

Owns the decision only; the call actor plays the phrase as its own round.
With ``FillerConfig.clips`` (the default) that round is a clip round: the TTS
stage renders each phrase once per agent, voice and rate (on first use) and
plays it from memory afterwards, with no TTS request
(:mod:`brisvox.agent.pipeline.cascade.tts_clips`).

* Delay: measured on the injected clock from the start of the tool round.
  The default is ONE fixed delay (1.2 s) for every tool that has a filler; a
  tool opts out with ``filler_after=None`` (under a fixed delay its own value
  is only the on/off switch). ``FillerPolicy.per_tool()`` uses each tool's
  ``filler_after`` as its delay instead. A round fills after the smallest
  delay of its calls (ties: the first call).
* Phrases rotate round-robin on the policy's counter; only a filler actually
  chosen (:meth:`FillerPolicy.choose`, called when the delay passed) advances
  it. :meth:`FillerPolicy.clone` starts its own rotation and shares only the
  clip cache. No randomness: simulations stay deterministic.
* A phrase may carry a clip key; it reaches the choice only when the clip
  cache reports the clip available.
* An empty phrase list or ``enabled=False`` switches fillers off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from brisvox.agent.tool_engine.registry import ToolSpec

DEFAULT_FILLER_DELAY = 1.2
DEFAULT_FILLER_TEXT = "One moment, please."


@dataclass(frozen=True, slots=True)
class FillerPhrase:
    text: str
    clip_key: str | None = None


@dataclass(frozen=True, slots=True)
class FillerChoice:
    text: str
    clip_key: str | None  # set only when the clip is available


class FillerClips(Protocol):
    def available(self, key: str) -> bool: ...


class StaticClips:
    """A clip cache that knows a fixed set of keys."""

    __slots__ = ("_keys",)

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = frozenset(keys)

    def available(self, key: str) -> bool:
        return key in self._keys


@dataclass(frozen=True, slots=True)
class FillerConfig:
    """Session config: ``enabled``, ``delay`` (fixed) or ``per_tool`` (each tool's own),
    ``clips``: phrases are played from their pre-rendered clips once rendered."""

    enabled: bool = True
    delay: float = DEFAULT_FILLER_DELAY
    per_tool: bool = False
    clips: bool = True

    def validate(self) -> None:
        if self.delay < 0:
            raise ValueError("filler delay must not be negative")


FillerConfig.DEFAULT = FillerConfig()  # type: ignore[attr-defined]
FillerConfig.PER_TOOL = FillerConfig(True, DEFAULT_FILLER_DELAY, True)  # type: ignore[attr-defined]
FillerConfig.OFF = FillerConfig(False)  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class FillerPlan:
    """A round's filler: after ``delay`` seconds, for the call at ``call_index``."""

    delay: float
    call_index: int
    tool: str


def _phrases(items: Sequence[str | FillerPhrase]) -> tuple[FillerPhrase, ...]:
    return tuple(p if isinstance(p, FillerPhrase) else FillerPhrase(p) for p in items)


class FillerPolicy:
    __slots__ = ("enabled", "delay", "per_tool_delay", "_phrases", "_tool_phrases", "_clips", "_counter")

    def __init__(self, delay: float = DEFAULT_FILLER_DELAY) -> None:
        self.enabled = True
        self.delay = delay
        self.per_tool_delay = False
        self._phrases: tuple[FillerPhrase, ...] = (FillerPhrase(DEFAULT_FILLER_TEXT),)
        self._tool_phrases: dict[str, tuple[FillerPhrase, ...]] = {}
        self._clips: FillerClips | None = None
        self._counter = 0

    # -- builders (each returns self)
    @classmethod
    def per_tool(cls) -> FillerPolicy:
        p = cls()
        p.per_tool_delay = True
        return p

    @classmethod
    def from_config(cls, config: FillerConfig) -> FillerPolicy:
        config.validate()
        p = cls.per_tool() if config.per_tool else cls(config.delay)
        p.enabled = config.enabled
        return p

    def with_delay(self, delay: float) -> FillerPolicy:
        self.delay = delay
        self.per_tool_delay = False
        return self

    def with_enabled(self, enabled: bool) -> FillerPolicy:
        self.enabled = enabled
        return self

    def with_phrases(self, phrases: Sequence[str | FillerPhrase]) -> FillerPolicy:
        self._phrases = _phrases(phrases)
        return self

    def with_tool_phrases(self, tool: str, phrases: Sequence[str | FillerPhrase]) -> FillerPolicy:
        self._tool_phrases[tool] = _phrases(phrases)
        return self

    def with_clips(self, clips: FillerClips) -> FillerPolicy:
        self._clips = clips
        return self

    def clone(self) -> FillerPolicy:
        """A copy with its own rotation (counter at 0); the clip cache is shared."""
        p = FillerPolicy(self.delay)
        p.enabled = self.enabled
        p.per_tool_delay = self.per_tool_delay
        p._phrases = self._phrases
        p._tool_phrases = dict(self._tool_phrases)
        p._clips = self._clips
        return p

    # -- decisions
    def plan(self, specs: Sequence[ToolSpec | None]) -> FillerPlan | None:
        """The filler of a round whose calls have ``specs`` (None: a call with no
        known tool), or None when the round speaks no filler."""
        if not self.enabled or not self._phrases and not self._tool_phrases:
            return None
        best: FillerPlan | None = None
        for i, spec in enumerate(specs):
            if spec is None or spec.filler_after is None:
                continue
            d = spec.filler_after if self.per_tool_delay else self.delay
            if best is None or d < best.delay:
                best = FillerPlan(d, i, spec.name)
        return best

    def choose(self, tool: str | None = None) -> FillerChoice | None:
        """The phrase to speak now (advances the rotation), or None when off."""
        if not self.enabled:
            return None
        phrases = self._tool_phrases.get(tool or "") or self._phrases
        if not phrases:
            return None
        p = phrases[self._counter % len(phrases)]
        self._counter += 1
        key = p.clip_key if p.clip_key and self._clips is not None and self._clips.available(p.clip_key) else None
        return FillerChoice(p.text, key)
