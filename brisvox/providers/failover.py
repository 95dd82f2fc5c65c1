"""Failover to an agent leg's ``secondary`` provider: the names the layer had before it grew.

The resilience layer itself lives in :mod:`brisvox.providers.resilience`
(every stage of every call is wrapped there, with or without a secondary).
This module keeps the original names for the two-leg case:
:class:`FailoverStt` / :class:`FailoverTts` / :class:`FailoverLlm` are the
resilient wrappers with a required secondary and the old keyword options
(``attempt_timeout``, ``first_event_timeout``); :data:`BREAKERS`,
:func:`breaker`, :data:`STATS` and :class:`Breaker` are the process-wide
state of :data:`brisvox.providers.resilience.DEFAULT`.

Invariants (of the layer): a process-wide breaker per leg with probation and
probe release; request errors and cancellations are never counted and never
fail over; every time is read from the loop's clock.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from brisvox.providers.base import LlmProvider, SttProvider, TtsProvider
from brisvox.providers.resilience import (
    DEFAULT,
    NOT_COUNTED,
    STATS,
    Breaker,
    ResilientLlm,
    ResilientStt,
    ResilientTts,
    leg_key,
)

BREAKERS = DEFAULT.breakers


def breaker(key: str) -> Breaker:
    return DEFAULT.breaker(key)


class FailoverStt(ResilientStt):
    def __init__(self, primary: SttProvider, secondary: SttProvider, pkey: str, skey: str,
                 attempt_timeout: float = 2.0) -> None:
        super().__init__(primary, secondary, pkey, skey, config=replace(DEFAULT.config, attempt_timeout=attempt_timeout))


class FailoverTts(ResilientTts):
    def __init__(self, primary: TtsProvider, secondary: TtsProvider, pkey: str, skey: str,
                 attempt_timeout: float = 2.0) -> None:
        super().__init__(primary, secondary, pkey, skey, config=replace(DEFAULT.config, attempt_timeout=attempt_timeout))


class FailoverLlm(ResilientLlm):
    def __init__(self, primary: LlmProvider, secondary: LlmProvider, pkey: str, skey: str,
                 first_event_timeout: float = 4.0) -> None:
        super().__init__(primary, secondary, pkey, skey,
                         config=replace(DEFAULT.config, llm_attempt_timeout=first_event_timeout))


def wrap(stage: str, primary: Any, secondary: Any, pkey: str, skey: str) -> Any:
    cls: Any = {"stt": FailoverStt, "tts": FailoverTts}.get(stage, FailoverLlm)
    return cls(primary, secondary, pkey, skey)


__all__ = ["BREAKERS", "Breaker", "FailoverLlm", "FailoverStt", "FailoverTts", "NOT_COUNTED", "STATS", "breaker",
           "leg_key", "wrap"]
