"""Segmenter: raw slices that concatenate to the text; where chunks are cut."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from brisvox.agent.conversation.context import AssistantMessage, Context, SystemMessage
from brisvox.agent.conversation.truncation import Truncation, apply_truncation
from brisvox.agent.pipeline.cascade.segmenter import Segmenter, SegmenterConfig


def run(text_parts: list[str], cfg: SegmenterConfig | None = None) -> list[str]:
    seg = Segmenter(cfg)
    out: list[str] = []
    for p in text_parts:
        out += seg.push(p)
    rest = seg.finish()
    if rest is not None:
        out.append(rest)
    return out


def test_first_chunk_after_three_words_then_sentences():
    chunks = run(["Sure, I can", " help you with that. It", " is easy. Bye"])
    assert chunks[0] == "Sure, I can"
    assert chunks[1] == " help you with that."
    assert chunks[2] == " It is easy."
    assert chunks[-1] == " Bye"


def test_a_word_is_never_cut_in_the_middle_of_a_delta():
    assert run(["Hel", "lo the", "re my fri", "end."]) == ["Hello there my", " friend."]


def test_whitespace_flood_is_bounded_and_loses_nothing():
    seg = Segmenter(SegmenterConfig(raw_cap=100))
    out = []
    for _ in range(50):
        out += seg.push("   ")
    assert len(seg.buf) <= 100
    out += seg.push("Hello there friend. ")
    rest = seg.finish()
    text = "".join(out) + (rest or "")
    assert text == ("   " * 50 + "Hello there friend.")


@settings(max_examples=200, deadline=None)
@given(
    words=st.lists(st.sampled_from(["Hi", "there,", "big", "world.", "ok?", "şu", "  ", "\n", "x" * 30, "end!"]), min_size=1, max_size=60),
    cuts=st.lists(st.integers(min_value=1, max_value=7), min_size=1, max_size=30),
)
def test_slices_concatenate_to_the_text_and_every_prefix_truncates(words, cuts):
    text = " ".join(words)
    parts, i, k = [], 0, 0
    while i < len(text):
        n = cuts[k % len(cuts)]
        parts.append(text[i : i + n])
        i += n
        k += 1
    chunks = run(parts, SegmenterConfig(max_chunk_chars=40, raw_cap=200))
    assert "".join(chunks) == text.rstrip()
    msg_text = text.lstrip()
    if not msg_text.strip():
        return
    # every sent prefix (at chunk boundaries) applies as a truncation without not_a_prefix
    sent = ""
    for c in chunks:
        sent += c
        heard = sent.lstrip() if msg_text.startswith(sent.lstrip()) else None
        assert heard is not None
        ctx = Context([SystemMessage("s"), AssistantMessage(msg_text)])
        apply_truncation(ctx, 1, Truncation(heard))
        ctx.validate()
