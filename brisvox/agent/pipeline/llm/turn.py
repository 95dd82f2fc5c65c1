"""The state of one user turn of the LLM runner, shared with the turn's round task.

Owns :class:`Turn`. The runner creates one per turn (a user turn, a keypad entry, a
greeting) and hands it to the round task it spawns; the runner's collaborators (the model
round, the tool phase, the flow hook) read and write it only from that task.

Invariants: ``token`` is cancelled exactly when the turn is halted (barge-in, a new turn,
hang-up), and no one mutates the context for the turn after that; ``raw`` is the text of
the current model round as received (recorded BEFORE it is sent, so it is a superset of
what was sent) and ``streaming`` is True while a model round streams and its message is
not pushed (a halt then keeps ``raw`` as the partial message); ``ordinal`` counts the
LlmResponseStarted frames of the epoch (the playout book's round numbers); ``filler`` is
a spoken filler not yet in the context; ``claimed`` / ``tools_from`` hand a committed
speculation to round 0's stream and then to its tool phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from brisvox.agent.pipeline.speculation.speculator import Helper
from brisvox.agent.tool_engine.registry import CancelToken


@dataclass(slots=True)
class Turn:
    """State shared between the runner and the round task of one turn."""

    epoch: int
    token: CancelToken
    ordinal: int = 0  # LlmResponseStarted frames sent in this epoch
    cur_round: int = -1
    raw: str = ""  # text of the current model round so far (raw deltas)
    streaming: bool = False  # a model round is streaming and its message is not pushed
    spoke: bool = False
    unflushed: bool = False
    filler: tuple[int, str] | None = None  # a spoken filler not yet in the context
    started_at: float = 0.0
    claimed: Helper | None = None  # a committed speculation: round 0's stream
    tools_from: Helper | None = None  # ... and the tool phase of that round
