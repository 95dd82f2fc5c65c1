"""The SIP table flood of ``python -m bench fuzz``: one source fills the server transaction table, another calls.

:func:`run_table_flood` starts its own ``brisvoxd`` (1 worker, 1 agent process,
the scripted providers, the gateway's echo agent) with the DEFAULT ``[sip]``
limits (``max_transactions`` 4096, ``other_rate``, ``refusal_rate``, the
per-source share), then from :data:`FLOODER` sends :data:`RATE` requests a
second for :data:`FLOOD_S` seconds that used to hold a server transaction
for 64*T1 each (REGISTER, MESSAGE, SUBSCRIBE, an unknown method, BYE/INFO/
CANCEL outside any dialog: one address filled the table in 16.4 s this way before per-source shares),
while :data:`BYSTANDER` places a call to ``sip:echo@`` every
:data:`CALL_EVERY_S` (INVITE, ACK, BYE at once). Printed: the bystander
INVITEs' answers and their worst answer time under the flood, the gateway's
log lines per 100 flood requests, the server transaction table at the end
of the flood and :data:`AFTER_S` after its start, the refusals by reason.

Invariants: everything binds 127.0.0.0/8 and is sent to the daemon's own
loopback port; the flood is bounded by count and time; the daemon's
process group is killed and its segments removed in ``finally``
(:meth:`bench.harness.daemon.Daemon.close`).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import time
from pathlib import Path
from typing import Any

from bench.harness.chaos.judge import Report
from bench.harness.daemon import Daemon, write_config
from bench.harness.fuzz import _gw_stats, _read_log
from bench.harness.fuzz_sip import request, sdp

FLOODER = "127.0.0.2"
BYSTANDER = "127.0.0.3"
RATE = 250.0  # requests a second: the rate that once filled the table in 16.4 s
FLOOD_S = 20.0  # the table (4096) would be full after 16.4 s if they held transactions
CALL_EVERY_S = 2.0
AFTER_S = 40.0
KINDS = ("REGISTER", "MESSAGE", "SUBSCRIBE", "FROBNICATE", "BYE", "INFO", "CANCEL")
REASONS = ("method", "unknown_method", "no_dialog", "no_transaction", "rate_limit", "flood", "tx_table_full",
           "tx_source_full")


def _config(tmp: Path) -> Path:
    rtp = 36000 + (os.getpid() % 200) * 40
    return write_config(tmp, workers=1, agents=1, extra=f"""
[gateway]
echo_use_workers = false

[sip]
port = 0
rtp_port_min = {rtp}
rtp_port_max = {rtp + 38}

[websocket]
enabled = false

[smart_turn]
enabled = false

[agents]
providers = "scripted"
smart_turn = false

[calls]
records = false
""")


def _udp(host: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    s.setblocking(False)
    return s


def _drain(s: socket.socket, codes: dict[int, int]) -> list[bytes]:
    got = []
    with contextlib.suppress(BlockingIOError):
        while True:
            d = s.recv(65535)
            got.append(d)
            if d.startswith(b"SIP/2.0 "):
                codes[int(d[8:11])] = codes.get(int(d[8:11]), 0) + 1
    return got


class _Bystander:
    """One call at a time from :data:`BYSTANDER`: INVITE, then on its final answer ACK and BYE."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sig = _udp(BYSTANDER)
        self.media = _udp(BYSTANDER)
        self.n = 0
        self.pending: tuple[str, float] | None = None
        self.answers: list[tuple[int, float]] = []  # (status, seconds) per INVITE

    def call(self, now: float) -> None:
        self.n += 1
        cid = f"bystander{self.n}x{os.getpid()}@{BYSTANDER}"
        head, body = request("INVITE", self.port, BYSTANDER, 990_000 + self.n, body=sdp(port=self.media.getsockname()[1]),
                             call_id=cid, from_tag=f"b{self.n}")
        self.sig.sendto(head + body, ("127.0.0.1", self.port))
        self.pending = (cid, now)

    def poll(self, now: float) -> None:
        _drain(self.media, {})
        for d in _drain(self.sig, {}):
            if self.pending is None or not d.startswith(b"SIP/2.0 ") or int(d[8:11]) < 200 or b"INVITE" not in d:
                continue
            status = int(d[8:11])
            cid, t0 = self.pending
            self.answers.append((status, now - t0))
            self.pending = None
            if status == 200:
                to = next(ln.split(b":", 1)[1].strip().decode() for ln in d.split(b"\r\n")
                          if ln.lower().startswith(b"to:"))
                tag = to.split("tag=", 1)[1].split(";")[0] if "tag=" in to else ""
                for method, cseq in (("ACK", 1), ("BYE", 2)):
                    h, b = request(method, self.port, BYSTANDER, 995_000 + self.n * 2 + cseq, call_id=cid,
                                   from_tag=f"b{self.n}", to_tag=tag, cseq=cseq)
                    self.sig.sendto(h + b, ("127.0.0.1", self.port))

    def close(self) -> None:
        self.sig.close()
        self.media.close()


