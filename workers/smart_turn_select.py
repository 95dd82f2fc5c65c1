"""Which Smart Turn file a worker loads: a short self-benchmark at boot, cached per host.

Owns the choice among the **candidate files** (:func:`candidates`): the
pinned int8 file and every derived file of :data:`workers.models.DERIVED`
made from it that is present and verified against its sidecar (the same
check :func:`workers.models.derived_for` makes). Every derived recipe is
covered by the accuracy gate (``tests/e2e/test_worker_smart_turn_accuracy.py``
runs over every candidate this module may return), so a file is a candidate
only because its recipe passed that gate, and at boot it must also answer
the benchmark inputs within :data:`BOOT_MAX_DIFF` of the int8 file (a file
that loads but computes something else is never chosen).

:func:`choose` times each candidate's session on the same inputs, interleaved
(one run of each in turn, so a noisy neighbour slows them alike), with the
thread count the worker will use, and keeps the fastest median; the first
derived file in catalogue order (today: float32 softmax with the GELUs fused)
wins ties within :data:`TIE_MARGIN`.

Invariants:

* Bounded: at most :data:`ROUNDS` timed runs per candidate, and it stops
  after :data:`BUDGET_S` of timing whatever it has (the int8 file is always
  timed, so there is always a choice).
* The result is cached in the models directory (:data:`CACHE_NAME`) keyed by
  the CPU model and flags, the onnxruntime version, the thread count and the
  sha256 of every candidate: a later boot on the same host and files reads
  it (no timing); any change times again. An unwritable directory only costs
  the next boot its timing. A cached choice is still a verified candidate.
* The chosen session is handed back (``Choice.session``) so the worker does
  not load the file twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from workers import mel

log = logging.getLogger("brisvox.workers.smart_turn")

CACHE_NAME = "smart-turn-choice.json"
ROUNDS = 8  # timed runs per candidate, at most
BUDGET_S = 1.2  # of timing, at most (loading the sessions comes on top: ~0.1 s each)
TIE_MARGIN = 0.03  # a derived file within 3 % of the fastest wins (fewer QLinear* kernels)
BOOT_MAX_DIFF = 0.05  # |p - p_int8| on the benchmark inputs, at most


@dataclass(frozen=True, slots=True)
class Candidate:
    label: str  # "int8", or the derived spec's name without its source's ("f32softmax")
    path: Path
    sha256: str


@dataclass(slots=True)
class Choice:
    """The file to load, its measured median inference time, and how it was decided."""

    label: str
    path: Path
    ms: float
    table: dict[str, float] = field(default_factory=dict)  # label -> median ms (timed or cached)
    cached: bool = False
    session: Any = None  # the chosen file's session when timed now (None: load it)
    rejected: dict[str, str] = field(default_factory=dict)  # label -> why not a candidate


def candidates(source: Path) -> tuple[list[Candidate], dict[str, str]]:
    """The int8 file, then every verified derived file made from it; and why others are not."""
    from workers import models

    src_sha = models.sha256_file(source)
    out = [Candidate("int8", source, src_sha)]
    rejected: dict[str, str] = {}
    for name, spec in models.DERIVED.items():
        if models.CATALOGUE[spec.source].filename != source.name:
            continue
        label = name.removeprefix(f"{spec.source}_")
        alt, why = models.derived_for(name, source)
        if alt is None:
            rejected[label] = why
            continue
        rec = models._read_sidecar(alt) or {}
        out.append(Candidate(label, alt, str(rec.get("sha256", ""))))
    return out, rejected


def host_key(cands: list[Candidate], threads: int) -> str:
    """sha256 of what decides the timings: CPU model + flags, onnxruntime, threads, the files."""
    import onnxruntime as ort

    model, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            k, _, v = line.partition(":")
            k = k.strip()
            if k == "model name" and not model:
                model = v.strip()
            elif k == "flags" and not flags:
                flags = " ".join(sorted(v.split()))
    except OSError:
        pass
    parts = [model, flags, ort.__version__, str(threads), *(f"{c.label}={c.sha256}" for c in cands)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def _inputs() -> np.ndarray:
    """Two fixed feature matrices: seeded speech-like noise (full window) and 2 s of it, padded."""
    rng = np.random.default_rng(20240617)
    full = (rng.normal(0, 2500, mel.WINDOW_SAMPLES) * np.sin(np.arange(mel.WINDOW_SAMPLES) / 900.0) ** 2)
    short = rng.normal(0, 2500, 2 * mel.SAMPLE_RATE)
    ext = mel.LogMel()
    return np.stack([ext(full.astype(np.int16)).copy(), ext(short.astype(np.int16)).copy()])


def _read_cache(directory: Path) -> dict[str, Any]:
    try:
        rec = json.loads((directory / CACHE_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return rec if isinstance(rec, dict) else {}


def _write_cache(directory: Path, key: str, entry: dict[str, Any]) -> None:
    rec = _read_cache(directory)
    rec = {k: v for k, v in rec.items() if isinstance(v, dict)}
    rec[key] = entry
    while len(rec) > 16:  # a few hosts share a models dir at most; drop the oldest
        rec.pop(min(rec, key=lambda k: float(rec[k].get("at", 0.0))))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{CACHE_NAME}.", dir=directory)
        with os.fdopen(fd, "w") as f:
            json.dump(rec, f, indent=1, sort_keys=True)
        os.chmod(tmp, 0o644)
        os.replace(tmp, directory / CACHE_NAME)
    except OSError as e:
        log.info("Smart Turn: cannot cache the file choice in %s (%s): the next boot times again", directory, e)


def _pick(table: dict[str, float]) -> str:
    best = min(table, key=lambda k: table[k])
    for label in table:  # candidates() order: int8 first, then the derived files
        if label != "int8" and table[label] <= table[best] * (1.0 + TIE_MARGIN):
            return label
    return best


def choose(source: Path, threads: int = 1, use_cache: bool = True,
           session_factory: Any = None) -> Choice:
    """The cheapest correct candidate for this host (see the module docstring)."""
    from workers.smart_turn import ort_session

    make = session_factory or ort_session
    cands, rejected = candidates(source)
    by_label = {c.label: c for c in cands}
    key = host_key(cands, threads)
    directory = source.parent
    if use_cache:
        hit = _read_cache(directory).get(key)
        if isinstance(hit, dict) and hit.get("choice") in by_label and isinstance(hit.get("ms"), dict):
            label = str(hit["choice"])
            table = {str(k): float(v) for k, v in hit["ms"].items()}
            return Choice(label, by_label[label].path, table.get(label, 0.0), table, True, None, rejected)
    feats = _inputs()
    sessions: dict[str, Any] = {}
    ref: np.ndarray | None = None
    for c in cands:
        s = make(c.path, threads)
        name = s.get_outputs()[0].name
        p = np.array([float(s.run([name], {"input_features": f[None]})[0].reshape(-1)[0]) for f in feats])
        if ref is None:
            ref = p
        elif float(np.max(np.abs(p - ref))) > BOOT_MAX_DIFF:
            rejected[c.label] = f"answers {p.round(3).tolist()} where int8 answers {ref.round(3).tolist()}"
            log.warning("Smart Turn: %s is not a candidate: %s", c.path.name, rejected[c.label])
            continue
        sessions[c.label] = (s, name)
    times: dict[str, list[float]] = {k: [] for k in sessions}
    t_end = time.perf_counter() + BUDGET_S
    x = feats[:1]
    for _ in range(ROUNDS):
        for label, (s, name) in sessions.items():
            t0 = time.perf_counter()
            s.run([name], {"input_features": x})
            times[label].append((time.perf_counter() - t0) * 1e3)
        if time.perf_counter() > t_end:
            break
    table = {k: round(float(np.median(v)), 3) for k, v in times.items()}
    label = _pick(table)
    if use_cache:
        _write_cache(directory, key, {"choice": label, "ms": table, "threads": threads, "at": time.time(),
                                      "files": {c.label: c.path.name for c in cands}})
    return Choice(label, by_label[label].path, table[label], table, False, sessions[label][0], rejected)
