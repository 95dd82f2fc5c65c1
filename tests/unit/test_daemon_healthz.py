"""The daemon's ``/healthz`` (metrics port) follows the daemon's state: 200 only while
running with every child ready; 503 from the moment ``brisvoxd drain`` is accepted (the
state is ``draining``), even while every child still reports ready, so a load balancer
probing the daemon stops sending calls to an instance that drains.

A real :class:`~brisvox.daemon.arbiter.Arbiter` (no child started; its child channel a
real ZeroMQ ROUTER with no peer, so a Shutdown frame goes nowhere; no pid to signal).
"""

from __future__ import annotations

import orjson
import zmq

from brisvox.config.daemon import DaemonConfig
from brisvox.daemon.arbiter import Arbiter
from brisvox.daemon.sdnotify import Notifier
from brisvox.daemon.slots import State
from brisvox.runtime.paths import PidLock


def healthz(arb: Arbiter) -> tuple[int, dict]:
    code, ctype, body = arb.serve_http("GET", "/healthz")
    assert ctype == "application/json"
    return code, orjson.loads(body)


def test_healthz_is_503_while_the_daemon_drains(tmp_path):
    arb = Arbiter(DaemonConfig(), tmp_path, tmp_path, PidLock(tmp_path))
    arb.notifier = Notifier(env={})
    ctx = zmq.Context()
    arb.table.chan = ctx.socket(zmq.ROUTER)
    arb.table.chan.bind(f"inproc://healthz-{id(arb)}")
    try:
        assert healthz(arb)[0] == 503  # starting
        arb.state = "running"
        assert all(s.pid == 0 for s in arb.slots) and arb.slots
        for s in arb.slots:
            s.state = State.READY
        code, body = healthz(arb)
        assert (code, body["status"], body["not_ready"]) == (200, "ok", [])
        reply = arb.run_command("drain", {"timeout_s": 30})
        assert reply.ok and reply.data["state"] == "draining" and arb.state == "draining"
        code, body = healthz(arb)
        assert (code, body["status"], body["state"]) == (503, "draining", "draining")
        for s in arb.slots:  # the children still ready: the daemon's state alone says draining
            s.state = State.READY
        assert healthz(arb)[0] == 503
        arb.run_command("stop", {})
        code, body = healthz(arb)
        assert (code, body["status"]) == (503, "stopping")
    finally:
        arb.table.chan.close(0)
        ctx.term()


def test_healthz_names_each_trunks_registration_without_judging_health_by_it():
    from brisvox.daemon.slots import Slot, State
    from brisvox.daemon.views import healthz as view

    gw = Slot("gateway", 0)
    gw.on_spawn(4242, 0.0)
    gw.state = State.READY
    gw.stats = {"sip_trunks": {"carrier": {"state": "failed", "error": "auth failed: wrong credentials (realm 'x')",
                                           "registrar": "192.0.2.1"}}}
    code, body = view("running", [gw])
    assert code == 200 and body["status"] == "ok"  # a carrier's outage is not the daemon's
    assert body["sip_trunks"] == {"carrier": {"state": "failed", "error": "auth failed: wrong credentials (realm 'x')"}}
    gw.stats = {}
    assert "sip_trunks" not in view("running", [gw])[1]
