"""The fleet scenario: spread, drain, SIGKILL and rejoin of brisvoxd instances behind Kamailio and HAProxy.

:func:`run` (``tests/system/test_fleet.py`` asserts every check it records,
``python -m bench fleet`` prints its figures with a larger :class:`Plan`), on a
started :class:`~bench.harness.fleet.Fleet` of two instances ``a`` and ``b``:

1. spread: SIPp calls through Kamailio and Twilio-protocol calls through
   HAProxy, long and short ones at once; each instance must get 40-60 % of them;
2. drain ``a`` while its long calls are live: its OPTIONS answer and its
   ``/healthz`` turn 503 (timed from the drain command), Kamailio marks it
   inactive, HAProxy marks it down; calls placed during the drain all reach
   ``b``; every call live at the drain ends normally (the caller hangs up
   first; SIPp fails a call on a BYE it did not expect); ``a`` exits once its
   last call ended;
3. ``a`` restarts and rejoins (active in both proxies);
4. SIGKILL of ``b``'s supervisor while calls are live on both: SIP calls
   placed right after it are answered by ``a`` within the probing interval +
   ``fr_timer``; WebSocket calls placed once HAProxy marked ``b`` down are
   served; how ``b``'s own calls ended is reported, not judged;
5. ``b`` restarts and rejoins: active in both proxies, and new calls reach it.

Invariants: the scenario never stops the fleet (its owner closes it), every
wait is bounded, every SIPp process and the caller loop are stopped in
``finally``; a check that fails is recorded and the scenario goes on where it
still can (a phase that cannot, raises: the owner reports it with the logs).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.harness import fleet_calls as C
from bench.harness.fleet import Fleet, free_port, wait_until
from bench.harness.fleet_calls import CallResult, SippRun


@dataclass(frozen=True)
class Plan:
    sip_long: int = 20  # phase 1: SIPp calls held through the drain
    sip_short: int = 10
    ws_long: int = 20  # phase 1: Twilio calls held through the drain
    ws_short: int = 10
    hold_long_s: float = 16.0
    hold_short_s: float = 6.5  # the question is 3.7 s, the answer comes about 1.1 s after it
    drain_sip: int = 6  # placed during the drain
    drain_ws: int = 6
    kill_sip: int = 8  # phase 4: live when b is killed
    kill_ws: int = 8
    kill_hold_s: float = 10.0
    failover_sip: int = 12  # SIP calls placed right after the kill, one every failover_step_s
    failover_step_s: float = 0.25
    failover_ws: int = 4  # WebSocket calls once HAProxy marked b down
    rejoin_sip: int = 6
    rejoin_ws: int = 6


@dataclass
class Check:
    key: str
    ok: bool
    detail: str


@dataclass
class Report:
    figures: dict[str, Any] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check(self, key: str, ok: bool, detail: str) -> bool:
        self.checks.append(Check(key, bool(ok), detail))
        return bool(ok)

    def failed(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def text(self) -> str:
        rows = [f"  {k}: {v}" for k, v in self.figures.items()]
        rows += [f"  [{'ok' if c.ok else 'FAIL'}] {c.key}: {c.detail}" for c in self.checks]
        rows += [f"  note: {n}" for n in self.notes]
        return "\n".join(rows)


class CallerLoop:
    """An asyncio loop on its own thread: the WebSocket and SIP clients run there while the
    scenario polls and acts on the main thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fleet-callers", daemon=True)
        self.thread.start()

    def submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        if not self.thread.is_alive():
            self.loop.close()


class Watch:
    """Polls ``fn`` every ``step`` s on a thread; :meth:`first` = the first time its value met a test."""

    def __init__(self, fn: Callable[[], Any], step: float = 0.02) -> None:
        self.fn, self.step = fn, step
        self.samples: list[tuple[float, Any]] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                v = self.fn()
            except Exception as e:  # noqa: BLE001 - an unreachable endpoint is a value too
                v = f"{type(e).__name__}"
            self.samples.append((time.monotonic(), v))
            self._stop.wait(self.step)

    def first(self, pred: Callable[[Any], bool], after: float) -> float | None:
        """Seconds after ``after`` of the first sample meeting ``pred`` (None: none did)."""
        for t, v in list(self.samples):
            if t >= after and pred(v):
                return t - after
        return None

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)


