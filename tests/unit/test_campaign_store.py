"""The campaign store and runner on a real SQLite file: the attempt is committed before the dial,
its outcome after; an interrupted attempt is recovered as unknown and never re-dialled; pause,
resume and cancel written by another connection (the CLI's) are followed; retries; the cap counts
answered calls still up; one runner per file; the CLI refuses bad input with line numbers."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import stat
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from brisvox.cli.brisvoxd import main as brisvoxd
from brisvox.outbound.campaign.csvload import load
from brisvox.outbound.campaign.outcomes import classify
from brisvox.outbound.campaign.runner import CampaignRunner, DialResult
from brisvox.outbound.campaign.scheduler import Settings
from brisvox.outbound.campaign.store import CampaignStore, RunnerLock, StoreError

ALL_DAY = ((0, 24 * 60),)


def csv_rows(n: int) -> list:
    return load("number,timezone\n" + "".join(f"+49301000{i:03d},UTC\n" for i in range(n)))


class FakeDialer:
    """Answers each target with the next scripted result (default answered), after ``delay`` s;
    ``on_dial`` sees each call first. Stands in for the gateway at unit level (the system test
    dials the real one)."""

    def __init__(self, script: dict[str, list[DialResult]] | None = None, delay: float = 0.0,
                 on_dial=None, live_ids: set[str] | None = None) -> None:  # noqa: ANN001
        self.script = script or {}
        self.delay = delay
        self.on_dial = on_dial
        self.calls: list[str] = []
        self.params: dict[str, dict[str, str]] = {}  # target -> the call parameters its dial carried
        self.live_ids = set() if live_ids is None else live_ids  # default: an answered call is over at once
        self.gate: asyncio.Event | None = None
        self.up = True  # the gateway answers
        self.vias: list[str] = []  # each dial's via

    async def dial(self, target: str, agent: str, ring_timeout_s: float,
                   params: Any = None, via: str = "sip") -> DialResult:
        self.calls.append(target)
        self.vias.append(via)
        self.params[target] = dict(params or {})
        if self.on_dial is not None:
            self.on_dial(target)
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(self.delay)
        seq = self.script.get(target)
        if seq:
            r = seq.pop(0)
            if isinstance(r, BaseException):
                raise r
            return r
        return DialResult(True, call_id=f"call-{target}")

    async def live(self, call_ids: Collection[str]) -> set[str] | None:
        return set(call_ids) & self.live_ids

    async def ready(self) -> bool:
        return self.up


async def run_until(runner: CampaignRunner, cond, timeout: float = 10.0) -> None:  # noqa: ANN001
    stop = asyncio.Event()
    task = asyncio.ensure_future(runner.run(stop))
    deadline = time.monotonic() + timeout
    try:
        while not cond():
            assert time.monotonic() < deadline, "condition not reached"
            assert not task.done(), task.exception()
            await asyncio.sleep(0.02)
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def until(cond, task: asyncio.Future, timeout: float = 10.0) -> None:  # noqa: ANN001
    """Wait for ``cond`` while the runner ``task`` lives (its failure, or the timeout, fails the test)."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert not task.done(), task.exception() if not task.cancelled() else "cancelled"
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def new_campaign(path: Path, n: int, **kw: object) -> int:
    st = CampaignStore(path)
    try:
        s = Settings(**{"rate": 100.0, "max_concurrent": 10, "windows": ALL_DAY, **kw})  # type: ignore[arg-type]
        return st.create("c1", "echo", "test.csv", s, csv_rows(n), time.time()).id
    finally:
        st.close()


def peek(path: Path, sql: str, args: tuple = ()) -> list[tuple]:
    """Another connection's view: what is committed."""
    db = sqlite3.connect(path)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def test_the_file_is_private_and_in_wal_mode(tmp_path: Path):
    path = tmp_path / "state" / "campaigns.sqlite3"
    st = CampaignStore(path)
    assert st.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert st.db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    new_campaign(path, 1)
    for p in (path, path.with_name(path.name + "-wal")):
        assert stat.S_IMODE(os.stat(p).st_mode) == 0o600, p
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    st.close()


