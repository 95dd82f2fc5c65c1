"""Local language models in an inference worker: small instruct GGUFs through llama.cpp.

Owns :data:`LLM_MODELS` (the catalogue names a job may ask for; the first is
the default, chosen by ``python -m bench local_llm``) and :class:`LlamaRunner`: the model (``llama_cpp.Llama`` with one thread,
imported and loaded lazily on the job-lane thread that uses it) and one
streamed chat completion whose text is handed to ``emit`` in small batches
(every ``batch_tokens`` tokens or ``batch_s`` seconds, so a reply is a few
frames, not one per token), stopping at the next token once the job is
cancelled. llama.cpp keeps the KV cache of the previous prompt, so a turn
that extends the previous conversation pays only for the new tokens; when
calls take turns on the one context, the runner parks the state of the call
that held it in a :class:`workers.llm_state_cache.CallStateCache` (LRU, at most
:data:`CACHED_CALLS` calls and :data:`CACHED_BYTES` bytes) and restores the
next call's, so each call keeps its prefix across turns; :meth:`LlamaRunner.forget`
drops a call's state at its detach. The prompt is the model's own chat template
(as ``create_chat_completion`` formats it), tokenized here so the prefix can be
compared before the context is touched.

Threads: a generation runs on one thread, or on up to ``[workers] llm_threads`` when the host
left that many cores idle between the previous generation's end and this one's start
(:class:`SpareCores`): a worker serving one
call on a quiet host lends its LLM the idle core (first token 280 -> 135 ms, 85 -> 45 ms a token
for the default model on this 2-core host), one under load stays on one thread, so it never
oversubscribes the cores its calls' VAD ticks, Whisper and Piper need. The lent threads serve
the prompt and the first :data:`LEND_WORDS` words of the answer (what the first TTS chunk
waits for); the rest runs on one thread, beside Piper synthesizing that chunk. The count is
set between tokens (``llama_set_n_threads``); the answer does not depend on it (greedy
decoding: the same text on one thread or two, checked on the 20 rubric questions).

Decoding is deterministic at temperature 0 (greedy); above it the job's
``seed`` fixes the sampling, so the same conversation gets the same answer.
These models are weak at tool calls: the local stack offers them no tools.
Single-threaded use only (one lane thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from workers.llm_state_cache import CallStateCache, SavedState, common_prefix

# catalogue name -> what it is (workers.models holds the files); the first is the default
LLM_MODELS: dict[str, str] = {
    "qwen_coder_05b": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    "smollm2": "SmolLM2-135M-Instruct Q4_1 (light: fast, weak answers)",
    "qwen_coder_15b": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (heavy, optional install)",
}
DEFAULT_LLM = next(iter(LLM_MODELS))
CACHED_CALLS = 8  # parked per-call states per model (a worker's calls beyond it re-evaluate their prefix)
CACHED_BYTES = 256 << 20  # ... and their bytes at most (a 500-token state of the 0.5B is ~7 MB)


@dataclass(frozen=True, slots=True)
class LlmOutcome:
    stop_reason: str
    input_tokens: int
    output_tokens: int
    first_token_s: float
    took_s: float
    threads: int = 1  # what the prompt and the first words ran on


LEND_WORDS = 4  # the first TTS chunk is cut after 3 complete words (the segmenter's first_min_words)
SPARE_WINDOW_S = 0.25  # a gap shorter than this between two generations tells nothing: one thread
SPARE_SLACK = 0.75  # a core counts as spare when at least 1 - this of it stayed idle (threads)


class SpareCores:
    """How many of this process's cores the host left idle, on average, between the end of the
    previous generation (:meth:`mark`) and now: the host's idle and iowait time over the gap's
    wall time, at most the cores this process may use (its affinity, at most its cgroup's CPU
    quota: ``brisvox.runtime.cpu``; a service under ``CPUQuota=100%`` lends no thread). The
    generation's own time is never in
    the gap, so a runner that used two threads does not count itself as load."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 idle: Callable[[], float] | None = None, cores: int | None = None) -> None:
        self.clock = clock
        self.idle = idle or _host_idle_s
        if cores is None:
            from brisvox.runtime.cpu import (
                usable_cores,  # the affinity, at most the cgroup's CPU quota
            )

            cores = usable_cores()
        self.cores = cores
        self._at: float | None = None  # the last mark (None: no generation ended yet)
        self._idle = 0.0

    def mark(self) -> None:
        """A generation ended: the next gap starts now."""
        self._at, self._idle = self.clock(), self.idle()

    def spare(self) -> float:
        """The idle cores over the gap since :meth:`mark` (0.0 before the first mark, or over a
        gap under :data:`SPARE_WINDOW_S`: too short to tell, or generations back to back)."""
        if self._at is None:
            return 0.0
        dt = self.clock() - self._at
        if dt < SPARE_WINDOW_S:
            return 0.0
        return max(0.0, min(float(self.cores), (self.idle() - self._idle) / dt))

    def threads(self, most: int) -> int:
        """The threads the next generation may take: up to ``most`` (and the cores), one per
        spare core, a core counting when the gap left at least 1 - :data:`SPARE_SLACK` of it
        idle beyond the whole ones (two threads on two cores need 1.25 idle on average); one
        when ``most`` is 1, on one core, or when nothing is known."""
        if most <= 1 or self.cores < 2:
            return 1
        return max(1, min(most, self.cores, int(self.spare() + SPARE_SLACK)))