def _admitted(fleet: Fleet, kind: str = "") -> dict[str, int]:
    """Calls each live instance's gateway admitted so far (``kind``: ``sip`` or ``twilio`` only)."""
    key = f"calls_admitted_{kind}" if kind else "calls_admitted"
    return {n: int(i.gateway_stats().get(key, 0)) for n, i in fleet.items() if i.alive()}


def _active(fleet: Fleet, name: str) -> int:
    return int(fleet.instances[name].gateway_stats().get("calls_active", 0))


def _wall(iso: Any) -> float:
    """A call record's ISO time as epoch seconds (0 when missing)."""
    try:
        return dt.datetime.fromisoformat(str(iso)).timestamp()
    except ValueError:
        return 0.0


def _ms(s: float | None) -> float | None:
    return None if s is None else round(s * 1000.0, 1)


class Ports:
    """Local SIP and media ports for each SIPp run (spread apart: SIPp takes media ports upward)."""

    def __init__(self) -> None:
        self.n = 0

    def next(self) -> tuple[int, int]:
        self.n += 1
        return free_port("127.0.0.1"), 40000 + (self.n % 12) * 2000


def _summary(results: list[CallResult], answered: bool = True) -> str:
    bad = [r for r in results if not (r.answered if answered else r.normal)]
    kinds: dict[str, int] = {}
    for r in bad:
        k = f"{r.ended_by}: {r.error or r.end_reason or ('no answer' if r.latency_ms is None else '')}"[:90]
        kinds[k] = kinds.get(k, 0) + 1
    return (f"{len(results) - len(bad)}/{len(results)} {'answered and ' if answered else ''}ended by the caller"
            + (f"; others {kinds}" if kinds else ""))


