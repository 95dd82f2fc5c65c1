"""The JSON call record written at hang-up, and where records live.

Owns the record format (one JSON object per call) and its storage:

* ``call_id``, ``agent``, ``transport`` and ``transport_ids`` (Twilio
  callSid/streamSid, SIP Call-ID), ``started``/``ended`` (UTC ISO-8601),
  ``duration_s``, ``end_reason``;
* ``call``: ``caller``, ``called`` (numbers, "" when the transport did not
  say) and ``params``, the call's parameters (at most 32, names of at most
  64 characters, values of at most 256) WITHOUT any that looks like a
  secret (a name with token, secret, password, auth, key, PIN, ... or a
  bearer/JWT value: :meth:`~brisvox.agent.tool_engine.call_info.CallInfo.record`);
* ``failed_stage``: the stage whose unexpected failure ended the call ("" for
  every other end; the end reason is then ``stage_failed:<stage>``, unless
  the call was ended otherwise first) and ``failure``: that stage, the task,
  the exception's type (never its message), what became of the apology and
  how many more tasks failed while the call ended (null without a failure);
* ``conversation``: the context as it stands at hang-up, i.e. what the caller
  heard (cut where they barged in), in the context's JSON form but with tool
  call ARGUMENTS REMOVED (names and ids only);
* ``tools``: each tool call with epoch, id, name, outcome and duration (never
  arguments);
* ``turns``: per-turn latencies from the timeline, with its raw marks on the
  call clock (``llm_rounds``: every timed LLM round by its number, with its
  ``first_token_ms`` and ``llm_ms``, request -> ``t_llm_done``; ``rounds_dropped``:
  the rounds past the 32 a turn times); ``clock_offset_s``: ``time.monotonic()`` minus the call clock at
  hang-up, so ``t + clock_offset_s`` is a mark on the host's monotonic clock
  (the one every process shares; about 0 on the daemon's stdlib loop), the
  clock the load generator stamps its own times with;
* ``speculation``: the speculative-start counters (runner and turn driver) and the hit
  rate (``brisvox/agent/pipeline/speculation/policy.py``); with a committed speculation the
  turn's request mark is when the speculative request left (a negative ``request_ms``:
  the head start);
* ``media``: the call's media state (:mod:`~brisvox.agent.host.call_media`): the
  state it started in and ended in, each change with its time, the holds and how
  long they lasted, and for a dialled call ``dial``: ``ringing_at_ms``,
  ``progress_at_ms``, ``answered_at_ms`` (ms from its first INVITE; one not reached
  is left out);
* ``stats``: every stage's counters.

Storage: ``write_record(record, target)``: ``target`` is a directory (one
file ``<started>-<call_id>.json`` per call, written atomically) or a file
ending in ``.jsonl`` (one line per call, appended). Every record file is
mode 0600 whatever the umask (a file found looser is tightened) and a
directory made here is 0700: a record holds what the caller said and the
tools' results (digits sent with ``send_dtmf`` among them). Nothing here logs
caller audio or tool arguments.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from brisvox.agent.conversation.context import message_to_json
from brisvox.runtime.private_files import DIR_MODE, FILE_MODE, open_private

if TYPE_CHECKING:
    from brisvox.agent.host.actor import CallActor

RECORD_VERSION = 1
RECORD_FILE_MODE = FILE_MODE  # transcripts, tool results, DTMF digits: the daemon's user only
RECORD_DIR_MODE = DIR_MODE


def _iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="milliseconds")


def conversation_json(actor: CallActor) -> list[dict[str, Any]]:
    out = []
    for m in actor.context:
        row = message_to_json(m)
        if "tool_calls" in row:
            row["tool_calls"] = [{"id": c["id"], "name": c["name"]} for c in row["tool_calls"]]
        row.pop("provider_data", None)
        out.append(row)
    return out


def build_record(actor: CallActor) -> dict[str, Any]:
    ended = actor.ended_wall
    failure = actor.failure
    return {
        "version": RECORD_VERSION,
        "call_id": actor.call_id,
        "agent": actor.agent,
        "transport": actor.transport,
        "transport_ids": actor.transport_ids,
        "call": actor.call_info.record(),
        "started": _iso(actor.started_wall),
        "ended": _iso(ended),
        "duration_s": round((ended or actor.started_wall) - actor.started_wall, 3),
        "end_reason": actor.end_reason,
        "failed_stage": failure.stage if failure is not None else "",
        "failure": failure.as_record() if failure is not None else None,
        "conversation": conversation_json(actor),
        "tools": [
            {"epoch": r.epoch, "call_id": r.call_id, "name": r.name, "outcome": r.outcome, "duration_ms": r.duration_ms}
            for r in actor.tool_records()
        ],
        "turns": actor.timeline.turn_latencies(),
        "clock_offset_s": round(time.monotonic() - actor.clock.now(), 6),
        "speculation": actor.speculation_stats(),
        "media": actor.media.record(actor.clock.now()),
        "stats": actor.stats(),
    }


def _safe(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in s)[:80] or "call"


def write_record(record: dict[str, Any], target: str | os.PathLike[str]) -> Path:
    """Write one record to a directory (one file per call) or append to a .jsonl file."""
    t = Path(target)
    if t.suffix == ".jsonl":
        t.parent.mkdir(mode=RECORD_DIR_MODE, parents=True, exist_ok=True)
        _write_private(t, orjson.dumps(record, option=orjson.OPT_NON_STR_KEYS) + b"\n", os.O_APPEND)
        return t
    t.mkdir(mode=RECORD_DIR_MODE, parents=True, exist_ok=True)
    stamp = (record.get("started") or "").replace(":", "").replace("-", "")[:15]
    path = t / f"{stamp}-{_safe(str(record.get('call_id', 'call')))}.json"
    tmp = path.with_suffix(".json.tmp")
    _write_private(tmp, orjson.dumps(record, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS), os.O_TRUNC)
    os.replace(tmp, path)
    return path


def _write_private(path: Path, data: bytes, flag: int) -> None:
    """Write ``data`` to ``path`` (created, or reused, with mode :data:`RECORD_FILE_MODE`)."""
    fd = open_private(path, flag)
    try:
        with os.fdopen(fd, "wb", closefd=False) as f:
            f.write(data)
    finally:
        os.close(fd)


def read_records(target: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every record under ``target`` (directory or .jsonl), oldest first; bad rows skipped."""
    t = Path(target)
    rows: list[dict[str, Any]] = []
    if t.is_file():
        for line in t.read_bytes().splitlines():
            try:
                r = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(r, dict):
                rows.append(r)
    elif t.is_dir():
        for p in sorted(t.glob("*.json")):
            try:
                r = orjson.loads(p.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue
            if isinstance(r, dict):
                rows.append(r)
    rows.sort(key=lambda r: str(r.get("started") or ""))
    return rows
