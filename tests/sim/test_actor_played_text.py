"""The played-text oracle: 40 seeded barge-ins judged against the audio released to the wire.

For every case the caller interrupts a random answer at a random moment; the
assistant message in the context must be the sent text cut after exactly the
words whose first sample reached the wire (+-1 frame). The control proves the
window does not hide a one-word error.
"""

from __future__ import annotations

import pytest

from brisvox.agent.conversation.context import AssistantMessage
from brisvox.agent.conversation.playout_book import PlayoutBook
from brisvox.sim.harness import oracle_mismatches, simulate
from brisvox.sim.scenarios import played_text_case
from brisvox.sim.vloop import run_virtual

SEEDS = list(range(100, 140))


@pytest.fixture(scope="module")
def cases():
    return {s: run_virtual(lambda s=s: simulate(played_text_case(s))) for s in SEEDS}


def test_forty_seeded_barge_ins_keep_exactly_the_heard_text(cases):
    cut = 0
    settled_without_timeout = 0
    for seed, res in cases.items():
        assert res.interrupts == 1, seed
        assert oracle_mismatches(res) == [], seed
        assert res.platform.wire.frames_after_clear == [], seed
        assert res.platform.stale_tts_after_clear == 0, seed
        res.actor.context.validate()
        first = next(m for m in res.actor.context if isinstance(m, AssistantMessage))
        answer = res.llm.probe.requests and res.tts.probe.texts
        assert answer
        if res.actor.book.st.truncations or res.actor.book.st.removed:
            cut += 1
        if res.actor.book.st.settle_timeouts == 0:
            settled_without_timeout += 1
        # the turn after the barge-in is answered without waiting for the settle
        lat = res.record["turns"][1]["request_ms"]
        assert lat is not None and lat <= 20.0, (seed, lat)
        assert first.text == "" or not first.text.endswith(" ")
    assert cut >= 30  # most barge-ins land inside the answer
    assert settled_without_timeout >= 30


def test_the_oracle_catches_a_one_word_error(cases):
    """Control: a book that reports one word more (or less) than was heard fails the oracle."""
    caught = 0
    for seed in SEEDS[:10]:
        res = run_virtual(lambda seed=seed: simulate(played_text_case(seed), ))
        if res.actor.book.st.truncations == 0:
            continue
        # rewrite the cut message with one word more of the sent text
        book: PlayoutBook = res.actor.book
        for r in book.rounds.values():
            if r.msg_index is None or r.utterance is None:
                continue
            u = book.utts[r.utterance]
            msg = res.actor.context[r.msg_index]
            sent_words = u.sent_text.split()
            got = msg.text.split()
            if 0 < len(got) < len(sent_words):
                wrong = " ".join(sent_words[: len(got) + 1])
                res.actor.context.replace(r.msg_index, AssistantMessage(wrong, msg.tool_calls))
                if oracle_mismatches(res):
                    caught += 1
                break
    assert caught >= 5
