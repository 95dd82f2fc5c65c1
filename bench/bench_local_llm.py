"""Local LLM candidates side by side: speed on one thread, memory, and answer quality.

``python -m bench local_llm`` measures every local LLM of the model catalogue
that is installed (``brisvox models install qwen_coder_15b`` adds the heavy
option), each in a child process of its own, loaded as the inference worker
loads it (:class:`workers.local_llm.LlamaRunner`, one thread, 2048 context):

* **load** time and **memory** (the child's peak RSS after the whole run:
  the model is memory-mapped and every page it touched counts);
* **first token** (median and p95 over the 20 questions) with a *warm*
  prompt: a call's system prompt is already in llama.cpp's KV cache, as it
  is from a call's second turn on, so the figure is the caller's question
  plus the first generated token;
* **decode rate**: generated tokens per second after the first;
* **quality**: the 20 fixed caller questions of :mod:`bench.llm_rubric`, four
  checks each (answers the question, one or two sentences, English, no
  lists), as a score out of 80, per decoding setting: ``greedy``
  (temperature 0), ``greedy rp1.1`` (repeat penalty 1.1), ``t0.2`` (temperature
  0.2, sampling ``seed=0``) and ``greedy few-shot`` (two example exchanges before the
  question);
* **S1**: tool scenario S1, the three-city weather question with a ``get_weather`` tool
  offered through the model's own chat template: passed when the model wrote
  exactly three well-formed calls for Paris, Rome and Izmir.

The choice rule (printed as the last row): among the candidates that meet the
bars (first token p95 <= 300 ms, >= 20 tokens/s) with 20 % headroom (<= 240
ms, >= 24 tokens/s: the default must hold them while the worker's other
threads and the other calls share the cores, and on a slower CPU than this
one), the most questions answered, then the highest score; the chosen
model's best setting is what ``configs/agents/local.toml`` ships.
``--quick`` asks 3 questions with one setting (the smoke test). The machine
is shared: give figures from one run, side by side.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

Row = tuple[str, Any, str, str]

SETTINGS: dict[str, dict[str, Any]] = {
    "greedy": {"temperature": 0.0, "repeat_penalty": 1.0, "few_shot": False},
    "greedy rp1.1": {"temperature": 0.0, "repeat_penalty": 1.1, "few_shot": False},
    "t0.2": {"temperature": 0.2, "repeat_penalty": 1.0, "few_shot": False},
    "greedy few-shot": {"temperature": 0.0, "repeat_penalty": 1.0, "few_shot": True},
}
FIRST_TOKEN_MS = 300.0
TOKENS_PER_S = 20.0
HEADROOM = 0.8  # the default must meet the bars by this factor (see the module docstring)
MAX_TOKENS = 64
CHILD_TIMEOUT_S = 900.0


def _messages(question: str, few_shot: bool) -> list[dict[str, str]]:
    from bench.llm_rubric import FEW_SHOT, SYSTEM

    msgs = [{"role": "system", "content": SYSTEM}]
    if few_shot:
        for q, a in FEW_SHOT:
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return msgs + [{"role": "user", "content": question}]


def child(name: str, quick: bool) -> dict[str, Any]:
    """Run in the child process: every setting over the questions, then S1."""
    from bench.llm_rubric import QUESTIONS, S1, S1_TOOLS, s1_calls, s1_passed, score
    from workers.local_llm import LlamaRunner
    from workers.models import locate

    runner = LlamaRunner(locate(name))
    runner.load()
    questions = QUESTIONS[:3] if quick else QUESTIONS
    settings = dict(list(SETTINGS.items())[:1]) if quick else SETTINGS
    out: dict[str, Any] = {"model": name, "load_s": runner.load_s, "settings": {}}
    firsts: list[float] = []
    rates: list[float] = []
    for sname, st in settings.items():
        # warm the prompt's common prefix (the system prompt and any examples), as a call's
        # earlier turns have; then every question pays for its own tokens only
        runner.generate(_messages("Hi", st["few_shot"]), 1, 0.0, lambda: False, lambda _t: None)
        answers: list[dict[str, Any]] = []
        for q, accepted in questions:
            pieces: list[str] = []
            o = runner.generate(_messages(q, st["few_shot"]), MAX_TOKENS, st["temperature"], lambda: False,
                                pieces.append, repeat_penalty=st["repeat_penalty"], seed=0)
            text = "".join(pieces).strip()
            s = score(text, accepted)
            answers.append({"q": q, "a": text, "score": s.total, "answers": s.answers, "short": s.short,
                            "english": s.english, "plain": s.plain})
            if sname == "greedy":
                firsts.append(o.first_token_s * 1000)
                if o.output_tokens > 1 and o.took_s > o.first_token_s:
                    rates.append((o.output_tokens - 1) / (o.took_s - o.first_token_s))
        out["settings"][sname] = {"score": sum(a["score"] for a in answers), "of": 4 * len(answers),
                                  "answered": sum(a["answers"] for a in answers), "answers": answers}
    r = runner.llm.create_chat_completion(messages=_messages(S1, False), tools=S1_TOOLS, temperature=0.0,
                                          max_tokens=160, seed=0)
    msg = r["choices"][0]["message"]
    native = [json.loads(c["function"]["arguments"]).get("city", "") for c in (msg.get("tool_calls") or [])]
    cities = native or s1_calls(msg.get("content") or "")
    out.update(first_ms=firsts, rates=rates, s1_text=(msg.get("content") or "")[:300], s1_cities=cities,
               s1=s1_passed(cities), rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def _installed() -> list[str]:
    from workers.local_llm import LLM_MODELS
    from workers.models import check

    return [n for n in LLM_MODELS if check(n).state == "ok"]


def _p95(xs: list[float]) -> float:
    return sorted(xs)[max(0, int(round(0.95 * len(xs))) - 1)] if xs else float("nan")


def _meets(r: dict[str, Any], factor: float) -> bool:
    rate = statistics.median(r["rates"]) if r["rates"] else 0.0
    return _p95(r["first_ms"]) <= FIRST_TOKEN_MS * factor and rate >= TOKENS_PER_S / factor


def run(quick: bool = False) -> list[Row]:
    names = _installed()
    if not names:
        raise RuntimeError("no local LLM is installed: run `brisvox models install`")
    results: list[dict[str, Any]] = []
    for name in names:
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "bench.bench_local_llm", "--child", name]
                           + (["--quick"] if quick else []), capture_output=True, text=True,
                           timeout=CHILD_TIMEOUT_S, cwd=Path(__file__).resolve().parent.parent,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
        if p.returncode != 0:
            raise RuntimeError(f"{name}: child failed: {p.stderr.strip().splitlines()[-1:]}")
        res = json.loads(p.stdout.strip().splitlines()[-1])
        res["wall_s"] = time.perf_counter() - t0
        results.append(res)
        _print_answers(res)
    rows: list[Row] = []
    for r in results:
        m = r["model"]
        rows += [(f"{m}: load", r["load_s"] * 1000, "ms", ""),
                 (f"{m}: peak RSS", r["rss_mb"], "MB", ""),
                 (f"{m}: first token p50 (warm prompt)", statistics.median(r["first_ms"]), "ms", ""),
                 (f"{m}: first token p95 (warm prompt)", _p95(r["first_ms"]), "ms", f"<= {FIRST_TOKEN_MS:.0f}"),
                 (f"{m}: decode rate p50", statistics.median(r["rates"]) if r["rates"] else 0.0, "tokens/s",
                  f">= {TOKENS_PER_S:.0f}")]
        for sname, st in r["settings"].items():
            rows.append((f"{m}: quality, {sname}", f"{st['answered']}/{len(st['answers'])} answered, "
                         f"{st['score']}/{st['of']} points", "", ""))
        rows.append((f"{m}: S1 (three get_weather calls)", "passed" if r["s1"] else f"failed {r['s1_cities']}",
                     "", ""))
        rows.append((f"{m}: meets the bars", f"{_meets(r, 1.0)} (with headroom: {_meets(r, HEADROOM)})", "", ""))
    ok = [r for r in results if _meets(r, HEADROOM)]
    if ok:
        def best_setting(r: dict[str, Any]) -> tuple[str, dict[str, Any]]:
            return max(r["settings"].items(), key=lambda kv: (kv[1]["answered"], kv[1]["score"]))

        best = max(ok, key=lambda r: (best_setting(r)[1]["answered"], best_setting(r)[1]["score"]))
        rows.append(("chosen (most answered within the bars, with headroom)",
                     f"{best['model']}, {best_setting(best)[0]}", "", ""))
    else:
        rows.append(("chosen (most answered within the bars, with headroom)", "none", "", ""))
    return rows


def _print_answers(r: dict[str, Any]) -> None:
    for sname, st in r["settings"].items():
        print(f"   -- {r['model']}, {sname}: {st['score']}/{st['of']}", flush=True)
        for a in st["answers"]:
            if a["score"] < 4:
                miss = [k for k in ("answers", "short", "english", "plain") if not a[k]]
                print(f"      {a['q']!r} -> {a['a'][:120]!r} (missed: {', '.join(miss)})", flush=True)
    print(f"   -- {r['model']}, S1: {r['s1_cities']} from {r['s1_text'][:160]!r}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], "--quick" in sys.argv)))
    else:
        for row in run("--quick" in sys.argv):
            print(row)
