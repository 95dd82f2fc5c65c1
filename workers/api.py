"""The workers' public surface for in-process use: the local models, run in the caller's process.

Code outside the worker processes that runs a local model itself (the
``brisvox call`` client, :mod:`brisvox.client`: it speaks the caller's lines
with Piper and transcribes the bot with Whisper) imports from here and only
from here; everything else in :mod:`workers` is the inference worker's
inside and may change with it (an import-linter contract in
``pyproject.toml`` holds the client to this module).

* :func:`locate` (and :class:`ModelError`): the verified path of a model file
  by catalogue name, or an error naming the fix (``brisvox models install``).
* :class:`WhisperRunner`: Whisper tiny.en (faster-whisper, int8, one thread,
  loaded on first use); single-threaded use only.
* :class:`PiperRunner`: the Piper joe voice, synthesized in a subprocess
  (piper-tts is GPL: it never runs in a brisvox process).

Importing this module loads no model and no model runtime (faster-whisper,
piper-tts are imported when a runner first needs them).
"""

from __future__ import annotations

from workers.local_stt import WhisperRunner
from workers.local_tts import PiperRunner
from workers.models import ModelError, locate

__all__ = ["ModelError", "PiperRunner", "WhisperRunner", "locate"]
