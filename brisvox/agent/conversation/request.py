"""RequestBuilder: the single seam from the call's Context to a provider LlmRequest.

Owns the conversion of the agent's Context/Message and the offered tools
(:class:`OfferedTool`, which the tool engine's ``ToolSpec`` is) to the
providers' types and the budgeted request window (docs/TOOLS.md, "The
request window"):

* assistant tool calls keep the internal id (``t<epoch>.<seq>``) and the
  provider's id; arguments and provider data become JSON text;
* tool results carry the name of the tool they answer;
* tools are name-ordered (prompt-cache stability);
* window (:func:`build_window`): the leading system prompt (always kept),
  then the summary of the dropped turns when one covers them (a system
  message, :data:`SUMMARY_PREFIX`), then the newest turns that fit the token
  budget (:class:`WindowConfig`: ``max_tokens`` counted with
  :class:`WindowEstimator`, the seed's bytes/4 + 4 per message plus provider
  data) and the turn cap ``max_turns``. The window is cut only at a turn
  start (a user message), so a tool result is never cut from its call and a
  turn is never split; the latest turn is always in. When the latest turn
  ALONE is over the budget, its tool results are clipped oldest first, each
  down to at most ``tool_result_floor_tokens``, until the window fits
  (:func:`clip_tool_message`: a JSON object that says it was clipped,
  whose cost follows the size KEPT, not the size of the result);
* a response's provider round-trip data (``Done.provider_data``) is bounded
  before it enters the context (:func:`provider_data_limit`: 32 KiB and half a
  message's allowance, ``max_message_tokens * 2`` bytes); the runner drops a
  larger one (``provider_data_oversized``);
* a summary is used only while it still matches the context (the messages
  it was made against are the same objects at the same indices); turns
  dropped that it does not cover make the window ``uncovered``.

The context itself is never trimmed here. Pure and synchronous; the cost is
O(messages in the window) plus the clipped bytes kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from brisvox.agent.conversation.context import (
    DEFAULT_ESTIMATOR,
    AssistantMessage,
    CharsPerToken,
    Context,
    Message,
    SystemMessage,
    TokenEstimator,
    ToolMessage,
    UserMessage,
)
from brisvox.providers.base import LlmMessage, LlmRequest, LlmTool, LlmToolCall

SUMMARY_PREFIX = "Summary of the earlier conversation: "
MIN_FLOOR_TOKENS = 48  # the clip marker alone costs about 35 tokens
CLIP_NOTE = "tool result clipped to fit the request window"


class OfferedTool(Protocol):
    """What a request tells the model of a tool (the tool engine's ``ToolSpec``
    is one): the conversation does not depend on the tool engine."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def parameters(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class WindowConfig:
    """The request window: ``max_tokens`` budget of every request's messages (system
    prompt and summary included; 0: no budget), at most ``max_turns`` user turns, and
    the floor a clipped tool result of the latest turn keeps."""

    max_tokens: int = 16_000
    max_turns: int = 40
    tool_result_floor_tokens: int = 250

    @property
    def max_message_tokens(self) -> int:
        """The most one message may cost in a request: the whole budget (0: no bound)."""
        return self.max_tokens


@dataclass(frozen=True, slots=True)
class RequestConfig:
    window: WindowConfig = field(default_factory=WindowConfig)
    temperature: float | None = None
    max_tokens: int = 0  # the RESPONSE's cap (0: the provider's default); the window's budget is window.max_tokens


def _json(v: Any) -> str:
    if v is None:
        return ""
    try:
        return orjson.dumps(v).decode()
    except (TypeError, orjson.JSONEncodeError):
        return ""


# --- the estimate -------------------------------------------------------------------------


def _utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "replace"))


def provider_data_bytes(msg: Message) -> int:
    """Bytes of the provider round-trip data an assistant message carries (as sent)."""
    if not isinstance(msg, AssistantMessage):
        return 0
    n = _utf8_len(_json(msg.provider_data)) if msg.provider_data is not None else 0
    for c in msg.tool_calls:
        if c.provider_data is not None:
            n += _utf8_len(_json(c.provider_data))
    return n


@dataclass(frozen=True, slots=True)
class WindowEstimator:
    """What the window counts: ``base`` (default: the seed's bytes/4 + 4 per message)
    plus the provider data of an assistant message (its bytes / 4), which goes out
    with every request that holds the message."""

    base: TokenEstimator = DEFAULT_ESTIMATOR

    def message_tokens(self, msg: Message) -> int:
        t = self.base.message_tokens(msg)
        if isinstance(msg, AssistantMessage) and (msg.provider_data is not None or msg.tool_calls):
            t += provider_data_bytes(msg) // _bytes_per_token(self.base)
        return t


