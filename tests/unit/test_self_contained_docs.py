"""The repository reads on its own: no source file or doc cites a document a reader cannot open.

Forbidden: the design and resource notes and the two reference specs that were kept
outside the repository (by file name, by their folder, or as "seed" plus their number),
and issue numbers of the tracker. Say the rule or the number itself, in a few words, or
point at the project's own docs (``docs/*.md``). A random seed is written ``seed=0``.

The scan covers the source and doc trees and ``README.md``, every text file in them,
skipping generated output (``bench/out``, ``__pycache__``, hidden directories such as
``bench/.venv-pipecat``). Nothing is allowed: a new
reference fails the test with its file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("ipc", "brisvox", "workers", "bench", "tests", "docs", "configs", "deploy", "examples",
           "scripts", "README.md", "Makefile")
SKIPPED = ("bench/out/", "tests/fixtures/generated/")  # generated, not written by hand

# One alternative per kind of reference; written so that this file's own source does not
# match (a backslash or a "?" follows every word).
PATTERN = re.compile(
    r"DESIGN\.md|RESOURCES\.md"  # the design and resource notes
    r"|seeds?/|seed ?0{0,2}[03]\b"  # the two reference specs, by folder or by number
    r"|issues? ?#?[0-9]+",  # an issue of the tracker
    re.IGNORECASE,
)

def _files() -> list[Path]:
    out: list[Path] = []
    for name in SCANNED:
        top = ROOT / name
        if top.is_file():
            out.append(top)
            continue
        for path in sorted(top.rglob("*")):
            rel = path.relative_to(ROOT)
            if any(p.startswith(".") or p == "__pycache__" for p in rel.parts):
                continue
            if path.is_file() and not rel.as_posix().startswith(SKIPPED):
                out.append(path)
    return out


def _text(path: Path) -> str | None:
    data = path.read_bytes()
    if b"\0" in data:
        return None  # binary (audio fixtures, compiled files)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _hits() -> list[tuple[str, int, str]]:
    hits: list[tuple[str, int, str]] = []
    for path in _files():
        text = _text(path)
        if text is None:
            continue
        rel = path.relative_to(ROOT).as_posix()
        for n, line in enumerate(text.splitlines(), 1):
            if PATTERN.search(line):
                hits.append((rel, n, line.strip()))
    return hits


def test_no_reference_to_documents_outside_the_repository() -> None:
    bad = _hits()
    assert not bad, (
        "cites a document that is not in the repository (say the rule or the number"
        " itself, or point at docs/*.md):\n"
        + "\n".join(f"{path}:{n}: {line}" for path, n, line in bad)
    )


def test_the_pattern_finds_each_kind_of_reference() -> None:
    # the examples are assembled, so this file itself stays clean
    examples = ["DESIGN" + ".md section 2", "see RESOURCES" + ".md", "seeds" + "/000",
                "Seed" + " 003 section 7", "seed" + " 000's S1", "(issue" + " 8)",
                "Issue #" + "12", "issues" + " 8 and 12"]
    for example in examples:
        assert PATTERN.search(example), example
    for fine in ("seed=0", "seeds 100-139", "in issue order", "the seeded fakes"):
        assert not PATTERN.search(fine), fine
