"""LocalLlm: the no-key language model (a small instruct GGUF via llama.cpp) run as a worker job.

The agent file's ``[llm] model`` picks one of :data:`MODELS` (default
Qwen2.5-Coder-0.5B-Instruct; ``smollm2`` is the light option); the
``temperature``, ``repeat_penalty`` and ``seed`` options go with every job
(temperature 0 is greedy and the same conversation gets the same answer).

Owns the actor side of a local completion: the request is converted to
``{"role", "content"}`` rows (tool results become user text; the model is
offered no tools: it is weak at them), trimmed from the oldest turn to
``max_context_chars`` (the system prompt is kept; the frame stays far below
the codec's 256 KiB), sent as an LlmJob to the call's inference worker, and
the streamed LlmJobDelta frames become TextDelta events, then Usage and Done.

* The stream ends with an LlmError when the worker refuses the job
  (``busy`` -> rate_limited, ``unsupported`` -> bad_request: the model file is
  missing, ``unknown_call``/no worker -> connect) or the job ends with an
  error; a silent worker is bounded by the runner's first-token and idle
  timeouts (the worker's death is never waited out longer).
* ``aclose()`` before the end sends JobCancel: the worker stops at its next
  token.
* ``warm()`` runs a one-token job once per worker per process (loads the
  model there before the first turn needs it).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from brisvox.providers.base import (
    Done,
    LlmEvent,
    LlmMessage,
    LlmRequest,
    ProviderError,
    TextDelta,
    Usage,
)
from brisvox.providers.llm_stream import GeneratedStream
from brisvox.providers.worker_jobs import JobChannel
from ipc.frames import ErrorReply, JobAccepted, JobCancel, LlmJob, LlmJobDelta

ERROR_KINDS = {"busy": ("rate_limited", True), "expired": ("timeout", True), "unknown_call": ("connect", True),
               "unsupported": ("bad_request", False), "bad_params": ("bad_request", False),
               "job_failed": ("server", True), "timeout": ("timeout", True)}


# the local LLMs an inference worker serves (workers.local_llm.LLM_MODELS; a unit test keeps the
# two equal): agent files are checked against this list at start, without importing the worker
MODELS = ("qwen_coder_05b", "smollm2", "qwen_coder_15b")


def worker_error(e: ErrorReply) -> ProviderError:
    kind, retry = ERROR_KINDS.get(e.kind, ("server", True))
    return ProviderError(kind, f"worker: {e.kind}: {e.detail}"[:300], retryable=retry)


def to_rows(msgs: Sequence[LlmMessage], max_chars: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for m in msgs:
        if m.role == "tool":
            rows.append({"role": "user", "content": f"[result of {m.name or 'a tool'}] {m.text}"})
        elif m.role == "assistant":
            if m.text:
                rows.append({"role": "assistant", "content": m.text})
        else:
            rows.append({"role": m.role, "content": m.text})
    head = rows[:1] if rows and rows[0]["role"] == "system" else []
    tail = rows[len(head):]
    budget = max_chars - sum(len(r["content"]) for r in head)
    kept: list[dict[str, Any]] = []
    for r in reversed(tail):
        budget -= len(r["content"])
        if budget < 0 and kept:
            break
        kept.append(r if budget >= 0 else {**r, "content": r["content"][-max(200, max_chars // 2):]})
    kept.reverse()
    while kept and kept[0]["role"] != "user":  # a window starts at a user turn
        kept.pop(0)
    return head + kept


class LocalLlm:
    calls_tools = False  # the model is offered no tools (registry.TOOLLESS_LLM, the resilience layer)

    def __init__(self, channel: JobChannel, call_id: str, *, model: str = "", max_tokens: int = 96,
                 temperature: float = 0.0, repeat_penalty: float = 1.0, seed: int = 0,
                 max_context_chars: int = 6000, request_timeout: float = 2.0, name: str = "local_llm") -> None:
        if model and model not in MODELS:
            raise ProviderError("bad_request", f"local_llm: unknown model {model!r} (known: {', '.join(MODELS)})",
                                retryable=False)
        self.name = name
        self.model = model
        self.repeat_penalty = float(repeat_penalty)
        self.seed = int(seed)
        self.channel = channel
        self.call_id = call_id
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.max_context_chars = max_context_chars
        self.request_timeout = request_timeout

    async def warm(self, timeout: float) -> None:  # noqa: ASYNC109
        w = self.channel.worker_of(self.call_id)
        key = (w, f"llm:{self.model}")
        if w < 0 or key in self.channel.warmed:
            return
        self.channel.warmed.add(key)
        req = LlmRequest((LlmMessage("user", "Hi"),), max_tokens=1)
        s = self.stream(req)
        try:
            async with asyncio.timeout(max(timeout, 10.0)):
                async for _ in s:
                    pass
        except TimeoutError:
            self.channel.warmed.discard(key)
        finally:
            await s.aclose()

    def stream(self, request: LlmRequest) -> GeneratedStream:
        return GeneratedStream(self.name, self._events(request))

    async def _events(self, req: LlmRequest) -> AsyncGenerator[LlmEvent, None]:
        ch = self.channel
        job = ch.next_job()
        q: asyncio.Queue[LlmJobDelta] = asyncio.Queue()
        unlisten = ch.listen(self.call_id, job, q.put_nowait)  # type: ignore[arg-type]
        finished = False
        try:
            frame = LlmJob(call_id=self.call_id, job=job, messages=to_rows(req.messages, self.max_context_chars),
                           deadline_ns=time.monotonic_ns() + int(5e9),
                           max_tokens=req.max_tokens or self.max_tokens,
                           temperature=self.temperature if req.temperature is None else req.temperature,
                           model=self.model, repeat_penalty=self.repeat_penalty, seed=self.seed)
            reply = await ch.request(frame, self.request_timeout)
            if isinstance(reply, ErrorReply):
                finished = True
                raise worker_error(reply)
            if not isinstance(reply, JobAccepted):
                finished = True
                raise ProviderError("protocol", f"unexpected reply {reply.TYPE}", retryable=False)
            expect = 0
            while True:
                f = await q.get()
                if f.seq != expect:
                    raise ProviderError("protocol", f"job frame {f.seq} out of order (expected {expect})")
                expect += 1
                if f.text:
                    yield TextDelta(f.text)
                if f.done:
                    finished = True
                    if f.error:
                        kind = f.error.split(":", 1)[0]
                        raise ProviderError("timeout" if kind == "expired" else "server", f.error[:300])
                    yield Usage(f.input_tokens, f.output_tokens)
                    yield Done("length" if f.stop_reason == "length" else "stop")
                    return
        finally:
            unlisten()
            if not finished:
                ch.send(JobCancel(call_id=self.call_id, job=job))
