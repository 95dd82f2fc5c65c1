"""EspeakTts: the light local voice, espeak-ng run as a SUBPROCESS (GPL-3.0 stays out of process).

Owns the espeak-ng fallback TTS. Each text chunk runs ``espeak-ng --stdout
-v <voice> -s <words per minute> -- <text>`` (the Debian package's CLI, or
the binary named by ``binary``); its WAV output is parsed (RIFF header, the
``data`` chunk; espeak writes 22,050 Hz mono PCM16) and streamed as TtsAudio
while the process writes it. A cancel kills the process. Each run is bounded
by ``timeout`` seconds and ``max_bytes`` of output; a missing binary or a
failed run ends the session with TtsClosed(reason). No word timings.

It needs no model and no worker: the fallback when the Piper voice is not
installed, and the cheapest voice for load tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
from collections.abc import AsyncIterator

from brisvox.providers.base import ProviderError, TtsConfig
from brisvox.providers.openai_tts import SerialTtsSession

RATE = 22_050


async def _wav_pcm(stream: asyncio.StreamReader, max_bytes: int) -> AsyncIterator[bytes]:
    head = await stream.readexactly(12)
    if head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        raise ProviderError("protocol", "espeak-ng did not write a WAV stream", retryable=False)
    while True:
        cid = await stream.readexactly(4)
        size = struct.unpack("<I", await stream.readexactly(4))[0]
        if cid == b"data":
            break
        await stream.readexactly(size + (size & 1))
    total = 0
    while True:
        chunk = await stream.read(8192)
        if not chunk:
            return
        total += len(chunk)
        if total > max_bytes:
            raise ProviderError("oversized", "espeak-ng output over its bound", retryable=False)
        yield chunk


class EspeakTts:
    def __init__(self, *, voice: str = "en-us", wpm: int = 170, binary: str = "espeak-ng", timeout: float = 10.0,
                 max_bytes: int = 20 << 20, name: str = "espeak") -> None:
        self.name = name
        self.voice = voice
        self.wpm = wpm
        self.binary = binary
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.runs = 0

    def idle_limit(self) -> float | None:
        return None

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        if shutil.which(self.binary) is None:
            raise ProviderError("connect", f"{self.binary} is not installed (Debian package espeak-ng)",
                                retryable=False)

    async def connect(self, config: TtsConfig, timeout: float) -> SerialTtsSession:  # noqa: ASYNC109
        if shutil.which(self.binary) is None:
            raise ProviderError("connect", f"{self.binary} is not installed (Debian package espeak-ng)",
                                retryable=False)
        voice = config.voice or self.voice
        wpm = int(self.wpm * (config.speed or 1.0))
        return SerialTtsSession(lambda ctx, text: self._run(text, voice, wpm), RATE)

    async def _run(self, text: str, voice: str, wpm: int) -> AsyncIterator[bytes]:
        self.runs += 1
        proc = await asyncio.create_subprocess_exec(
            self.binary, "--stdout", "-v", voice, "-s", str(wpm), "--", text,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(self.timeout):
                async for chunk in _wav_pcm(proc.stdout, self.max_bytes):
                    yield chunk
                rc = await proc.wait()
            if rc != 0:
                raise ProviderError("server", f"espeak-ng exited with {rc}")
        except asyncio.IncompleteReadError:
            raise ProviderError("protocol", "espeak-ng output ended early") from None
        except TimeoutError:
            raise ProviderError("timeout", f"espeak-ng ran over {self.timeout:g}s") from None
        finally:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(proc.wait(), 1.0)