def _host_idle_s() -> float:
    import psutil

    t = psutil.cpu_times()
    return float(t.idle + getattr(t, "iowait", 0.0))




class LlamaRunner:
    def __init__(self, model_path: Path, n_ctx: int = 2048, threads: int = 1) -> None:
        self.model_path = Path(model_path)
        self.n_ctx = n_ctx
        self.threads = threads
        self.llm: Any = None
        self.load_s = 0.0
        self.cache = CallStateCache(CACHED_CALLS, CACHED_BYTES)
        self.owner = ""  # the call whose tokens the context holds ("" none, or a job without a call)
        self._format: Any = None
        self._threads = threads  # what the context runs with now (set_threads)

    def load(self) -> None:
        if self.llm is not None:
            return
        t0 = time.perf_counter()
        from llama_cpp import Llama
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        llm = Llama(str(self.model_path), n_ctx=self.n_ctx, n_threads=self.threads,
                    n_threads_batch=self.threads, verbose=False)
        # the formatter create_chat_completion would use (Llama.__init__: the GGUF's template)
        eos, bos = llm.token_eos(), llm.token_bos()
        text = llm._model.token_get_text  # noqa: SLF001 - as Llama.__init__ reads the tokens' text
        self._format = Jinja2ChatFormatter(template=llm.metadata["tokenizer.chat_template"],
                                           eos_token=text(eos) if eos != -1 else "",
                                           bos_token=text(bos) if bos != -1 else "", stop_token_ids=[eos])
        self.llm = llm
        self.load_s = time.perf_counter() - t0

    def prompt(self, messages: list[dict[str, Any]]) -> tuple[list[int], Any]:
        """The prompt tokens of ``messages`` and the formatter's answer (its stops)."""
        self.load()
        res = self._format(messages=messages)
        return self.llm.tokenize(res.prompt.encode("utf-8"), add_bos=not res.added_special, special=True), res

    def set_threads(self, n: int) -> None:
        """Run the next evaluations on ``n`` threads (prompt and generation alike)."""
        n = max(1, int(n))
        if n != self._threads:
            import llama_cpp

            llama_cpp.llama_set_n_threads(self.llm._ctx.ctx, n, n)  # noqa: SLF001 - the context Llama holds
            self._threads = n

    def live_tokens(self) -> list[int]:
        return [int(t) for t in self.llm.input_ids[: self.llm.n_tokens]]

    def _save(self) -> SavedState:
        import ctypes

        import llama_cpp

        ctx = self.llm._ctx.ctx  # noqa: SLF001 - Llama.save_state without its n_tokens x n_vocab logits copy
        size = llama_cpp.llama_state_get_size(ctx)
        buf = (ctypes.c_uint8 * int(size))()
        n = int(llama_cpp.llama_state_get_data(ctx, buf, size))
        if n > size:
            raise RuntimeError("llama_state_get_data overran its buffer")
        return SavedState(tuple(self.live_tokens()), ctypes.string_at(buf, n))

    def _restore(self, st: SavedState) -> None:
        """Load ``st`` into the context. The logits are not restored: the prompt extends the
        state's tokens, and llama.cpp evaluates at least the last token again before sampling."""
        import ctypes

        import llama_cpp

        llm = self.llm
        buf = (ctypes.c_uint8 * len(st.data)).from_buffer_copy(st.data)
        if llama_cpp.llama_state_set_data(llm._ctx.ctx, buf, len(st.data)) != len(st.data):  # noqa: SLF001
            raise RuntimeError("llama_state_set_data refused the state")
        n = len(st.tokens)
        llm.input_ids[:n] = st.tokens
        llm.n_tokens = n
        llm._requires_eval = True  # noqa: SLF001 - as Llama.load_state leaves it

    def switch(self, call_id: str, prompt: list[int]) -> str:
        """Give the context to ``call_id`` for ``prompt``: park the holder's state, restore the
        call's own when it shares more of the prompt than the context does. Returns what happened:
        "live" (the call held it), "restored", "shared" (kept another call's tokens: their common
        prefix, e.g. the system prompt, still counts) or "cold"."""
        if call_id and call_id == self.owner:
            return "live"
        if self.owner and self.llm.n_tokens:
            self.cache.put(self.owner, self._save())
        self.owner = call_id
        live = common_prefix(self.live_tokens(), prompt)
        st = self.cache.take(call_id, prompt, live) if call_id else None
        if st is not None:
            self._restore(st)
            return "restored"
        return "shared" if live else "cold"

    def forget(self, call_id: str) -> None:
        """The call ended: drop its parked state; the context keeps its tokens for the shared prefix.
        Runs on the worker's main thread while the lane may run a job: a job of this call still
        running parks its state again at the next switch, and the LRU bound evicts it."""
        self.cache.drop(call_id)
        if self.owner == call_id:
            self.owner = ""

    def generate(self, messages: list[dict[str, Any]], max_tokens: int, temperature: float,
                 cancelled: Callable[[], bool], emit: Callable[[str], None],
                 batch_tokens: int = 4, batch_s: float = 0.04, repeat_penalty: float = 1.0,
                 seed: int = 0, call_id: str = "", threads: int = 0, lend_words: int = LEND_WORDS) -> LlmOutcome:
        """One streamed completion of ``messages``. ``threads``: for its prompt and its first
        ``lend_words`` words (0: as the last one left it); the rest on one thread."""
        self.load()
        if threads:
            self.set_threads(threads)
        started, lent = self._threads, self._threads > 1
        head = ""  # the answer so far, while the threads are lent
        t0 = time.perf_counter()
        prompt, fmt = self.prompt(messages)
        self.switch(call_id, prompt)
        first = 0.0
        buf: list[str] = []
        last = t0
        out_tokens = 0
        stop = "stop"
        stream = self.llm.create_completion(prompt=prompt, max_tokens=max(1, max_tokens), temperature=temperature,
                                            repeat_penalty=repeat_penalty, seed=seed, stream=True,
                                            stop=fmt.stop or [], stopping_criteria=fmt.stopping_criteria)
        try:
            for chunk in stream:
                if cancelled():
                    stop = "cancelled"
                    break
                ch = chunk["choices"][0]
                piece = ch.get("text")
                if piece:
                    out_tokens += 1
                    if not first:
                        first = time.perf_counter() - t0
                    buf.append(piece)
                    if lent:
                        head += piece
                        if len(head.split()) > lend_words:  # the first TTS chunk is out: leave the core to Piper
                            self.set_threads(1)
                            lent = False
                    now = time.perf_counter()
                    if len(buf) >= batch_tokens or now - last >= batch_s or out_tokens == 1:
                        emit("".join(buf))
                        buf.clear()
                        last = now
                fr = ch.get("finish_reason")
                if fr:
                    stop = "length" if fr == "length" else "stop"
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if buf and stop != "cancelled":
            emit("".join(buf))
        return LlmOutcome(stop, len(prompt), out_tokens, first, time.perf_counter() - t0, started)
