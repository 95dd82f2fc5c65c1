"""A campaign's state in one SQLite file: campaigns, rows, attempts (stdlib ``sqlite3``, WAL).

Owns the schema and every read and write of it; the CLI (another process)
and the runner share the file, so pause, resume and cancel work across
processes (the runner polls). The file is created mode 0600 (its ``-wal`` and
``-shm`` files take the same mode from SQLite), in a directory created 0700.

Invariants:

* Attempt before dial: :meth:`CampaignStore.begin_attempt` commits the
  attempt (its row ``dialing``, ``attempts`` + 1) with ``synchronous =
  FULL`` (the commit is on disk, the WAL fsynced) BEFORE the caller sends
  anything; :meth:`CampaignStore.finish_attempt` commits its outcome after.
  A kill -9 at any point leaves either no attempt (nothing was dialled) or an
  attempt without outcome (maybe dialled).
* Recovery (:meth:`CampaignStore.recover`, once when a runner starts): an
  attempt without outcome was interrupted; it becomes ``unknown`` and so does
  its row, which is never dialled again by itself: the INVITE may have gone
  out, the callee may have answered (the gateway, another process, may still
  carry that call), and a second ring would be a second call to a person
  who did not consent to it. ``brisvoxd campaign status`` counts them.
* A row is dialled only from ``pending`` or ``waiting`` (a retry) and only
  while its campaign is ``running``, checked in the same write transaction
  that records the attempt: a pause or cancel committed first wins.
* Every row ends ``done`` with exactly one outcome
  (:data:`~.outcomes.ROW_OUTCOMES`); a row's attempts are numbered 1, 2, ...
  without gaps (UNIQUE(row_id, n)); at most ``max_attempts`` of them.
* One runner per file: :class:`RunnerLock` (``flock`` on ``<db>.runner.lock``).
* A done row's ``campaign.row.done`` event: ``notified_at`` stays NULL until the runner
  knows the event is committed to the webhook outbox (:meth:`CampaignStore.mark_notified`;
  a runner without webhooks marks it with the outcome, and the rows a cancel ended with
  :meth:`CampaignStore.mark_all_notified`); a row done but not notified (the runner killed
  in between, a recovered ``unknown``, a row a cancel ended: the CLI's transaction marks
  it done and leaves it unnotified) is listed by :meth:`CampaignStore.unnotified` and
  sent, again if need be, under the same event id: at least once, exactly once after
  deduplication by id (the outbox's own, and the receiver's).
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from brisvox.outbound.campaign.csvload import Row
from brisvox.outbound.campaign.outcomes import (
    AMD_VERDICTS,
    ATTEMPT_OUTCOMES,
    CANCELLED,
    UNKNOWN,
    shown,
)
from brisvox.outbound.campaign.scheduler import Due, Settings, after_attempt
from brisvox.runtime.private_files import FILE_MODE, private_dir
from brisvox.runtime.private_files import open_private as private_fd

DB_NAME = "campaigns.sqlite3"
STATES = ("running", "paused", "cancelled", "done")
SCHEMA_VERSION = 2  # 2: rows.notified_at
_SCHEMA = """
CREATE TABLE IF NOT EXISTS campaigns (
  id INTEGER PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  agent TEXT NOT NULL,
  source TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('running', 'paused', 'cancelled', 'done')),
  settings TEXT NOT NULL,
  created_at REAL NOT NULL,
  updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS rows (
  id INTEGER PRIMARY KEY,
  campaign_id INTEGER NOT NULL REFERENCES campaigns(id),
  line INTEGER NOT NULL,
  number TEXT NOT NULL,
  timezone TEXT NOT NULL,
  variables TEXT NOT NULL,
  state TEXT NOT NULL CHECK (state IN ('pending', 'dialing', 'waiting', 'done')),
  attempts INTEGER NOT NULL DEFAULT 0,
  next_at REAL NOT NULL,
  outcome TEXT,
  notified_at REAL,
  UNIQUE (campaign_id, number),
  CHECK ((state = 'done') = (outcome IS NOT NULL))
);
CREATE INDEX IF NOT EXISTS rows_due ON rows (campaign_id, state, next_at);
CREATE TABLE IF NOT EXISTS attempts (
  id INTEGER PRIMARY KEY,
  row_id INTEGER NOT NULL REFERENCES rows(id),
  n INTEGER NOT NULL,
  started_at REAL NOT NULL,
  ended_at REAL,
  outcome TEXT,
  detail TEXT NOT NULL DEFAULT '',
  call_id TEXT NOT NULL DEFAULT '',
  amd TEXT,
  UNIQUE (row_id, n)
);
CREATE INDEX IF NOT EXISTS attempts_call ON attempts (call_id);
CREATE INDEX IF NOT EXISTS attempts_started ON attempts (started_at);
"""


class StoreError(ValueError):
    """A request the store refuses (an unknown campaign, a name taken, a state change not allowed)."""


@dataclass(frozen=True, slots=True)
class Campaign:
    id: int
    name: str
    agent: str
    source: str
    state: str
    settings: Settings
    created_at: float


@dataclass(frozen=True, slots=True)
class Attempt:
    """An attempt committed before its dial: what to dial, and under which campaign."""

    id: int
    row_id: int
    n: int
    campaign_id: int
    number: str
    agent: str
    variables: Mapping[str, str] = field(default_factory=dict)  # the row's: the call's parameters


@dataclass(frozen=True, slots=True)
class DoneRow:
    """A done row whose ``campaign.row.done`` is to be sent: the row, its last attempt, its campaign."""

    row_id: int
    campaign_id: int
    campaign: str
    campaign_created_at: float
    agent: str
    number: str
    outcome: str
    attempts: int
    call_id: str


def open_private(path: Path) -> None:
    """Create ``path`` owner-only (its directory 0700), or tighten a looser one
    (:mod:`brisvox.runtime.private_files`, the rule call records follow).

    An existing file is not opened here: closing a descriptor of it drops every POSIX lock this
    process holds on it, the locks of its open SQLite connections among them (a second store in
    one process: the runner's meter thread). Another process's closing connection then takes
    itself for the last one, checkpoints and deletes the WAL under the running connection, and
    what that commits afterwards is lost (seen: tests/system/test_campaign_twilio.py)."""
    private_dir(path.parent)
    try:
        os.close(private_fd(path, os.O_EXCL))  # a new file: no connection of this process holds it
    except FileExistsError:
        if path.stat().st_mode & 0o777 != FILE_MODE:
            os.chmod(path, FILE_MODE)  # a file made before (another umask, an older version)


class CampaignStore:
    """The SQLite file at ``path`` (see the module docstring). Not thread-safe: one per thread."""

    def __init__(self, path: str | os.PathLike[str], busy_timeout_s: float = 10.0) -> None:
        self.path = Path(path)
        open_private(self.path)
        self.db = sqlite3.connect(self.path, isolation_level=None, timeout=busy_timeout_s)
        self.db.row_factory = sqlite3.Row
        mode = self.db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise StoreError(f"{self.path}: cannot use WAL mode (journal_mode {mode})")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.execute("PRAGMA foreign_keys=ON")
        with self._write():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self.db.execute(stmt)
            version = self.db.execute("PRAGMA user_version").fetchone()[0]
            if version == 1:  # the rows settled before events were tracked: not sent again
                self.db.execute("ALTER TABLE rows ADD COLUMN notified_at REAL")
                self.db.execute("UPDATE rows SET notified_at = 0 WHERE state = 'done'")
                version = 0
            if version == 0:
                self.db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            elif version != SCHEMA_VERSION:
                raise StoreError(f"{self.path}: schema version {version}, this brisvox knows {SCHEMA_VERSION}")

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction (BEGIN IMMEDIATE: the write lock first), committed on exit."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- campaigns -------------------------------------------------------------------------------

    def create(self, name: str, agent: str, source: str, settings: Settings, rows: Sequence[Row],
               now: float) -> Campaign:
        """A new running campaign with ``rows`` pending (one transaction: all or nothing)."""
        with self._write() as db:
            if db.execute("SELECT 1 FROM campaigns WHERE name = ?", (name,)).fetchone():
                raise StoreError(f"a campaign named {name!r} exists (pick another --name)")
            cur = db.execute("INSERT INTO campaigns (name, agent, source, state, settings, created_at, updated_at)"
                             " VALUES (?, ?, ?, 'running', ?, ?, ?)",
                             (name, agent, source, json.dumps(settings.to_json()), now, now))
            cid = int(cur.lastrowid or 0)
            db.executemany("INSERT INTO rows (campaign_id, line, number, timezone, variables, state, next_at)"
                           " VALUES (?, ?, ?, ?, ?, 'pending', ?)",
                           [(cid, r.line, r.number, r.timezone, json.dumps(dict(r.variables)), now) for r in rows])
        c = self.campaign(name)
        assert c is not None
        return c

    def _campaign(self, r: sqlite3.Row) -> Campaign:
        return Campaign(int(r["id"]), r["name"], r["agent"], r["source"], r["state"],
                        Settings.from_json(json.loads(r["settings"])), float(r["created_at"]))

    def campaign(self, key: str | int) -> Campaign | None:
        """The campaign named ``key``, else the one whose id it is."""
        r = self.db.execute("SELECT * FROM campaigns WHERE name = ?", (str(key),)).fetchone()
        if r is None and str(key).isdigit():
            r = self.db.execute("SELECT * FROM campaigns WHERE id = ?", (int(key),)).fetchone()
        return self._campaign(r) if r else None

    def campaigns(self, states: Sequence[str] = STATES) -> list[Campaign]:
        marks = ",".join("?" * len(states))
        return [self._campaign(r) for r in
                self.db.execute(f"SELECT * FROM campaigns WHERE state IN ({marks}) ORDER BY id", tuple(states))]

    def set_state(self, key: str, to: str, now: float) -> Campaign:
        """Pause (from running), resume (from paused) or cancel (from running or paused: every row not
        yet dialled ends ``cancelled``; a row waiting for a retry ends with its last attempt's outcome;
        a row being dialled is left to :meth:`finish_attempt`, which ends it with that dial's outcome).
        The rows a cancel ends are done and not notified, in the same transaction: their
        ``campaign.row.done`` is sent by the runner as any other row's (:meth:`unnotified`)."""
        allowed = {"paused": ("running",), "running": ("paused",), "cancelled": ("running", "paused")}[to]
        found = self.campaign(key)
        if found is None:
            raise StoreError(f"no campaign {key!r}")
        with self._write() as db:
            r = db.execute("SELECT id, state FROM campaigns WHERE id = ?", (found.id,)).fetchone()
            if r["state"] not in allowed:
                raise StoreError(f"campaign {key!r} is {r['state']}: cannot become {to}")
            db.execute("UPDATE campaigns SET state = ?, updated_at = ? WHERE id = ?", (to, now, r["id"]))
            if to == "cancelled":  # notified_at NULL: each row's event is the runner's to send (once)
                db.execute("UPDATE rows SET state = 'done', outcome = COALESCE((SELECT a.outcome FROM attempts a"
                           " WHERE a.row_id = rows.id ORDER BY a.n DESC LIMIT 1), ?), notified_at = NULL"
                           " WHERE campaign_id = ? AND state IN ('pending', 'waiting')", (CANCELLED, r["id"]))
        c = self.campaign(found.id)
        assert c is not None
        return c

    def finish_if_done(self, campaign_id: int, now: float) -> bool:
        """Mark a running campaign ``done`` once every row is; whether it is done (or cancelled) now."""
        left = "SELECT COUNT(*) FROM rows WHERE campaign_id = ? AND state != 'done'"
        if self.db.execute(left, (campaign_id,)).fetchone()[0]:
            return False  # read first: most ticks write nothing
        with self._write() as db:
            if db.execute(left, (campaign_id,)).fetchone()[0]:
                return False
            db.execute("UPDATE campaigns SET state = 'done', updated_at = ? WHERE id = ? AND state = 'running'",
                       (now, campaign_id))
        return True

    # -- dialling -------------------------------------------------------------------------------

    def due(self, campaign_id: int, now: float, limit: int = 500) -> list[Due]:
        """Rows that may be dialled at ``now`` (pending, or waiting with their retry time come), oldest first."""
        return [Due(int(r["id"]), r["timezone"]) for r in self.db.execute(
            "SELECT id, timezone FROM rows WHERE campaign_id = ? AND state IN ('pending', 'waiting')"
            " AND next_at <= ? ORDER BY next_at, id LIMIT ?", (campaign_id, now, limit))]

    def next_due_at(self, campaign_id: int) -> float | None:
        r = self.db.execute("SELECT MIN(next_at) FROM rows WHERE campaign_id = ? AND state IN ('pending', 'waiting')",
                            (campaign_id,)).fetchone()
        return None if r[0] is None else float(r[0])

    def defer(self, moves: Sequence[tuple[int, float]]) -> None:
        """Move rows' next time (to their calling hours' opening)."""
        if moves:
            with self._write() as db:
                db.executemany("UPDATE rows SET next_at = ? WHERE id = ? AND state IN ('pending', 'waiting')",
                               [(t, rid) for rid, t in moves])

    def last_started(self, campaign_id: int) -> float | None:
        r = self.db.execute("SELECT MAX(a.started_at) FROM attempts a JOIN rows r ON r.id = a.row_id"
                            " WHERE r.campaign_id = ?", (campaign_id,)).fetchone()
        return None if r[0] is None else float(r[0])

    def begin_attempt(self, row_id: int, now: float) -> Attempt | None:
        """Record (committed, on disk) that ``row_id`` is dialled now; None (nothing recorded, do not
        dial) when the row is not dialable or its campaign not running any more."""
        with self._write() as db:
            r = db.execute("SELECT r.id, r.attempts, r.number, r.campaign_id, r.variables, c.agent FROM rows r"
                           " JOIN campaigns c ON c.id = r.campaign_id WHERE r.id = ?"
                           " AND r.state IN ('pending', 'waiting') AND c.state = 'running'", (row_id,)).fetchone()
            if r is None:
                return None
            n = int(r["attempts"]) + 1
            db.execute("UPDATE rows SET state = 'dialing', attempts = ? WHERE id = ?", (n, row_id))
            cur = db.execute("INSERT INTO attempts (row_id, n, started_at) VALUES (?, ?, ?)", (row_id, n, now))
            return Attempt(int(cur.lastrowid or 0), row_id, n, int(r["campaign_id"]), r["number"], r["agent"],
                           json.loads(r["variables"]))

    def finish_attempt(self, attempt: Attempt, outcome: str, detail: str, call_id: str, now: float,
                       notified: bool = True) -> str | None:
        """Record an attempt's outcome; its row is done (returns the row's outcome) or waits for a
        retry (returns None). An attempt already finished (recovered) is left as it is.
        ``notified`` False: the row's event is still to be sent (:meth:`mark_notified`)."""
        if outcome not in ATTEMPT_OUTCOMES:
            raise ValueError(f"outcome {outcome!r}")
        with self._write() as db:
            cur = db.execute("UPDATE attempts SET outcome = ?, detail = ?, call_id = ?, ended_at = ?"
                             " WHERE id = ? AND outcome IS NULL", (outcome, detail[:200], call_id[:128], now,
                                                                   attempt.id))
            if cur.rowcount != 1:
                return None
            c = db.execute("SELECT c.state, c.settings FROM campaigns c WHERE c.id = ?",
                           (attempt.campaign_id,)).fetchone()
            final, retry_at = after_attempt(Settings.from_json(json.loads(c["settings"])), outcome, attempt.n, now)
            if retry_at is not None and c["state"] == "cancelled":
                final, retry_at = outcome, None
            if final is not None:
                db.execute("UPDATE rows SET state = 'done', outcome = ?, notified_at = ? WHERE id = ?"
                           " AND state = 'dialing'", (final, now if notified else None, attempt.row_id))
            else:
                db.execute("UPDATE rows SET state = 'waiting', next_at = ? WHERE id = ? AND state = 'dialing'",
                           (retry_at, attempt.row_id))
            return final

    def recover(self, now: float, notified: bool = True) -> int:
        """At a runner's start: every attempt without an outcome (interrupted) and its row become
        ``unknown`` (see the module docstring). How many. ``notified`` as :meth:`finish_attempt`'s."""
        with self._write() as db:
            n = db.execute("UPDATE attempts SET outcome = ?, ended_at = ?, detail = 'interrupted: the runner"
                           " stopped during this attempt (it may have been dialled)' WHERE outcome IS NULL",
                           (UNKNOWN, now)).rowcount
            db.execute("UPDATE rows SET state = 'done', outcome = ?, notified_at = ? WHERE state = 'dialing'",
                       (UNKNOWN, now if notified else None))
        return int(n)

    def unnotified(self, limit: int = 500, row_ids: Sequence[int] | None = None) -> list[DoneRow]:
        """Done rows whose event is not known to be committed (at most ``limit``; only ``row_ids``
        when given), with their last attempt."""
        where = "" if row_ids is None else f" AND r.id IN ({','.join(str(int(i)) for i in row_ids) or '0'})"
        return [DoneRow(int(r["id"]), int(r["campaign_id"]), r["name"], float(r["created_at"]), r["agent"],
                        r["number"], r["outcome"], int(r["attempts"]), r["call_id"] or "")
                for r in self.db.execute(
                    "SELECT r.id, r.campaign_id, c.name, c.created_at, c.agent, r.number, r.outcome, r.attempts,"
                    " (SELECT a.call_id FROM attempts a WHERE a.row_id = r.id ORDER BY a.n DESC LIMIT 1) AS call_id"
                    " FROM rows r JOIN campaigns c ON c.id = r.campaign_id"
                    f" WHERE r.state = 'done' AND r.notified_at IS NULL{where} ORDER BY r.id LIMIT ?", (limit,))]

    def mark_notified(self, row_ids: Sequence[int], now: float) -> None:
        """The rows' events are committed to the outbox."""
        with self._write() as db:
            db.executemany("UPDATE rows SET notified_at = ? WHERE id = ?", [(now, i) for i in row_ids])

    def mark_all_notified(self, now: float) -> int:
        """A runner without webhooks: every done row's event counts as sent (there is nowhere to send
        it; the rows a cancel ended, which no dial of this runner finished). How many."""
        with self._write() as db:
            return int(db.execute("UPDATE rows SET notified_at = ? WHERE state = 'done' AND notified_at IS NULL",
                                  (now,)).rowcount)

    def record_amd(self, call_id: str, verdict: str) -> bool:
        """The answering-machine verdict (``human``/``machine``) of an answered attempt's call."""
        if verdict not in AMD_VERDICTS:
            raise ValueError(f"verdict {verdict!r}: one of {', '.join(AMD_VERDICTS)}")
        with self._write() as db:
            return db.execute("UPDATE attempts SET amd = ? WHERE call_id = ? AND call_id != ''",
                              (verdict, call_id)).rowcount > 0

    def answered_calls(self, campaign_id: int, since: float) -> list[str]:
        """Call ids of the campaign's attempts answered since ``since`` (they may still be live)."""
        return [r[0] for r in self.db.execute(
            "SELECT a.call_id FROM attempts a JOIN rows r ON r.id = a.row_id WHERE r.campaign_id = ?"
            " AND a.outcome = 'answered' AND a.call_id != '' AND a.ended_at >= ?", (campaign_id, since))]

    # -- reading ---------------------------------------------------------------------------------

    def started_since(self, campaign_id: int, since: float) -> list[float]:
        return [float(r[0]) for r in self.db.execute(
            "SELECT a.started_at FROM attempts a JOIN rows r ON r.id = a.row_id WHERE r.campaign_id = ?"
            " AND a.started_at >= ?", (campaign_id, since))]

    def progress(self, campaign_id: int) -> dict[str, Any]:
        """Rows by state, rows done by outcome (as shown: AMD verdicts), attempts made, unknowns recovered."""
        states = {r[0]: int(r[1]) for r in self.db.execute(
            "SELECT state, COUNT(*) FROM rows WHERE campaign_id = ? GROUP BY state", (campaign_id,))}
        outcomes: dict[str, int] = {}
        for rec in self.rows(campaign_id):
            if rec["outcome"] is not None:
                outcomes[rec["outcome"]] = outcomes.get(rec["outcome"], 0) + 1
        attempts = self.db.execute("SELECT COUNT(*) FROM attempts a JOIN rows r ON r.id = a.row_id"
                                   " WHERE r.campaign_id = ?", (campaign_id,)).fetchone()[0]
        return {"rows": sum(states.values()), "states": states, "outcomes": outcomes, "attempts": int(attempts)}

    def metered(self, ended_since: float, limit: int) -> list[Campaign]:
        """The campaigns ``/metrics`` shows: every running or paused one, and those that ended
        (cancelled, done) at or after ``ended_since``, newest first, at most ``limit``."""
        return [self._campaign(r) for r in self.db.execute(
            "SELECT * FROM campaigns WHERE state IN ('running', 'paused') OR updated_at >= ?"
            " ORDER BY id DESC LIMIT ?", (ended_since, limit))]

    def tallies(self, campaign_id: int) -> dict[str, Any]:
        """What ``/metrics`` counts of a campaign, in aggregate queries (no row is read into Python):
        rows by state; done rows by outcome as shown (``answered_human`` / ``answered_machine``
        once AMD said); attempts made, finished attempts by outcome, retries (attempts after a
        row's first)."""
        states = {r[0]: int(r[1]) for r in self.db.execute(
            "SELECT state, COUNT(*) FROM rows WHERE campaign_id = ? GROUP BY state", (campaign_id,))}
        outcomes: dict[str, int] = {}
        for r in self.db.execute(
                "SELECT r.outcome, CASE WHEN r.outcome = 'answered' THEN (SELECT a.amd FROM attempts a"
                " WHERE a.row_id = r.id ORDER BY a.n DESC LIMIT 1) END AS amd, COUNT(*) FROM rows r"
                " WHERE r.campaign_id = ? AND r.state = 'done' GROUP BY 1, 2", (campaign_id,)):
            key = shown(r[0], r[1]) or r[0]
            outcomes[key] = outcomes.get(key, 0) + int(r[2])
        attempts: dict[str, int] = {}
        made = retries = 0
        for r in self.db.execute(
                "SELECT a.outcome, COUNT(*), SUM(a.n > 1) FROM attempts a JOIN rows r ON r.id = a.row_id"
                " WHERE r.campaign_id = ? GROUP BY a.outcome", (campaign_id,)):
            made += int(r[1])
            retries += int(r[2] or 0)
            if r[0] is not None:
                attempts[r[0]] = int(r[1])
        return {"states": states, "outcomes": outcomes, "attempts": made, "attempt_outcomes": attempts,
                "retries": retries}

    def rows(self, campaign_id: int) -> Iterator[dict[str, Any]]:
        """Every row with its attempts (oldest first), in file order: what exports hold."""
        atts: dict[int, list[dict[str, Any]]] = {}
        for a in self.db.execute("SELECT a.* FROM attempts a JOIN rows r ON r.id = a.row_id WHERE r.campaign_id = ?"
                                 " ORDER BY a.row_id, a.n", (campaign_id,)):
            atts.setdefault(int(a["row_id"]), []).append(
                {"n": a["n"], "started_at": a["started_at"], "ended_at": a["ended_at"], "outcome": a["outcome"],
                 "detail": a["detail"], "call_id": a["call_id"], "amd": a["amd"]})
        for r in self.db.execute("SELECT * FROM rows WHERE campaign_id = ? ORDER BY line", (campaign_id,)):
            mine = atts.get(int(r["id"]), [])
            last = mine[-1] if mine else None
            yield {"line": r["line"], "number": r["number"], "timezone": r["timezone"],
                   "variables": json.loads(r["variables"]), "state": r["state"],
                   "outcome": shown(r["outcome"], last["amd"] if last else None),
                   "attempts": mine}


CAMPAIGN_VERDICT = {"human": "human", "machine": "machine", "ivr": "machine", "fax": "machine"}


def record_verdict(db_path: Path, call_id: str, verdict: str) -> bool:
    """An agent process's AMD verdict for ``call_id``, into the store if a campaign dialled it
    (``ivr`` and ``fax`` count as ``machine``; ``uncertain`` leaves the row ``answered``).
    Blocking (a thread's); never creates the store; False when nothing was recorded."""
    shown = CAMPAIGN_VERDICT.get(verdict)
    if shown is None or not db_path.is_file():
        return False
    store = CampaignStore(db_path)
    try:
        return store.record_amd(call_id, shown)
    finally:
        store.close()


class RunnerLock:
    """``<db>.runner.lock`` held with ``flock`` while a runner runs: a second runner on the file is refused."""

    def __init__(self, db_path: Path) -> None:
        self.path = db_path.with_name(db_path.name + ".runner.lock")
        self.fd = -1

    def acquire(self) -> None:
        open_private(self.path)
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreError(f"another campaign runner holds {self.path}") from None
        self.fd = fd

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
