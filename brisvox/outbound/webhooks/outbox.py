"""The durable outbox: one SQLite file (WAL) of webhook deliveries, and the retry decision.

Owns the file ``<state_dir>/webhooks.sqlite3`` (:func:`outbox_path`; mode 0600, its
``-wal``/``-shm`` too) and its one table, a row per (event, endpoint)::

    seq, event_id, type, scope, url, body, created, attempts, next_at,
    delivered_at, gave_up_at, last_error

``scope`` + ``url`` is the endpoint's id (``daemon``: a ``[[webhooks]]`` of brisvoxd.toml;
``agent:<name>``: one of that agent file's); the secret is never stored (the courier
looks it up by that id). Every process of the daemon opens the file: the agent
processes (and the outbound role's own services) insert, the courier claims and settles.

Invariants:

* Durable: the producers' connections are ``synchronous = FULL`` in WAL mode, so
  :meth:`Outbox.enqueue` returns only after its rows are on disk; the courier's is ``NORMAL``
  (a settled attempt survives a crash of any process, and only a power loss can lose it: the
  event is then sent once more, which at least once allows); a row is never deleted before it is delivered or given up (and then
  only by :meth:`Outbox.prune`, after ``keep_s``).
* At least once: a claim moves ``next_at`` to the end of a lease (the attempt's timeout plus
  a margin) in the same transaction that selects the rows (``BEGIN IMMEDIATE``); an attempt
  that never settles (the courier died) is due again when the lease ends, also after a
  restart. An (event, endpoint) pair is inserted once (``UNIQUE``).
* A row is in exactly one state: pending (neither time set), delivered or given up.
* Times are wall-clock seconds (rows outlive the process), passed in by the caller.
* :func:`after_failure` is pure: exponential backoff from :class:`~brisvox.runtime.retry.RetryPolicy`
  (full jitter, never below ``base``), a server's Retry-After honoured, the last attempt
  placed at the horizon (``created + horizon_s``), give up after it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from brisvox.outbound.webhooks.events import Event
from brisvox.runtime.private_files import FILE_MODE, open_private, private_dir
from brisvox.runtime.retry import Random, RetryPolicy

FILE_NAME = "webhooks.sqlite3"
BUSY_TIMEOUT_MS = 5000
KEEP_S = 7 * 86400.0  # delivered and given-up rows are kept a week (for `status` and debugging), then pruned

SCHEMA = """
CREATE TABLE IF NOT EXISTS deliveries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id TEXT NOT NULL,
    type TEXT NOT NULL,
    scope TEXT NOT NULL,
    url TEXT NOT NULL,
    body BLOB NOT NULL,
    created REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_at REAL NOT NULL,
    delivered_at REAL,
    gave_up_at REAL,
    last_error TEXT NOT NULL DEFAULT '',
    UNIQUE (event_id, scope, url)
);
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (next_at)
    WHERE delivered_at IS NULL AND gave_up_at IS NULL;