def test_each_attempt_is_committed_before_the_dial_and_its_outcome_after(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 3)
    seen: list[list[tuple]] = []

    def on_dial(target: str) -> None:  # at the moment of dialling, another process sees the attempt
        seen.append(peek(path, "SELECT r.number, r.state, a.n, a.outcome FROM attempts a JOIN rows r"
                               " ON r.id = a.row_id WHERE r.number = ?", (target,)))

    d = FakeDialer(on_dial=on_dial)
    runner = CampaignRunner(path, d, poll_s=0.02)
    asyncio.run(run_until(runner, lambda: len(d.calls) == 3 and peek(path, "SELECT state FROM campaigns") ==
                          [("done",)]))
    assert [s[0][1:] for s in seen] == [("dialing", 1, None)] * 3
    assert peek(path, "SELECT outcome, call_id FROM attempts ORDER BY id") == [
        ("answered", f"call-{n}") for n in d.calls]
    assert peek(path, "SELECT DISTINCT state, outcome FROM rows") == [("done", "answered")]


def test_a_rows_variables_go_with_its_dial_as_the_calls_parameters(tmp_path: Path):
    path = tmp_path / "c.db"
    rows = load("number,first_name,account\n+493010001,Ada,A-1\n+493010002,Bob,\n", ("first_name", "account"), "UTC")
    st = CampaignStore(path)
    st.create("vars", "echo", "v.csv", Settings(rate=100.0, windows=ALL_DAY), rows, time.time())
    st.close()
    d = FakeDialer()
    asyncio.run(run_until(CampaignRunner(path, d, poll_s=0.02),
                          lambda: peek(path, "SELECT state FROM campaigns") == [("done",)]))
    assert d.params == {"+493010001": {"first_name": "Ada", "account": "A-1"},
                        "+493010002": {"first_name": "Bob", "account": ""}}


def test_an_interrupted_attempt_is_recovered_unknown_and_never_dialled_again(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 2)
    st = CampaignStore(path)
    (due, _) = st.due(1, time.time())
    att = st.begin_attempt(due.row_id, time.time())
    assert att is not None
    st.db.close()  # the runner was killed here: the attempt is on disk, its outcome never came
    d = FakeDialer()
    runner = CampaignRunner(path, d, poll_s=0.02)
    asyncio.run(run_until(runner, lambda: peek(path, "SELECT state FROM campaigns") == [("done",)]))
    assert runner.recovered == 1
    assert d.calls == ["+49301000001"]  # only the other row
    assert peek(path, "SELECT number, outcome, attempts FROM rows ORDER BY id") == [
        ("+49301000000", "unknown", 1), ("+49301000001", "answered", 1)]
    assert peek(path, "SELECT outcome, detail LIKE 'interrupted%' FROM attempts WHERE row_id = ?",
                (att.row_id,)) == [("unknown", 1)]


def test_busy_then_answered_is_retried_after_the_delay_within_max_attempts(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 2, max_attempts=2, retry_delay_s=0.3)
    n0, n1 = "+49301000000", "+49301000001"
    d = FakeDialer({n0: [DialResult(False, error="busy"), DialResult(True, call_id="x")],
                    n1: [DialResult(False, error="503 Service Unavailable"),
                         DialResult(False, error="no answer")]})
    asyncio.run(run_until(CampaignRunner(path, d, poll_s=0.02),
                          lambda: peek(path, "SELECT state FROM campaigns") == [("done",)]))
    assert sorted(d.calls) == [n0, n0, n1, n1]
    got = peek(path, "SELECT r.number, a.n, a.outcome, a.started_at FROM attempts a JOIN rows r ON r.id = a.row_id"
                     " ORDER BY r.number, a.n")
    assert [g[:3] for g in got] == [(n0, 1, "busy"), (n0, 2, "answered"), (n1, 1, "failed"), (n1, 2, "no_answer")]
    assert got[1][3] - got[0][3] >= 0.3 and got[3][3] - got[2][3] >= 0.3
    assert peek(path, "SELECT number, outcome FROM rows ORDER BY number") == [(n0, "answered"), (n1, "no_answer")]


