"""Per-call llama.cpp states of an inference worker's LLM: the prompt prefix a call already paid for.

Owns :class:`CallStateCache`: for each call whose turns a local LLM answered,
the model state (KV cache, as ``llama_state_get_data`` bytes) after its last
job, with the tokens that state holds. A worker has one llama.cpp context per
model; when calls take turns on it, the runner parks the state of the call
that held the context here and restores the next call's, so a call's system
prompt and previous turns are not evaluated again (llama.cpp then evaluates
only the tokens after the longest common prefix).

Invariants:

* Bounded: at most ``max_calls`` entries and ``max_bytes`` of state in all;
  beyond either the least recently used entry is evicted (a state larger than
  ``max_bytes`` is not kept at all). Counted: ``hits``, ``misses``,
  ``evicted``, ``invalidated``.
* :meth:`take` hands a call's state out only when it is worth restoring: its
  tokens share at least ``min_prefix`` tokens with the new prompt and more
  than the context already shares (``live``). A state whose prefix changed
  (another system prompt, the history trimmed from its oldest turn) is
  dropped (``invalidated``); a taken state leaves the cache (the context
  holds it now).
* :meth:`drop` forgets a call (its detach): nothing of an ended call is kept.

Pure bookkeeping: no llama.cpp import; one thread (the LLM lane's) uses it,
``drop`` from another holds the lock too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SavedState:
    """A context's state: the tokens its KV cache holds, and the bytes that restore it."""

    tokens: tuple[int, ...]
    data: bytes


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class CallStateCache:
    def __init__(self, max_calls: int = 8, max_bytes: int = 256 << 20, min_prefix: int = 8) -> None:
        if max_calls < 1 or max_bytes < 1 or min_prefix < 1:
            raise ValueError("max_calls, max_bytes and min_prefix must be positive")
        self.max_calls = max_calls
        self.max_bytes = max_bytes
        self.min_prefix = min_prefix
        self._states: OrderedDict[str, SavedState] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.evicted = 0
        self.invalidated = 0

    def __len__(self) -> int:
        return len(self._states)

    @property
    def bytes(self) -> int:
        return self._bytes

    def __contains__(self, call_id: str) -> bool:
        return call_id in self._states

    def put(self, call_id: str, state: SavedState) -> None:
        """Park ``call_id``'s state (replacing its older one), evicting the least recently used
        entries beyond the bounds."""
        with self._lock:
            self._pop(call_id)
            if len(state.data) > self.max_bytes:
                self.evicted += 1
                return
            self._states[call_id] = state
            self._bytes += len(state.data)
            while len(self._states) > self.max_calls or self._bytes > self.max_bytes:
                _, old = self._states.popitem(last=False)
                self._bytes -= len(old.data)
                self.evicted += 1

    def take(self, call_id: str, prompt: Sequence[int], live: int = 0) -> SavedState | None:
        """``call_id``'s parked state if restoring it pays for ``prompt`` (see the module
        docstring); ``live``: how many of the prompt's tokens the context already holds."""
        with self._lock:
            st = self._pop(call_id)
        if st is None:
            self.misses += 1
            return None
        shared = common_prefix(st.tokens, prompt)
        if shared < self.min_prefix:
            self.invalidated += 1
            return None
        if shared <= live:
            self.misses += 1
            return None
        self.hits += 1
        return st

    def drop(self, call_id: str) -> None:
        with self._lock:
            self._pop(call_id)

    def _pop(self, call_id: str) -> SavedState | None:
        st = self._states.pop(call_id, None)
        if st is not None:
            self._bytes -= len(st.data)
        return st

    def stats(self) -> dict[str, int]:
        return {"calls": len(self._states), "bytes": self._bytes, "hits": self.hits, "misses": self.misses,
                "evicted": self.evicted, "invalidated": self.invalidated}
