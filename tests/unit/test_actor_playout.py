"""The playout book driven by hand: heard prefixes, clears, marks, lead margin and fade."""

from __future__ import annotations

import asyncio

from brisvox.agent.conversation.context import AssistantMessage, Context, SystemMessage, UserMessage
from brisvox.agent.conversation.playout_book import PlayoutBook, PlayoutConfig, heard_prefix
from brisvox.sim.vloop import run_virtual

WORDS = [("Hello,", 0.0, 0.4), ("big", 0.4, 0.7), ("world.", 0.7, 1.1)]
SENT = "Hello, big world."


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t


def test_heard_prefix_counts_words_that_started():
    assert heard_prefix(SENT, WORDS, 0.0).heard == ""
    assert heard_prefix(SENT, WORDS, 0.01).heard == "Hello,"
    assert heard_prefix(SENT, WORDS, 0.4).heard == "Hello,"
    assert heard_prefix(SENT, WORDS, 0.41).heard == "Hello, big"
    assert heard_prefix(SENT, WORDS, 5.0).heard == SENT


def test_heard_prefix_without_timings_is_an_estimate_at_a_word_end():
    t = heard_prefix(SENT, [], 0.5)  # 7 characters at 14/s
    assert t.estimated and t.heard == "Hello, big"[: len(t.heard)] and t.heard in ("Hello,", "Hello, big")


def _book(lead: float = 0.0) -> tuple[PlayoutBook, FakeClock]:
    clk = FakeClock()
    book = PlayoutBook(clk, 8000, 24000, PlayoutConfig(lead_margin=lead, settle_wait=0.25))  # type: ignore[arg-type]
    book.register_round(1, 0)
    book.register_utterance(1, 0, 7)
    book.push_sent(7, SENT)
    for w in WORDS:
        book.add_word(7, *w)
    book.utterance_tts_start(7, 0)
    book.add_audio(7, int(1.1 * 24000))
    book.utterance_out_start(7, 1000)
    return book, clk


def _ctx() -> Context:
    return Context([SystemMessage("s"), UserMessage("q"), AssistantMessage(SENT)])


def test_a_cut_utterance_is_frozen_at_the_clear_and_set_by_the_final_position():
    book, clk = _book()
    book.set_msg_index(1, 0, 2)
    book.note_release(1000 + 3600)  # 0.45 s released
    clk.t = 5.0
    book.note_clear(2, 5.0)
    book.note_release(1000 + 8000)  # the gateway's floor after the clear: must not count
    book.note_cleared(2, 1000 + 4000)  # the final position: 0.5 s
    ctx = _ctx()
    book.apply(ctx)
    assert ctx[2].text == "Hello, big"
    assert book.st.truncations == 1


def test_without_a_final_position_the_last_report_before_the_clear_is_used():
    book, clk = _book()
    book.set_msg_index(1, 0, 2)
    book.note_release(1000 + 2000)  # 0.25 s
    book.note_clear(2, 5.0)
    book.note_release(1000 + 8000)
    ctx = _ctx()
    book.apply(ctx)
    assert ctx[2].text == "Hello,"


def test_an_echoed_mark_keeps_the_message_whole_but_not_after_a_clear():
    book, _ = _book()
    book.set_msg_index(1, 0, 2)
    book.register_end_mark(7, "m1")
    assert book.mark_played("m1") == 1
    ctx = _ctx()
    book.apply(ctx)
    assert ctx[2].text == SENT
    book2, _ = _book()
    book2.set_msg_index(1, 0, 2)
    book2.register_end_mark(7, "m1")
    book2.note_release(1000 + 1600)
    book2.note_clear(2, 1.0)
    assert book2.mark_played("m1") is None  # echoed after the clear covered it
    ctx2 = _ctx()
    book2.apply(ctx2)
    assert ctx2[2].text == "Hello,"


def test_lead_margin_fades_after_the_last_release():
    book, clk = _book(lead=0.2)
    book.set_msg_index(1, 0, 2)
    clk.t = 1.0
    book.note_release(1000 + 4000)  # 0.5 s released at t=1.0
    book.note_clear(2, 1.05)  # 50 ms later: 150 ms of lead remain -> heard 0.35 s
    book.note_cleared(2, 1000 + 4000)
    ctx = _ctx()
    book.apply(ctx)
    assert ctx[2].text == "Hello,"
    book2, clk2 = _book(lead=0.2)
    book2.set_msg_index(1, 0, 2)
    clk2.t = 1.0
    book2.note_release(1000 + 4000)
    book2.note_clear(2, 3.0)  # long after the last release: the buffer drained, no lead
    book2.note_cleared(2, 1000 + 4000)
    ctx2 = _ctx()
    book2.apply(ctx2)
    assert ctx2[2].text == "Hello, big"


def test_nothing_heard_removes_the_message():
    book, _ = _book()
    book.set_msg_index(1, 0, 2)
    book.note_clear(2, 0.1)
    book.note_cleared(2, 900)
    ctx = _ctx()
    book.apply(ctx)
    assert len(ctx) == 2 and book.st.removed == 1
    ctx.validate()


def test_settle_wait_is_bounded_from_the_barge_in():
    async def main():
        loop = asyncio.get_running_loop()
        from brisvox.clock import CLOCK

        book = PlayoutBook(CLOCK, 8000, 24000, PlayoutConfig(settle_wait=0.25))
        book.register_round(1, 0)
        book.register_utterance(1, 0, 3)
        book.push_sent(3, SENT)
        book.set_msg_index(1, 0, 2)
        book.utterance_out_start(3, 0)
        book.note_clear(2, loop.time())
        t0 = loop.time()
        ok = await book.wait_settled()
        assert not ok and abs(loop.time() - t0 - 0.25) < 1e-6
        assert book.st.settle_timeouts == 1
        # settled by the final position: no wait at all
        book2 = PlayoutBook(CLOCK, 8000, 24000, PlayoutConfig(settle_wait=0.25))
        book2.register_round(1, 0)
        book2.register_utterance(1, 0, 3)
        book2.set_msg_index(1, 0, 2)
        book2.utterance_out_start(3, 0)
        book2.note_clear(2, loop.time())
        loop.call_later(0.05, book2.note_cleared, 2, 100)
        t0 = loop.time()
        assert await book2.wait_settled()
        assert abs(loop.time() - t0 - 0.05) < 1e-6

    run_virtual(main)
