"""CallStateCache: per-call llama.cpp states kept across turns, bounded, LRU, invalidated by a changed prefix.

* reuse: a parked state comes back for a prompt that extends its tokens, and leaves the cache;
* a state sharing no more of the prompt than the live context is not restored;
* a changed prefix (another system prompt) invalidates the state (dropped, counted);
* the call cap and the byte cap evict the least recently used call; an oversized state is not kept;
* a call's drop forgets it.
"""

from __future__ import annotations

import pytest

from workers.llm_state_cache import CallStateCache, SavedState, common_prefix

SYS = tuple(range(100, 140))  # a 40-token system prompt


def st(tokens: tuple[int, ...], size: int = 10) -> SavedState:
    return SavedState(tokens, b"x" * size)


def test_a_parked_state_is_restored_for_the_next_turn_and_leaves_the_cache() -> None:
    c = CallStateCache(max_calls=4, max_bytes=1000)
    turn1 = (*SYS, 1, 2, 3, 4)
    c.put("a", st(turn1))
    got = c.take("a", (*turn1, 5, 6, 7))
    assert got is not None and got.tokens == turn1
    assert "a" not in c and c.bytes == 0
    assert c.take("a", (*turn1, 5)) is None  # taken once: the context holds it now
    assert (c.hits, c.misses) == (1, 1)


def test_a_state_no_better_than_the_live_context_is_not_restored() -> None:
    c = CallStateCache()
    c.put("a", st((*SYS, 1, 2)))
    prompt = (*SYS, 1, 2, 3)
    assert c.take("a", prompt, live=common_prefix((*SYS, 1, 2, 9), prompt)) is None
    assert c.misses == 1 and c.hits == 0


def test_a_changed_prefix_invalidates_the_state() -> None:
    c = CallStateCache(min_prefix=8)
    c.put("a", st((*SYS, 1, 2)))
    other_system = (7, 7, 7, *SYS[3:], 1, 2, 3)
    assert c.take("a", other_system) is None
    assert c.invalidated == 1 and "a" not in c


def test_the_call_cap_evicts_the_least_recently_used_call() -> None:
    c = CallStateCache(max_calls=2, max_bytes=10_000)
    c.put("a", st(SYS))
    c.put("b", st(SYS))
    c.put("a", st((*SYS, 1)))  # a is the most recent now
    c.put("c", st(SYS))
    assert "b" not in c and "a" in c and "c" in c
    assert len(c) == 2 and c.evicted == 1


def test_the_byte_cap_evicts_and_an_oversized_state_is_not_kept() -> None:
    c = CallStateCache(max_calls=10, max_bytes=100)
    c.put("a", st(SYS, 40))
    c.put("b", st(SYS, 40))
    c.put("c", st(SYS, 40))  # 120 > 100: a goes
    assert "a" not in c and c.bytes == 80
    c.put("d", st(SYS, 101))
    assert "d" not in c and c.bytes == 80 and c.evicted == 2


def test_drop_forgets_a_call() -> None:
    c = CallStateCache()
    c.put("a", st(SYS))
    c.drop("a")
    c.drop("never")
    assert "a" not in c and c.bytes == 0 and c.take("a", SYS) is None


def test_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError):
        CallStateCache(max_calls=0)
