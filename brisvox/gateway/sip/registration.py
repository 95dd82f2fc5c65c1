"""Registration to a trunk (RFC 3261 section 10): REGISTER at start, refreshed, retried, removed at stop.

Owns two classes:

* :class:`Registration`, the pure state machine of one ``[[sip.trunks]]``
  entry's binding: it takes events (started, a final response, a timeout,
  the timer, stop) and returns actions (:class:`SendRegister`,
  :class:`Wait`), reading no clock and doing no I/O, like the house's
  ``TurnMachine``. States: ``unregistered`` -> ``registering`` ->
  ``registered`` (refresh: ``registering`` again) or ``failed`` (waiting
  its backoff) -> ``unregistering`` -> ``stopped``.
* :class:`TrunkRegistrar`, the user agent's driver of those machines: it
  builds each REGISTER (one Call-ID per trunk, CSeq growing, the Contact of
  our listener, ``Expires``), sends it in a client transaction, answers a
  401/407 with the trunk's credentials
  (:class:`~brisvox.gateway.sip.client_auth.ClientAuth`, once per challenge),
  feeds the outcome to the machine, keeps one loop timer per trunk, and
  reports each trunk's state in the gateway's stats (``/metrics``,
  ``brisvoxd status``).

Invariants:

* A refresh is sent at a random point between 50 % and 80 % of the
  expiry the registrar granted (the 200's Contact ``expires``, else its
  ``Expires``, else what we asked).
* A failure (a 4xx/5xx/6xx, a wrong password, Timer F: no answer) waits the
  project's one retry policy (:mod:`brisvox.runtime.retry`: 2 s doubling to
  5 minutes, full jitter), at least the response's ``Retry-After``, then tries
  again, for ever: a trunk that comes back is registered again. A 423
  (Interval Too Brief) asks again at once with its ``Min-Expires``
  (at most :data:`MAX_EXPIRES` s), counted as no failure; twice in a row is
  a failure.
* A 200 whose top Via names a ``received``/``rport`` other than our Contact's
  address (we are behind NAT) registers that address instead, once.
* :meth:`Registration.stop` removes a binding the registrar holds
  (``Expires: 0``) and ends in ``stopped`` on its answer or timeout; a
  trunk that was not registered stops at once.
* While registered, a keepalive goes to the registrar every ``keepalive_s``:
  over UDP an OPTIONS (it keeps a NAT's mapping open and proves the registrar
  alive; any final answer is alive, none within Timer F registers again at
  once), over TCP/TLS an RFC 5626 ping (CRLFCRLF) on the registered
  connection (no pong within 10 s, or no connection: registered again at once).
* A reload (:meth:`TrunkRegistrar.reload`) registers every listed trunk again
  at once; a trunk dropped from the file (or changed) removes its old binding
  first, so a registrar never keeps routing to an entry we no longer have.
* Each REGISTER's challenge is answered once (a new :class:`ClientAuth`
  per REGISTER): wrong credentials fail that attempt with the reason,
  never a loop.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from brisvox.gateway.config import SipConfig, SipTrunk
from brisvox.gateway.sip.client_auth import ClientAuth, trunk_credentials
from brisvox.gateway.sip.counters import SipCounters
from brisvox.gateway.sip.transactions import TransactionLayer
from brisvox.runtime.retry import Attempts, RetryPolicy, parse_retry_after
from brisvox.wire.sip_message import SipMessage, new_branch, new_call_id, new_tag
from brisvox.wire.sip_transaction import Action, Deliver, TimedOut

__all__ = ["Registration", "SendRegister", "TrunkRegistrar", "Wait"]

log = logging.getLogger("brisvox.gateway.sip")

BACKOFF = RetryPolicy(base=2.0, multiplier=2.0, cap=300.0, jitter="full", retry_after_max=3600.0)
MAX_EXPIRES = 86400
STOP_WAIT_S = 2.0  # how long a stop waits for the registrar to confirm the removal
PONG_WAIT_S = 10.0  # RFC 5626 section 4.4.1: a ping's pong is due within 10 s


@dataclass(frozen=True, slots=True)
class SendRegister:
    """Send a REGISTER asking for ``expires`` seconds (0: remove the binding)."""

    expires: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Call :meth:`Registration.on_timer` at loop time ``at``."""

    at: float


RegAction = SendRegister | Wait


