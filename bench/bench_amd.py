"""Answering-machine detection benchmark: the AMD detector over the labelled set of openings.

Generates the set of :mod:`bench.amd_set` when missing (seed ``REPORT_SEED``;
the detector's defaults were tuned on ``TUNE_SEED``, a different set, so the
reported figures are not fit to it), scores every opening with the worker's
own VAD (:class:`workers.vad.SileroBatch`, Silero's native 8 kHz mode, one
batch row per opening, as the worker's tick runs it) and feeds each window
and its probability to :class:`workers.amd.AmdDetector` (``leave_message``
on, so the beep is measured too). Runs: audio only; audio with an
oracle transcript (each sentence's text heard 300 ms after it ends); a third
with no VAD probabilities at all (the detector's energy fallback); and (the
full ``python -m bench amd``, or ``--local-stt``) audio with the local STT's
text, Whisper tiny.en transcribing the opening so far as the screening's
``CallAmd`` asks it (every ``HEAR_EVERY_S`` after the last job, each text heard
when its job is done, timed on this machine). Prints, per run: accuracy per class, the
confusion matrix, time to verdict p50 / p95 per class (a person's also from
the start of their speech), the beep onset error (share of beeps found
within 300 ms of the true start), false beeps, and the detector's CPU per
20 ms of audio per call.

``python -m bench amd`` (the reported seed); ``python -m bench.bench_amd --seed 1``
for the tuning set (``--scale`` resizes it). ``--denoise off,rnnoise,deepfilter`` runs,
instead, the openings with a tone through a denoised call's worker path (:func:`denoise_runs`):
what the suppressor does to the beep and the fax tones, and what the detector finds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import soxr

from bench import amd_set
from brisvox.agent.host.call_amd import HEAR_EVERY_S, HEAR_FIRST_S, HEAR_MIN_SAMPLES, HEAR_TIMEOUT_S
from workers.amd import (
    CED_HZ,
    CNG_HZ,
    VERDICTS,
    WINDOW_MS,
    AmdBeep,
    AmdDetector,
    AmdGreetingEnd,
    AmdParams,
    AmdVerdict,
)
from workers.denoise import Denoiser, make_model
from workers.models import locate
from workers.resample import stream
from workers.vad import WINDOW8, SileroBatch

Row = tuple[str, float, str, str]
REPORT_SEED = 2
TUNE_SEED = 1
STT_LAG_MS = 300
BEEP_TOL_MS = 300
HEAR_FIRST_MS = int(HEAR_FIRST_S * 1000)
HEAR_EVERY_MS = int(HEAR_EVERY_S * 1000)
HEAR_TIMEOUT_MS = int(HEAR_TIMEOUT_S * 1000)


def probabilities(openings: list[np.ndarray], width: int = WINDOW8) -> list[np.ndarray]:
    """Silero speech probability of every 32 ms window of every opening (``width`` 256: native
    8 kHz; 512: in16): one batched run per window index over all openings, one state slot
    each (the worker's tick)."""
    n = len(openings)
    sil = SileroBatch(locate("silero_vad"), capacity=n)
    counts = [len(x) // width for x in openings]
    out = [np.zeros(c, dtype=np.float32) for c in counts]
    longest = max(counts)
    scale = np.float32(1.0 / 32768.0)
    for w in range(longest):
        idx = np.array([i for i in range(n) if counts[i] > w], dtype=np.intp)
        win = np.stack([openings[i][w * width : (w + 1) * width] for i in idx]).astype(np.float32) * scale
        p = sil.run(idx, win)
        for j, i in enumerate(idx):
            out[i][w] = p[j]
    return out


class LocalStt:
    """The worker's local Whisper (:class:`workers.api.WhisperRunner`, the model the ``SttJob``
    lane runs) over an opening, asked as :class:`brisvox.agent.host.call_amd.CallAmd` asks it
    while screening: the opening upsampled to in16 as the worker does (soxr QQ), the span
    from the answer to the wake-up transcribed, the text heard when the job is done (its
    measured wall time on this machine): the first at ``HEAR_FIRST_S``, the next ``HEAR_EVERY_S``
    after each job is done."""

    def __init__(self) -> None:
        from workers.api import WhisperRunner, locate

        self.runner = WhisperRunner(locate("whisper_tiny_en").parent)
        self.runner.load()
        self.took_ms: list[float] = []
        self.texts: dict[str, list[tuple[int, int, str]]] = {}  # opening -> (span end, heard at, text)

    def opening(self, x: np.ndarray) -> np.ndarray:
        return np.clip(np.round(soxr.resample(x.astype(np.float32), amd_set.RATE, 16000, quality="QQ")),
                       -32768, 32767).astype(np.int16)

    def transcribe(self, x16: np.ndarray, end_ms: int) -> tuple[str, int]:
        out = self.runner.transcribe(x16[: end_ms * 16], max_tokens=32)
        took = int(round(out.took_s * 1000))
        self.took_ms.append(took)
        return out.text, took


def detect(x: np.ndarray, probs: np.ndarray, params: AmdParams, words: list[dict[str, Any]] | None,
           vad: bool = True, stt: LocalStt | None = None, name: str = "") -> tuple[list[Any], int, int]:
    """Feed one opening (``vad`` False: no probabilities, the detector's energy fallback;
    ``words``: the oracle transcript; ``stt``: the local STT's); returns (events, windows fed,
    thread CPU ns spent in feed: other processes' load does not count, the clock reads' own
    cost (~0.3 us a window) does)."""
    d = AmdDetector(params, rate=amd_set.RATE)
    heard = sorted(((w["end_ms"] + STT_LAG_MS, w["text"]) for w in words), reverse=True) if words else []
    said: list[str] = []
    events: list[Any] = []
    ns = 0
    fed = 0
    x16 = stt.opening(x) if stt is not None else x
    wake, job = HEAR_FIRST_MS, None  # the next wake-up of the screening's transcription; the job out
    for k in range(len(probs)):
        while heard and heard[-1][0] <= d.t_ms + WINDOW_MS:  # said before this window ends
            said.append(heard.pop()[1])
            events += d.hear(" ".join(said))
        if stt is not None and d.verdict is None:  # CallAmd transcribes while the screen detects
            now = d.t_ms + WINDOW_MS
            if job is not None and job[1] <= now:
                if job[2].strip():
                    stt.texts.setdefault(name, []).append(job)
                    events += d.hear(job[2])
                wake, job = job[1] + HEAR_EVERY_MS, None
            if job is None and wake <= now:
                if wake * 16 < HEAR_MIN_SAMPLES:
                    wake += HEAR_EVERY_MS
                else:
                    text, took = stt.transcribe(x16, wake)
                    job = (wake, wake + min(took, HEAR_TIMEOUT_MS), text if took <= HEAR_TIMEOUT_MS else "")
        win = x[k * WINDOW8 : (k + 1) * WINDOW8]
        t0 = time.thread_time_ns()
        ev = d.feed(win, float(probs[k]) if vad else None)
        ns += time.thread_time_ns() - t0
        fed += 1
        events += ev
        if d.done:
            break
    if not d.done:
        events += d.expire()
    return events, fed, ns


def _pct(a: list[float], q: float) -> float:
    return float(np.percentile(a, q)) if a else float("nan")


def evaluate(man: dict[str, Any], probs: list[np.ndarray], audio: list[np.ndarray], transcripts: bool,
             params: AmdParams | None = None, vad: bool = True, stt: LocalStt | None = None) -> dict[str, Any]:
    base = params or AmdParams()
    p = AmdParams(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                     "leave_message": True, "transcripts": transcripts})
    conf = {t: dict.fromkeys(VERDICTS, 0) for t in VERDICTS}
    took: dict[str, list[float]] = {t: [] for t in VERDICTS}
    human_from_speech: list[float] = []
    human_after_reply: list[float] = []
    beep_err: list[float] = []
    beeps = found = false_beeps = 0
    end_err: list[float] = []
    misses: list[str] = []
    timelines: list[dict[str, Any]] = []
    ns = fed = 0
    for item, x, pr in zip(man["openings"], audio, probs, strict=True):
        ev, n, t = detect(x, pr, p, item["words"] if transcripts and stt is None else None, vad, stt, item["name"])
        ns += t
        fed += n
        v = next(e for e in ev if isinstance(e, AmdVerdict))
        label = item["label"]
        conf[label][v.kind] += 1
        took[label].append(v.at_ms)
        if v.kind != label:
            misses.append(f"{item['name']}->{v.kind}({v.reason}@{v.at_ms})")
        if label == "human" and item["words"]:
            w = item["words"][0]
            human_from_speech.append(v.at_ms - w["start_ms"])
            human_after_reply.append(v.at_ms - w["end_ms"])
            timelines.append({"name": item["name"], "variant": item.get("variant", ""), "speech_ms": w["start_ms"],
                              "reply_end_ms": w["end_ms"], "verdict_ms": v.at_ms, "kind": v.kind, "rule": v.reason,
                              "text": w["text"], "voice": item["voice"]})
        beep = next((e for e in ev if isinstance(e, AmdBeep)), None)
        if label == "machine" and item.get("beep_ms", -1) >= 0:
            beeps += 1
            if beep is not None:
                err = abs(beep.onset_ms - item["beep_ms"])
                beep_err.append(err)
                found += err <= BEEP_TOL_MS
        elif beep is not None:
            false_beeps += 1
        ge = next((e for e in ev if isinstance(e, AmdGreetingEnd)), None)
        if label == "machine" and item.get("beep_ms", -1) < 0 and ge is not None and v.kind == "machine":
            end_err.append(ge.end_ms - item["greeting_end_ms"])
    return {"confusion": conf, "took": took, "human_from_speech": human_from_speech,
            "human_after_reply": human_after_reply, "beeps": beeps,
            "beep_found": found, "beep_err": beep_err, "false_beeps": false_beeps, "end_err": end_err,
            "misses": misses, "timelines": timelines, "us_per_20ms": ns / 1000 / max(1, fed) * 20 / 32, "windows": fed}


TARGETS = {"machine": ">= 95 %", "human": ">= 98 %"}


def rows_of(tag: str, r: dict[str, Any]) -> list[Row]:
    rows: list[Row] = []
    conf = r["confusion"]
    for t in VERDICTS:
        n = sum(conf[t].values())
        if n:
            rows.append((f"{tag}: {t} right ({n} openings)", 100.0 * conf[t][t] / n, "%", TARGETS.get(t, "")))
    for t in VERDICTS:
        for k in VERDICTS:
            if t != k and conf[t][k]:
                rows.append((f"{tag}: confusion {t} -> {k}", conf[t][k], "openings", ""))
    for t in VERDICTS:
        if r["took"][t]:
            rows.append((f"{tag}: {t} verdict p50", _pct(r["took"][t], 50), "ms", ""))
            rows.append((f"{tag}: {t} verdict p95", _pct(r["took"][t], 95), "ms", "<= 1500" if t == "human" else ""))
    rows.append((f"{tag}: human verdict p95 from speech start", _pct(r["human_from_speech"], 95), "ms", ""))
    tl = r["timelines"]
    if tl:
        rows.append((f"{tag}: human reply end p95 from the answer (the floor: no verdict before it)",
                     _pct([t["reply_end_ms"] for t in tl], 95), "ms", ""))
        rows.append((f"{tag}: people decided within 1500 ms of the answer", 100.0 * sum(t["verdict_ms"] <= 1500
                     for t in tl) / len(tl), "%", ""))
        for var in sorted({t["variant"] for t in tl}):
            sub = [t["verdict_ms"] for t in tl if t["variant"] == var]
            rows.append((f"{tag}: human verdict p95, {var} ({len(sub)})", _pct(sub, 95), "ms", ""))
    for q in (50, 95):
        rows.append((f"{tag}: human verdict p{q} after the reply's last word", _pct(r["human_after_reply"], q), "ms", ""))
    if r["beeps"]:
        rows.append((f"{tag}: beeps found within 300 ms ({r['beeps']} beeps)", 100.0 * r["beep_found"] / r["beeps"],
                     "%", ">= 95 %"))
        rows.append((f"{tag}: beep onset error p95", _pct(r["beep_err"], 95), "ms", ""))
    rows.append((f"{tag}: false beeps (no beep in the opening)", r["false_beeps"], "openings", "0"))
    if r["end_err"]:
        for q in (50, 95):
            rows.append((f"{tag}: greeting end error p{q} (no beep; + = late)", _pct(r["end_err"], q), "ms", ""))
    rows.append((f"{tag}: detector CPU per 20 ms of audio per call", r["us_per_20ms"], "us", ""))
    return rows


def matrix(r: dict[str, Any]) -> str:
    conf = r["confusion"]
    head = "true \\ said".ljust(12) + "".join(k[:9].rjust(10) for k in VERDICTS)
    lines = [head] + [t.ljust(12) + "".join(str(conf[t][k]).rjust(10) for k in VERDICTS) for t in VERDICTS]
    return "\n".join(lines)


def timelines(r: dict[str, Any], last: int = 0) -> str:
    """Each person's opening, latest verdict last (``last``: only that many): when their speech
    started and ended, when the verdict came, by which rule."""
    tl = sorted(r["timelines"], key=lambda t: t["verdict_ms"])[-last:]
    head = f"{'opening':<10} {'variant':<18} {'speech':>6} {'end':>6} {'verdict':>7} {'after':>6}  rule / said"
    return "\n".join([head] + [f"{t['name']:<10} {t['variant']:<18} {t['speech_ms']:>6} {t['reply_end_ms']:>6} "
                               f"{t['verdict_ms']:>7} {t['verdict_ms'] - t['reply_end_ms']:>6}  {t['kind']}/{t['rule']}"
                               f" {t['text']!r} {t['voice']}" for t in tl])


def measure(seed: int, scale: float = 1.0, params: AmdParams | None = None, show: bool = True,
            out: Path = amd_set.OUT, show_timelines: int = 0, local_stt: bool = False) -> list[Row]:
    t0 = time.perf_counter()
    man = amd_set.build(seed, out, scale=scale)
    audio = [amd_set.load(man, it) for it in man["openings"]]
    t1 = time.perf_counter()
    probs = probabilities(audio)
    t2 = time.perf_counter()
    rows: list[Row] = [("openings", len(audio), "", ">= 200"), ("seed", seed, "", f"tuned on {TUNE_SEED}")]
    runs: list[tuple[str, bool, bool, LocalStt | None]] = [
        ("audio", False, True, None), ("audio+transcript", True, True, None), ("energy, no VAD", False, False, None)]
    if local_stt:
        runs.append(("audio+local STT", True, True, LocalStt()))
    for tag, tr, vad, stt in runs:
        t3 = time.perf_counter()
        r = evaluate(man, probs, audio, tr, params, vad, stt)
        rows += rows_of(tag, r)
        if stt is not None:
            rows += [(f"{tag}: Whisper jobs (one opening so far each)", len(stt.took_ms), "jobs", ""),
                     (f"{tag}: Whisper job wall time p50", _pct(stt.took_ms, 50), "ms", ""),
                     (f"{tag}: Whisper job wall time p95", _pct(stt.took_ms, 95), "ms", ""),
                     (f"{tag}: run took", time.perf_counter() - t3, "s", "")]
            if show:
                for name in [m.split("->")[0] for m in r["misses"]][:12]:
                    print(f"      heard {name}: {stt.texts.get(name, [])}")
        if show:
            print(f"   -- {tag}: confusion (rows: the truth)\n" + "\n".join("      " + ln for ln in matrix(r).splitlines()))
            print(f"      misses: {' '.join(r['misses'][:40])}", flush=True)
            if show_timelines and tag == "audio":
                print("   -- people's timelines (ms from the answer), latest verdicts:\n"
                      + "\n".join("      " + ln for ln in timelines(r, show_timelines).splitlines()))
    if show:
        print(f"   (set {t1 - t0:.1f} s, VAD {t2 - t1:.1f} s, piper voice: {man['piper']})")
    return rows


def worker_in16(x8: np.ndarray, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """An 8 kHz opening as the worker of a call with ``[audio] denoise = mode`` holds it:
    (in16 before the denoiser: the InputChain's resampler, soxr QQ, fed 20 ms frames, what
    ``InputChain.pre`` keeps; in16 after it: what the ring, the VAD and the STT get), both
    cut to whole windows at the same positions."""
    rs = stream(amd_set.RATE, 16000)
    assert rs is not None
    den = Denoiser(make_model(mode)) if mode != "off" else None
    pre: list[np.ndarray] = []
    post: list[np.ndarray] = []
    for k in range(0, len(x8), 160):
        y = rs.resample_chunk(x8[k : k + 160], last=False)
        pre.append(y)
        post.append(den.process(y) if den is not None else y)
    if den is not None:
        post.append(den.flush())
        den.close()
    a, b = np.concatenate(pre), np.concatenate(post)
    n = min(len(a), len(b)) // 512 * 512
    return a[:n], b[:n]


def tone_level_db(x: np.ndarray, hz: float, rate: int) -> float:
    """dBFS (a sine's RMS) of the ``hz`` component of ``x``."""
    n = np.arange(len(x))
    amp = 2 * np.abs(np.dot(x.astype(np.float64), np.exp(-2j * np.pi * hz * n / rate))) / max(1, len(x))
    return float(20 * np.log10(amp / np.sqrt(2) / 32768 + 1e-12))


def _tone_of(item: dict[str, Any], x8: np.ndarray) -> tuple[float, int, int]:
    """(frequency, start ms, length ms) of an opening's tone: the beep, or a fax's first tone."""
    if item["label"] == "machine":
        return float(item["beep_hz"]), int(item["beep_ms"]), int(item["beep_len_ms"])
    loud = np.nonzero(np.abs(x8.astype(np.int32)) > 1000)[0]
    return (CED_HZ if item.get("variant") == "ced" else CNG_HZ), int(loud[0]) * 1000 // amd_set.RATE, 500


def denoise_runs(man: dict[str, Any], audio: list[np.ndarray], modes: list[str],
                 show: bool = True) -> list[Row]:
    """The openings with a tone (machines with a beep, faxes) as a denoised call's worker sees
    them (:func:`worker_in16`; the VAD on the denoised in16, 16 kHz Silero), each detected twice:
    the tone tests reading the audio from before the denoiser (what the worker does) and
    reading the denoised windows (what it did before 2026-12-07). Per mode: the tone's level
    in the line and in the denoised in16, beeps found within ``BEEP_TOL_MS``, machine and fax
    verdicts; ``off`` is the same 16 kHz path without a denoiser."""
    picked = [(it, x) for it, x in zip(man["openings"], audio, strict=True)
              if (it["label"] == "machine" and it.get("beep_ms", -1) >= 0) or it["label"] == "fax"]
    rows: list[Row] = []
    p = AmdParams(leave_message=True)
    for mode in modes:
        t0 = time.perf_counter()
        cut = [x[: (it["beep_ms"] + it["beep_len_ms"] + 600) * 8] if it["label"] == "machine" else x
               for it, x in picked]  # nothing after a beep matters here
        held = [worker_in16(x, mode) for x in cut]
        probs = probabilities([post for _, post in held], width=512)
        t1 = time.perf_counter()
        drops: dict[str, list[float]] = {"machine": [], "fax": []}
        tally = {src: {"beeps": 0, "found": 0, "machine": 0, "fax": 0} for src in ("pre", "denoised")}
        misses: list[str] = []
        for (it, x8), (pre, post), pr in zip(picked, held, probs, strict=True):
            hz, at, ms = _tone_of(it, x8)
            span = slice((at + 40) * 16, (at + min(ms, 1000) - 40) * 16)
            drops[it["label"]].append(tone_level_db(pre[span], hz, 16000) - tone_level_db(post[span], hz, 16000))
            for src in ("pre", "denoised"):
                d = AmdDetector(p, rate=16000)
                ev: list[Any] = []
                for k in range(len(pr)):
                    w = slice(k * 512, (k + 1) * 512)
                    ev += d.feed(post[w], float(pr[k]), pre[w] if src == "pre" else None)
                    if d.done:
                        break
                if not d.done:
                    ev += d.expire()
                v = next(e for e in ev if isinstance(e, AmdVerdict))
                t = tally[src]
                if it["label"] == "machine":
                    t["beeps"] += 1
                    t["machine"] += v.kind == "machine"
                    b = next((e for e in ev if isinstance(e, AmdBeep)), None)
                    found = b is not None and abs(b.onset_ms - at) <= BEEP_TOL_MS
                    t["found"] += found
                else:
                    found = v.kind == "fax"
                    t["fax"] += found
                if src == "pre" and not found:
                    misses.append(f"{it['name']}->{v.kind}({v.reason}@{v.at_ms}"
                                  f"{', beep@' + str(b.onset_ms) if it['label'] == 'machine' and b else ''})")
        nb, nf = len(drops["machine"]), len(drops["fax"])
        tag = f"denoise {mode}"
        if mode != "off":
            rows += [(f"{tag}: beep level lost in in16, p50 / min ({nb} beeps)", _pct(drops["machine"], 50), "dB",
                      f"min {min(drops['machine']):.1f}" if nb else ""),
                     (f"{tag}: fax tone level lost in in16, p50 ({nf} faxes)", _pct(drops["fax"], 50), "dB", "")]
        for src, label in (("pre", "tones before the denoiser"), ("denoised", "tones from the denoised in16")):
            if mode == "off" and src == "denoised":
                continue
            t = tally[src]
            rows += [(f"{tag}, {label}: beeps found within 300 ms", 100.0 * t["found"] / max(1, t["beeps"]), "%",
                      ">= 95 %"),
                     (f"{tag}, {label}: machines with a beep right", 100.0 * t["machine"] / max(1, t["beeps"]), "%", ""),
                     (f"{tag}, {label}: faxes right", 100.0 * t["fax"] / max(1, nf), "%", "")]
        if show:
            print(f"   ({tag}: {len(picked)} openings, denoise + VAD {t1 - t0:.1f} s, "
                  f"detection {time.perf_counter() - t1:.1f} s)\n      misses (tones before the denoiser): "
                  f"{' '.join(misses)}", flush=True)
    return rows


def cpu_16k(seconds: float = 60.0) -> float:
    """us of thread CPU per 20 ms of audio for 16 kHz windows (512 samples: a call whose VAD runs
    on in16), over noise in 256 ms bursts: a machine at 1.6 s, then listening for a beep that never
    comes (every window analysed to the end)."""
    rng = np.random.default_rng(0)
    n = int(seconds * 1000 / WINDOW_MS)
    wins = np.clip(rng.normal(0, 3000, (n, 512)), -32768, 32767).astype(np.int16)
    d = AmdDetector(AmdParams(leave_message=True, listen_max_ms=120_000), rate=16000)
    t0 = time.thread_time_ns()
    fed = 0
    for k in range(n):
        d.feed(wins[k], 0.3 if (k // 8) % 2 else 0.9)  # 256 ms on, 256 ms off: listens on to the end
        fed += 1
        if d.done:
            break
    return (time.thread_time_ns() - t0) / 1000 / fed * 20 / WINDOW_MS


def run(quick: bool = False) -> list[Row]:
    rows = measure(REPORT_SEED, scale=0.25 if quick else 1.0, local_stt=not quick)
    return rows + [("detector CPU per 20 ms per call, 16 kHz windows (synthetic)", cpu_16k(10.0 if quick else 60.0),
                    "us", "")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bench_amd")
    ap.add_argument("--seed", type=int, default=REPORT_SEED)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--timelines", type=int, default=0, metavar="N",
                    help="print the N people's openings decided last (speech start, end, verdict)")
    ap.add_argument("--local-stt", action="store_true",
                    help="a fourth run with the local Whisper transcribing as the screening does (minutes)")
    ap.add_argument("--denoise", default="", metavar="MODES",
                    help="only the openings with a tone, through the worker's denoise path: comma-separated "
                         "modes, e.g. off,rnnoise,deepfilter (DeepFilterNet: minutes)")
    a = ap.parse_args(argv)
    if a.denoise:
        man = amd_set.build(a.seed, scale=a.scale)
        rows = denoise_runs(man, [amd_set.load(man, it) for it in man["openings"]], a.denoise.split(","))
    else:
        rows = measure(a.seed, a.scale, show_timelines=a.timelines, local_stt=a.local_stt)
    for fig, val, unit, target in rows:
        v = f"{val:.1f}" if isinstance(val, float) else str(val)
        print(f"   {fig:<58} {v:>10} {unit:<9} {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
