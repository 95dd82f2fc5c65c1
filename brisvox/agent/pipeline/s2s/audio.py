"""Audio conversion at the edges of the S2S stage: caller audio to the provider, model audio to the tts ring.

Owns the two converters of one S2S call (soxr streams at ``QQ`` quality: no
added delay and output on every call, what the realtime path needs; the HQ
qualities buffer 43-85 ms and answer in bursts; one stream per direction and
session, so no chunk-edge clicks):

* :class:`InputConverter`: 16 kHz PCM16 (the call's in16 ring) to what the
  session takes: PCM16 at its ``input_rate`` (24 kHz for OpenAI, 16 kHz for
  Gemini: no conversion at all) or μ-law at 8 kHz (the G.711 codec of
  :mod:`brisvox.wire.g711`; resampled 16 -> 8 kHz first).
* :class:`OutputConverter`: the provider's PCM16 bytes at its ``output_rate``
  to int16 samples at the call's tts ring rate (an odd trailing byte is kept
  for the next chunk, so a provider that splits samples loses nothing).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from brisvox.wire.g711 import ulaw_encode

IN16 = 16000


def _stream(src: int, dst: int) -> Any:
    import soxr

    return soxr.ResampleStream(src, dst, 1, dtype="int16", quality="QQ")


class InputConverter:
    __slots__ = ("rate", "ulaw", "_rs")

    def __init__(self, rate: int, encoding: str = "pcm16") -> None:
        self.ulaw = encoding == "g711_ulaw"
        self.rate = 8000 if self.ulaw else rate
        self._rs = _stream(IN16, self.rate) if self.rate != IN16 else None

    def convert(self, samples: np.ndarray) -> bytes:
        s = samples if self._rs is None else self._rs.resample_chunk(samples)
        if self.ulaw:
            return ulaw_encode(s)
        return np.ascontiguousarray(s, dtype="<i2").tobytes()


class OutputConverter:
    __slots__ = ("src", "dst", "_rs", "_odd")

    def __init__(self, src: int, dst: int) -> None:
        self.src = src
        self.dst = dst
        self._rs = _stream(src, dst) if src != dst else None
        self._odd = b""

    def convert(self, pcm: bytes) -> np.ndarray:
        if self._odd:
            pcm = self._odd + pcm
            self._odd = b""
        if len(pcm) % 2:
            self._odd = pcm[-1:]
            pcm = pcm[:-1]
        samples = np.frombuffer(pcm, dtype="<i2").astype(np.int16, copy=False)
        if self._rs is not None and len(samples):
            samples = self._rs.resample_chunk(samples)
        return samples
