"""The LLM runner's policy: its configuration, its counters, the tool record and the tool-round bound.

Owns what :mod:`brisvox.agent.pipeline.llm.runner` is configured with and
reports, apart from how it runs a turn: :class:`LlmRunnerConfig` (bounds,
timeouts), :class:`RunnerStats`, :class:`ToolRecord` (one tool call for the
call record, never its arguments), the fixed fallback line, and
:class:`ToolRounds`, the tool loop's bound for one turn: at most
``max_tool_rounds`` rounds execute tools; the next response's calls are
answered ``tool_round_limit`` unrun (and the runner speaks the fallback line);
without a tool engine a round's calls are answered ``unknown_tool`` and the
round still counts toward the bound.

The runner never retries a failed model request (but a silent one once, when the
layer would not: :mod:`brisvox.agent.pipeline.llm.round`): the resilience layer around
every call's LLM does (:mod:`brisvox.providers.resilience.llm`; the bound is in
docs/PROVIDERS.md, "How often one vendor is contacted").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from brisvox.agent.conversation.request import RequestConfig
from brisvox.agent.pipeline.llm.summarizer import SummaryConfig
from brisvox.agent.pipeline.speculation.policy import SpeculationConfig
from brisvox.agent.tool_engine.filler import FillerConfig
from brisvox.providers.base import ProviderTimeouts

FALLBACK_LINE = "Sorry, I could not finish that. Could you say it again?"
TOOL_ROUND_LIMIT = "tool_round_limit"


@dataclass(frozen=True, slots=True)
class LlmRunnerConfig:
    system_prompt: str = "You are a helpful voice assistant. Answer briefly."
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
    errors: int = 0
    first_token_timeouts: int = 0
    first_token_retries: int = 0  # requests re-issued once after a first-token timeout (round.py)
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
    # the request window and the summarizer (brisvox/agent/pipeline/llm/summarizer.py)
    requests_trimmed: int = 0  # requests that left older turns out
    requests_clipped: int = 0  # requests whose latest turn had its tool results clipped
    results_clipped: int = 0
    requests_over_budget: int = 0  # over the budget even with every result at the floor
    provider_data_oversized: int = 0  # responses whose provider data was dropped (over provider_data_limit)
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


class ToolAction(Enum):
    RUN = "run"  # execute the calls (the round counts)
    UNOFFERED = "unoffered"  # no tool engine: answer them unknown_tool (the round counts)
    LIMIT = "limit"  # the bound is reached: answer them tool_round_limit, speak the fallback line


class ToolRounds:
    """The tool loop's bound for one turn (a new one per turn).

    Invariants: :meth:`next` returns RUN or UNOFFERED at most ``limit`` times, then LIMIT
    for good; ``used`` is the rounds that counted."""

    __slots__ = ("limit", "can_run", "used")

    def __init__(self, limit: int, can_run: bool) -> None:
        self.limit = limit
        self.can_run = can_run  # the runner has a tool engine
        self.used = 0

    def next(self) -> ToolAction:
        """What to do with the calls of the response that just ended."""
        if self.used >= self.limit:
            return ToolAction.LIMIT
        self.used += 1
        return ToolAction.RUN if self.can_run else ToolAction.UNOFFERED
