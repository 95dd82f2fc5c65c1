"""The scripted conversations of the chaos run: what is said, heard and answered, per turn.

Every caller speaks the same recorded question (``turn_complete.8k.wav``) at
each of its turns; what the fake STT "hears" is the scripted phrase for the
Nth utterance of its connection (N counts from-finalize answers that had
speech). A call's *variant* is its agent (``chaos_<variant>``) and the path
prefix of its three vendor URLs (``/<variant>/...``), so the vendors know the
script and the faults that apply without knowing the call:

* ``talk``: three questions, three answers, no tool;
* ``book``: turn 2 asks for a booking; the LLM says "Let me book that." and
  calls ``book_table``; the tool's result becomes "You are booked, Kaya:
  BK-n."; turn 3 says goodbye;
* ``slowbook``: ``book`` whose booking API answers after 3 s (the caller
  hangs up mid-tool);
* ``sttcut``, ``ttscut``, ``llmhang``, ``llm429``: ``talk`` whose STT cuts its
  socket at the last utterance, whose TTS cuts its socket mid-answer, whose
  LLM never answers one request, or answers one with 429 + ``Retry-After``,
  when the fault schedule armed it;
* ``sttfin``: ``talk`` whose STT never answers the Finalize of the last
  utterance (the stage's Finalize timeout replaces the session; the finals
  gate answers the turn from the interim), when armed.
* ``ttsdie``: ``talk`` whose primary TTS (Cartesia) dies mid-answer 2 and
  stays down, when armed; its agent has a secondary TTS of another vendor
  (ElevenLabs) with a voice of its own, which speaks the rest of the call.

Invariants: the LLM's answer depends only on the variant's script and the
request (how many user turns it carries, whether it ends with a tool result);
ids in the answers are deterministic (``call_book_<turn>``); booking numbers
and tool-call ids are the only per-call parts and :func:`normalise` removes
them.
"""

from __future__ import annotations

import re
from typing import Any

from bench.harness.llm_wire import Call, Resp

SCRIPT_OF = {"talk": "talk", "book": "book", "slowbook": "book", "sttcut": "talk", "ttscut": "talk",
             "llmhang": "talk", "llm429": "talk", "sttfin": "talk", "ttsdie": "talk"}
VARIANTS = tuple(SCRIPT_OF)

USER = {
    "talk": ["Can you tell me what time you close tonight?", "Do you have a table on the terrace?",
             "Thank you, goodbye."],
    "book": ["I would like to book a table.", "For two people at seven tonight, the name is Kaya.",
             "Thank you, goodbye."],
}
BOT = {
    "talk": ["We close at eleven tonight.", "Yes, the terrace is open.", "Goodbye, see you soon."],
    "book": ["Sure. For how many people, and when?", "Let me book that.", "Goodbye, see you soon."],
}
BOOKED = "You are booked, Kaya: {booking}."
NOT_BOOKED = "Sorry, I could not confirm the booking."
BOOK_ARGS = {"name": "Kaya", "date": "2026-05-01", "time": "19:00", "people": 2}
TURNS = 3
SECONDARY_VOICE = "ChaosSecondVoice0001"  # the ttsdie agents' secondary TTS (an ElevenLabs voice id: 20 characters)
MARKER = "[chaos:{variant}]"


def system_prompt(variant: str) -> str:
    return f"{MARKER.format(variant=variant)} You answer calls for Brisvox Bistro. Answer briefly."


def stt_phrase(variant: str, n: int) -> str:
    """The transcript of utterance ``n`` (0-based) on one STT connection; "" past the script."""
    lines = USER[SCRIPT_OF.get(variant, "talk")]
    return lines[n] if 0 <= n < len(lines) else ""


_BK = re.compile(r"BK-\d+")


def llm_answer(variant: str, body: dict[str, Any]) -> Resp:
    """The fake model's answer to one Chat Completions request."""
    script = SCRIPT_OF.get(variant, "talk")
    msgs = body.get("messages") or []
    n_user = sum(1 for m in msgs if m.get("role") == "user")
    last = msgs[-1] if msgs else {}
    turn = max(1, min(TURNS, n_user))
    if script == "book" and turn == 2:
        if last.get("role") == "tool":
            m = _BK.search(str(last.get("content", "")))
            return Resp(text=[BOOKED.format(booking=m.group(0)) if m else NOT_BOOKED])
        return Resp(text=[BOT["book"][1]], calls=[Call(f"call_book_{n_user}", "book_table", dict(BOOK_ARGS))])
    if last.get("role") == "tool":  # a tool result outside the booking turn: acknowledge it
        return Resp(text=["Noted."])
    return Resp(text=split_text(BOT[script][turn - 1]))


def split_text(s: str) -> list[str]:
    """A sentence as streamed deltas (word by word)."""
    words = s.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]


def expected(variant: str) -> list[tuple[str, str]]:
    """The normalised conversation of an undisturbed call of ``variant``."""
    script = SCRIPT_OF[variant]
    out: list[tuple[str, str]] = []
    for i in range(TURNS):
        out.append(("user", USER[script][i]))
        if script == "book" and i == 1:
            out += [("assistant", BOT["book"][1] + " +tool:book_table"), ("tool", "<booking>"),
                    ("assistant", BOOKED.format(booking="BK-#"))]
        else:
            out.append(("assistant", BOT[script][i]))
    return out


def normalise(conversation: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """A record's conversation as (role, text) with booking numbers and tool ids removed;
    the system prompt and late notes are left out (notes are judged on their own)."""
    out: list[tuple[str, str]] = []
    for m in conversation:
        role = m.get("role")
        if role == "user":
            out.append(("user", str(m.get("content", "")).strip()))
        elif role == "assistant":
            text = _BK.sub("BK-#", str(m.get("text", "")).strip())
            calls = "".join(f" +tool:{c.get('name')}" for c in m.get("tool_calls") or [])
            out.append(("assistant", (text + calls).strip()))
        elif role == "tool":
            out.append(("tool", "<booking>" if _BK.search(str(m.get("content", ""))) else "<error>"))
    return out