def run(fleet: Fleet, plan: Plan | None = None, log: Callable[[str], None] = print) -> Report:
    plan = plan or Plan()
    rep = Report()
    a, b = fleet.instances["a"], fleet.instances["b"]
    ulaw = C.ulaw_file(fleet.tmp)
    line = C.speech()
    loop = CallerLoop()
    ports = Ports()
    sipps: list[SippRun] = []
    watches: list[Watch] = []

    def sipp(label: str, n: int, hold_s: float, rate: float = 10.0) -> SippRun:
        lp, mp = ports.next()
        r = SippRun(fleet.tmp, label, fleet.sip_target, ulaw, calls=n, hold_ms=int(hold_s * 1000), rate=rate,
                    local_port=lp, media_port=mp)
        sipps.append(r)
        return r.start()

    def ws(n: int, hold_s: float, step: float = 0.1, url: str = "") -> concurrent.futures.Future[Any]:
        u = url or fleet.ws_url("/twilio")
        return loop.submit(C.calls([("twilio", u, hold_s, i * step) for i in range(n)], line))

    try:
        # 1. spread ------------------------------------------------------------------------------
        n1 = plan.sip_long + plan.sip_short + plan.ws_long + plan.ws_short
        log(f"   1. spread: {plan.sip_long + plan.sip_short} SIPp calls via Kamailio, "
            f"{plan.ws_long + plan.ws_short} Twilio calls via HAProxy")
        adm0 = _admitted(fleet)
        adm0_kind = {k: _admitted(fleet, k) for k in ("sip", "twilio")}
        s_long = sipp("long", plan.sip_long, plan.hold_long_s)
        s_short = sipp("short", plan.sip_short, plan.hold_short_s)
        w_long = ws(plan.ws_long, plan.hold_long_s)
        w_short = ws(plan.ws_short, plan.hold_short_s)
        try:
            wait_until(lambda: sum(_admitted(fleet).values()) - sum(adm0.values()) >= n1, 30,
                       f"{n1} calls admitted")
        except AssertionError as e:
            rep.notes.append(str(e))
        adm1 = _admitted(fleet)
        per = {n: adm1[n] - adm0.get(n, 0) for n in adm1}
        total = max(1, sum(per.values()))
        rep.figures["spread: calls per instance"] = per
        rep.figures["spread: share per instance %"] = {n: round(100.0 * v / total, 1) for n, v in per.items()}
        for k, before in adm0_kind.items():
            now = _admitted(fleet, k)
            rep.figures[f"spread: {k} calls per instance"] = {n: now[n] - before.get(n, 0) for n in now}
        rep.check("spread.all_admitted", sum(per.values()) == n1, f"{sum(per.values())} of {n1} admitted: {per}")
        rep.check("spread.share", all(0.4 <= v / total <= 0.6 for v in per.values()),
                  f"each instance 40-60 % of the calls: {per}")
        r_short = s_short.wait(plan.hold_short_s + 30)
        short_ws = w_short.result(plan.hold_short_s + 40)
        rep.check("spread.short_calls", r_short.ok and all(r.answered for r in short_ws),
                  f"SIPp short {r_short.successful} ok / {r_short.failed} failed {r_short.failures}; "
                  f"Twilio short {_summary(short_ws)}")

        # 2. drain a -----------------------------------------------------------------------------
        n_long = plan.sip_long + plan.ws_long
        try:  # the short calls released in both gateways: only the long ones are live
            wait_until(lambda: _active(fleet, "a") + _active(fleet, "b") <= n_long, 10, f"{n_long} calls live")
        except AssertionError as e:
            rep.notes.append(str(e))
        live_a = _active(fleet, "a")
        rep.figures["drain: calls live on a at the drain"] = live_a
        log(f"   2. drain a with {live_a} calls live on it")
        w_opt = Watch(lambda: C.options(a.host, a.sip_port, 0.3))
        w_hz = Watch(lambda: C.healthz(a.host, a.ws_port, 0.5)[0], 0.05)  # its limit: 50/s per source
        w_ds = Watch(lambda: fleet.kamailio.dispatcher().get(a.sip_uri, "?"), 0.05)
        w_hp = Watch(lambda: fleet.haproxy.status().get("a", "?"), 0.05)
        proc_a = a.daemon.proc if a.daemon is not None else None
        w_exit = Watch(lambda: proc_a is not None and proc_a.poll() is not None, 0.05)
        watches += [w_opt, w_hz, w_ds, w_hp, w_exit]
        time.sleep(0.3)
        adm_before = _admitted(fleet)
        wall_drain = time.time()
        t_drain = fleet.drain("a")
        s_during = sipp("during-drain", plan.drain_sip, plan.hold_short_s, rate=5.0)
        try:
            wait_until(lambda: fleet.haproxy.down("a"), 5, "HAProxy to mark a down")
        except AssertionError as e:
            rep.notes.append(str(e))
        w_during = ws(plan.drain_ws, plan.hold_short_s, step=0.2)
        r_during = s_during.wait(plan.hold_short_s + 30)
        during_ws = w_during.result(plan.hold_short_s + 40)
        opt_503 = w_opt.first(lambda v: v == 503, t_drain)
        hz_503 = w_hz.first(lambda v: v == 503, t_drain)
        ds_off = w_ds.first(lambda v: isinstance(v, str) and v.startswith("I"), t_drain)
        hp_down = w_hp.first(lambda v: isinstance(v, str) and v.startswith("DOWN"), t_drain)
        rep.figures["drain -> first OPTIONS 503 (ms)"] = _ms(opt_503)
        rep.figures["drain -> first /healthz 503 (ms)"] = _ms(hz_503)
        rep.figures["drain -> Kamailio marks a inactive (ms)"] = _ms(ds_off)
        rep.figures["drain -> HAProxy marks a down (ms)"] = _ms(hp_down)
        rep.check("drain.options_503", opt_503 is not None and opt_503 <= fleet.ping_interval,
                  f"a's OPTIONS answer 503 {_ms(opt_503)} ms after the drain (within one probing interval, "
                  f"{fleet.ping_interval} s); answers seen {sorted({str(v) for _, v in w_opt.samples})}")
        rep.check("drain.healthz_503", hz_503 is not None and hz_503 <= 1.0,
                  f"a's /healthz 503 {_ms(hz_503)} ms after the drain; seen {sorted({str(v) for _, v in w_hz.samples})}")
        rep.check("drain.kamailio_inactive", ds_off is not None and ds_off <= fleet.ping_interval + 1.0,
                  f"dispatcher flags of a after the drain: {_ms(ds_off)} ms "
                  f"({sorted({str(v) for _, v in w_ds.samples})})")
        rep.check("drain.haproxy_down", hp_down is not None and hp_down <= 1.5,
                  f"HAProxy status of a after the drain: {_ms(hp_down)} ms ({sorted({str(v) for _, v in w_hp.samples})})")
        adm_after = _admitted(fleet)
        # a may have exited already (its last call ended): its admissions after the drain are
        # its call records that started after it (a record is written at each call's end)
        new_a = (adm_after["a"] - adm_before.get("a", 0) if "a" in adm_after
                 else sum(1 for r in a.records() if _wall(r.get("started")) > wall_drain))
        new_b = adm_after.get("b", 0) - adm_before.get("b", 0)
        rep.figures["drain: new calls on a / b"] = f"{new_a} / {new_b}"
        rep.check("drain.no_new_calls_on_a", new_a == 0, f"{new_a} calls admitted by a after its drain")
        rep.check("drain.new_calls_on_b", new_b == plan.drain_sip + plan.drain_ws and r_during.ok
                  and all(r.answered for r in during_ws),
                  f"{new_b} of {plan.drain_sip + plan.drain_ws} new calls on b; SIPp {r_during.successful} ok / "
                  f"{r_during.failed} failed {r_during.failures}; Twilio {_summary(during_ws)}")
        r_long = s_long.wait(plan.hold_long_s + 40)
        long_ws = w_long.result(plan.hold_long_s + 40)
        dropped = r_long.failed + sum(1 for r in long_ws if not r.normal)
        rep.figures["drain: calls dropped (live at the drain, not ended by the caller)"] = dropped
        rep.check("drain.no_call_dropped", dropped == 0 and r_long.successful == plan.sip_long,
                  f"SIPp long {r_long.successful} ok / {r_long.failed} failed {r_long.failures}; "
                  f"Twilio long {_summary(long_ws)}" + ("" if r_long.ok else f"\n{r_long.tail}"))
        assert a.daemon is not None
        try:
            rc = a.daemon.wait_exit(30)
            time.sleep(0.1)
            t_exit = w_exit.first(bool, t_drain)
            rep.figures["drain -> a exited (s)"] = None if t_exit is None else round(t_exit, 2)
            rep.check("drain.exit", rc == 0, f"a exited with {rc} once its calls ended")
        except Exception as e:  # noqa: BLE001
            rep.check("drain.exit", False, f"a did not exit within 30 s of its last call: {type(e).__name__}")
        reasons: dict[str, int] = {}
        for r in a.records():
            reasons[str(r.get("end_reason"))] = reasons.get(str(r.get("end_reason")), 0) + 1
        rep.figures["drain: end reasons of a's call records"] = reasons
        for w in (w_opt, w_hz, w_ds, w_hp, w_exit):
            w.stop()

        # 3. a rejoins ---------------------------------------------------------------------------
        log("   3. restart a")
        t_ready = fleet.restart("a")
        t_join = fleet.wait_active(["a"], timeout=10)
        rep.figures["a restart: start -> ready (s)"] = round(t_ready, 1)
        rep.figures["a restart: ready -> active in both proxies (ms)"] = _ms(t_join)
        rep.check("rejoin_a", t_join <= fleet.ping_interval + 2.0, f"{_ms(t_join)} ms after ready")
        fleet.wait_active(["a", "b"], timeout=10)

        # 4. SIGKILL b ---------------------------------------------------------------------------
        adm0 = _admitted(fleet)
        s_kill = sipp("kill", plan.kill_sip, plan.kill_hold_s)
        w_kill = ws(plan.kill_ws, plan.kill_hold_s)
        n4 = plan.kill_sip + plan.kill_ws
        try:
            wait_until(lambda: sum(_admitted(fleet).values()) - sum(adm0.values()) >= n4, 20, f"{n4} calls admitted")
        except AssertionError as e:
            rep.notes.append(str(e))
        live_b = _active(fleet, "b")
        rep.figures["kill: calls live on b at the SIGKILL"] = live_b
        log(f"   4. SIGKILL b's supervisor with {live_b} calls live on it")
        w_ds = Watch(lambda: fleet.kamailio.dispatcher().get(b.sip_uri, "?"), 0.05)
        w_hp = Watch(lambda: fleet.haproxy.status().get("b", "?"), 0.05)
        w_gone = Watch(lambda: fleet.group_gone("b"), 0.05)
        watches += [w_ds, w_hp, w_gone]
        time.sleep(0.2)
        t_kill = fleet.kill("b")
        probes = loop.submit(C.calls([("sip", f"sip:fleet@{fleet.sip_target}", 1.5, i * plan.failover_step_s)
                                      for i in range(plan.failover_sip)], line, first_idx=1000))
        try:
            wait_until(lambda: fleet.haproxy.down("b"), 5, "HAProxy to mark b down")
        except AssertionError as e:
            rep.notes.append(str(e))
        ws_probe = ws(plan.failover_ws, 2.0, step=0.2)
        sip_probes = probes.result(plan.failover_sip * plan.failover_step_s + 40)
        ws_probes = ws_probe.result(45)
        ds_off = w_ds.first(lambda v: isinstance(v, str) and v.startswith("I"), t_kill)
        hp_down = w_hp.first(lambda v: isinstance(v, str) and v.startswith("DOWN"), t_kill)
        setups = [r.setup_ms for r in sip_probes if r.setup_ms is not None]
        bound_ms = (fleet.ping_interval * 1000 + fleet.fr_timer_ms) + 500
        rep.figures["kill -> Kamailio marks b inactive (ms)"] = _ms(ds_off)
        rep.figures["kill -> HAProxy marks b down (ms)"] = _ms(hp_down)
        rep.figures["failover: SIP setup time of calls placed after the kill, max / p50 (ms)"] = (
            f"{max(setups):.0f} / {np.median(setups):.0f}" if setups else None)
        rep.check("kill.sip_failover", len(setups) == plan.failover_sip and all(r.normal for r in sip_probes)
                  and max(setups, default=1e9) <= bound_ms,
                  f"SIP calls after the kill: {_summary(sip_probes, False)}; setup ms {[round(x) for x in setups]} "
                  f"(bound probing interval + fr_timer + 0.5 s = {bound_ms} ms)")
        rep.check("kill.ws_failover", all(r.normal for r in ws_probes),
                  f"Twilio calls once HAProxy marked b down: {_summary(ws_probes, False)}")
        r_kill = s_kill.wait(plan.kill_hold_s + 40)
        kill_ws = w_kill.result(plan.kill_hold_s + 40)
        rep.figures["kill: SIPp calls live at the kill (ok / failed, failures)"] = (
            f"{r_kill.successful} / {r_kill.failed} {r_kill.failures}")
        rep.figures["kill: Twilio calls live at the kill"] = _summary(kill_ws, False)
        bye_left = sum(1 for r in kill_ws if r.ended_by == "server")
        rep.check("kill.survivors", r_kill.successful + sum(r.normal for r in kill_ws) >= n4 - live_b,
                  f"the calls on a went on: {r_kill.successful} SIPp + {sum(r.normal for r in kill_ws)} Twilio ended "
                  f"normally of {n4} ({live_b} were on b; {bye_left} Twilio calls ended by the server)")
        try:
            wait_until(lambda: fleet.group_gone("b"), 15, "b's children to exit")
            time.sleep(0.1)
            t_gone = w_gone.first(bool, t_kill)
            rep.figures["kill -> every process of b gone (s)"] = None if t_gone is None else round(t_gone, 2)
        except AssertionError as e:
            rep.notes.append(str(e))
        for w in (w_ds, w_hp, w_gone):
            w.stop()

        # 5. b rejoins ---------------------------------------------------------------------------
        log("   5. restart b")
        t_ready = fleet.restart("b")
        t_join = fleet.wait_active(["b"], timeout=10)
        rep.figures["b restart: start -> ready (s)"] = round(t_ready, 1)
        rep.figures["b restart: ready -> active in both proxies (ms)"] = _ms(t_join)
        adm0 = _admitted(fleet)
        s_rejoin = sipp("rejoin", plan.rejoin_sip, 2.0)
        rejoin_ws = ws(plan.rejoin_ws, 2.0, step=0.3).result(60)
        r_rejoin = s_rejoin.wait(40)
        adm1 = _admitted(fleet)
        got_b = adm1.get("b", 0) - adm0.get("b", 0)
        rep.figures["rejoin: new calls on a / b"] = f"{adm1.get('a', 0) - adm0.get('a', 0)} / {got_b}"
        rep.check("rejoin_b", got_b >= 2 and r_rejoin.ok and all(r.normal for r in rejoin_ws),
                  f"{got_b} of {plan.rejoin_sip + plan.rejoin_ws} new calls on b; SIPp {r_rejoin.successful} ok / "
                  f"{r_rejoin.failed} failed; Twilio {_summary(rejoin_ws, False)}")
        try:
            wait_until(lambda: all(_active(fleet, n) == 0 for n in ("a", "b")), 15, "every call table empty")
            rep.check("clean", True, "every instance's call table is empty")
        except AssertionError as e:
            rep.check("clean", False, str(e))
        return rep
    finally:
        for w in watches:
            w.stop()
        for s in sipps:
            s.stop()
        loop.close()
