"""The budgeted request window (brisvox/agent/conversation/request.py), pure.

Cut only at turn starts, the system prompt always kept, the budget respected exactly
with the default estimator (and the next older turn would not have fit), the turn cap,
clipping of the latest turn's tool results oldest first down to the floor (a turn with
12 large results), clipped results valid JSON that say so, clipping cost that follows
the size kept, provider data counted, the summary in place of the dropped turns and
only while it matches the context, and where an ahead summary ends.
"""

from __future__ import annotations

import random
import time

import orjson
import pytest

from brisvox.agent.conversation import request as rq
from brisvox.agent.conversation.context import (
    DEFAULT_ESTIMATOR,
    AssistantMessage,
    Context,
    Message,
    SystemMessage,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from brisvox.agent.conversation.request import (
    SUMMARY_PREFIX,
    WINDOW_ESTIMATOR,
    RequestConfig,
    WindowConfig,
    WindowSummary,
    build_request,
    build_window,
    clip_tool_message,
    clipped_text,
    request_tokens,
    summary_target,
    utf8_prefix,
)
from tests.providers_fakes.window_rig import as_context

SYSTEM = SystemMessage("You are a test agent. " * 10)


def tokens(msgs: tuple[Message, ...] | list[Message]) -> int:
    return sum(WINDOW_ESTIMATOR.message_tokens(m) for m in msgs)


def conversation(rng: random.Random, turns: int, *, max_result: int = 6000, greeting: bool = True) -> Context:
    """A valid call: a greeting, then turns of a user message, 0-3 tool rounds of 1-3
    calls (results of random size), sometimes a late note, and an answer."""
    msgs: list[Message] = [SYSTEM]
    if greeting:
        msgs.append(AssistantMessage("Hello, how can I help?"))
    for t in range(turns):
        msgs.append(UserMessage(f"turn {t}: " + "u" * rng.randrange(0, 400)))
        seq = 0
        for _ in range(rng.randrange(0, 4)):
            calls = tuple(ToolCall(f"t{t}.{seq + i}", "lookup", {"q": i}) for i in range(rng.randrange(1, 4)))
            seq += len(calls)
            msgs.append(AssistantMessage("one moment" if rng.random() < 0.3 else "", calls))
            for c in calls:
                msgs.append(ToolMessage(c.id, orjson.dumps({"rows": "r" * rng.randrange(10, max_result)}).decode()))
        if rng.random() < 0.1:
            msgs.append(SystemMessage("Late tool result: the call finished."))
        msgs.append(AssistantMessage("Here you are. " * rng.randrange(1, 20)))
    ctx = Context(msgs)
    ctx.validate()
    return ctx


def turn_starts(ctx: Context) -> list[int]:
    return [i for i, m in enumerate(ctx) if isinstance(m, UserMessage)]


# -- the cut ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_every_window_is_valid_cut_at_a_turn_start_and_a_suffix_of_the_context(seed: int) -> None:
    rng = random.Random(seed)
    ctx = conversation(rng, 40)
    starts = set(turn_starts(ctx))
    for budget in (0, 300, 1000, 2500, 5000, 12_000, 10**7):
        for cap in (1, 3, 40):
            w = build_window(ctx, WindowConfig(max_tokens=budget, max_turns=cap))
            Context(w.messages).validate()  # never a result without its call, never an open call
            assert w.messages[0] is ctx[0]  # the system prompt
            assert w.start in starts or w.start == 1
            if not w.clipped:
                assert w.messages[1:] == ctx.messages[w.start:]
            assert w.dropped == w.start - 1
            req = build_request(ctx, [], RequestConfig(window=WindowConfig(max_tokens=budget, max_turns=cap)))
            as_context(req).validate()
            assert request_tokens(req) == w.tokens


def test_the_system_prompt_is_kept_even_when_it_alone_is_over_the_budget() -> None:
    ctx = conversation(random.Random(1), 10)
    w = build_window(ctx, WindowConfig(max_tokens=10))
    assert w.messages[0] is SYSTEM and w.over_budget
    assert w.start == turn_starts(ctx)[-1]  # the latest turn is always in
    Context(w.messages).validate()


def test_no_system_prompt_and_no_user_turn_yet() -> None:
    assert build_window(Context(), WindowConfig()).messages == ()
    greeting = Context([SYSTEM, AssistantMessage("Hello!")])
    assert build_window(greeting, WindowConfig(max_tokens=20)).messages == greeting.messages
    bare = Context([UserMessage("hi"), AssistantMessage("hello")])
    assert build_window(bare, WindowConfig(max_tokens=100)).messages == bare.messages


@pytest.mark.parametrize("seed", range(4))
def test_the_budget_is_respected_exactly_with_the_default_estimator(seed: int) -> None:
    rng = random.Random(100 + seed)
    ctx = conversation(rng, 60, max_result=2000)
    starts = turn_starts(ctx)
    for budget in range(800, 20_000, 731):
        w = build_window(ctx, WindowConfig(max_tokens=budget, max_turns=1000))
        assert w.tokens == tokens(w.messages)
        if not any(isinstance(m, AssistantMessage) and m.provider_data for m in w.messages):
            assert w.tokens == Context(w.messages).estimate_tokens()  # the seed's estimate: bytes/4 + 4
        # over the budget only when the latest turn alone, its results at the floor, is
        latest = starts[-1]
        at_floor = tokens([ctx[0]]) + sum(min(WINDOW_ESTIMATOR.message_tokens(m), 250) if isinstance(m, ToolMessage)
                                          else WINDOW_ESTIMATOR.message_tokens(m) for m in ctx.messages[latest:])
        assert w.over_budget == (at_floor > budget), budget
        if w.clipped or w.over_budget:
            continue
        assert w.tokens <= budget
        # tight: the next older turn (or the greeting) would not have fit
        older = max([s for s in starts if s < w.start], default=1)
        if w.start > 1:
            more = tokens(list(ctx.messages[older:w.start]))
            assert w.tokens + more > budget, (budget, w.start)


def test_the_turn_cap_still_applies_under_the_budget() -> None:
    ctx = conversation(random.Random(3), 30, max_result=50)
    w = build_window(ctx, WindowConfig(max_tokens=10**6, max_turns=5))
    assert sum(isinstance(m, UserMessage) for m in w.messages) == 5
    assert w.start == turn_starts(ctx)[-5]


# -- clipping ---------------------------------------------------------------------------------


def big_turn(n: int, size: int, prefix: list[Message] | None = None) -> Context:
    msgs: list[Message] = list(prefix or [SYSTEM, UserMessage("earlier"), AssistantMessage("ok")])
    msgs.append(UserMessage("Give me the full report."))
    calls = tuple(ToolCall(f"t999.{i}", "report", {"part": i}) for i in range(n))
    msgs.append(AssistantMessage("", calls))
    for i, c in enumerate(calls):
        msgs.append(ToolMessage(c.id, orjson.dumps({"part": i, "text": f"part {i} " + "é" * (size // 2)}).decode()))
    ctx = Context(msgs)
    ctx.validate()
    return ctx


def test_twelve_large_results_in_the_latest_turn_are_clipped_oldest_first_to_fit() -> None:
    ctx = big_turn(12, 60_000)
    cfg = WindowConfig(max_tokens=4000, max_turns=50, tool_result_floor_tokens=250)
    w = build_window(ctx, cfg)
    Context(w.messages).validate()
    assert w.tokens == tokens(w.messages) <= 4000 and not w.over_budget
    assert w.tokens > 4000 - 4  # the budget is used, not wasted
    results = [m for m in w.messages if isinstance(m, ToolMessage)]
    assert [m.call_id for m in results] == [f"t999.{i}" for i in range(12)]
    costs = [WINDOW_ESTIMATOR.message_tokens(m) for m in results]
    assert w.clipped == 12
    assert costs[:11] == [250] * 11  # the oldest first, down to the floor
    assert 250 <= costs[11] <= 4000 - 11 * 250  # the newest keeps what is left
    original = {m.call_id: m.content for m in ctx if isinstance(m, ToolMessage)}
    for m in results:
        body = orjson.loads(m.content)  # still valid JSON
        assert body["clipped"] is True and body["note"] == rq.CLIP_NOTE
        assert body["original_chars"] == len(original[m.call_id])
        assert original[m.call_id].startswith(body["partial"]) and body["partial"].startswith('{"part":')
    assert w.start == turn_starts(ctx)[-1]  # nothing older fits


def test_clipping_stops_as_soon_as_the_turn_fits() -> None:
    ctx = big_turn(4, 8000)  # 4 results of ~2000 tokens: 1 clipped result saves enough
    w = build_window(ctx, WindowConfig(max_tokens=6500))
    results = [m for m in w.messages if isinstance(m, ToolMessage)]
    assert w.clipped == 1 and orjson.loads(results[0].content)["clipped"]
    assert all(not m.content.startswith('{"clipped"') for m in results[1:])
    assert w.tokens <= 6500


def test_a_turn_too_large_even_at_the_floor_is_sent_at_the_floor_and_counted() -> None:
    ctx = big_turn(12, 8000)
    w = build_window(ctx, WindowConfig(max_tokens=2000, tool_result_floor_tokens=250))
    assert w.over_budget and w.clipped == 12
    assert all(WINDOW_ESTIMATOR.message_tokens(m) == 250 for m in w.messages if isinstance(m, ToolMessage))
    Context(w.messages).validate()


def test_only_the_latest_turn_is_ever_clipped() -> None:
    ctx = big_turn(3, 20_000)
    ctx.push(UserMessage("thanks"))
    w = build_window(ctx, WindowConfig(max_tokens=3000))
    assert w.clipped == 0 and w.messages[1:] == (ctx[len(ctx) - 1],)  # the big turn is dropped whole


@pytest.mark.parametrize("content", [
    orjson.dumps({"a": "b" * 5000}).decode(),
    "plain text, not JSON " * 500,
    "quotes \" and \\ backslashes " * 300,
    "\x01\x02 control \n\t" * 400,
    "ğüşöç İstanbul 東京 🎉" * 400,
    "lone \ud800 surrogate " * 300,
])
def test_a_clipped_result_is_valid_json_marked_clipped_and_within_its_bytes(content: str) -> None:
    for limit in (150, 300, 1000, 4000):
        out = clipped_text(content, limit)
        assert len(out.encode("utf-8", "replace")) <= limit
        body = orjson.loads(out)
        assert body["clipped"] is True and body["original_chars"] == len(content)
        kept = body["partial"]
        assert content.encode("utf-8", "replace").decode("utf-8").startswith(kept)
        assert len(out.encode()) > limit - 8 or kept == content  # filled, not wasted
        m = clip_tool_message(ToolMessage("t1.0", content), 100)
        assert WINDOW_ESTIMATOR.message_tokens(m) <= 100 and orjson.loads(m.content)["clipped"]


def test_utf8_prefix_cuts_on_a_character_boundary() -> None:
    s = "aé東🎉" * 10
    for n in range(0, 60):
        p = utf8_prefix(s, n)
        assert s.startswith(p) and len(p.encode()) <= n
        assert len(s[: len(p) + 1].encode()) > n or p == s


@pytest.mark.serial  # compares wall-clock costs
def test_clipping_looks_at_the_size_kept_not_at_the_size_of_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    huge = orjson.dumps({"rows": "é" * (2 * 1024 * 1024)}).decode()  # 4 MiB of UTF-8
    seen: list[int] = []
    real = rq.orjson.dumps

    class Spy:
        JSONEncodeError = rq.orjson.JSONEncodeError

        @staticmethod
        def dumps(v: object) -> bytes:
            if isinstance(v, str):
                seen.append(len(v))
            return real(v)

    monkeypatch.setattr(rq, "orjson", Spy)
    m = clip_tool_message(ToolMessage("t1.0", huge), 250)
    assert WINDOW_ESTIMATOR.message_tokens(m) <= 250
    assert seen and max(seen) <= 1000  # only the kept prefix was encoded
    monkeypatch.undo()
    # and in time: a 4 MiB result clips about as fast as a 40 KiB one
    small = huge[: 40 * 1024]

    def cost(text: str) -> float:
        best = 1.0
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(20):
                clip_tool_message(ToolMessage("t1.0", text), 250)
            best = min(best, (time.perf_counter() - t0) / 20)
        return best

    assert cost(huge) < 10 * cost(small) + 50e-6


def test_provider_data_counts_against_the_budget() -> None:
    pd = {"signature": "s" * 4000}
    msgs: list[Message] = [SYSTEM]
    for t in range(20):
        msgs += [UserMessage(f"turn {t}"), AssistantMessage("answer " * 10, provider_data=pd)]
    ctx = Context(msgs)
    a = AssistantMessage("answer " * 10, provider_data=pd)
    assert WINDOW_ESTIMATOR.message_tokens(a) == DEFAULT_ESTIMATOR.message_tokens(a) + len(orjson.dumps(pd)) // 4
    call = AssistantMessage("", (ToolCall("t1.0", "x", {}, "p", {"thought": "t" * 400}),))
    assert WINDOW_ESTIMATOR.message_tokens(call) == DEFAULT_ESTIMATOR.message_tokens(call) + 414 // 4
    w = build_window(ctx, WindowConfig(max_tokens=5000))
    assert w.tokens <= 5000 and sum(isinstance(m, UserMessage) for m in w.messages) == 4
    req = build_request(ctx, [], RequestConfig(window=WindowConfig(max_tokens=5000)))
    assert request_tokens(req) == w.tokens


# -- the summary --------------------------------------------------------------------------------


def summary_of(ctx: Context, until: int, text: str = "the caller is Ada, booked table 4") -> WindowSummary:
    return WindowSummary(text, until, ctx[1], ctx[until])


def test_the_summary_goes_after_the_system_prompt_in_place_of_the_dropped_turns() -> None:
    ctx = conversation(random.Random(5), 30, max_result=800)
    cfg = WindowConfig(max_tokens=3000)
    plain = build_window(ctx, cfg)
    assert plain.uncovered and not plain.summary
    starts = turn_starts(ctx)
    covers = min(s for s in starts if s > plain.start)  # the summary's room costs the oldest turn
    w = build_window(ctx, cfg, summary_of(ctx, covers))
    assert w.summary and not w.uncovered
    assert w.messages[1] == SystemMessage(SUMMARY_PREFIX + "the caller is Ada, booked table 4")
    assert w.start == covers and w.messages[2] is ctx[covers]
    assert w.tokens <= 3000
    Context(w.messages).validate()
    # a summary that covers MORE than the window would drop: the window starts where it ends
    later = starts[-3]
    w2 = build_window(ctx, cfg, summary_of(ctx, later))
    assert w2.start == later and w2.messages[2] is ctx[later]


def test_a_summary_that_covers_less_than_the_dropped_turns_is_sent_and_the_window_is_uncovered() -> None:
    ctx = conversation(random.Random(6), 30, max_result=800)
    cfg = WindowConfig(max_tokens=2500)
    w = build_window(ctx, cfg, summary_of(ctx, turn_starts(ctx)[1]))  # covers the greeting and turn 0
    assert w.summary and w.uncovered and w.start > turn_starts(ctx)[1]
    Context(w.messages).validate()


def test_no_summary_when_nothing_is_dropped_and_a_stale_summary_is_ignored() -> None:
    ctx = conversation(random.Random(7), 3, max_result=100)
    s = summary_of(ctx, turn_starts(ctx)[1])
    assert not build_window(ctx, WindowConfig(max_tokens=10**6), s).summary
    big = conversation(random.Random(8), 30, max_result=800)
    s = summary_of(big, turn_starts(big)[10])
    assert build_window(big, WindowConfig(max_tokens=2500), s).summary
    replaced = Context(big.messages)
    replaced.replace(turn_starts(big)[10], UserMessage("another conversation"))  # e.g. a reset
    w = build_window(replaced, WindowConfig(max_tokens=2500), s)
    assert not w.summary and w.uncovered
    shorter = Context(big.messages[: turn_starts(big)[10]])
    assert not build_window(shorter, WindowConfig(max_tokens=500), s).summary


def test_the_ahead_target_is_the_next_window_start_and_never_the_last_turn() -> None:
    ctx = conversation(random.Random(9), 30, max_result=800)
    cfg = WindowConfig(max_tokens=3000)
    starts = turn_starts(ctx)
    target = summary_target(ctx, cfg, 400)
    assert target in starts and target <= starts[-1]
    # the next request (same-size user message), with a summary of up to 400 tokens, starts there
    nxt = Context(ctx.messages)
    nxt.push(UserMessage(ctx[starts[-1]].content))  # type: ignore[union-attr]
    w = build_window(nxt, cfg, WindowSummary("s" * 1500, target, ctx[1], ctx[target]))
    assert w.summary and not w.uncovered and w.start == target
    # the just-finished turn alone over the window: the target stops at its start
    huge = big_turn(12, 20_000, prefix=list(ctx.messages))
    assert summary_target(huge, cfg, 400) == turn_starts(huge)[-1]
    # nothing dropped: nothing to summarize
    assert summary_target(ctx, WindowConfig(max_tokens=0), 400) == 1
