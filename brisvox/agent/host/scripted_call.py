"""The scripted provider set of ``[agents] providers = "scripted"``: fixed lines, no keys.

Owns :func:`scripted_providers`: every call of an agent process in scripted
mode gets the scripted providers the simulation uses too (the STT hears the
``user`` lines in order, the LLM answers the ``bot`` lines in order, the TTS
speaks them in the word codec), seeded by the call id so a call replays the
same way. The lines come from ``[agents] script`` (JSON ``{"user": [...],
"bot": [...]}``) or are the built-in demo lines.
"""

from __future__ import annotations

from pathlib import Path

from brisvox.agent.host.config import AgentsConfig
from brisvox.providers.base import LlmProvider, SttProvider, TtsProvider


def scripted_providers(cfg: AgentsConfig, call_id: str, tts_rate: int) -> tuple[SttProvider, LlmProvider, TtsProvider]:
    """The scripted provider set: lines from ``[agents] script`` (JSON: {"user": [...],
    "bot": [...]}) or built-in demo lines."""
    import orjson

    from brisvox.providers.scripted_session import ScriptedLinesStt
    from brisvox.providers.seeded_fakes import FakeLlm, FakeTts, LlmScript, Say
    from brisvox.providers.word_codec import Vocab

    user: list[str] = ["hello", "tell me more", "thank you"]
    bot: list[str] = [
        "Hello! I am the scripted brisvox agent. This line is long enough to be interrupted, "
        "so go ahead and talk over me whenever you like.",
        "Here is more. The scripted agent speaks fixed lines in order.",
        "You are welcome. Goodbye.",
    ]
    if cfg.script:
        data = orjson.loads(Path(cfg.script).read_bytes())
        user = [str(x) for x in data.get("user", user)]
        bot = [str(x) for x in data.get("bot", bot)]
    seed = sum(call_id.encode()) % 1000
    stt = ScriptedLinesStt(user, seed=seed)
    llm = FakeLlm([LlmScript((Say(b),)) for b in bot], seed=seed + 1, default=LlmScript((Say("Okay."),)))
    tts = FakeTts(Vocab(), seed=seed + 2, rate=tts_rate)
    return stt, llm, tts
