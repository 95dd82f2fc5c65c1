"""Scale-out: two real brisvoxd behind the shipped Kamailio and HAProxy configs, on loopback.

Instances ``a`` (127.0.0.3) and ``b`` (127.0.0.4), each its own daemon
(gateway, one worker with the real Silero VAD, one agent process with the
scripted providers: no model file or key), behind Kamailio
(``deploy/kamailio/kamailio.cfg``, SIP) and HAProxy
(``deploy/haproxy/haproxy.cfg``, WebSocket) on 127.0.0.2, both started from
the shipped files (:mod:`bench.harness.fleet`). The scenario
(:mod:`bench.harness.fleet_scenario`, what each check means is in its
docstring):

* 60 calls, half SIPp through Kamailio and half Twilio Media Streams clients
  through HAProxy: each instance gets 40-60 % of them;
* ``brisvoxd drain`` of ``a`` with about 20 calls live on it: its OPTIONS
  answer turns 503 within one probing interval, Kamailio stops sending it
  calls, HAProxy marks it down (its /healthz says 503), every call live at the
  drain ends normally (no BYE from brisvox before the caller's), calls placed
  during the drain reach ``b``;
* SIGKILL of ``b``'s supervisor: SIP calls placed right after it are answered
  by ``a`` within the probing interval + fr_timer; once HAProxy marked ``b``
  down, WebSocket calls go to ``a``; how ``b``'s calls ended is printed;
* restarts rejoin: each restarted instance is active in both proxies and
  takes new calls.

The figures are printed (``pytest -s``). Skipped only when kamailio, kamcmd,
haproxy or sipp is missing (``make test`` installs them:
scripts/apt-packages.txt). Every process is stopped by its pid or process
group and every instance's /dev/shm segments removed, also on failure
(``Fleet.close``); ``short_tmp`` removes the directory.
"""

from __future__ import annotations

import pytest

from bench.harness.fleet import Fleet, tools_missing
from bench.harness.fleet_scenario import Plan, run

MISSING = tools_missing()

pytestmark = [pytest.mark.system, pytest.mark.timeout(300),
              pytest.mark.serial,  # failover within the proxies' probing interval + fr_timer
              pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (make test installs them)")]


def test_fleet_spread_drain_sigkill_and_rejoin(short_tmp):
    with Fleet(short_tmp, n=2) as fleet:
        try:
            took = fleet.start()
            rep = run(fleet, Plan(), log=print)
        except BaseException:
            print(fleet.logs())
            raise
        print(f"\nfleet (started in {took:.1f} s):\n{rep.text()}")
        failed = rep.failed()
        if failed:
            print(fleet.logs())
        assert not failed, "\n".join(f"{c.key}: {c.detail}" for c in failed)