def run_table_flood(tmp: Path, flood_s: float = FLOOD_S, log: Any = print) -> Report:
    tmp.mkdir(parents=True, exist_ok=True)
    rep = Report()
    d = Daemon(tmp, config=_config(tmp), env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}, real_roles=True)
    bad = by = None
    try:
        d.start()
        snap = d.wait_ready(60)
        port = int(d.child(snap, "gateway-0")["endpoints"]["sip"].rsplit(":", 1)[1])
        before = _gw_stats(d)
        log_start = d.log_path.stat().st_size
        log(f"   SIP table flood: {RATE:.0f} requests/s from {FLOODER} for {flood_s:.0f} s, "
            f"a call from {BYSTANDER} every {CALL_EVERY_S:.0f} s")
        bad, by = _udp(FLOODER), _Bystander(port)
        codes: dict[int, int] = {}
        sent = 0
        t0 = time.monotonic()
        next_call = t0 + 1.0
        for k in itertools.count():
            now = time.monotonic()
            if now - t0 >= flood_s:
                break
            head, body = request(KINDS[k % len(KINDS)], port, FLOODER, k + 1)
            bad.sendto(head + body, ("127.0.0.1", port))
            sent += 1
            _drain(bad, codes)
            if by.pending is None and now >= next_call:
                by.call(now)
                next_call = now + CALL_EVERY_S
            by.poll(now)
            delay = t0 + (k + 1) / RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        t_end = time.monotonic()
        while by.pending is not None and time.monotonic() - t_end < 5:
            by.poll(time.monotonic())
            time.sleep(0.01)
        time.sleep(1.2)  # the gateway reports its counters every 0.5 s
        _drain(bad, codes)
        at_end = _gw_stats(d)
        lines = [ln for ln in _read_log(d, log_start) if ln.get("role") == "gateway"
                 and ln.get("level") in ("info", "warning", "error", "critical")]
        while time.monotonic() - t0 < AFTER_S:
            time.sleep(0.5)
        after = _gw_stats(d)
    finally:
        for s in (bad, by):
            if s is not None:
                s.close()
        d.close()
    answers = by.answers
    worst = max((t for _, t in answers), default=None)
    ok = bool(answers) and all(st == 200 for st, _ in answers)
    rep.add("table_bystander", "SIP table flood: bystander INVITEs answered 200 / placed",
            f"{sum(st == 200 for st, _ in answers)}/{by.n}", "", "all", ok,
            f"answers {sorted({st for st, _ in answers})}")
    rep.add("table_answer_s", "SIP table flood: worst bystander INVITE answer time",
            round(worst, 3) if worst is not None else None, "s", "< 1", worst is not None and worst < 1.0)
    per100 = 100.0 * len(lines) / max(1, sent)
    rep.add("table_log_lines", "SIP table flood: gateway log lines per 100 flood requests",
            round(per100, 3), "lines", "<= 1", per100 <= 1.0, f"{len(lines)} lines, {sent} requests")
    # the bystander's own calls hold two each (INVITE, BYE) for 64*T1: only its address may hold any
    for key, when, st in (("table_size_end", "at the flood's end", at_end),
                          ("table_size_40s", f"{AFTER_S:.0f} s after its start", after)):
        n, sources = st.get("sip_server_transactions"), st.get("sip_server_transaction_sources")
        rep.add(key, f"SIP table flood: server transactions {when} / sources holding any", f"{n}/{sources}", "",
                f"<= {2 * by.n}/1 (the bystander's calls)", n is not None and n <= 2 * by.n
                and sources is not None and sources <= 1)
    refused = {r: int(at_end.get(f"sip_refused_{r}", 0)) - int(before.get(f"sip_refused_{r}", 0)) for r in REASONS}
    rep.add("table_refused", "SIP table flood: refusals by reason (sip_refused_*)", sum(refused.values()), "",
            f"{sent} sent", None, str({r: n for r, n in refused.items() if n}) + f"; answers received {codes}")
    return rep