"""


def outbox_path(state_dir: str | os.PathLike[str]) -> Path:
    return Path(state_dir) / FILE_NAME


@dataclass(frozen=True, slots=True)
class Row:
    """One pending delivery as claimed."""

    seq: int
    event_id: str
    type: str
    scope: str
    url: str
    body: bytes
    created: float
    attempts: int


@dataclass(frozen=True, slots=True)
class Target:
    """An endpoint an event goes to: its scope and URL (the row's endpoint id)."""

    scope: str
    url: str


class Outbox:
    """One connection to the outbox file. Not shared between threads (each opens its own)."""

    def __init__(self, path: str | os.PathLike[str], synchronous: str = "FULL") -> None:
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous: FULL or NORMAL")
        self.path = Path(path)
        private_dir(self.path.parent)
        os.close(open_private(self.path, 0))  # 0600 before SQLite writes a byte
        self.db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                  check_same_thread=False)
        self.db.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        self.db.execute("PRAGMA journal_mode = WAL")
        self.db.execute(f"PRAGMA synchronous = {synchronous}")
        self.db.executescript(SCHEMA)
        for suffix in ("-wal", "-shm"):
            side = self.path.with_name(self.path.name + suffix)
            try:
                if side.stat().st_mode & 0o777 != FILE_MODE:
                    os.chmod(side, FILE_MODE)
            except OSError:
                pass

    def close(self) -> None:
        self.db.close()

    def enqueue(self, items: Iterable[tuple[Event, Target]], now: float) -> int:
        """Insert one row per (event, target), due at once, in one transaction; how many were new."""
        rows = [(e.id, e.type, t.scope, t.url, e.body, e.created, now) for e, t in items]
        if not rows:
            return 0
        cur = self.db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            before = self.db.total_changes
            cur.executemany("INSERT OR IGNORE INTO deliveries (event_id, type, scope, url, body, created, next_at) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
            n = self.db.total_changes - before
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return n

    def claim(self, now: float, limit: int, lease_s: float) -> list[Row]:
        """Up to ``limit`` due rows, oldest due first, leased until ``now + lease_s``."""
        if limit <= 0:
            return []
        cur = self.db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            got = cur.execute(
                "SELECT seq, event_id, type, scope, url, body, created, attempts FROM deliveries "
                "WHERE delivered_at IS NULL AND gave_up_at IS NULL AND next_at <= ? ORDER BY next_at, seq LIMIT ?",
                (now, limit)).fetchall()
            cur.executemany("UPDATE deliveries SET next_at = ? WHERE seq = ?", [(now + lease_s, r[0]) for r in got])
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return [Row(int(r[0]), r[1], r[2], r[3], r[4], bytes(r[5]), float(r[6]), int(r[7])) for r in got]

    def delivered(self, seq: int, now: float) -> None:
        self.db.execute("UPDATE deliveries SET delivered_at = ?, attempts = attempts + 1, last_error = '' "
                        "WHERE seq = ? AND delivered_at IS NULL AND gave_up_at IS NULL", (now, seq))

    def retry(self, seq: int, next_at: float, error: str) -> None:
        self.db.execute("UPDATE deliveries SET attempts = attempts + 1, next_at = ?, last_error = ? "
                        "WHERE seq = ? AND delivered_at IS NULL AND gave_up_at IS NULL", (next_at, error[:500], seq))

    def give_up(self, seq: int, now: float, error: str, attempted: bool = True) -> None:
        self.db.execute("UPDATE deliveries SET attempts = attempts + ?, gave_up_at = ?, last_error = ? "
                        "WHERE seq = ? AND delivered_at IS NULL AND gave_up_at IS NULL",
                        (1 if attempted else 0, now, error[:500], seq))

    def next_due(self) -> float | None:
        """When the earliest pending row is due (None: nothing pending)."""
        r = self.db.execute("SELECT MIN(next_at) FROM deliveries WHERE delivered_at IS NULL AND gave_up_at IS NULL"
                            ).fetchone()
        return None if r is None or r[0] is None else float(r[0])

    def counts(self, now: float) -> dict[str, Any]:
        """Rows by state, and the age of the oldest pending one (0: none)."""
        r = self.db.execute(
            "SELECT SUM(delivered_at IS NULL AND gave_up_at IS NULL), SUM(delivered_at IS NOT NULL), "
            "SUM(gave_up_at IS NOT NULL), MIN(CASE WHEN delivered_at IS NULL AND gave_up_at IS NULL "
            "THEN created END) FROM deliveries").fetchone()
        pending, delivered, gave_up, oldest = r
        return {"pending": int(pending or 0), "delivered": int(delivered or 0), "gave_up": int(gave_up or 0),
                "oldest_pending_age_s": round(max(0.0, now - oldest), 3) if oldest is not None else 0.0}

    def prune(self, now: float, keep_s: float = KEEP_S) -> int:
        """Delete the delivered and given-up rows settled more than ``keep_s`` ago; how many."""
        cur = self.db.execute("DELETE FROM deliveries WHERE COALESCE(delivered_at, gave_up_at) < ?", (now - keep_s,))
        return int(cur.rowcount)

    def rows(self) -> list[dict[str, Any]]:
        """Every row (for tests and debugging)."""
        cur = self.db.execute("SELECT seq, event_id, type, scope, url, created, attempts, next_at, delivered_at, "
                              "gave_up_at, last_error FROM deliveries ORDER BY seq")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def after_failure(created: float, attempts: int, now: float, horizon_s: float, policy: RetryPolicy,
                  retry_after: float | None = None, random: Random | None = None) -> float | None:
    """When to try again after the ``attempts``-th failed attempt (wall seconds), or None: give up.

    The delay is ``policy.delay(attempts)`` (full jitter) but at least ``policy.base``; a
    ``retry_after`` longer than that is waited instead; the next attempt is never later than
    the horizon ``created + horizon_s``, and at or past it the row is given up."""
    deadline = created + horizon_s
    if now >= deadline:
        return None
    delay = max(policy.base, policy.delay(max(1, attempts), random))
    if retry_after is not None:
        delay = max(delay, min(retry_after, policy.cap))
    return min(now + delay, deadline)
