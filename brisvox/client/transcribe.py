"""Turn the bot's (or a recorded caller's) audio back into text, locally: Whisper tiny.en.

Owns the client's use of the worker's Whisper runner
(:class:`workers.api.WhisperRunner`: faster-whisper, int8, one thread,
loaded once on first use): audio at any rate is resampled to 16 kHz and cut
into pieces of at most ``PIECE_S`` seconds (Whisper's window is 30 s), each
transcribed and the texts joined. The runner trims each piece to its voiced
part and skips clips shorter than 0.2 s (an empty text, not an error).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from brisvox.client.speech import resample

RATE = 16_000
PIECE_S = 25.0


class TranscribeError(RuntimeError):
    """faster-whisper or the Whisper model is not installed."""


class Transcriber:
    def __init__(self, models_dir: str | None = None, max_tokens: int = 200) -> None:
        self.models_dir = models_dir
        self.max_tokens = max_tokens
        self._runner: Any = None

    def _get(self) -> Any:
        if self._runner is None:
            try:
                import faster_whisper  # noqa: F401
            except ImportError:
                raise TranscribeError("faster-whisper is not installed: pip install -e '.[local]'") from None
            from workers.api import ModelError, WhisperRunner, locate

            try:
                path = locate("whisper_tiny_en", self.models_dir)
            except ModelError as e:
                raise TranscribeError(str(e)) from None
            self._runner = WhisperRunner(path.parent)
        return self._runner

    def text(self, samples: np.ndarray, rate: int) -> str:
        if len(samples) == 0:
            return ""
        x = resample(samples, rate, RATE)
        runner = self._get()
        n = int(PIECE_S * RATE)
        parts = []
        for i in range(0, len(x), n):
            t = runner.transcribe(x[i:i + n], "en", self.max_tokens).text
            if t:
                parts.append(t)
        return " ".join(parts).strip()
