"""Local language models in an inference worker: small instruct GGUFs through llama.cpp.

Owns :data:`LLM_MODELS` (the catalogue names a job may ask for; the first is
the default, chosen by ``python -m bench local_llm``) and :class:`LlamaRunner`: the model (``llama_cpp.Llama`` with one thread,
imported and loaded lazily on the job-lane thread that uses it) and one
streamed chat completion whose text is handed to ``emit`` in small batches
(every ``batch_tokens`` tokens or ``batch_s`` seconds, so a reply is a few
frames, not one per token), stopping at the next token once the job is
cancelled. llama.cpp keeps the KV cache of the previous prompt, so a turn
that extends the previous conversation pays only for the new tokens.

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

# catalogue name -> what it is (workers.models holds the files); the first is the default
LLM_MODELS: dict[str, str] = {
    "qwen_coder_05b": "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
    "smollm2": "SmolLM2-135M-Instruct Q4_1 (light: fast, weak answers)",
    "qwen_coder_15b": "Qwen2.5-Coder-1.5B-Instruct Q4_K_M (heavy, optional install)",
}
DEFAULT_LLM = next(iter(LLM_MODELS))


@dataclass(frozen=True, slots=True)
class LlmOutcome:
    stop_reason: str
    input_tokens: int
    output_tokens: int
    first_token_s: float
    took_s: float


class LlamaRunner:
    def __init__(self, model_path: Path, n_ctx: int = 2048, threads: int = 1) -> None:
        self.model_path = Path(model_path)
        self.n_ctx = n_ctx
        self.threads = threads
        self.llm: Any = None
        self.load_s = 0.0

    def load(self) -> None:
        if self.llm is not None:
            return
        t0 = time.perf_counter()
        from llama_cpp import Llama

        self.llm = Llama(str(self.model_path), n_ctx=self.n_ctx, n_threads=self.threads,
                         n_threads_batch=self.threads, verbose=False)
        self.load_s = time.perf_counter() - t0

    def generate(self, messages: list[dict[str, Any]], max_tokens: int, temperature: float,
                 cancelled: Callable[[], bool], emit: Callable[[str], None],
                 batch_tokens: int = 4, batch_s: float = 0.04, repeat_penalty: float = 1.0,
                 seed: int = 0) -> LlmOutcome:
        self.load()
        t0 = time.perf_counter()
        first = 0.0
        buf: list[str] = []
        last = t0
        out_tokens = 0
        stop = "stop"
        stream = self.llm.create_chat_completion(messages=messages, max_tokens=max(1, max_tokens),
                                                 temperature=temperature, repeat_penalty=repeat_penalty,
                                                 seed=seed, stream=True)
        try:
            for chunk in stream:
                if cancelled():
                    stop = "cancelled"
                    break
                ch = chunk["choices"][0]
                piece = ch.get("delta", {}).get("content")
                if piece:
                    out_tokens += 1
                    if not first:
                        first = time.perf_counter() - t0
                    buf.append(piece)
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
        n_in = sum(len(str(m.get("content", ""))) for m in messages) // 4
        return LlmOutcome(stop, n_in, out_tokens, first, time.perf_counter() - t0)
