"""Signed tokens are single-use: the ids of the tokens already let in, until they expire.

Owns :class:`SpentTokens`, the table the handshake checks (:mod:`brisvox.gateway.ws.auth`)
spend a signed token's ``jti`` in once every other check passed: a second handshake with the
same token is a replay (refused 401 ``ws_refused_token_replay``).

Invariants:

* A ``jti`` is remembered until its token's ``exp`` (unix seconds: the token's own clock),
  never longer: every :meth:`SpentTokens.spend` first forgets the expired ones (a heap ordered
  by ``exp``), so the table holds only tokens that could still be presented.
* Memory is bounded: at most ``cap`` entries (``[websocket] spent_tokens_max``). A spend
  beyond it is refused (``FULL``: the server answers 503) rather than forgetting a live
  token, which would let that one be replayed.
* One table per gateway process (:data:`brisvox.gateway.ws.auth.SPENT`): a gateway is one
  process, and ids are random (a collision between two issuers is a refusal, never a grant).
"""

from __future__ import annotations

import heapq

SPENT, REPLAYED, FULL = "spent", "replayed", "full"


class SpentTokens:
    """The spent token ids (see the module invariants)."""

    def __init__(self) -> None:
        self._exp: dict[str, int] = {}  # jti -> exp
        self._heap: list[tuple[int, str]] = []  # (exp, jti), soonest first

    def __len__(self) -> int:
        return len(self._exp)

    def _forget(self, now: float) -> None:
        heap, table = self._heap, self._exp
        while heap and heap[0][0] <= now:
            exp, jti = heapq.heappop(heap)
            if table.get(jti) == exp:
                del table[jti]

    def spend(self, jti: str, exp: int, now: float, cap: int) -> str:
        """Spend ``jti`` (valid until ``exp``) at ``now``: ``SPENT`` (first use), ``REPLAYED``
        (seen before, not expired) or ``FULL`` (``cap`` live ids already held)."""
        self._forget(now)
        if jti in self._exp:
            return REPLAYED
        if len(self._exp) >= cap:
            return FULL
        self._exp[jti] = exp
        heapq.heappush(self._heap, (exp, jti))
        return SPENT
