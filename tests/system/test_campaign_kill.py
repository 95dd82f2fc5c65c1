"""A 200-row campaign through a real daemon's gateway to four SIPp far ends on loopback, its
runner SIGKILLed twice mid-campaign and restarted, and every webhook event of it delivered to a
receiver that is down for the first half of the campaign and answers 500 at random after.

The far ends answer as a person (180, 200, the callee's BYE 0.5 s later), busy (486), never
(180 until our CANCEL at the 1 s ring timeout: ``no answer``) and failed (503). The campaign
retries busy and no answer once (2 attempts), 16 calls per second, at most 16 at once. The
runner (``python -m brisvox.outbound.campaign run --config``: its ``campaign.row.done`` events
to the daemon's outbox) is killed with SIGKILL after 60 and after 150 attempts (each time while
a dial rings) and started again each time. An answered call runs a scripted agent file (real
gateway, worker and agent processes) whose prompt names the row's ``first_name`` variable.
The daemon's ``[[webhooks]]`` receiver (an HTTP server in this process) is down until half the
rows are done, then answers 500 to a seeded 35 % of the requests. Checked, from the store,
from the far ends' own message logs (``sipp -trace_msg``, their wall-clock timestamps) and
from the receiver:

* every row ends with exactly one outcome, the one its far end gives (or ``unknown``: an
  attempt in flight at a kill, never re-dialled: no attempt follows an unknown one); each
  kill lands while a dial rings, so 2 to 2 x 16 unknowns;
* no row is dialled more than its retry policy allows (a person or a 503 once, busy and no
  answer twice); each far end saw each row's recorded attempts (an interrupted one at most);
* the rate cap (16/s) holds at the far ends: no 17 INVITEs inside one second (100 ms allowed for
  loopback and scheduling jitter);
* after deduplication by event id: one ``campaign.row.done`` per row with the row's outcome
  (the rows settled just before a kill and the recovered unknowns included), and each answered
  call one ``call.started``, ``call.answered`` and ``call.ended``; every request's
  ``Brisvox-Signature`` verifies and a repeated id always carries the same body; nothing is
  given up;
* a row's variable reached its call: ``call.started``'s parameters and the agent's system
  prompt in the call record (``{{first_name}}`` filled) hold the row's value.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.harness import sipp as S
from bench.harness.daemon import ROOT, Daemon, agents_config, cli, write_config
from tests.system.gateway_harness import free_port, free_port_pair_base, have, rtp_range
from tests.system.test_sip_outbound import _RESP, Media, answered_then_bye, busy
from tests.system.test_webhooks_daemon import SECRET, Receiver, outbox_rows, verify_webhook, wait

pytestmark = [pytest.mark.system, pytest.mark.serial, pytest.mark.timeout(240),
              pytest.mark.skipif(not have("sipp"), reason="needs sipp (sip-tester)")]

RATE, CAP, ROWS = 16, 16, 200
KINDS = {"human": 100, "busy": 40, "noanswer": 30, "failed": 30}
ALLOWED = {"human": 1, "busy": 2, "noanswer": 2, "failed": 1}
OUTCOME = {"human": "answered", "busy": "busy", "noanswer": "no_answer", "failed": "failed"}
KILL_AT = (60, 150)
CALL_EVENTS = ["call.answered", "call.ended", "call.started"]

AGENT = """name = "reminder"
system_prompt = "You call {{first_name}} to remind them of their appointment."

[stt]
provider = "scripted_stt"
[stt.options]
text = "hello"

[llm]
provider = "scripted"
[llm.options]
fallback = "Hello, this is your reminder."