def test_pause_resume_and_cancel_from_another_connection_are_followed(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 6, rate=20.0, max_concurrent=1)
    d = FakeDialer(delay=0.05)
    cli = CampaignStore(path)  # the CLI's connection

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(CampaignRunner(path, d, poll_s=0.02).run(stop))
        await until(lambda: len(d.calls) >= 2, task)
        cli.set_state("c1", "paused", time.time())
        await asyncio.sleep(0.2)  # the dial in flight finishes, no new one starts
        paused_at = len(d.calls)
        await asyncio.sleep(0.4)
        assert len(d.calls) == paused_at and paused_at <= 3
        cli.set_state("c1", "running", time.time())
        await until(lambda: len(d.calls) >= paused_at + 1, task)
        cli.set_state("c1", "cancelled", time.time())
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
    states = peek(path, "SELECT outcome, COUNT(*) FROM rows GROUP BY outcome")
    dialled = len(d.calls)
    assert 3 <= dialled < 6
    assert dict(states) == {"answered": dialled, "cancelled": 6 - dialled}
    assert peek(path, "SELECT state FROM campaigns") == [("cancelled",)]
    with pytest.raises(StoreError, match="cancelled: cannot become running"):
        cli.set_state("c1", "running", time.time())
    cli.close()


def test_answered_calls_still_up_count_against_the_cap(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 3, max_concurrent=2)
    up = {"call-+49301000000", "call-+49301000001"}
    d = FakeDialer(live_ids=up)
    runner = CampaignRunner(path, d, poll_s=0.02, live_every_s=0.05)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(runner.run(stop))
        await until(lambda: len(d.calls) >= 2, task)
        await asyncio.sleep(0.5)
        assert len(d.calls) == 2  # both answered calls are up: the third waits
        up.clear()  # they hang up
        await until(lambda: len(d.calls) >= 3, task)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())


def test_a_dialer_without_verdict_makes_the_attempt_unknown_not_retried(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 1, max_attempts=3, retry_on=frozenset({"failed"}))
    d = FakeDialer({"+49301000000": [TimeoutError("the gateway does not answer on ipc://x")]})
    asyncio.run(run_until(CampaignRunner(path, d, poll_s=0.02),
                          lambda: peek(path, "SELECT state FROM campaigns") == [("done",)]))
    assert d.calls == ["+49301000000"]
    assert peek(path, "SELECT outcome, detail FROM attempts") == [("unknown", "the gateway does not answer on ipc://x")]


def test_no_attempt_is_begun_while_the_gateway_does_not_answer(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 2)
    d = FakeDialer()
    d.up = False

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(CampaignRunner(path, d, poll_s=0.02, ready_every_s=0.05).run(stop))
        await asyncio.sleep(0.4)
        assert d.calls == [] and peek(path, "SELECT COUNT(*) FROM attempts") == [(0,)]
        d.up = True
        await until(lambda: peek(path, "SELECT state FROM campaigns") == [("done",)], task)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
    assert sorted(d.calls) == ["+49301000000", "+49301000001"]


def test_a_zone_this_host_does_not_know_stalls_only_its_campaign(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 1)
    st = CampaignStore(path)
    s = Settings(rate=100.0, windows=ALL_DAY)
    st.create("c2", "echo", "b.csv", s, load("number,timezone\n+4930777777,UTC\n"), time.time())
    st.db.execute("UPDATE rows SET timezone = 'Gone/Zone' WHERE campaign_id = 1")  # tzdata changed under it
    st.close()
    d = FakeDialer()
    asyncio.run(run_until(CampaignRunner(path, d, poll_s=0.02),
                          lambda: peek(path, "SELECT state FROM campaigns WHERE name = 'c2'") == [("done",)]))
    assert d.calls == ["+4930777777"]
    assert peek(path, "SELECT state FROM rows WHERE campaign_id = 1") == [("pending",)]