WINDOW_ESTIMATOR = WindowEstimator()


def _bytes_per_token(est: TokenEstimator) -> int:
    return est.bytes_per_token if isinstance(est, CharsPerToken) else 4


def request_message_tokens(m: LlmMessage, bytes_per_token: int = 4, per_message: int = 4) -> int:
    """The default WindowEstimator's count of a message AS SENT (tests and benches
    check built requests with it): the same bytes the context message is counted by."""
    if m.role == "assistant":
        n = _utf8_len(m.text)
        pd = _utf8_len(m.provider_data)
        for c in m.tool_calls:
            n += len(c.name) + len(c.id) + _utf8_len(c.arguments)
            pd += _utf8_len(c.provider_data)
        return n // bytes_per_token + per_message + pd // bytes_per_token
    if m.role == "tool":
        return (_utf8_len(m.text) + len(m.call_id)) // bytes_per_token + per_message
    return _utf8_len(m.text) // bytes_per_token + per_message


def request_tokens(req: LlmRequest) -> int:
    """The size of a request's messages by the default window estimate."""
    return sum(request_message_tokens(m) for m in req.messages)


# --- provider data ------------------------------------------------------------------------

PROVIDER_DATA_MAX_BYTES = 32 * 1024


def provider_data_limit(cfg: WindowConfig) -> int:
    """The most bytes (as serialized JSON) of a response's provider round-trip data the
    context keeps: 32 KiB, and at most half a message's allowance
    (``max_message_tokens * 2`` bytes: half of its tokens at 4 bytes a token). Data that
    goes out with every later request must not crowd the window it is counted in."""
    if cfg.max_message_tokens <= 0:
        return PROVIDER_DATA_MAX_BYTES
    return min(PROVIDER_DATA_MAX_BYTES, cfg.max_message_tokens * 2)


def provider_data_fits(value: Any, limit: int) -> bool:
    """``value`` (a response's provider data) is within ``limit`` bytes of JSON. A value
    that does not serialize fits: the assembler refuses it (``bad_provider_data``)."""
    try:
        return len(orjson.dumps(value)) <= limit
    except (TypeError, orjson.JSONEncodeError):
        return True


# --- clipping -----------------------------------------------------------------------------


def utf8_prefix(s: str, max_bytes: int) -> str:
    """The longest prefix of ``s`` within ``max_bytes`` of UTF-8 (lone surrogates count
    as the ``?`` they are encoded as), cut on a character boundary. Looks at no more than
    ``max_bytes`` characters of ``s``: the cost follows the prefix, not ``s``."""
    if max_bytes <= 0:
        return ""
    head = s[:max_bytes]
    if head.isascii():
        return head
    return head.encode("utf-8", "replace")[:max_bytes].decode("utf-8", "ignore")


