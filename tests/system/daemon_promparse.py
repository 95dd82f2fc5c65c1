"""A strict parser of the Prometheus text exposition format 0.0.4 (test support).

Stricter than scrapers: every sample's family must have a ``# TYPE`` line
before it, families are contiguous and declared once, series are unique,
label values use only the three legal escapes, and the text ends with a
newline. Returns ``{family: {"type", "help", "samples": {labels_tuple: value}}}``.
"""

from __future__ import annotations

import math
import re

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}


class PromError(ValueError):
    pass


def _value(s: str, lineno: int) -> float:
    if s in ("NaN", "+Inf", "-Inf", "Inf"):
        return float(s.replace("Inf", "inf").replace("NaN", "nan"))
    try:
        v = float(s)
    except ValueError:
        raise PromError(f"line {lineno}: bad value {s!r}") from None
    if math.isnan(v) and s != "NaN":
        raise PromError(f"line {lineno}: bad value {s!r}")
    return v


def _labels(text: str, i: int, lineno: int) -> tuple[tuple[tuple[str, str], ...], int]:
    assert text[i] == "{"
    i += 1
    out: list[tuple[str, str]] = []
    while True:
        if text[i] == "}":
            return tuple(out), i + 1
        m = LABEL.match(text, i)
        if not m:
            raise PromError(f"line {lineno}: bad label name at {text[i:i + 20]!r}")
        name = m.group(0)
        i = m.end()
        if text[i : i + 2] != '="':
            raise PromError(f"line {lineno}: expected =\" after label {name}")
        i += 2
        val = []
        while True:
            c = text[i]
            if c == "\\":
                nxt = text[i + 1]
                if nxt not in ('\\', '"', "n"):
                    raise PromError(f"line {lineno}: illegal escape \\{nxt}")
                val.append("\n" if nxt == "n" else nxt)
                i += 2
            elif c == '"':
                i += 1
                break
            elif c == "\n":
                raise PromError(f"line {lineno}: newline in label value")
            else:
                val.append(c)
                i += 1
        if any(k == name for k, _ in out):
            raise PromError(f"line {lineno}: label {name} repeated")
        out.append((name, "".join(val)))
        if text[i] == ",":
            i += 1
        elif text[i] != "}":
            raise PromError(f"line {lineno}: expected , or }} after label {name}")


def parse(text: str) -> dict[str, dict]:
    if not text.endswith("\n"):
        raise PromError("exposition must end with a newline")
    fams: dict[str, dict] = {}
    done: set[str] = set()
    current: str | None = None
    for lineno, line in enumerate(text[:-1].split("\n"), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                name = parts[2]
                if not NAME.fullmatch(name):
                    raise PromError(f"line {lineno}: bad metric name {name!r}")
                fam = fams.setdefault(name, {"type": None, "help": None, "samples": {}})
                if name in done:
                    raise PromError(f"line {lineno}: family {name} declared after its samples ended")
                if current is not None and current != name:
                    done.add(current)
                current = name
                if parts[1] == "TYPE":
                    if fam["type"] is not None:
                        raise PromError(f"line {lineno}: second TYPE for {name}")
                    if fam["samples"]:
                        raise PromError(f"line {lineno}: TYPE for {name} after its samples")
                    t = parts[3] if len(parts) > 3 else ""
                    if t not in TYPES:
                        raise PromError(f"line {lineno}: bad type {t!r}")
                    fam["type"] = t
                else:
                    if fam["help"] is not None:
                        raise PromError(f"line {lineno}: second HELP for {name}")
                    fam["help"] = parts[3] if len(parts) > 3 else ""
            continue
        m = NAME.match(line)
        if not m:
            raise PromError(f"line {lineno}: bad sample {line!r}")
        name = m.group(0)
        i = m.end()
        labels: tuple[tuple[str, str], ...] = ()
        if i < len(line) and line[i] == "{":
            labels, i = _labels(line + "\n", i, lineno)
        rest = line[i:]
        if not rest.startswith(" "):
            raise PromError(f"line {lineno}: expected a space before the value")
        fields = rest.split()
        if not 1 <= len(fields) <= 2:
            raise PromError(f"line {lineno}: expected value [timestamp]")
        value = _value(fields[0], lineno)
        if len(fields) == 2 and not re.fullmatch(r"-?\d+", fields[1]):
            raise PromError(f"line {lineno}: bad timestamp")
        base = name
        for suffix in ("_bucket", "_sum", "_count"):
            if name.endswith(suffix) and name[: -len(suffix)] in fams and fams[name[: -len(suffix)]]["type"] in ("histogram", "summary"):
                base = name[: -len(suffix)]
        fam = fams.get(base)
        if fam is None or fam["type"] is None:
            raise PromError(f"line {lineno}: sample of {name} without a TYPE line")
        if base in done or (current is not None and current != base):
            raise PromError(f"line {lineno}: samples of {base} are not contiguous")
        key = (name, tuple(sorted(labels)))
        if key in fam["samples"]:
            raise PromError(f"line {lineno}: duplicate series {name}{dict(labels)}")
        fam["samples"][key] = value
    return fams


def value(fams: dict[str, dict], name: str, **labels: str) -> float:
    """The value of one series (labels must match exactly)."""
    key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
    for fam in fams.values():
        if key in fam["samples"]:
            return fam["samples"][key]
    raise KeyError(f"no series {name}{labels}")