def test_one_runner_per_file(tmp_path: Path):
    path = tmp_path / "c.db"
    a, b = RunnerLock(path), RunnerLock(path)
    a.acquire()
    with pytest.raises(StoreError, match="another campaign runner"):
        b.acquire()
    a.release()
    b.acquire()
    b.release()


@pytest.mark.parametrize("ok,error,want", [
    (True, "", "answered"), (False, "busy", "busy"), (False, "no answer", "no_answer"),
    (False, "503 Service Unavailable", "failed"), (False, "declined", "failed"), (False, "timeout", "failed"),
    (False, "refused: max_calls", "refused"), (False, "192.0.2.1 is not in [sip] allow", "refused"),
    (False, "a number needs [sip] trunk (or dial a sip: URI)", "refused")])
def test_classify(ok: bool, error: str, want: str):
    assert classify(ok, error) == want


def test_the_cli_refuses_a_bad_csv_with_line_numbers_and_stores_nothing(tmp_path: Path, capsys):
    db = tmp_path / "c.db"
    bad = tmp_path / "bad.csv"
    bad.write_text("number,timezone,name\n+4930123456,UTC,Ann\nnope,UTC,Bo\n+4930123456,Nowhere/Land,Cy\n")
    assert brisvoxd(["campaign", "start", str(bad), "--agent", "echo", "--db", str(db), "--var", "name",
                     "--no-agent-check"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: malformed number 'nope'" in err
    assert f"{bad}:4: duplicate of line 2" in err and f"{bad}:4: bad time zone 'Nowhere/Land'" in err
    assert not db.exists() or peek(db, "SELECT COUNT(*) FROM campaigns") == [(0,)]
    assert brisvoxd(["campaign", "start", str(bad), "--agent", "echo", "--db", str(db), "--no-agent-check"]) == 2
    assert "bad.csv:1: unknown variable 'name'" in capsys.readouterr().err


def test_the_cli_starts_pauses_reports_and_exports(tmp_path: Path, capsys):
    db = tmp_path / "c.db"
    good = tmp_path / "leads.csv"
    good.write_text("number,name\n+4930123456,Ann\n+4930123457,Bo\n")
    args = ["--db", str(db)]
    assert brisvoxd(["campaign", "start", str(good), "--agent", "echo", "--var", "name", "--timezone",
                     "Europe/Berlin", "--rate", "2", "--hours", "08:00-12:00,13:00-21:00", "--no-agent-check",
                     *args]) == 0
    assert "campaign leads (id 1): 2 rows" in capsys.readouterr().out
    assert brisvoxd(["campaign", "start", str(good), "--agent", "echo", "--var", "name", "--timezone", "UTC",
                     "--no-agent-check", *args]) == 1  # the name is taken
    assert brisvoxd(["campaign", "pause", "leads", *args]) == 0
    assert brisvoxd(["campaign", "pause", "leads", *args]) == 1  # already paused
    capsys.readouterr()
    st = CampaignStore(db)
    att = st.begin_attempt(1, time.time())
    assert att is None  # paused: nothing may be dialled
    st.set_state("leads", "running", time.time())
    att = st.begin_attempt(1, time.time())
    assert att is not None
    st.finish_attempt(att, "answered", "answered", "call-7", time.time())
    assert st.record_amd("call-7", "machine")
    st.close()
    assert brisvoxd(["campaign", "status", "leads", "--json", *args]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["outcomes"] == {"answered_machine": 1} and rep["states"] == {"done": 1, "pending": 1}
    assert rep["rate_now"] == 0.1 and rep["settings"]["windows"] == [[480, 720], [780, 1260]]
    assert brisvoxd(["campaign", "export", "leads", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "line,number,timezone,outcome,attempts,first_attempt_at,last_attempt_at,last_detail,call_id,amd,name"
    assert lines[1].startswith("2,+4930123456,Europe/Berlin,answered_machine,1,") and lines[1].endswith(
        ",answered,call-7,machine,Ann")
    assert lines[2] == "3,+4930123457,Europe/Berlin,pending,0,,,,,,Bo"
    out = tmp_path / "out.json"
    assert brisvoxd(["campaign", "export", "leads", "--format", "json", "-o", str(out), *args]) == 0
    data = json.loads(out.read_text())
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600
    assert [r["outcome"] for r in data["rows"]] == ["answered_machine", None]
    assert data["rows"][0]["attempts"][0]["call_id"] == "call-7"
    assert brisvoxd(["campaign", "cancel", "leads", *args]) == 0
    assert peek(db, "SELECT outcome FROM rows ORDER BY line") == [("answered",), ("cancelled",)]
    assert brisvoxd(["campaign", "status", "nope", *args]) == 1


def test_the_cli_refuses_a_name_that_reads_as_an_id_or_holds_odd_characters(tmp_path: Path, capsys):
    good = tmp_path / "leads.csv"
    good.write_text("number\n+4930123456\n")
    base = ["campaign", "start", str(good), "--agent", "echo", "--timezone", "UTC", "--db", str(tmp_path / "c.db"),
            "--no-agent-check"]
    assert brisvoxd([*base, "--name", "12"]) == 2
    assert brisvoxd([*base, "--name", "a b"]) == 2
    assert "--name 'a b'" in capsys.readouterr().err
    assert brisvoxd([*base, "--name", "q4-2026.calls"]) == 0
    st = CampaignStore(tmp_path / "c.db")
    assert st.campaign("1") is not None and st.campaign("1").name == "q4-2026.calls"  # an id
    assert st.campaign("q4-2026.calls") is not None and st.campaign("2") is None
    st.close()


def test_each_settled_row_is_reported_once_with_its_outcome_and_a_retried_row_only_at_its_end(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 3, max_attempts=2, retry_delay_s=0.01, retry_on=frozenset({"busy"}))
    d = FakeDialer({"+49301000001": [DialResult(False, error="busy"), DialResult(False, error="busy")],
                    "+49301000002": [DialResult(False, error="no answer")]})
    done: list[tuple[str, str, str, int]] = []

    async def on_row_done(row: Any) -> bool:
        done.append((row.number, row.outcome, row.call_id, row.attempts))
        return True

    runner = CampaignRunner(path, d, poll_s=0.02, on_row_done=on_row_done)
    asyncio.run(run_until(runner, lambda: peek(path, "SELECT state FROM campaigns") == [("done",)]))
    assert sorted(done) == [("+49301000000", "answered", "call-+49301000000", 1),
                            ("+49301000001", "busy", "", 2), ("+49301000002", "no_answer", "", 1)]
    assert peek(path, "SELECT COUNT(*) FROM rows WHERE notified_at IS NULL") == [(0,)]


def test_a_rows_event_not_committed_before_a_kill_is_sent_again_at_the_next_start_under_its_id(tmp_path: Path):
    from brisvox.outbound.webhooks.campaign_events import row_event_id

    path = tmp_path / "c.db"
    new_campaign(path, 3)
    refused: set[str] = {"+49301000001"}  # its event is not committed (the runner dies before)
    sent: list[tuple[str, str, int]] = []

    async def on_row_done(row: Any) -> bool:
        sent.append((row.number, row.outcome, row.row_id))
        return row.number not in refused

    asyncio.run(run_until(CampaignRunner(path, FakeDialer(), poll_s=0.02, on_row_done=on_row_done,
                                         renotify_every_s=3600),
                          lambda: peek(path, "SELECT state FROM campaigns") == [("done",)]))
    assert peek(path, "SELECT number FROM rows WHERE notified_at IS NULL") == [("+49301000001",)]
    # a kill mid-dial: an attempt without outcome, recovered unknown by the next runner, and its event sent
    st = CampaignStore(path)
    c = st.create("c2", "echo", "t.csv", Settings(rate=100.0, windows=ALL_DAY), csv_rows(1), time.time())
    att = st.begin_attempt(st.due(c.id, time.time())[0].row_id, time.time())
    st.close()
    assert att is not None
    refused.clear()
    sent.clear()
    asyncio.run(run_until(CampaignRunner(path, FakeDialer(), poll_s=0.02, on_row_done=on_row_done),
                          lambda: not peek(path, "SELECT 1 FROM rows WHERE notified_at IS NULL")))
    assert sorted(sent) == [("+49301000000", "unknown", att.row_id), ("+49301000001", "answered", 2)]
    created = dict(peek(path, "SELECT id, created_at FROM campaigns"))
    assert row_event_id(created[1], 1, 2) == row_event_id(created[1], 1, 2) != row_event_id(created[1], 1, 3)


def test_a_version_1_store_gains_notified_at_and_its_settled_rows_are_not_sent_again(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 2)
    db = sqlite3.connect(path)  # a store as version 1 left it: no notified_at, one row done
    db.executescript("UPDATE rows SET state = 'done', outcome = 'busy' WHERE id = 1;"
                     "ALTER TABLE rows DROP COLUMN notified_at; PRAGMA user_version = 1;")
    db.close()
    st = CampaignStore(path)
    assert st.db.execute("PRAGMA user_version").fetchone()[0] == 2
    assert st.unnotified() == []  # the row settled before: its event was the old runner's to send
    assert peek(path, "SELECT id, notified_at FROM rows ORDER BY id") == [(1, 0.0), (2, None)]
    st.close()


class HoldingDialer(FakeDialer):
    """A FakeDialer whose ``hold`` targets wait for their event, then get their ``script`` result:
    dials in flight for as long as the test wants."""

    def __init__(self, script: dict[str, list[DialResult]] | None = None, hold: Collection[str] = ()) -> None:
        super().__init__(script)
        self.hold = {t: asyncio.Event() for t in hold}

    async def dial(self, target: str, agent: str, ring_timeout_s: float, params: Any = None,
                   via: str = "sip") -> DialResult:
        if target not in self.hold:
            return await super().dial(target, agent, ring_timeout_s, params, via)
        self.calls.append(target)
        await self.hold[target].wait()
        seq = self.script.get(target)
        return seq.pop(0) if seq else DialResult(True, call_id=f"call-{target}")


def row_events_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The outbound role's real ``on_row_done`` (service.RowEvents) into a real outbox."""
    from brisvox.config.daemon import parse_config
    from brisvox.outbound.campaign.service import RowEvents
    from brisvox.outbound.webhooks.campaign_events import CampaignEvents

    monkeypatch.setenv("HOOK_SECRET", "whsec_unit")
    cfg = parse_config({"agents": {"agents_dir": str(tmp_path)}, "webhooks": [
        {"url": "https://d.example.com/rows", "secret_env": "HOOK_SECRET", "events": ["campaign.row.done"]}]})
    return RowEvents(CampaignEvents(cfg, state_dir=tmp_path / "state"))


def outbox_events(tmp_path: Path) -> list[tuple[str, str, str]]:
    """(event id, number, outcome) of every campaign.row.done row of the outbox."""
    from brisvox.outbound.webhooks.outbox import Outbox

    ob = Outbox(tmp_path / "state" / "webhooks.sqlite3")
    try:
        out = []
        for event_id, body in ob.db.execute("SELECT event_id, body FROM deliveries"
                                            " WHERE type = 'campaign.row.done' ORDER BY seq"):
            data = json.loads(body)["data"]
            out.append((event_id, data["row_id"], data["outcome"]))
        return out
    finally:
        ob.close()


def test_a_cancel_sends_one_row_done_per_row_it_ended_across_a_crash_and_an_in_flight_row_keeps_its_outcome(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from brisvox.outbound.webhooks.campaign_events import row_event_id

    path = tmp_path / "c.db"
    cid = new_campaign(path, 5, max_concurrent=2, max_attempts=3, retry_delay_s=3600.0,
                       retry_on=frozenset({"busy", "no_answer"}))
    n = [f"+49301000{i:03d}" for i in range(5)]
    # row 0 answered, row 1 busy (waits an hour for its retry), rows 2 and 3 in flight at the cancel
    # (2 answered, 3 not answered: retryable, but its campaign is cancelled), row 4 never dialled
    d = HoldingDialer({n[1]: [DialResult(False, error="busy")], n[3]: [DialResult(False, error="no answer")]},
                      hold=(n[2], n[3]))
    events = row_events_to(tmp_path, monkeypatch)
    crashing = True  # the first runner: each event the cancel owes is committed, then the runner dies unmarked
    sent: list[tuple[str, str]] = []

    async def on_row_done(row: Any) -> bool:
        sent.append((row.number, row.outcome))
        ok = await events.row_done(row)
        return ok and not (crashing and row.number in (n[1], n[4]))

    cli = CampaignStore(path)

    async def first_runner() -> None:
        stop = asyncio.Event()
        task = asyncio.ensure_future(CampaignRunner(path, d, poll_s=0.02, on_row_done=on_row_done,
                                                    renotify_every_s=3600).run(stop))
        await until(lambda: len(d.calls) == 4 and peek(path, "SELECT COUNT(*) FROM rows WHERE state = 'dialing'")
                    == [(2,)] and len(sent) == 1, task)  # row 0 settled, 1 waits, 2 and 3 dialling
        assert peek(path, "SELECT state FROM rows ORDER BY id") == [("done",), ("waiting",), ("dialing",),
                                                                     ("dialing",), ("pending",)]
        cli.set_state("c1", "cancelled", time.time())
        await until(lambda: len(sent) == 3, task)  # the runner saw the cancel: rows 1 and 4 sent at once
        for t in (n[2], n[3]):  # the dials in flight end
            d.hold[t].set()
        await until(lambda: len(sent) == 5, task)
        await asyncio.sleep(0.1)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(first_runner())
    assert sorted(sent) == [(n[0], "answered"), (n[1], "busy"), (n[2], "answered"), (n[3], "no_answer"),
                                 (n[4], "cancelled")]
    assert d.calls == n[:4]  # nothing dialled after the cancel, row 3 not retried
    assert peek(path, "SELECT number FROM rows WHERE notified_at IS NULL ORDER BY id") == [(n[1],), (n[4],)]
    # the next runner sends what the crash left unmarked, under the same ids: one outbox event per row
    crashing = False
    sent.clear()
    asyncio.run(run_until(CampaignRunner(path, FakeDialer(), poll_s=0.02, on_row_done=on_row_done),
                          lambda: not peek(path, "SELECT 1 FROM rows WHERE notified_at IS NULL")))
    assert sorted(sent) == [(n[1], "busy"), (n[4], "cancelled")]
    assert events.close()
    created = peek(path, "SELECT created_at FROM campaigns")[0][0]
    ids = {r: row_event_id(created, cid, r) for r in range(1, 6)}
    got = outbox_events(tmp_path)
    assert sorted(got) == sorted([(ids[1], 1, "answered"), (ids[2], 2, "busy"), (ids[3], 3, "answered"),
                                  (ids[4], 4, "no_answer"), (ids[5], 5, "cancelled")])
    assert peek(path, "SELECT outcome FROM rows ORDER BY id") == [("answered",), ("busy",), ("answered",),
                                                                  ("no_answer",), ("cancelled",)]
    # a third runner owes nothing
    sent.clear()
    asyncio.run(run_until(CampaignRunner(path, FakeDialer(), poll_s=0.02, on_row_done=on_row_done),
                          lambda: True))
    assert sent == []
    cli.close()


def test_a_cancel_that_dies_mid_transaction_ends_no_row_and_owes_no_event(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 3)
    cli = CampaignStore(path)
    # the process dies while the cancel's UPDATE is half way through its rows (a trigger aborts it there)
    cli.db.execute("CREATE TEMP TRIGGER crash BEFORE UPDATE OF state ON rows WHEN OLD.id = 2"
                   " BEGIN SELECT RAISE(ABORT, 'killed'); END")
    with pytest.raises(sqlite3.IntegrityError, match="killed"):
        cli.set_state("c1", "cancelled", time.time())
    assert peek(path, "SELECT state FROM campaigns") == [("running",)]
    assert peek(path, "SELECT state, outcome, notified_at FROM rows") == [("pending", None, None)] * 3
    assert cli.unnotified() == []
    cli.db.execute("DROP TRIGGER crash")
    cli.set_state("c1", "cancelled", time.time())
    assert [(r.row_id, r.outcome, r.attempts) for r in cli.unnotified()] == [(1, "cancelled", 0), (2, "cancelled", 0),
                                                                           (3, "cancelled", 0)]
    cli.close()


def test_a_runner_without_webhooks_owes_no_event_for_the_rows_a_cancel_ended(tmp_path: Path):
    path = tmp_path / "c.db"
    new_campaign(path, 2)
    cli = CampaignStore(path)
    cli.set_state("c1", "cancelled", time.time())  # no runner runs: the rows wait for one
    assert len(cli.unnotified()) == 2
    asyncio.run(run_until(CampaignRunner(path, FakeDialer(), poll_s=0.02),
                          lambda: not peek(path, "SELECT 1 FROM rows WHERE notified_at IS NULL")))
    cli.create("c2", "echo", "t.csv", Settings(rate=100.0, windows=ALL_DAY), csv_rows(1), time.time())
    cli.set_state("c2", "paused", time.time())

    async def scenario() -> None:  # a cancel of a paused campaign while the runner runs
        stop = asyncio.Event()
        task = asyncio.ensure_future(CampaignRunner(path, FakeDialer(), poll_s=0.02).run(stop))
        await asyncio.sleep(0.1)
        cli.set_state("c2", "cancelled", time.time())
        await until(lambda: not peek(path, "SELECT 1 FROM rows WHERE notified_at IS NULL"), task)
        stop.set()
        await asyncio.wait_for(task, 10)

    asyncio.run(scenario())
    assert peek(path, "SELECT outcome, COUNT(*) FROM rows GROUP BY outcome") == [("cancelled", 3)]
    cli.close()


def test_status_and_both_exports_show_the_rows_a_cancel_ended(tmp_path: Path, capsys):
    db = tmp_path / "c.db"
    new_campaign(db, 2)
    st = CampaignStore(db)
    att = st.begin_attempt(1, time.time())
    assert att is not None
    st.finish_attempt(att, "answered", "answered", "call-1", time.time())
    st.close()
    args = ["--db", str(db)]
    assert brisvoxd(["campaign", "cancel", "c1", *args]) == 0
    capsys.readouterr()
    assert brisvoxd(["campaign", "status", "c1", *args]) == 0
    assert "outcomes: answered 1, cancelled 1" in capsys.readouterr().out
    assert brisvoxd(["campaign", "export", "c1", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2].startswith("3,+49301000001,UTC,cancelled,0,") and len(lines) == 3
    assert brisvoxd(["campaign", "export", "c1", "--format", "json", *args]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(r["outcome"], r["attempts"]) for r in data["rows"]][1] == ("cancelled", [])
