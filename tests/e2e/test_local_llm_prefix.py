"""The local LLM keeps each call's prompt prefix across turns when calls take turns on its one context.

With the real default model (llama.cpp, one thread): two calls alternate turns on one
:class:`workers.local_llm.LlamaRunner`. Each call's second turn restores its own parked state
(``switch`` says "restored"; the cache counts the hit) and its greedy answer is the one the
model gives when the whole prompt is evaluated afresh; the call's end drops its state.
"""

from __future__ import annotations

from typing import Any

import pytest

from workers.local_llm import DEFAULT_LLM, LlamaRunner
from workers.models import ModelError, locate

SYSTEM = "You are a friendly voice assistant on a phone line. Answer in one or two short sentences."


def answer(r: LlamaRunner, msgs: list[dict[str, Any]], call_id: str) -> str:
    out: list[str] = []
    r.generate(msgs, 24, 0.0, lambda: False, out.append, call_id=call_id)
    return "".join(out).strip()


def test_alternating_calls_restore_their_own_prefix_and_answer_as_a_fresh_context() -> None:
    try:
        path = locate(DEFAULT_LLM)
    except ModelError as e:
        pytest.skip(str(e))
    r = LlamaRunner(path)
    a: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": "What is the capital of France?"}]
    b: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM + " You work for a bank."},
                               {"role": "user", "content": "What do bees make?"}]
    a.append({"role": "assistant", "content": answer(r, a, "a")})
    b.append({"role": "assistant", "content": answer(r, b, "b")})
    assert "a" in r.cache and r.owner == "b"
    a.append({"role": "user", "content": "How many days are in a week?"})
    prompt, _ = r.prompt(a)
    assert r.switch("a", prompt) == "restored"
    assert r.cache.hits == 1 and "b" in r.cache
    got = answer(r, a, "a")  # the context is a's already: "live"
    r.forget("a")
    r.forget("b")
    assert len(r.cache) == 0 and r.owner == ""
    fresh = LlamaRunner(path)
    assert got == answer(fresh, a, "") and got
