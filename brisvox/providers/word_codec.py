"""Synthetic "speech": words encoded in PCM sample values (the scripted providers' codec).

Owns the audio codec of the scripted TTS
(:class:`brisvox.providers.seeded_fakes.FakeTts`, which the agent process's
``[agents] providers = "scripted"`` speaks with) and of the simulation
(``brisvox/sim``: its STT, caller and WebSocket client decode it). A word is
a run of constant samples ``sign * (1000 + code)``, ``code`` its index in a
:class:`Vocab`, ``sign`` alternating per word so two equal neighbours stay
two runs; silence is 0. So any party can decode exactly which words a
stretch of audio carries: the fake STT transcribes only the caller audio it
really received, and the simulated caller knows exactly which bot words
reached its ear (the played-text oracle). Decimation by an integer factor
keeps the values.

Word duration: ``0.08 + 0.055 * len(word)`` seconds (about 14 characters
per second, a usual speaking-rate estimate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BASE = 1000
THRESHOLD = 500  # |sample| above this is speech
NOISE = 32000  # a loud non-word (a cough): speech for the VAD, nothing for the STT


def word_seconds(word: str) -> float:
    return 0.08 + 0.055 * len(word)


class Vocab:
    """Word <-> code, assigned on first use (deterministic for a deterministic script)."""

    __slots__ = ("_codes", "_words")

    def __init__(self) -> None:
        self._codes: dict[str, int] = {}
        self._words: list[str] = []

    def code(self, word: str) -> int:
        c = self._codes.get(word)
        if c is None:
            c = len(self._words)
            if c >= 31000:
                raise ValueError("vocabulary full")
            self._codes[word] = c
            self._words.append(word)
        return c

    def word(self, code: int) -> str:
        return self._words[code]

    def known(self, code: int) -> bool:
        return 0 <= code < len(self._words)


@dataclass(frozen=True, slots=True)
class WordSpan:
    word: str
    start: int  # sample offset
    end: int


def encode(vocab: Vocab, words: list[str], rate: int, parity: int = 0) -> tuple[np.ndarray, list[WordSpan]]:
    """Samples for ``words`` back to back at ``rate`` and each word's span."""
    spans: list[WordSpan] = []
    lens = [max(1, round(word_seconds(w) * rate)) for w in words]
    out = np.empty(sum(lens), dtype=np.int16)
    pos = 0
    for i, (w, n) in enumerate(zip(words, lens, strict=True)):
        sign = 1 if (i + parity) % 2 == 0 else -1
        out[pos : pos + n] = sign * (BASE + vocab.code(w))
        spans.append(WordSpan(w, pos, pos + n))
        pos += n
    return out, spans


class Decoder:
    """Streaming decoder: feed samples, get completed words (a run ended)."""

    __slots__ = ("vocab", "cur", "run", "total")

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.cur = 0  # current sample value of the open run (0: silence)
        self.run = 0  # samples in the open run
        self.total = 0

    def feed(self, samples: np.ndarray) -> list[str]:
        done: list[str] = []
        n = len(samples)
        if n == 0:
            return done
        if self.cur == 0 and not samples.any():  # silence after silence: the common case
            self.run += n
            self.total += n
            return done
        s = samples.astype(np.int32)
        s[np.abs(s) < THRESHOLD] = 0
        # boundaries where the value changes
        change = np.flatnonzero(np.diff(s)) + 1
        starts = np.concatenate(([0], change))
        ends = np.concatenate((change, [len(s)]))
        for a, b in zip(starts, ends, strict=True):
            v = int(s[a])
            if v == self.cur:
                self.run += int(b - a)
                continue
            if self.cur != 0 and self.run > 0 and self.vocab.known(abs(self.cur) - BASE):
                done.append(self.vocab.word(abs(self.cur) - BASE))
            self.cur = v
            self.run = int(b - a)
        self.total += len(samples)
        return done

    def pending(self) -> str | None:
        """The word of the open run, if any (heard partly)."""
        if self.cur != 0 and self.run > 0 and self.vocab.known(abs(self.cur) - BASE):
            return self.vocab.word(abs(self.cur) - BASE)
        return None

    def close_run(self) -> str | None:
        w = self.pending()
        self.cur = 0
        self.run = 0
        return w


def decode_all(vocab: Vocab, samples: np.ndarray) -> list[str]:
    d = Decoder(vocab)
    words = d.feed(samples)
    last = d.close_run()
    if last is not None:
        words.append(last)
    return words
