"""``[[sip.trunks]]`` on the real gateway process: registration and client-side digest, against a
registrar and callee written here from RFC 3261 (it challenges with brisvox/wire/sip_digest.py's
server, which the unit tests hold to the RFC vectors).

* brisvox REGISTERs at start, answers the 401 once, is registered, refreshes within 50-80 % of
  the 2 s the registrar grants, and removes the binding (Expires: 0) when it stops.
* A wrong password ends each attempt after one answer ("wrong credentials", in the trunk's state
  and the stats), then backs off: a handful of REGISTERs in seconds, never a loop.
* A registrar that never answers: Timer F, then the backoff, counted; one that goes quiet while
  registered is found by the OPTIONS keepalive and registered with again at once.
* An INVITE from the trunk's address runs the trunk's agent and the call names the trunk.
* ``dial`` through the trunk: the callee's 407 is answered once with Proxy-Authorization (CSeq
  advanced), the call is answered; a callee that challenges again ends the dial with the reason.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import Any

import pytest

from brisvox.wire import sip_digest as d
from brisvox.wire.sip_message import SipMessage, parse
from ipc import frames as F
from ipc.bus import request_sync
from tests.system.gateway_harness import GatewayProc, wait_for

pytestmark = pytest.mark.system

SECRET = "trunk secret"


class Peer:
    """A UDP registrar and callee: challenges every REGISTER and INVITE once per request
    (401 / 407), grants ``grant`` seconds, answers an authenticated INVITE 200 with SDP, and
    records every request it got. ``silent``: answers nothing."""

    def __init__(self, host: str = "127.0.0.5", grant: int = 2, silent: bool = False,
                 reject_invites: bool = False) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.1)
        self.addr = self.sock.getsockname()
        self.grant = grant
        self.silent = silent
        self.reject_invites = reject_invites
        self.server = d.DigestServer("carrier.example", b"p" * 32, lifetime_s=30)
        self.requests: list[tuple[float, SipMessage]] = []
        self.bound: dict[str, int] = {}  # contact -> expires
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def close(self) -> None:
        self.stop.set()
        self.th.join(2)
        self.sock.close()

    def of(self, method: str) -> list[SipMessage]:
        return [m for _, m in self.requests if m.method == method]

    def _reply(self, req: SipMessage, status: int, reason: str, to: Any, extra: str = "", body: bytes = b"") -> None:
        vias = "".join(f"Via: {v}\r\n" for v in req.get_all("via"))
        head = (f"SIP/2.0 {status} {reason}\r\n{vias}From: {req.get('from')}\r\nTo: {req.get('to')}"
                f"{'' if 'tag=' in req.get('to') else ';tag=peer'}\r\nCall-ID: {req.call_id}\r\n"
                f"CSeq: {req.get('cseq')}\r\n{extra}Content-Length: {len(body)}\r\n\r\n")
        self.sock.sendto(head.encode() + body, to)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                data, src = self.sock.recvfrom(65535)
            except (TimeoutError, BlockingIOError):
                continue
            except OSError:
                return
            try:
                req = parse(data)
            except Exception:
                continue
            if not req.is_request:
                continue
            self.requests.append((time.monotonic(), req))
            if self.silent or req.method == "ACK":
                continue
            now = time.monotonic()
            secret = {"1001": SECRET}.get
            if req.method == "REGISTER":
                v = self.server.verify(req.get("authorization") or None, "REGISTER", req.uri, src[0], now, secret)
                if not v.ok:
                    ch = "".join(f"WWW-Authenticate: {c}\r\n" for c in self.server.challenges(src[0], now))
                    self._reply(req, 401, "Unauthorized", src, ch)
                    continue
                expires = int(req.get("expires") or "0")
                contact = req.get("contact").strip("<>")
                grant = min(expires, self.grant)
                if grant:
                    self.bound[contact] = grant
                else:
                    self.bound.pop(contact, None)
                self._reply(req, 200, "OK", src, f"Contact: <{contact}>;expires={grant}\r\n" if grant else "")
            elif req.method == "INVITE":
                v = self.server.verify(req.get("proxy-authorization") or None, "INVITE", req.uri, src[0], now,
                                       secret)
                if not v.ok or self.reject_invites:
                    ch = "".join(f"Proxy-Authenticate: {c}\r\n" for c in self.server.challenges(src[0], now))
                    self._reply(req, 407, "Proxy Authentication Required", src, ch)
                    continue
                body = (f"v=0\r\no=- 1 1 IN IP4 {self.addr[0]}\r\ns=-\r\nc=IN IP4 {self.addr[0]}\r\nt=0 0\r\n"
                        f"m=audio {self.addr[1] + 2} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n").encode()
                self._reply(req, 200, "OK", src, f"Contact: <sip:callee@{self.addr[0]}:{self.addr[1]}>\r\n"
                            "Content-Type: application/sdp\r\n", body)
            elif req.method in ("BYE", "OPTIONS", "CANCEL"):
                self._reply(req, 200, "OK", src)


def trunk(peer: Peer, **kw: Any) -> dict[str, Any]:
    return {"name": "carrier", "registrar": f"{peer.addr[0]}:{peer.addr[1]}", "username": "1001",
            "secret_env": "BRISVOX_TEST_TRUNK", "agent": "echo", "expires": 60, **kw}



def test_registers_refreshes_and_removes_its_binding_and_takes_the_trunks_calls(short_tmp, monkeypatch):
    monkeypatch.setenv("BRISVOX_TEST_TRUNK", SECRET)
    peer = Peer()
    try:
        with GatewayProc(short_tmp, inbox=True, sip={"trunks": [trunk(peer, keepalive_s=0)]}) as gw:
            assert wait_for(lambda: len(peer.bound) == 1, 5), peer.requests
            st = gw.stats()
            assert st["sip_trunk_carrier_registered"] == 1 and st["sip_trunks"]["carrier"]["state"] == "registered"
            regs = peer.of("REGISTER")
            assert len(regs) == 2 and regs[0].cseq[0] + 1 == regs[1].cseq[0]  # the 401, then answered
            assert regs[1].call_id == regs[0].call_id and regs[1].from_tag == regs[0].from_tag
            assert regs[1].get("authorization") and not regs[0].get("authorization")
            assert f":{gw.sip_port}>" in regs[1].get("contact")  # the Contact reaches our listener
            # granted 2 s: refreshed between 1.0 and 1.6 s later
            t_first = next(t for t, m in peer.requests if m.method == "REGISTER" and m.get("authorization"))
            assert wait_for(lambda: len([m for m in peer.of("REGISTER") if m.get("authorization")]) >= 2, 4)
            t_second = [t for t, m in peer.requests if m.method == "REGISTER" and m.get("authorization")][1]
            assert 0.9 <= t_second - t_first <= 2.0, t_second - t_first  # each refresh answers a fresh 401
            # an INVITE from the trunk's address runs the trunk's agent and names it
            inv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            inv.bind((peer.addr[0], 0))
            inv.settimeout(3)
            with contextlib.closing(inv):
                h, p = inv.getsockname()
                body = (f"v=0\r\no=- 1 1 IN IP4 {h}\r\ns=-\r\nc=IN IP4 {h}\r\nt=0 0\r\n"
                        f"m=audio {p + 2} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n").encode()
                msg = (f"INVITE sip:+15550100@127.0.0.1:{gw.sip_port} SIP/2.0\r\n"
                       f"Via: SIP/2.0/UDP {h}:{p};branch=z9hG4bKtrunkcall;rport\r\nFrom: <sip:caller@{h}>;tag=c1\r\n"
                       f"To: <sip:+15550100@127.0.0.1>\r\nCall-ID: trunkcall\r\nCSeq: 1 INVITE\r\n"
                       f"Contact: <sip:caller@{h}:{p}>\r\nMax-Forwards: 70\r\nContent-Type: application/sdp\r\n"
                       f"Content-Length: {len(body)}\r\n\r\n").encode() + body
                inv.sendto(msg, ("127.0.0.1", gw.sip_port))
                resp = parse(inv.recv(65535))
                while resp.status < 200:
                    resp = parse(inv.recv(65535))
                assert resp.status == 200
                [call] = gw.command("calls").values()
                assert call["ids"]["sip_trunk"] == "carrier" and call["agent"] == "echo"
        # stopped: the binding is removed
        assert wait_for(lambda: peer.bound == {}, 1), peer.bound
        assert any(m.get("expires") == "0" for m in peer.of("REGISTER"))
    finally:
        peer.close()


def test_a_wrong_password_fails_with_the_reason_and_backs_off(short_tmp, monkeypatch):
    monkeypatch.setenv("BRISVOX_TEST_TRUNK", "not the secret")
    peer = Peer()
    silent = Peer(host="127.0.0.6", silent=True)
    try:
        with GatewayProc(short_tmp, inbox=True, sip={"t1_ms": 50, "trunks": [
                trunk(peer), trunk(silent, name="gone")]}) as gw:
            t0 = time.monotonic()
            assert wait_for(lambda: gw.stats()["sip_trunks"]["gone"]["state"] == "failed", 12)  # Timer F: 3.2 s
            st = gw.stats()
            elapsed = time.monotonic() - t0 + 0.5
            row = st["sip_trunks"]["carrier"]
            assert row["state"] in ("failed", "registering") and "wrong credentials" in row["error"], row
            failures = st["sip_trunk_carrier_failures"]
            assert st["sip_trunk_carrier_registered"] == 0 and failures >= 1
            # each attempt: the REGISTER and its one answered copy, never more; between attempts the
            # backoff (2 s, 4 s, 8 s ...), so in `elapsed` seconds at most 2 + log2(elapsed) attempts
            regs = len(peer.of("REGISTER"))
            assert 2 <= regs <= 2 * failures + 2, (regs, failures)
            assert failures <= 2 + int(elapsed).bit_length(), (failures, elapsed)
            assert "no answer" in st["sip_trunks"]["gone"]["error"] and st["sip_trunk_gone_registered"] == 0
            assert st["sip_register_failed"] >= 2
    finally:
        peer.close()
        silent.close()


def test_dial_through_the_trunk_answers_its_407_once(short_tmp, monkeypatch):
    monkeypatch.setenv("BRISVOX_TEST_TRUNK", SECRET)
    peer = Peer()
    rude = Peer(host="127.0.0.7", reject_invites=True)
    try:
        with GatewayProc(short_tmp, inbox=True, sip={"trunks": [
                trunk(peer, register=False), trunk(rude, name="rude", register=False)]}) as gw:
            reply = request_sync(gw.inbox, F.Command(name="dial", args={
                "target": "+15550100", "trunk": "carrier", "agent": "echo", "ring_timeout_s": 10}), 20)
            assert isinstance(reply, F.CommandReply) and reply.ok, reply
            invites = peer.of("INVITE")
            assert len(invites) == 2 and invites[1].cseq[0] == invites[0].cseq[0] + 1
            assert invites[0].uri == f"sip:+15550100@{peer.addr[0]}:{peer.addr[1]}"
            assert invites[1].get("proxy-authorization") and invites[1].call_id == invites[0].call_id
            assert "sip:1001@" in invites[0].get("from")
            [call] = gw.command("calls").values()
            assert call["ids"]["sip_trunk"] == "carrier"
            # a callee that challenges again: the dial ends with the reason, after two INVITEs
            bad = request_sync(gw.inbox, F.Command(name="dial", args={
                "target": "+15550101", "trunk": "rude", "agent": "echo", "ring_timeout_s": 10}), 20)
            assert isinstance(bad, F.CommandReply) and not bad.ok
            assert "wrong credentials" in bad.error and len(rude.of("INVITE")) == 2
            unknown = request_sync(gw.inbox, F.Command(name="dial", args={
                "target": "+15550102", "trunk": "nope", "agent": "echo"}), 5)
            assert not unknown.ok and "no [[sip.trunks]] entry" in unknown.error  # type: ignore[attr-defined]
    finally:
        peer.close()
        rude.close()


def test_keepalives_find_a_registrar_gone_quiet_and_register_again(short_tmp, monkeypatch):
    monkeypatch.setenv("BRISVOX_TEST_TRUNK", SECRET)
    peer = Peer(grant=60)
    try:
        with GatewayProc(short_tmp, inbox=True, sip={"t1_ms": 50, "trunks": [trunk(peer, keepalive_s=0.3)]}) as gw:
            assert wait_for(lambda: len(peer.bound) == 1, 5)
            assert wait_for(lambda: len(peer.of("OPTIONS")) >= 2, 3)  # alive: one every 0.3 s
            n = len(peer.of("REGISTER"))
            peer.silent = True  # the registrar's host goes away: the next OPTIONS times out (64 x T1)
            assert wait_for(lambda: gw.stats().get("sip_trunk_keepalive_lost", 0) >= 1, 8)
            assert len(peer.of("REGISTER")) > n  # registering again at once, not 60 s later
            peer.silent = False
            assert wait_for(lambda: gw.stats()["sip_trunks"]["carrier"]["state"] == "registered", 10)
    finally:
        peer.close()


def _trunk_toml(name: str, peer: Peer, password_env: str = "BRISVOX_TEST_TRUNK") -> str:
    return (f'[[sip.trunks]]\nname = "{name}"\nregistrar = "{peer.addr[0]}:{peer.addr[1]}"\nusername = "1001"\n'
            f'secret_env = "{password_env}"\nagent = "echo"\nexpires = 60\nkeepalive_s = 0\n')


def test_reload_registers_again_adds_and_removes_trunks(short_tmp):
    """``brisvoxd reload`` reaches the gateway: a listed trunk registers again at once (not at its
    refresh, a minute away), a new one registers, a dropped one removes its binding (Expires: 0);
    a file the gateway cannot apply (a trunk over a transport without a listener) is refused by
    the supervisor and leaves the registrations as they were."""
    from bench.harness.daemon import Daemon, cli, write_config

    carrier, office = Peer(grant=60), Peer(host="127.0.0.6", grant=60)
    base = "[gateway]\necho_use_workers = false\n\n[sip]\nport = 0\nrtp_port_min = 47000\nrtp_port_max = 47998\n\n"
    cfg = write_config(short_tmp, workers=1, agents=1, extra=base + _trunk_toml("carrier", carrier))
    d = Daemon(short_tmp, config=cfg, env={"BRISVOX_TEST_ROLE_MAIN": "gateway=brisvox.gateway.process:main",
                                           "BRISVOX_TEST_TRUNK": SECRET})
    try:
        d.start()
        d.wait_ready(30)
        assert wait_for(lambda: len(carrier.bound) == 1, 5), carrier.requests
        n = len(carrier.of("REGISTER"))
        cfg.write_text(cfg.read_text() + "\n" + _trunk_toml("office", office))
        r = cli("reload", "--config", str(cfg))
        assert r.returncode == 0 and "told 3 children" in r.stdout, (r.stdout, r.stderr)
        assert wait_for(lambda: len(office.bound) == 1, 5), office.requests  # added: registered
        assert wait_for(lambda: len(carrier.of("REGISTER")) >= n + 2, 5)  # kept: registered again now
        assert len(carrier.bound) == 1

        def trunks() -> dict[str, Any]:
            return (d.child(d.status(), "gateway-0").get("stats") or {}).get("sip_trunks") or {}

        assert wait_for(lambda: {k: v["state"] for k, v in trunks().items()} ==
                        {"carrier": "registered", "office": "registered"}, 5), trunks()
        # a trunk over TLS without a TLS listener: the supervisor refuses the file, nothing changes
        bad = cfg.read_text()
        cfg.write_text(bad + '\n[[sip.trunks]]\nname = "tls"\nregistrar = "127.0.0.7:5061"\nregister = false\n'
                       'username = "x"\ntransport = "tls"\n')
        r = cli("reload", "--runtime-dir", str(d.run_dir))
        assert r.returncode == 1 and "configuration error" in r.stderr, (r.stdout, r.stderr)
        # carrier dropped: its binding removed; office registered again
        cfg.write_text(bad.replace(_trunk_toml("carrier", carrier), ""))
        m = len(office.of("REGISTER"))
        r = cli("reload", "--config", str(cfg))
        assert r.returncode == 0, r.stderr
        assert wait_for(lambda: carrier.bound == {}, 5), carrier.requests
        assert any(x.get("expires") == "0" for x in carrier.of("REGISTER"))
        assert wait_for(lambda: len(office.of("REGISTER")) >= m + 2 and len(office.bound) == 1, 5)
        assert wait_for(lambda: set(trunks()) == {"office"}, 5), trunks()
    finally:
        d.close()
        carrier.close()
        office.close()
