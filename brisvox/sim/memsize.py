"""What a call actor holds in memory: a bounded walk of its object graph.

Owns :func:`retained_bytes`, used by the long-call test (memory flat over an
hour) and the actor bench (memory per call actor). It follows references
from the actor and sums ``sys.getsizeof`` of every object reached once,
without entering modules, classes, functions, code, the event loop, or any
object passed in ``stop`` (the providers, rings and link the host owns).
numpy arrays count their buffers. Not exact (interpreter-internal sharing is
not modelled) but deterministic and cheap enough to run twice per test.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import types
from typing import Any

import numpy as np

_SKIP_TYPES = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.MethodType,
    asyncio.AbstractEventLoop,
)


def retained_bytes(root: Any, stop: list[Any] | None = None, exclude_types: tuple[type, ...] = ()) -> int:
    seen: set[int] = {id(x) for x in (stop or [])}
    total = 0
    todo = [root]
    while todo:
        obj = todo.pop()
        oid = id(obj)
        if oid in seen:
            continue
        seen.add(oid)
        if isinstance(obj, _SKIP_TYPES) or (exclude_types and isinstance(obj, exclude_types)):
            continue
        try:
            total += sys.getsizeof(obj)
        except TypeError:
            continue
        if isinstance(obj, np.ndarray):
            if obj.base is None:
                total += 0  # getsizeof already includes an owned buffer
            continue
        if isinstance(obj, str | bytes | int | float | bool) or obj is None:
            continue
        todo.extend(gc.get_referents(obj))
    return total


def actor_bytes(actor: Any) -> int:
    """What one CallActor retains, without what its host owns (providers, rings, link)."""
    stop = [actor.source, actor.sink, actor.link, actor.stt.provider, actor.runner.provider, actor.tts.provider]
    if actor.engine is not None:
        stop.append(actor.engine.registry)
    return retained_bytes(actor, stop)