def clipped_text(content: str, max_bytes: int) -> str:
    """``content`` as a JSON object that says it was clipped, keeping the longest prefix
    for which the whole text fits ``max_bytes`` of UTF-8 (the prefix JSON-escaped as
    ``partial``; ``original_chars`` the length of the whole result). Valid JSON always;
    only the kept prefix is encoded, never the whole result."""
    head = f'{{"clipped":true,"original_chars":{len(content)},"note":"{CLIP_NOTE}","partial":"'
    tail = '"}'
    room = max_bytes - len(head) - len(tail)
    k = room
    part = b""
    for _ in range(8):
        if k <= 0:
            part = b""
            break
        enc = orjson.dumps(utf8_prefix(content, k))[1:-1]
        if len(enc) <= room:
            part = enc
            break
        k = min(k - 1, k * room // len(enc))  # escapes made it longer: shrink in proportion
    return head + part.decode() + tail


def clip_tool_message(msg: ToolMessage, max_tokens: int, estimator: TokenEstimator = WINDOW_ESTIMATOR) -> ToolMessage:
    """``msg`` with its content clipped so the message costs at most ``max_tokens``
    (never below the clip marker itself); the result still answers the same call."""
    base = estimator.base if isinstance(estimator, WindowEstimator) else estimator
    if isinstance(base, CharsPerToken):
        bpt, per = base.bytes_per_token, base.per_message
        room = (max_tokens - per) * bpt + bpt - 1 - len(msg.call_id)
        return ToolMessage(msg.call_id, clipped_text(msg.content, room), msg.is_error)
    room = max(0, (max_tokens - 4) * 4 - len(msg.call_id))  # another estimator: shrink until it agrees
    out = ToolMessage(msg.call_id, clipped_text(msg.content, room), msg.is_error)
    for _ in range(6):
        over = estimator.message_tokens(out) - max_tokens
        if over <= 0 or room <= 0:
            break
        room = max(0, room - max(over * 4, room // 4))
        out = ToolMessage(msg.call_id, clipped_text(msg.content, room), msg.is_error)
    return out


# --- the window ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WindowSummary:
    """A summary of ``ctx[first_index:covers_until]``, valid while ``ctx[first_index] is
    first`` and ``ctx[covers_until] is anchor`` (a user message: a turn start)."""

    text: str
    covers_until: int
    first: Message
    anchor: Message

    def message(self) -> SystemMessage:
        return SystemMessage(SUMMARY_PREFIX + self.text)

    def valid_for(self, msgs: Sequence[Message]) -> bool:
        head = 1 if msgs and isinstance(msgs[0], SystemMessage) else 0
        c = self.covers_until
        return (head < c < len(msgs) and msgs[c] is self.anchor and msgs[head] is self.first
                and isinstance(self.anchor, UserMessage))


@dataclass(frozen=True, slots=True)
class Window:
    """One request's messages and how they were chosen. ``start``: the context index of
    the first windowed message (after the system prompt); ``dropped``: messages left
    out before it; ``uncovered``: some of them are covered by no summary."""

    messages: tuple[Message, ...]
    start: int
    tokens: int
    dropped: int = 0
    clipped: int = 0
    summary: bool = False
    uncovered: bool = False
    over_budget: bool = False


class _Costs:
    """Per-message estimates of one build (each message estimated at most once)."""

    __slots__ = ("msgs", "est", "memo")

    def __init__(self, msgs: Sequence[Message], est: TokenEstimator) -> None:
        self.msgs = msgs
        self.est = est
        self.memo: dict[int, int] = {}

    def __call__(self, i: int) -> int:
        t = self.memo.get(i)
        if t is None:
            t = self.memo[i] = self.est.message_tokens(self.msgs[i])
        return t


def _walk(msgs: Sequence[Message], cost: _Costs, lo: int, limit: float, max_turns: int) -> tuple[int, int, int]:
    """The window's start over ``msgs[lo:]``, cut at turn starts: the latest turn always,
    then older turns while they fit ``limit`` and the turn cap. Returns (start, tokens,
    start of the latest turn)."""
    n = len(msgs)
    start, used, users, acc = n, 0, 0, 0
    latest = -1
    for j in range(n - 1, lo - 1, -1):
        acc += cost(j)
        is_user = isinstance(msgs[j], UserMessage)
        if not is_user and j != lo:
            continue
        if latest < 0:
            latest = j
        elif used + acc > limit or (is_user and users >= max_turns):
            break
        start, used, acc = j, used + acc, 0
        users += is_user
    if latest < 0:
        latest = n
    return start, used, latest


def _clip_latest(win: list[Message], excess: int, floor: int, est: TokenEstimator, cost: _Costs,
                 offset: int) -> tuple[int, int]:
    """Clip the tool results of ``win`` (the latest turn, ``offset`` its index in the
    context) oldest first, each down to ``floor`` at most, until ``excess`` tokens are
    saved. Returns (clipped, tokens saved)."""
    clipped = saved = 0
    for k in range(len(win)):
        m = win[k]
        if not isinstance(m, ToolMessage):
            continue
        t = cost(k + offset)
        if t <= floor:
            continue
        c = clip_tool_message(m, max(floor, t - excess), est)
        s = t - est.message_tokens(c)
        if s <= 0:
            continue
        win[k] = c
        clipped += 1
        saved += s
        excess -= s
        if excess <= 0:
            break
    return clipped, saved


def build_window(ctx: Context | Sequence[Message], cfg: WindowConfig, summary: WindowSummary | None = None,
                 estimator: TokenEstimator | None = None) -> Window:
    """The messages of the next request (see the module docs)."""
    msgs: Sequence[Message] = ctx.messages if isinstance(ctx, Context) else ctx
    est = estimator or WINDOW_ESTIMATOR
    cost = _Costs(msgs, est)
    n = len(msgs)
    head = 1 if n and isinstance(msgs[0], SystemMessage) else 0
    head_tokens = cost(0) if head else 0
    budget: float = cfg.max_tokens if cfg.max_tokens > 0 else float("inf")
    max_turns = max(1, cfg.max_turns)
    limit = budget - head_tokens
    start, used, latest = _walk(msgs, cost, head, limit, max_turns)
    note: SystemMessage | None = None
    lo = head
    if start > head and summary is not None and summary.valid_for(msgs):
        note = summary.message()
        limit -= est.message_tokens(note)
        lo = min(summary.covers_until, latest)
        start, used, latest = _walk(msgs, cost, lo, limit, max_turns)
    win = list(msgs[start:])
    clipped = 0
    if used > limit and start == latest:
        floor = max(MIN_FLOOR_TOKENS, cfg.tool_result_floor_tokens)
        clipped, saved = _clip_latest(win, int(used - limit), floor, est, cost, start)
        used -= saved
    out: list[Message] = [msgs[0]] if head else []
    if note is not None:
        out.append(note)
        used += est.message_tokens(note)
    out.extend(win)
    return Window(tuple(out), start, int(used + head_tokens), dropped=start - head, clipped=clipped,
                  summary=note is not None, uncovered=start > lo, over_budget=used > budget - head_tokens)


def summary_target(ctx: Context | Sequence[Message], cfg: WindowConfig, reserve_tokens: int,
                   estimator: TokenEstimator | None = None) -> int:
    """Where a summary refreshed AHEAD should end: the start of the window the next
    request will have once the next user message is in (a placeholder the size of the
    last one), with ``reserve_tokens`` kept for the summary, but never past the start of
    the last user turn (that turn is not final yet). ``head`` (nothing to summarize)
    when the next window drops nothing."""
    msgs: Sequence[Message] = ctx.messages if isinstance(ctx, Context) else ctx
    n = len(msgs)
    head = 1 if n and isinstance(msgs[0], SystemMessage) else 0
    last_user = next((i for i in range(n - 1, head - 1, -1) if isinstance(msgs[i], UserMessage)), -1)
    if last_user <= head:
        return head
    est = estimator or WINDOW_ESTIMATOR
    ahead = (*msgs, msgs[last_user])  # the placeholder: the same size as the last user message
    cost = _Costs(ahead, est)
    budget: float = cfg.max_tokens if cfg.max_tokens > 0 else float("inf")
    limit = budget - (cost(0) if head else 0) - reserve_tokens
    start, _, _ = _walk(ahead, cost, head, limit, max(1, cfg.max_turns))
    return min(start, last_user)


# --- conversion ---------------------------------------------------------------------------


def window_start(ctx: Context, turns: int) -> int:
    """Index of the first message of a window of the last ``turns`` user turns (no budget)."""
    return build_window(ctx, WindowConfig(max_tokens=0, max_turns=turns)).start


def convert(msgs: Sequence[Message], names: dict[str, str]) -> list[LlmMessage]:
    out: list[LlmMessage] = []
    for m in msgs:
        if isinstance(m, SystemMessage):
            out.append(LlmMessage("system", m.content))
        elif isinstance(m, UserMessage):
            out.append(LlmMessage("user", m.content))
        elif isinstance(m, AssistantMessage):
            calls = []
            for c in m.tool_calls:
                names[c.id] = c.name
                calls.append(LlmToolCall(c.id, c.name, _json(c.arguments) or "{}", c.provider_id or "", _json(c.provider_data)))
            out.append(LlmMessage("assistant", m.text, tuple(calls), provider_data=_json(m.provider_data)))
        elif isinstance(m, ToolMessage):
            out.append(LlmMessage("tool", m.content, call_id=m.call_id, name=names.get(m.call_id, ""), is_error=m.is_error))
    return out


def request_of(window: Window, tools: Sequence[OfferedTool], cfg: RequestConfig) -> LlmRequest:
    specs = sorted(tools, key=lambda s: s.name)
    return LlmRequest(
        messages=tuple(convert(window.messages, {})),
        tools=tuple(LlmTool(s.name, s.description, s.parameters) for s in specs),
        temperature=cfg.temperature,
        max_tokens=cfg.max_tokens,
    )


def build_request(ctx: Context, tools: Sequence[OfferedTool], cfg: RequestConfig,
                  summary: WindowSummary | None = None) -> LlmRequest:
    return request_of(build_window(ctx, cfg.window, summary), tools, cfg)