class Registration:
    """One trunk's binding (see the module docstring). Times are the caller's loop clock."""

    def __init__(self, expires: int, rand: Callable[[], float] = random.random) -> None:
        self.asked = expires
        self.rand = rand
        self.state = "unregistered"
        self.error = ""
        self.registered_until = 0.0
        self.next_at = 0.0
        self.granted = 0
        self.registrations = 0
        self.failures = 0
        self._attempts: Attempts | None = None
        self._brief = 0

    def start(self, now: float) -> list[RegAction]:
        if self.state in ("registering", "unregistering", "stopped"):
            return []
        self.state = "registering"
        return [SendRegister(self.asked)]

    def on_ok(self, granted: int | None, now: float) -> list[RegAction]:
        """A 2xx to our REGISTER, granting ``granted`` seconds (None: what we asked)."""
        if self.state == "unregistering":
            self.state = "stopped"
            self.registered_until = 0.0
            return []
        if self.state != "registering":
            return []
        g = max(1, min(granted if granted is not None else self.asked, MAX_EXPIRES))
        self.state, self.error, self.granted = "registered", "", g
        self.registrations += 1
        self._attempts = None
        self._brief = 0
        self.registered_until = now + g
        self.next_at = now + g * (0.5 + 0.3 * self.rand())
        return [Wait(self.next_at)]

    def on_too_brief(self, min_expires: int | None, now: float) -> list[RegAction]:
        """A 423: ask again with the registrar's Min-Expires."""
        if self.state != "registering":
            return []
        if min_expires is None or not self.asked < min_expires <= MAX_EXPIRES or self._brief:
            return self.on_failure("423 without a usable Min-Expires", None, now)
        self._brief += 1
        self.asked = min_expires
        return [SendRegister(self.asked)]

    def on_failure(self, error: str, retry_after: float | None, now: float) -> list[RegAction]:
        """The REGISTER failed (a final error, a challenge not answered, no answer)."""
        if self.state == "unregistering":
            self.state = "stopped"
            return []
        if self.state != "registering":
            return []
        self.state, self.error = "failed", error[:200]
        self.failures += 1
        self._brief = 0
        if now >= self.registered_until:
            self.registered_until = 0.0
        if self._attempts is None:
            self._attempts = BACKOFF.attempts(self.rand)
        wait = self._attempts.next_delay(retry_after)
        if wait is None:  # a Retry-After over an hour: wait the cap instead, never give up
            wait = BACKOFF.cap
        self.next_at = now + wait
        return [Wait(self.next_at)]

    def on_timer(self, now: float) -> list[RegAction]:
        if self.state in ("registered", "failed") and now >= self.next_at:
            self.state = "registering"
            return [SendRegister(self.asked)]
        if self.state in ("registered", "failed"):
            return [Wait(self.next_at)]
        return []

    def on_flow_lost(self, now: float) -> list[RegAction]:
        """A keepalive to the registrar went unanswered: register again now (it may have lost
        the binding, or a NAT in between its mapping)."""
        if self.state != "registered":
            return []
        self.state = "registering"
        return [SendRegister(self.asked)]

    def refresh_now(self, now: float) -> list[RegAction]:
        """Register again now (a reload: the operator asks for it; a failed trunk skips the rest
        of its backoff, a registered one refreshes). Nothing while a REGISTER is out."""
        if self.state not in ("registered", "failed", "unregistered"):
            return []
        self.state = "registering"
        return [SendRegister(self.asked)]

    def stop(self, now: float) -> list[RegAction]:
        """Remove the binding (the registrar holds one until ``registered_until``)."""
        holds = self.registered_until > now or self.state == "registering"
        if self.state in ("stopped", "unregistering"):
            return []
        if not holds:
            self.state = "stopped"
            return []
        self.state = "unregistering"
        return [SendRegister(0)]


def _int(v: str) -> int | None:
    v = v.strip()
    return int(v) if v.isdigit() and len(v) < 10 else None


def granted_expires(resp: SipMessage, contact_user: str) -> int | None:
    """The expiry a 2xx to REGISTER grants our binding: its Contact's ``expires`` (the one
    with our user), else the Expires header, else None."""
    for c in resp.get_all("contact"):
        for part in c.split(","):
            if f"sip:{contact_user}@" in part:
                for p in part.split(";")[1:]:
                    k, _, v = p.partition("=")
                    if k.strip().lower() == "expires" and (n := _int(v)) is not None:
                        return n
    return _int(resp.get("expires"))


