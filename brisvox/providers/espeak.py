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

:func:`usable_voice` is the offline check of a leg's ``voice`` (``brisvoxd check``):
the voices ``espeak-ng --voices`` lists (a language code, a file name, and a
``+variant`` of ``espeak-ng --voices=variant``), case-insensitive as espeak-ng
matches them; MBROLA voices (``mb/...``) only when the ``mbrola`` binary is
installed. Any other voice makes espeak-ng exit 1 without a sound.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import struct
import subprocess
from collections.abc import AsyncIterator
from functools import lru_cache

from brisvox.providers.base import ProviderError, TtsConfig
from brisvox.providers.openai_tts import SerialTtsSession

RATE = 22_050
DEFAULT_VOICE = "en-us"


def _listing(binary: str, which: str) -> list[list[str]]:
    out = subprocess.run([binary, f"--voices{which}"], capture_output=True, text=True, timeout=10.0,
                         check=False).stdout
    return [line.split() for line in out.splitlines()[1:] if line.strip()]


@lru_cache(maxsize=8)
def voices(binary: str = "espeak-ng") -> tuple[frozenset[str], frozenset[str]] | None:
    """(voices, variants) espeak-ng accepts after ``-v``, lower-cased; None when ``binary``
    is not installed. Columns: Pty, Language, Age/Gender, VoiceName, File, Other Languages."""
    if shutil.which(binary) is None:
        return None
    try:
        rows, variant_rows = _listing(binary, ""), _listing(binary, "=variant")
    except (OSError, subprocess.SubprocessError):
        return None
    mbrola = shutil.which("mbrola") is not None
    names: set[str] = set()
    for r in rows:
        if len(r) < 5 or (r[4].startswith("mb/") and not mbrola):
            continue
        names.update({r[1].lower(), r[4].lower()})
        names.update(x.strip("()").lower() for x in r[5:] if x.startswith("("))
    variants = {x.lower() for r in variant_rows if len(r) >= 5 for x in (r[3], r[4].rsplit("/", 1)[-1])}
    return frozenset(names), frozenset(variants)


def usable_voice(voice: str, binary: str = "espeak-ng") -> bool | None:
    """Can espeak-ng speak with ``voice`` (``name`` or ``name+variant``)? None: not installed."""
    known = voices(binary)
    if known is None:
        return None
    names, variants = known
    base, _, variant = voice.lower().partition("+")
    return base in names and (not variant or variant in variants)


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
    def __init__(self, *, voice: str = DEFAULT_VOICE, wpm: int = 170, binary: str = "espeak-ng", timeout: float = 10.0,
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