[tts]
provider = "scripted_tts"
"""


def failed_503() -> str:
    return S.scenario('  <recv request="INVITE"/>\n' + S.send(_RESP.format(status="503 Service Unavailable")
                      + "\n      Content-Length: 0") + '  <recv request="ACK"/>\n', name="callee")


def rings_until_cancel() -> str:
    """180, then our CANCEL: 200 to it, 487 to the INVITE (its CSeq kept from the INVITE), the ACK."""
    invite = ('  <recv request="INVITE">\n    <action>\n'
              '      <ereg regexp="([0-9]+) INVITE" search_in="hdr" header="CSeq:" assign_to="cs,cseq"/>\n'
              '    </action>\n  </recv>\n  <Reference variables="cs"/>\n')
    ringing = S.send(_RESP.format(status="180 Ringing") + "\n      Content-Length: 0", False)
    ok = S.send(_RESP.format(status="200 OK") + "\n      Content-Length: 0", False)
    terminated = S.send(_RESP.format(status="487 Request Terminated").replace("[last_CSeq:]", "CSeq: [$cseq] INVITE")
                        + "\n      Content-Length: 0")
    return S.scenario(invite + ringing + '  <recv request="CANCEL"/>\n' + ok + terminated
                      + '  <recv request="ACK"/>\n', name="callee")


def far_end(tmp: Path, kind: str, scen: str, port: int) -> subprocess.Popen[bytes]:
    path = tmp / f"{kind}.xml"
    path.write_text(scen)
    args = ["sipp", "-sf", str(path), "-i", "127.0.0.1", "-p", str(port), "-mi", "127.0.0.1",
            "-mp", str(free_port_pair_base(4)), "-timeout", "200s", "-nostdin", "-trace_msg",
            "-message_file", str(tmp / f"{kind}.msg.log"), "-trace_err", "-error_file", str(tmp / f"{kind}.err.log")]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp,
                            start_new_session=True)


_BLOCK = re.compile(r"^-{20,} (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+)\n(UDP message received[^\n]*)\n\n(.*?)(?=^-{20,} |\Z)",
                    re.M | re.S)


def invites(log: Path) -> dict[str, tuple[float, str]]:
    """Call-ID -> (first INVITE's arrival, the Request-URI's user) from a SIPp message log."""
    out: dict[str, tuple[float, str]] = {}
    for m in _BLOCK.finditer(log.read_text(errors="replace")):
        msg = m.group(3)
        if not msg.startswith("INVITE "):
            continue
        cid = re.search(r"^Call-ID:\s*(\S+)", msg, re.M | re.I)
        user = re.match(r"INVITE sips?:([^@]+)@", msg)
        assert cid and user, msg[:300]
        t = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S.%f").timestamp()
        out.setdefault(cid.group(1), (t, user.group(1)))
    return out


def runner(db: Path, rdir: Path, env: dict[str, str], log: Path, cfg: Path | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "brisvox.outbound.campaign", "run", "--db", str(db),
                                 "--runtime-dir", str(rdir), "--poll", "0.05", "--drain", "5",
                                 *(("--config", str(cfg)) if cfg is not None else ())],
                                cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def q(db: Path, sql: str) -> list[tuple]:
    c = sqlite3.connect(db, timeout=10)
    try:
        return c.execute(sql).fetchall()
    finally:
        c.close()


def test_a_campaign_survives_two_sigkills_of_its_runner_and_a_down_then_flaky_receiver_exactly_once():
    tmp = Path(tempfile.mkdtemp(prefix="bvc", dir="/tmp"))
    lo, hi = rtp_range(400)
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "reminder.toml").write_text(AGENT)
    hook_port = free_port(socket.SOCK_STREAM)
    rx = Receiver(hook_port, seed=11)
    hooks = (f'\n[[webhooks]]\nurl = "http://127.0.0.1:{hook_port}/hooks"\nsecret_env = "HOOK_SECRET"\n'
             'allow_private = true\ntimeout_s = 2.0\nretry_base_s = 0.2\nretry_cap_s = 1.0\n')
    extra = agents_config(agents, tmp / "records", default_agent="reminder",
                          sip=f"port = 0\nrtp_port_min = {lo}\nrtp_port_max = {hi}") + hooks
    cfg = write_config(tmp, workers=1, agents=1, extra=extra)
    d = Daemon(tmp, config=cfg, real_roles=True, env={"HOOK_SECRET": SECRET})
    media = Media()
    ports = {k: free_port() for k in KINDS}
    scen = {"human": answered_then_bye(media.port, 500), "busy": busy(), "noanswer": rings_until_cancel(),
            "failed": failed_503()}
    peers: list[subprocess.Popen[bytes]] = []
    procs: list[subprocess.Popen[bytes]] = []
    db = tmp / "campaigns.sqlite3"
    rlog = tmp / "runner.log"
    try:
        d.start()
        d.wait_ready(60)
        peers = [far_end(tmp, k, scen[k], ports[k]) for k in KINDS]
        kind_of: dict[str, str] = {}
        lines = ["number,first_name"]
        i = 0
        for k, n in KINDS.items():
            for _ in range(n):
                num = f"+4930{i:07d}"
                kind_of[num] = k
                lines.append(f"sip:{num}@127.0.0.1:{ports[k]},Name{i:03d}")
                i += 1
        order = [lines[0], *(lines[1 + (j * 37) % ROWS] for j in range(ROWS))]  # the kinds interleaved
        src = tmp / "leads.csv"
        src.write_text("\n".join(order) + "\n")
        time.sleep(0.5)  # SIPp binds its ports
        r = cli("campaign", "start", str(src), "--agent", "reminder", "--config", str(cfg), "--db", str(db),
                "--var", "first_name",
                "--timezone", "UTC", "--hours", "00:00-24:00", "--days", "all", "--rate", str(RATE),
                "--max-concurrent", str(CAP), "--max-attempts", "2", "--retry-delay", "1",
                "--retry-on", "busy,no_answer", "--ring-timeout", "1", env=d.env)
        assert r.returncode == 0, r.stderr
        t0 = time.monotonic()
        for kill_at in (*KILL_AT, None):
            p = runner(db, d.run_dir, d.env, rlog, cfg)
            procs.append(p)
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:
                assert p.poll() is None, rlog.read_text()[-3000:]
                if rx.server is None and q(db, "SELECT COUNT(*) FROM rows WHERE state = 'done'")[0][0] >= ROWS // 2:
                    assert not rx.requests and outbox_rows(tmp / "state")  # down so far: events wait
                    rx.up(fail=0.35)  # the second half: 500 at random
                if kill_at is not None and q(db, "SELECT COUNT(*) FROM attempts")[0][0] >= kill_at and q(
                        db, f"SELECT COUNT(*) FROM attempts WHERE outcome IS NULL AND started_at"
                            f" BETWEEN {time.time() - 0.6} AND {time.time() - 0.2}")[0][0]:
                    break  # mid-dial: a no-answer dial rings 1 s, this one has 0.4 s or more to go
                if kill_at is None and q(db, "SELECT state FROM campaigns") == [("done",)]:
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(f"stuck before {kill_at}: {q(db, 'SELECT state, COUNT(*) FROM rows GROUP BY state')}"
                                     f"\n{rlog.read_text()[-3000:]}")
            if kill_at is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(5)
        elapsed = time.monotonic() - t0
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
        assert "interrupted by the last stop are now unknown" in rlog.read_text()
        time.sleep(1.5)  # the last answered calls' BYEs
        for peer in peers:
            peer.terminate()
            peer.wait(10)
        assert rx.server is not None  # it came up mid-campaign
        wait(lambda: (rows_ := outbox_rows(tmp / "state")) and all(r["delivered_at"] for r in rows_)
             and len({r["event_id"] for r in rows_}) == len(rx.accepted()), 30, "every event delivered",
             lambda: sum(1 for r in outbox_rows(tmp / "state") if not r["delivered_at"]))

        # every row: done, exactly one outcome, the one its far end gives (or unknown)
        rows = {num: (state, outcome, n) for num, state, outcome, n in
                q(db, "SELECT number, state, outcome, attempts FROM rows")}
        assert len(rows) == ROWS
        users = {num: num.split(":")[1].split("@")[0] for num in rows}
        unknown = 0
        for num, (state, outcome, n) in rows.items():
            k = kind_of[users[num]]
            assert state == "done" and outcome in (OUTCOME[k], "unknown"), (num, k, state, outcome)
            unknown += outcome == "unknown"
            assert 1 <= n <= ALLOWED[k], (num, k, n)
        assert len(KILL_AT) <= unknown <= len(KILL_AT) * CAP, unknown  # each kill left a dial in flight
        # an interrupted attempt is its row's last: never re-dialled
        assert q(db, "SELECT COUNT(*) FROM attempts a WHERE a.outcome = 'unknown' AND EXISTS (SELECT 1 FROM"
                     " attempts b WHERE b.row_id = a.row_id AND b.n > a.n)") == [(0,)]
        # the far ends' view: per row at most its policy, and the recorded attempts (an interrupted one may be missing)
        seen: dict[str, list[float]] = {}
        for k in KINDS:
            for t, user in invites(tmp / f"{k}.msg.log").values():
                assert kind_of[user] == k
                seen.setdefault(user, []).append(t)
        att = {users[num]: (n, u) for num, n, u in q(
            db, "SELECT r.number, COUNT(*), SUM(a.outcome = 'unknown') FROM attempts a JOIN rows r ON r.id = a.row_id"
                " GROUP BY r.id")}
        for user, (n, unk) in att.items():
            got = len(seen.get(user, []))
            assert n - unk <= got <= n <= ALLOWED[kind_of[user]], (user, kind_of[user], got, n, unk)
        # the rate cap at the far ends: any RATE + 1 consecutive INVITEs span at least 1 s (less 100 ms of jitter)
        ts = sorted(t for v in seen.values() for t in v)
        assert len(ts) >= ROWS - unknown
        spans = [ts[j + RATE] - ts[j] for j in range(len(ts) - RATE)]
        assert min(spans) >= 0.9, (min(spans), len(ts))
        # the webhooks: every event once after dedup by id, signed, a retry the very same bytes
        assert all(r["gave_up_at"] is None for r in outbox_rows(tmp / "state"))
        bodies: dict[str, bytes] = {}
        for headers, body, _ in rx.requests:
            ev = verify_webhook(SECRET, headers.get("brisvox-signature"), body)
            assert headers["brisvox-event-id"] == ev["id"] and headers["brisvox-event-type"] == ev["type"]
            assert bodies.setdefault(ev["id"], body) == body
        assert sum(1 for *_, code in rx.requests if code == 500) >= 1 and len(rx.requests) > len(bodies)
        got = rx.accepted()
        assert set(got) == set(bodies)  # every id sent was accepted at last
        row_done = [ev["data"] for ev in got.values() if ev["type"] == "campaign.row.done"]
        assert sorted(e["row"] for e in row_done) == sorted(rows)  # one per row (ids are per row)
        assert {e["row"]: e["outcome"] for e in row_done} == {num: o for num, (_, o, _) in rows.items()}
        by_call: dict[str, list[dict[str, Any]]] = {}
        for ev in got.values():
            if ev["type"] != "campaign.row.done":
                by_call.setdefault(ev["data"]["call_id"], []).append(ev)
        for cid, evs in by_call.items():
            assert sorted(e["type"] for e in evs) == CALL_EVENTS, (cid, [e["type"] for e in evs])
        answered = dict(q(db, "SELECT a.call_id, r.variables FROM attempts a JOIN rows r ON r.id = a.row_id"
                              " WHERE a.outcome = 'answered'"))
        assert len(answered) == KINDS["human"] - sum(1 for num, (_, o, _) in rows.items()
                                                     if kind_of[users[num]] == "human" and o == "unknown")
        assert set(answered) <= set(by_call) and len(by_call) - len(answered) <= unknown  # an unknown may have run
        for cid, variables in answered.items():  # the row's variable reached the agent
            name = orjson.loads(variables)["first_name"]
            ev = {e["type"]: e["data"] for e in by_call[cid]}
            assert ev["call.started"]["call"]["params"]["first_name"] == name
            system = ev["call.ended"]["record"]["conversation"][0]
            assert system["role"] == "system" and f"You call {name} to remind" in system["content"], system
        print(f"campaign: {len(ts)} INVITEs in {elapsed:.1f} s, {unknown} unknown after 2 kills, "
              f"tightest {RATE + 1} INVITEs span {min(spans):.3f} s; webhooks: {len(got)} events, "
              f"{len(rx.requests)} requests ({sum(1 for *_, c in rx.requests if c == 500)} answered 500)")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        for peer in peers:
            if peer.poll() is None:
                peer.kill()
                peer.wait(5)
        d.close()
        rx.down()
        media.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_sigterm_gives_a_ringing_dial_the_drain_then_exits_and_the_next_start_makes_it_unknown():
    tmp = Path(tempfile.mkdtemp(prefix="bvc", dir="/tmp"))
    lo, hi = rtp_range(20)
    extra = f"\n[gateway]\necho_use_workers = false\n\n[sip]\nport = 0\nrtp_port_min = {lo}\nrtp_port_max = {hi}\n"
    cfg = write_config(tmp, workers=1, agents=1, extra=extra)
    d = Daemon(tmp, config=cfg, env={"BRISVOX_TEST_ROLE_MAIN": "gateway=brisvox.gateway.process:main"})
    port = free_port()
    db, rlog = tmp / "campaigns.sqlite3", tmp / "runner.log"
    peer: subprocess.Popen[bytes] | None = None
    p: subprocess.Popen[bytes] | None = None
    try:
        d.start()
        d.wait_ready(60)
        peer = far_end(tmp, "ringing", rings_until_cancel(), port)
        src = tmp / "one.csv"
        src.write_text(f"number\nsip:+4930555@127.0.0.1:{port}\n")
        time.sleep(0.5)
        r = cli("campaign", "start", str(src), "--agent", "echo", "--config", str(cfg), "--db", str(db),
                "--timezone", "UTC", "--hours", "00:00-24:00", "--days", "all", "--ring-timeout", "20", env=d.env)
        assert r.returncode == 0, r.stderr
        p = runner(db, d.run_dir, d.env, rlog)
        deadline = time.monotonic() + 20
        while not q(db, "SELECT COUNT(*) FROM attempts")[0][0]:
            assert time.monotonic() < deadline and p.poll() is None, rlog.read_text()[-2000:]
            time.sleep(0.05)
        time.sleep(0.5)  # ringing now (SIPp's 180), for 20 s
        t = time.monotonic()
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
        waited = time.monotonic() - t
        assert waited < 10, waited  # --drain 5, not the ring's 20 s + 40 s
        assert "still waiting at the stop" in rlog.read_text()
        assert q(db, "SELECT state, outcome FROM rows") == [("dialing", None)]  # left for the next start
        p = runner(db, d.run_dir, d.env, rlog)
        deadline = time.monotonic() + 20
        while q(db, "SELECT state FROM campaigns") != [("done",)]:
            assert time.monotonic() < deadline and p.poll() is None, rlog.read_text()[-2000:]
            time.sleep(0.05)
        assert q(db, "SELECT state, outcome, attempts FROM rows") == [("done", "unknown", 1)]
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 0
        assert len(invites(tmp / "ringing.msg.log")) == 1  # dialled once, never again
    finally:
        for proc in (p, peer):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(5)
        d.close()
        shutil.rmtree(tmp, ignore_errors=True)
