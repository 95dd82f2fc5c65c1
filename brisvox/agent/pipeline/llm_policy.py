"""The LLM runner's policy: its configuration, its counters, the tool record and the retry rule.

Owns what :mod:`brisvox.agent.pipeline.llm_runner` is configured with and
reports, apart from how it runs a turn: :class:`LlmRunnerConfig` (bounds,
timeouts, retries), :class:`RunnerStats`, :class:`ToolRecord` (one tool call
for the call record, never its arguments), the fixed fallback line, and
:func:`retry_wait`, the retry rule: a failed request is retried (at most
``retries`` times, only while nothing of the response was sent: the runner
checks that; a failed speculative stream counts as the first attempt) unless it is a request error (``retryable`` False: HTTP
400/401/403/404/413/422), after ``retry_delay`` or the server's
``Retry-After`` when longer; a ``Retry-After`` over ``retry_after_max`` is
not waited for mid-turn: the turn ends without a retry.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from brisvox.agent.conversation.request import RequestConfig
from brisvox.agent.pipeline.speculation import SpeculationConfig
from brisvox.agent.pipeline.summarizer import SummaryConfig
from brisvox.agent.tool_engine.filler import FillerConfig
from brisvox.providers.base import ProviderTimeouts

FALLBACK_LINE = "Sorry, I could not finish that. Could you say it again?"
TOOL_ROUND_LIMIT = "tool_round_limit"


@dataclass(frozen=True, slots=True)
class LlmRunnerConfig:
    system_prompt: str = "You are a helpful voice assistant. Answer briefly."
    retries: int = 1
    retry_delay: float = 0.2
    retry_after_max: float = 2.0  # a longer Retry-After is not waited for: the turn ends
    max_tool_rounds: int = 6
    join_timeout: float = 1.0
    analysis_job: float = 1.0  # bound of the whole played-text pass
    filler: FillerConfig = field(default_factory=FillerConfig)
    filler_phrases: tuple[str, ...] = ()
    fallback_line: str = FALLBACK_LINE
    request: RequestConfig = field(default_factory=RequestConfig)  # the window: request.window
    summary: SummaryConfig = field(default_factory=SummaryConfig)  # default: no summarizer
    timeouts: ProviderTimeouts = field(default_factory=ProviderTimeouts)
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)  # default off


@dataclass(slots=True)
class ToolRecord:
    """One tool call for the call record: never its arguments."""

    epoch: int
    call_id: str
    name: str
    outcome: str
    duration_ms: float
    at: float | None = None  # call-clock time the run ended (the trace's tool span)


@dataclass(slots=True)
class RunnerStats:
    turns: int = 0
    requests: int = 0
    retries: int = 0
    errors: int = 0
    first_token_timeouts: int = 0
    idle_timeouts: int = 0
    tool_rounds: int = 0
    tool_calls: int = 0
    fillers: int = 0
    fallbacks: int = 0
    round_limits: int = 0
    halts: int = 0
    partial_messages: int = 0
    interrupted_calls: int = 0
    late_notes: int = 0
    zombies: int = 0
    mutations_skipped: int = 0
    round_crashes: int = 0
    assemble_errors: int = 0
    silent_turns: int = 0
    warms: int = 0
    warm_failures: int = 0
    truncation_timeouts: int = 0
    dtmf: int = 0
    greetings: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    # the request window and the summarizer (brisvox/agent/pipeline/summarizer.py)
    requests_trimmed: int = 0  # requests that left older turns out
    requests_clipped: int = 0  # requests whose latest turn had its tool results clipped
    results_clipped: int = 0
    requests_over_budget: int = 0  # over the budget even with every result at the floor
    uncovered_requests: int = 0  # dropped turns no summary covered (a summarizer configured)
    summary_requests: int = 0
    summaries: int = 0
    summary_failures: int = 0
    summary_timeouts: int = 0
    summary_too_large: int = 0
    summary_clipped: int = 0
    summary_degraded: int = 0  # the breaker opened (breaker_failures in a row)
    summary_backoffs: int = 0  # refreshes skipped while it was open
    summaries_discarded: int = 0  # made for a conversation that was reset meanwhile



def retry_wait(retryable: bool, retry_after: float | None, cfg: LlmRunnerConfig) -> float | None:
    """How long to wait before the retry; None: no retry (a request error, or a Retry-After
    longer than a caller should wait mid-turn, ``retry_after_max``)."""
    if not retryable or (retry_after is not None and retry_after > cfg.retry_after_max):
        return None
    return max(cfg.retry_delay, retry_after or 0.0)