class _Trunk:
    """What the driver keeps per trunk: its config, machine, dialog identity and timer."""

    __slots__ = ("cfg", "reg", "call_id", "tag", "cseq", "timer", "contact_host", "contact_port", "nat_learned",
                 "stopped", "keepalive")

    def __init__(self, cfg: SipTrunk, reg: Registration, host: str, port: int) -> None:
        self.cfg = cfg
        self.reg = reg
        self.call_id = ""
        self.tag = new_tag()
        self.cseq = 0
        self.timer: asyncio.TimerHandle | None = None
        self.contact_host = host
        self.contact_port = port
        self.nat_learned = False
        self.stopped: asyncio.Event | None = None
        self.keepalive: asyncio.TimerHandle | None = None


class TrunkRegistrar:
    """Drives every registering trunk's :class:`Registration` (see the module docstring)."""

    def __init__(self, cfg: SipConfig, transactions: TransactionLayer, counters: SipCounters,
                 loop: asyncio.AbstractEventLoop, rand: Callable[[], float] = random.random) -> None:
        self.cfg = cfg
        self.transactions = transactions
        self.counters = counters
        self.loop = loop
        self.rand = rand
        self.trunks: dict[str, _Trunk] = {}
        self.leaving: list[_Trunk] = []  # removed by a reload, their Expires: 0 not yet answered

    def start(self, host: str, port: int) -> None:
        """Register every ``[[sip.trunks]]`` entry with ``register = true`` (our listener: ``host:port``)."""
        for t in self.cfg.trunks:
            if t.register and t.name not in self.trunks:
                own = port  # the Contact names our listener of the trunk's transport
                if t.transport != "udp":
                    own = int(self.transactions.via_host_for(t.transport.upper()).rsplit(":", 1)[1])
                tr = _Trunk(t, Registration(t.expires, self.rand), host, own)
                tr.call_id = new_call_id(self.cfg.advertised_host)
                self.trunks[t.name] = tr
                self._perform(tr, tr.reg.start(self.loop.time()))

    def reload(self, cfg: SipConfig, host: str, port: int) -> dict[str, str]:
        """Apply a reloaded ``[[sip.trunks]]``: a trunk no longer listed (or no longer
        registering) removes its binding (``Expires: 0``, not awaited); one whose entry changed
        removes the old binding and registers the new entry; a new one registers; an unchanged
        one registers again now. Returns trunk name -> what was done."""
        self.cfg = cfg
        wanted = {t.name: t for t in cfg.trunks if t.register}
        done: dict[str, str] = {}
        now = self.loop.time()
        for name, tr in list(self.trunks.items()):
            new = wanted.get(name)
            if new is not None and new == tr.cfg:
                self._perform(tr, tr.reg.refresh_now(now))
                done[name] = "registering again"
                continue
            del self.trunks[name]
            self._cancel_timers(tr)
            actions = tr.reg.stop(now)
            if actions:
                self.leaving.append(tr)
                tr.stopped = asyncio.Event()
                self._perform(tr, actions)
            done[name] = "removed" if new is None else "changed"
        self.start(host, port)
        for name in wanted:
            done.setdefault(name, "added")
        return done

    def _cancel_timers(self, tr: _Trunk) -> None:
        for h in (tr.timer, tr.keepalive):
            if h is not None:
                h.cancel()
        tr.timer = tr.keepalive = None

    async def stop(self, timeout: float = STOP_WAIT_S) -> None:
        """De-register every trunk; wait at most ``timeout`` for the registrars' answers (and for
        the removals a reload started)."""
        waits = [tr.stopped.wait() for tr in self.leaving if tr.stopped is not None and not tr.stopped.is_set()]
        now = self.loop.time()
        for tr in self.trunks.values():
            self._cancel_timers(tr)
            actions = tr.reg.stop(now)
            if actions:
                tr.stopped = asyncio.Event()
                waits.append(tr.stopped.wait())
                self._perform(tr, actions)
        if waits:
            try:
                await asyncio.wait_for(asyncio.gather(*waits), timeout)
            except TimeoutError:
                self.counters.count("sip_register_stop_timeouts")

    def close(self) -> None:
        for tr in [*self.trunks.values(), *self.leaving]:
            self._cancel_timers(tr)

    def stats(self) -> dict[str, Any]:
        """Per trunk: ``sip_trunk_<name>_registered`` (1/0), ``_failures``, ``_registrations``,
        ``_expires_in_s``, ``_next_s`` (numbers, for /metrics), and the state and last error
        under ``sip_trunks`` (for ``brisvoxd status``)."""
        now = self.loop.time()
        out: dict[str, Any] = {}
        rows = {}
        for name, tr in self.trunks.items():
            r = tr.reg
            p = f"sip_trunk_{name}"
            out[f"{p}_registered"] = 1 if r.state == "registered" or (r.registered_until > now) else 0
            out[f"{p}_registrations"] = r.registrations
            out[f"{p}_failures"] = r.failures
            out[f"{p}_expires_in_s"] = round(max(0.0, r.registered_until - now), 1)
            out[f"{p}_next_s"] = round(max(0.0, r.next_at - now), 1) if r.state in ("registered", "failed") else 0
            rows[name] = {"state": r.state, "error": r.error, "registrar": tr.cfg.registrar,
                          "expires_in_s": out[f"{p}_expires_in_s"], "next_s": out[f"{p}_next_s"]}
        if rows:
            out["sip_trunks"] = rows
        return out

    # -- the machine's actions -----------------------------------------------------------------

    def _perform(self, tr: _Trunk, actions: list[RegAction]) -> None:
        for a in actions:
            if isinstance(a, SendRegister):
                self._send(tr, a.expires, ClientAuth(trunk_credentials(tr.cfg)))
            else:
                if tr.timer is not None:
                    tr.timer.cancel()
                tr.timer = self.loop.call_at(a.at, self._on_timer, tr)

    def _on_timer(self, tr: _Trunk) -> None:
        tr.timer = None
        self._perform(tr, tr.reg.on_timer(self.loop.time()))

    def _request(self, t: SipTrunk, method: str, from_: str, to: str, call_id: str, cseq: int) -> SipMessage:
        """A request to the trunk's domain over its transport (Via with rport; RFC 3581)."""
        req = SipMessage(method=method, uri=f"sip:{t.domain}")
        tp = t.transport.upper()
        req.headers += [
            ("via", f"SIP/2.0/{tp} {self.transactions.via_host_for(tp)};branch={new_branch()};rport"),
            ("max-forwards", "70"), ("from", from_), ("to", to), ("call-id", call_id), ("cseq", f"{cseq} {method}"),
        ]
        return req

    def _register(self, tr: _Trunk, expires: int) -> SipMessage:
        t = tr.cfg
        aor = f"sip:{t.username}@{t.domain}"
        tr.cseq += 1
        req = self._request(t, "REGISTER", f"<{aor}>;tag={tr.tag}", f"<{aor}>", tr.call_id, tr.cseq)
        h = req.headers
        host = f"[{tr.contact_host}]" if ":" in tr.contact_host else tr.contact_host
        param = f";transport={t.transport}" if t.transport != "udp" else ""
        h.append(("contact", f"<sip:{t.contact_user or t.username}@{host}:{tr.contact_port}{param}>"))
        h.append(("expires", str(expires)))
        h.append(("user-agent", self.cfg.user_agent))
        return req

    def _send(self, tr: _Trunk, expires: int, auth: ClientAuth, req: SipMessage | None = None) -> None:
        req = req or self._register(tr, expires)
        self.counters.count("sip_register_sent")
        self.transactions.request(req, tr.cfg.next_hop, lambda a: self._on_action(tr, expires, auth, req, a))

    def _on_action(self, tr: _Trunk, expires: int, auth: ClientAuth, req: SipMessage, a: Action) -> None:
        now = self.loop.time()
        if isinstance(a, TimedOut):
            self._failed(tr, "no answer from the registrar (Timer F)", None, now)
            return
        if not isinstance(a, Deliver) or a.msg.status < 200:
            return
        resp = a.msg
        st = resp.status
        if st in (401, 407):
            again, why = auth.retry(req, resp)
            if again is None:
                self._failed(tr, why, None, now)
                return
            tr.cseq = again.cseq[0]
            self.counters.count("sip_auth_answered")
            self._send(tr, expires, auth, again)
            return
        if 200 <= st < 300:
            if expires and self._learn_nat(tr, resp):
                tr.reg.state = "registering"  # the same attempt, with the address the registrar sees
                self._send(tr, expires, ClientAuth(trunk_credentials(tr.cfg)))
                return
            self.counters.count("sip_register_ok" if expires else "sip_register_removed")
            if expires:
                self.counters.log_limit(f"sip_register_ok:{tr.cfg.name}", "trunk %s registered with %s",
                                        tr.cfg.name, tr.cfg.registrar, level=logging.INFO)
            self._perform(tr, tr.reg.on_ok(granted_expires(resp, tr.cfg.contact_user or tr.cfg.username), now))
            self._stopped(tr)
            self._arm_keepalive(tr)
            return
        if st == 423:
            self._perform(tr, tr.reg.on_too_brief(_int(resp.get("min-expires")), now))
            return
        self._failed(tr, f"{st} {resp.reason}"[:120], parse_retry_after(resp.get("retry-after") or None), now)

    # -- keepalives ----------------------------------------------------------------------------

    def _arm_keepalive(self, tr: _Trunk) -> None:
        if tr.cfg.keepalive_s > 0 and tr.keepalive is None and tr.reg.state == "registered":
            tr.keepalive = self.loop.call_later(tr.cfg.keepalive_s, self._send_keepalive, tr)

    def _send_keepalive(self, tr: _Trunk) -> None:
        """UDP: an OPTIONS to the registrar (its NAT binding kept, its liveness seen); any answer
        is alive, none (Timer F) registers again at once. TCP/TLS: an RFC 5626 ping (CRLFCRLF) on
        the registered connection; no pong within :data:`PONG_WAIT_S` (or no connection) is a
        dead flow: register again at once."""
        tr.keepalive = None
        if tr.reg.state != "registered":
            return
        t = tr.cfg
        if t.transport != "udp":
            self.counters.count("sip_trunk_keepalives")
            token = self.transactions.stream_ping(t.transport.upper(), t.next_hop)
            if token is None:
                self._flow_lost(tr)
                return
            tr.keepalive = self.loop.call_later(min(PONG_WAIT_S, t.keepalive_s), self._pong_due, tr, token)
            return
        req = self._request(t, "OPTIONS", f"<sip:{t.username}@{t.domain}>;tag={new_tag()}", f"<sip:{t.domain}>",
                            new_call_id(self.cfg.advertised_host), 1)
        req.headers.append(("user-agent", self.cfg.user_agent))
        self.counters.count("sip_trunk_keepalives")
        self.transactions.request(req, t.next_hop, lambda a: self._keepalive_result(tr, a))

    def _keepalive_result(self, tr: _Trunk, a: Action) -> None:
        if isinstance(a, TimedOut):
            self._flow_lost(tr)
        elif isinstance(a, Deliver) and a.msg.status >= 200:
            self._arm_keepalive(tr)

    def _pong_due(self, tr: _Trunk, token: Any) -> None:
        tr.keepalive = None
        if tr.reg.state != "registered":
            return
        if self.transactions.stream_ponged(token):
            self._arm_keepalive(tr)
        else:
            self._flow_lost(tr)

    def _flow_lost(self, tr: _Trunk) -> None:
        self.counters.count("sip_trunk_keepalive_lost")
        self.counters.log_limit(f"sip_keepalive:{tr.cfg.name}", "trunk %s: keepalive to %s unanswered; "
                                "registering again", tr.cfg.name, tr.cfg.registrar, level=logging.WARNING)
        self._perform(tr, tr.reg.on_flow_lost(self.loop.time()))

    def _failed(self, tr: _Trunk, error: str, retry_after: float | None, now: float) -> None:
        self.counters.count("sip_register_failed")
        self.counters.log_limit(f"sip_register_failed:{tr.cfg.name}", "trunk %s: REGISTER to %s failed: %s",
                                tr.cfg.name, tr.cfg.registrar, error, level=logging.WARNING)
        self._perform(tr, tr.reg.on_failure(error, retry_after, now))
        self._stopped(tr)

    def _stopped(self, tr: _Trunk) -> None:
        if tr.reg.state == "stopped":
            if tr.stopped is not None:
                tr.stopped.set()
            if tr in self.leaving:
                self.leaving.remove(tr)

    def _learn_nat(self, tr: _Trunk, resp: SipMessage) -> bool:
        """Behind NAT: the 200's Via says the address the registrar saw; register that, once."""
        if tr.nat_learned:
            return False
        try:
            via = resp.top_via
        except ValueError:
            return False
        received = via.params.get("received") or ""
        rport = _int(via.params.get("rport") or "")
        host = received or tr.contact_host
        port = rport or tr.contact_port
        if (host, port) == (tr.contact_host, tr.contact_port):
            return False
        tr.nat_learned = True
        tr.contact_host, tr.contact_port = host, port
        self.counters.count("sip_register_nat_learned")
        return True
