"""A campaign's CSV file, loaded and validated before anything is dialled (pure: no I/O but the text given).

Format (docs/OUTBOUND.md): UTF-8 (a BOM is allowed), a header line naming the
columns, one row per line after it (RFC 4180 quoting). Columns:

* ``number`` (required): an E.164 number (``+`` then 7-15 digits; spaces,
  dashes, dots and parentheses are dropped first) dialled through the
  gateway's ``[sip] trunk``, or a ``sip:``/``sips:`` URI ``user@host``.
* ``timezone`` (optional): the row's IANA time zone (``Europe/Berlin``);
  calling hours are that zone's wall clock. Without the column every row
  takes the campaign's default zone (``--timezone``); without either the
  file is refused.
* every other column is a variable: a value kept with the row (stored,
  exported) and sent with its dial as a call parameter (the agent's
  ``CallStart.params``: its prompt's ``{{name}}``, its tools' ``call_info``). A
  variable must be declared (``declared``: the names the operator gives with
  ``--var``, at most :data:`~brisvox.wire.jsontext.MAX_DIAL_PARAMS` of them, none
  of the gateway's own ``from``/``to``/``direction``); an undeclared column is an
  unknown variable.

Invariants: :func:`load` either returns every row or raises
:class:`CsvRefused` listing the problems (at most :data:`MAX_PROBLEMS`), each
with its line number (the line the record ends on, 1 = the header): a
malformed number, a duplicate (after normalisation: both lines named), a bad
time zone, an unknown variable (the header's line), a row with the wrong
number of fields, an empty file, more than :data:`MAX_ROWS` rows. Nothing is
half loaded.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from brisvox.wire.jsontext import DIAL_RESERVED, MAX_DIAL_PARAMS

NUMBER = "number"
TIMEZONE = "timezone"
RESERVED = (NUMBER, TIMEZONE)
MAX_ROWS = 100_000
MAX_PROBLEMS = 20
MAX_TARGET = 256  # the gateway's own bound on a dial target
MAX_VALUE = 256  # a variable's value, as the gateway bounds a call parameter
_VAR_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_E164 = re.compile(r"^\+[1-9][0-9]{6,14}$")
_SIP_URI = re.compile(r"^sips?:[!-~]+@[!-~]+$")
_FORMATTING = re.compile(r"[\s\-.()]")


@dataclass(frozen=True, slots=True)
class Row:
    """One validated row: its line in the file, the normalised target, its zone and variables."""

    line: int
    number: str
    timezone: str
    variables: Mapping[str, str]


class CsvRefused(ValueError):
    """The file cannot start a campaign; ``problems`` are (line, message) pairs, in line order."""

    def __init__(self, problems: list[tuple[int, str]], more: int = 0) -> None:
        self.problems = problems
        self.more = more
        text = "; ".join(f"line {n}: {m}" for n, m in problems)
        super().__init__(text + (f"; and {more} more" if more else ""))


def normalise_number(raw: str) -> str | None:
    """The dial target of a ``number`` cell, or None when it is malformed."""
    v = raw.strip()
    if v.lower().startswith(("sip:", "sips:")):
        return v if len(v) <= MAX_TARGET and _SIP_URI.match(v) else None
    v = _FORMATTING.sub("", v)
    return v if _E164.match(v) else None


def valid_zone(name: str) -> bool:
    """Is ``name`` an IANA time zone this host knows?"""
    if not name or len(name) > 64 or name != name.strip():
        return False
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def load(text: str, declared: Collection[str] = (), default_timezone: str = "") -> list[Row]:
    """The rows of a campaign file (see the module docstring), or :class:`CsvRefused`."""
    problems: list[tuple[int, str]] = []
    more = 0

    def bad(line: int, msg: str) -> None:
        nonlocal more
        if len(problems) < MAX_PROBLEMS:
            problems.append((line, msg))
        else:
            more += 1

    if default_timezone and not valid_zone(default_timezone):
        raise CsvRefused([(0, f"--timezone {default_timezone[:64]!r} is not an IANA time zone")])
    if len(set(declared)) > MAX_DIAL_PARAMS:
        raise CsvRefused([(0, f"at most {MAX_DIAL_PARAMS} variables (--var): each is a parameter of the call")])
    for name in declared:
        if not _VAR_NAME.match(name) or name in RESERVED or name.lower() in DIAL_RESERVED:
            raise CsvRefused([(0, f"--var {name[:64]!r}: a variable is a name of letters, digits and _ "
                                  f"(not {' or '.join(RESERVED + DIAL_RESERVED)})")])
    reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""), strict=True)
    try:
        header = next(reader, None)
        while header is not None and not any(c.strip() for c in header):
            header = next(reader, None)
        if header is None:
            raise CsvRefused([(1, "empty file: a header line naming the columns is needed (number, ...)")])
        head_line = reader.line_num
        cols = [c.strip() for c in header]
        if NUMBER not in cols:
            bad(head_line, "no 'number' column")
        seen_cols: set[str] = set()
        for c in cols:
            if c in seen_cols:
                bad(head_line, f"column {c[:64]!r} twice")
            seen_cols.add(c)
            if c not in RESERVED and c not in declared:
                bad(head_line, f"unknown variable {c[:64]!r} (declare it with --var {c[:64]})"
                    if c else "an unnamed column")
        if TIMEZONE not in cols and not default_timezone:
            bad(head_line, "no 'timezone' column and no --timezone default")
        if problems:
            raise CsvRefused(problems, more)
        rows: list[Row] = []
        first_line: dict[str, int] = {}
        records = 0
        for rec in reader:
            line = reader.line_num
            if not any(c.strip() for c in rec):
                continue
            records += 1
            if records > MAX_ROWS:
                raise CsvRefused([(line, f"more than {MAX_ROWS} rows: split the file")])
            if len(rec) != len(cols):
                bad(line, f"{len(rec)} fields, the header has {len(cols)}")
                continue
            cells = dict(zip(cols, rec, strict=True))
            number = normalise_number(cells[NUMBER])
            zone = cells[TIMEZONE].strip() if TIMEZONE in cells else ""
            zone = zone or default_timezone
            if number is None:
                bad(line, f"malformed number {cells[NUMBER][:40]!r} (E.164: +<country><number>, or sip:user@host)")
            elif number in first_line:
                bad(line, f"duplicate of line {first_line[number]} ({number[:40]})")
            else:
                first_line[number] = line
            if not valid_zone(zone):
                bad(line, f"bad time zone {zone[:64]!r} (an IANA name: Europe/Berlin)")
            variables = {k: v for k, v in cells.items() if k not in RESERVED}
            for k, v in variables.items():
                if len(v) > MAX_VALUE or any(ord(ch) < 32 for ch in v):
                    bad(line, f"variable {k!r}: at most {MAX_VALUE} characters, no control characters")
            if number is not None:
                rows.append(Row(line, number, zone, MappingProxyType(variables)))
    except csv.Error as e:
        bad(reader.line_num, f"not CSV: {e}")
    if problems:
        raise CsvRefused(problems, more)
    if not rows:
        raise CsvRefused([(1, "no rows after the header")])
    return rows
