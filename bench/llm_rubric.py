"""The local-LLM benchmark's fixed caller questions and the rubric that scores an answer.

Owns :data:`QUESTIONS` (20 short caller questions, each with the words of
which one must appear for the answer to count as answering it) and
:func:`score`: four checks per answer, each 0 or 1, judged mechanically (no
model judges a model):

* ``answers``: one of the question's accepted words appears (word match,
  case-folded; digits and number words are both accepted where a number is
  the answer);
* ``short``: one or two sentences and at most 40 words (a phone answer);
* ``english``: mostly ASCII letters and at least one very common English word;
* ``plain``: no list, no markdown, no code, no emoji (it is spoken by a TTS).

Also :data:`S1` (tool scenario S1 of ``tests/system/test_providers_tool_scenarios.py``:
three independent weather lookups asked in one sentence) and :func:`s1_calls`,
which reads the tool calls a model wrote (Qwen's ``<tool_call>{json}</tool_call>``
text or bare JSON objects) and keeps the well-formed ``get_weather`` ones.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("What is the capital of France?", ("paris",)),
    ("How many days are in a week?", ("seven", "7")),
    ("What color is the sky on a clear day?", ("blue",)),
    ("What is two plus two?", ("four", "4")),
    ("Hello, can you hear me?", ("yes", "hear", "hello", "hi")),
    ("What is the capital of Japan?", ("tokyo",)),
    ("How many hours are in a day?", ("24", "twenty-four", "twenty")),
    ("What is the opposite of hot?", ("cold",)),
    ("Which planet do we live on?", ("earth",)),
    ("What do bees make?", ("honey",)),
    ("At what temperature does water freeze in Celsius?", ("0", "zero")),
    ("How many legs does a spider have?", ("eight", "8")),
    ("What language do people speak in Spain?", ("spanish",)),
    ("What is the largest ocean on Earth?", ("pacific",)),
    ("How many minutes are in an hour?", ("sixty", "60")),
    ("I would like to book a table for two tonight.", ("book", "booking", "table", "reservation", "reserve")),
    ("Can I speak to a human, please?", ("human", "transfer", "connect", "agent", "person", "representative")),
    ("Thank you, goodbye.", ("bye", "goodbye", "welcome", "thank", "thanks")),
    ("How do I reset my password?", ("password", "reset")),
    ("At what temperature does water boil in Celsius?", ("100", "hundred")),
)

SYSTEM = ("You are a friendly voice assistant on a phone line. "
          "Answer in one or two short sentences. Do not use lists or special characters.")
# the few-shot variant: the same instruction and two example exchanges, as chat turns
FEW_SHOT: tuple[tuple[str, str], ...] = (
    ("What is the capital of Italy?", "The capital of Italy is Rome."),
    ("Can you help me with my order?", "Of course, I can help with your order. What would you like to know?"),
)

COMMON = {"the", "a", "an", "is", "are", "was", "were", "be", "been", "i", "you", "it", "we", "they", "he", "she",
          "of", "to", "and", "or", "in", "on", "at", "by", "for", "from", "with", "as", "that", "this", "what",
          "can", "will", "would", "not", "no", "yes", "all", "my", "your", "our", "their", "hello", "hi", "there",
          "have", "has", "do", "does", "how", "when", "where", "which", "who", "about", "if", "so", "but"}


def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+(?:['-][a-z0-9]+)*", text.lower())


@dataclass(frozen=True, slots=True)
class Score:
    answers: int
    short: int
    english: int
    plain: int

    @property
    def total(self) -> int:
        return self.answers + self.short + self.english + self.plain


def sentences(text: str) -> int:
    parts = [p for p in re.split(r"(?<=[.!?])\s+", text.strip()) if re.search(r"[A-Za-z0-9]", p)]
    return len(parts)


# function words of the languages small models drift into (SmolLM2 answers in French)
FOREIGN = {"le", "la", "les", "des", "et", "est", "une", "du", "el", "los", "las", "y", "es", "und", "der",
           "die", "das", "ist", "il", "di", "che", "non", "e", "que", "um", "uma"}


def is_english(text: str) -> bool:
    """Latin letters only, at most one foreign function word, and a common English word once the
    answer is longer than a few words ("Cold." is English; "Le Grand Paris, la France" is not)."""
    w = words(text)
    letters = [c for c in text if c.isalpha()]
    if not w or sum(c.isascii() for c in letters) < 0.95 * len(letters):
        return False
    if sum(x in FOREIGN for x in w) > 1:
        return False
    return len(w) < 6 or bool(COMMON & set(w))


def is_plain(text: str) -> bool:
    if re.search(r"(^|\n)\s*([-*•]|\d+[.)])\s", text) or re.search(r"[*#`|<>{}\[\]_~]", text):
        return False
    return not any(ord(c) > 0x2000 and not c.isalpha() for c in text)  # no emoji or symbols


def score(answer: str, accepted: tuple[str, ...]) -> Score:
    w = set(words(answer))
    answers = int(any(a in w or (" " in a and a in answer.lower()) for a in accepted))
    short = int(0 < sentences(answer) <= 2 and len(words(answer)) <= 40)
    return Score(answers, short, int(is_english(answer)), int(is_plain(answer)))


# -- tool scenario S1: three independent calls in one response -----------------------------------

S1 = "What is the weather in Paris, Rome and Izmir?"
S1_CITIES = ("paris", "rome", "izmir")
S1_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of one city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "city name"}},
                   "required": ["city"], "additionalProperties": False}}}]


def s1_calls(text: str) -> list[str]:
    """The cities of the well-formed get_weather calls a model wrote, in order."""
    found: list[str] = []
    for m in re.finditer(r"\{.*?\}\s*\}|\{[^{}]*\}", text, re.S):
        try:
            obj = json.loads(m.group(0))
        except ValueError:
            continue
        if not isinstance(obj, dict) or obj.get("name") != "get_weather":
            continue
        args = obj.get("arguments", obj.get("parameters"))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                continue
        if isinstance(args, dict) and isinstance(args.get("city"), str) and set(args) == {"city"}:
            found.append(args["city"])
    return found


def s1_passed(cities: list[str]) -> bool:
    return sorted(c.strip().lower() for c in cities) == sorted(S1_CITIES)
