"""The provider resilience layer: recover from a provider's failure in place or on a secondary.

Every stage of a call is wrapped (:func:`wrap`, used by
:func:`brisvox.providers.registry.build_call`): :class:`ResilientStt`,
:class:`ResilientLlm` and :class:`ResilientTts` implement the provider
protocols of :mod:`brisvox.providers.base` over a primary leg and an
optional secondary leg, so the pipeline's stages see ordinary providers and
keep their own rules for what the layer cannot recover.

* :mod:`.core`: the config (:class:`ResilienceConfig`), the retry buckets
  (a call's 3 tokens, one back per 20 s; the process's 50, one back per
  100 ms; the first attempt of a connect or request is free), the
  process-wide breakers with probation, the order legs are tried in, the
  attempt timeout (2 s) and the counters.
* :mod:`.stt`: mid-call recovery of an STT session with the replay of the
  open utterance's audio (at most 4 s) and exact Finalize accounting.
* :mod:`.llm`: a request that fails before any content is re-issued;
  ``Retry-After`` is honoured.
* :mod:`.tts`: unheard utterances are re-spoken on a new session; the last
  64 cancelled ids are remembered; an idle session is refreshed before the
  provider's idle limit.

Invariants: the wrappers never retry a request error (``bad_request``) or
a cancelled operation, never count one against a breaker, and never spend
more than the budget; each wrapper instance belongs to one call (its budget,
its counters: ``stats()``), the breakers and the process bucket are shared by
every call of the process (:class:`Resilience`, :data:`DEFAULT`). Every time
is read from the injected clock (the running loop's; virtual in the
simulator). Every relay task ends when the stage closes its session.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from brisvox.providers.resilience.core import (
    DEFAULT,
    NOT_COUNTED,
    PROVIDER_STATS,
    STATS,
    Breaker,
    Bucket,
    Budget,
    Resilience,
    ResilienceConfig,
    ResilienceStats,
    leg_key,
    leg_own,
)
from brisvox.providers.resilience.llm import ResilientLlm
from brisvox.providers.resilience.stt import AudioWindow, ResilientStt
from brisvox.providers.resilience.tts import ResilientTts

WRAPPERS: dict[str, type[Any]] = {"stt": ResilientStt, "llm": ResilientLlm, "tts": ResilientTts}


def wrap(stage: str, primary: Any, secondary: Any = None, pkey: str = "", skey: str = "", *,
         resilience: Resilience | None = None, config: ResilienceConfig | None = None,
         own: tuple[Mapping[str, Any], Mapping[str, Any]] = ({}, {})) -> Any:
    """``primary`` (and ``secondary``, optional) of ``stage`` behind the layer, for one call.
    ``own``: the session-config fields each leg sets itself (:func:`leg_own`), replaced in
    the call's config at that leg's every connect."""
    return WRAPPERS[stage](primary, secondary, pkey, skey, resilience=resilience, config=config, own=own)


def unwrap(provider: Any) -> Any:
    """The primary provider behind a wrapper (the provider itself when it is not wrapped)."""
    if isinstance(provider, ResilientStt | ResilientLlm | ResilientTts):
        return provider.primary
    return provider


__all__ = [
    "AudioWindow", "Breaker", "Bucket", "Budget", "DEFAULT", "NOT_COUNTED", "PROVIDER_STATS", "Resilience", "ResilienceConfig",
    "ResilienceStats", "ResilientLlm", "ResilientStt", "ResilientTts", "STATS", "leg_key", "leg_own", "unwrap",
    "wrap",
]
