"""Outbound SIP calls (``dial``) against the real gateway process, SIPp as the callee on loopback.

Answered: SIPp answers 180 then 200 with an SDP naming this test's own RTP socket,
the gateway ACKs, admits the call and starts its agent (the echo agent, started the
way an inbound call's is); RTP flows both ways (our socket receives the gateway's
RTP and sends back, the call's packets_in counts it); SIPp's BYE ends it and the
counters show it. Busy: SIPp answers 486, the dial reports "busy" and nothing stays
in the call table.
"""

from __future__ import annotations

import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from bench.harness import sipp as S
from ipc import frames as F
from ipc.bus import request_sync
from tests.system.gateway_harness import GatewayProc, free_port, free_port_pair_base, have

pytestmark = [pytest.mark.system, pytest.mark.skipif(not have("sipp"), reason="needs sipp (sip-tester)")]

_RESP = """      SIP/2.0 {status}
      [last_Via:]
      [last_From:]
      [last_To:];tag=[pid]SIPpTag01[call_number]
      [last_Call-ID:]
      [last_CSeq:]
      Contact: <sip:callee@[local_ip]:[local_port]>"""


def _uas(final: str, after: str, keep_from: bool = False) -> str:
    invite = ('  <recv request="INVITE">\n    <action>\n'
              '      <ereg regexp=".*" search_in="hdr" header="From:" check_it="true" assign_to="from_hdr"/>\n'
              '    </action>\n  </recv>\n') if keep_from else '  <recv request="INVITE"/>\n'
    return S.scenario(invite + S.send(_RESP.format(status="180 Ringing") + "\n      Content-Length: 0", False)
                      + final + after, name="callee")


def answered_then_bye(media_port: int, hold_ms: int) -> str:
    sdp = "\n".join(f"      {line}" for line in (
        "v=0", "o=callee 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0",
        f"m=audio {media_port} RTP/AVP 0 101", "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:101 telephone-event/8000", "a=sendrecv"))
    ok = S.send(_RESP.format(status="200 OK") + "\n      Content-Type: application/sdp\n"
                "      Content-Length: [len]\n\n" + sdp)
    bye = """      BYE sip:brisvox@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:callee@[local_ip]:[local_port]>;tag=[pid]SIPpTag01[call_number]
      To:[$from_hdr]
      [last_Call-ID:]
      CSeq: 2 BYE
      Contact: <sip:callee@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0"""
    after = ('  <recv request="ACK"/>\n' + f'  <pause milliseconds="{hold_ms}"/>\n'
             + S.send(bye) + '  <recv response="200"/>\n')
    return _uas(ok, after, keep_from=True)


def busy() -> str:
    return _uas(S.send(_RESP.format(status="486 Busy Here") + "\n      Content-Length: 0"),
                '  <recv request="ACK"/>\n')


def run_callee(tmp: Path, scen: str, port: int, timeout: int = 30) -> subprocess.Popen[str]:
    path = tmp / f"callee-{port}.xml"
    path.write_text(scen)
    args = ["sipp", "-sf", str(path), "-m", "1", "-i", "127.0.0.1", "-p", str(port),
            "-mi", "127.0.0.1", "-mp", str(free_port_pair_base(4)), "-timeout", f"{timeout}s",
            "-timeout_error", "-nostdin", "-trace_err", "-error_file", str(tmp / f"callee-err-{port}.log")]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def dial(gw: GatewayProc, target: str, agent: str = "echo", wait: float = 20.0) -> F.CommandReply:
    reply = request_sync(gw.inbox, F.Command(name="dial", args={"target": target, "agent": agent,
                                                                "ring_timeout_s": 10}), wait)
    assert isinstance(reply, F.CommandReply)
    return reply


class Media:
    """The callee's RTP socket: counts what the gateway sends, answers each packet with one."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received = 0
        self.sent = 0
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self) -> None:
        seq, ts = 1, 0
        while not self.stop.is_set():
            try:
                data, addr = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(data) >= 12 and data[0] >> 6 == 2:
                self.received += 1
                pkt = struct.pack("!BBHII", 0x80, 0, seq & 0xFFFF, ts & 0xFFFFFFFF, 0x1234) + b"\xff" * 160
                seq, ts = seq + 1, ts + 160
                self.sock.sendto(pkt, addr)
                self.sent += 1

    def close(self) -> None:
        self.stop.set()
        self.th.join(2)
        self.sock.close()


def _counter(stats: dict[str, Any], name: str) -> int:
    return int(stats.get(name, 0) or 0)


def test_dial_answered_runs_the_echo_agent_rtp_both_ways_and_bye_ends_it(short_tmp):
    media = Media()
    port = free_port()
    with GatewayProc(short_tmp, inbox=True) as gw:
        callee = run_callee(short_tmp, answered_then_bye(media.port, 3000), port)
        try:
            time.sleep(0.5)  # SIPp binds its port
            reply = dial(gw, f"sip:callee@127.0.0.1:{port}")
            assert reply.ok, (reply.error, gw.stderr())
            call_id = (reply.data or {})["call_id"]
            assert reply.data and reply.data["codec"] == "PCMU"
            time.sleep(1.0)
            calls = gw.command("calls")
            assert call_id in calls, calls
            live = calls[call_id]
            assert live["transport"] == "sip" and live["agent"] == "echo" and live["state"] == "active"
            assert live["ids"].get("direction") == "outbound"
            out, err = callee.communicate(timeout=30)
            assert callee.returncode == 0, (out[-2000:], err[-2000:])
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and call_id in gw.command("calls"):
                time.sleep(0.1)
            assert call_id not in gw.command("calls")
            st = gw.stats()
            assert media.received > 20, "the callee got no RTP from the gateway"
            assert media.sent > 20
            assert _counter(st, "sip_dial_answered") == 1, st
            assert _counter(st, "calls_admitted_sip") == 1
            assert _counter(st, "packets_in") > 20 or live["packets_in"] > 0
            assert _counter(st, "sip_requests_BYE") == 1
            assert _counter(st, "rtp_ports_in_use") == 0
        finally:
            if callee.poll() is None:
                callee.kill()
            media.close()


def test_dial_busy_reports_busy_and_leaves_nothing(short_tmp):
    port = free_port()
    with GatewayProc(short_tmp, inbox=True) as gw:
        callee = run_callee(short_tmp, busy(), port)
        try:
            time.sleep(0.5)
            reply = dial(gw, f"sip:callee@127.0.0.1:{port}")
            assert not reply.ok and reply.error == "busy", reply
            out, err = callee.communicate(timeout=30)
            assert callee.returncode == 0, (out[-2000:], err[-2000:])
            st = gw.stats()
            assert _counter(st, "sip_dial_failed_busy") == 1, st
            assert st["calls_active"] == 0 and _counter(st, "rtp_ports_in_use") == 0
            # a target outside [sip] allow and a malformed one are refused without a call
            assert dial(gw, "sip:x@192.0.2.1:5060").error.endswith("not in [sip] allow")
            assert dial(gw, "1234").error.startswith("a number needs [sip] trunk")
            assert gw.stats()["calls_admitted"] == 1
        finally:
            if callee.poll() is None:
                callee.kill()


def test_brisvoxd_dial_reaches_the_daemons_gateway_and_reports_busy(short_tmp):
    from bench.harness.daemon import Daemon, cli, write_config

    extra = "\n[gateway]\necho_use_workers = false\n\n[sip]\nport = 0\nrtp_port_min = 47000\nrtp_port_max = 47998\n"
    d = Daemon(short_tmp, config=write_config(short_tmp, workers=1, agents=1, extra=extra),
               env={"BRISVOX_TEST_ROLE_MAIN": "gateway=brisvox.gateway.process:main"})
    port = free_port()
    callee: subprocess.Popen[str] | None = None
    try:
        d.start()
        d.wait_ready(30)
        callee = run_callee(short_tmp, busy(), port)
        time.sleep(0.5)
        r = cli("dial", "--runtime-dir", str(d.run_dir), "--agent", "echo", "--ring-timeout", "5",
                f"sip:callee@127.0.0.1:{port}", env=d.env)
        assert r.returncode == 1 and "dial failed: busy" in r.stderr, (r.stdout, r.stderr)
        callee.communicate(timeout=20)
        assert callee.returncode == 0
    finally:
        if callee is not None and callee.poll() is None:
            callee.kill()
        d.close()


def challenging_callee(media_port: int, hold_ms: int) -> str:
    """A callee that answers the first INVITE 401 and checks the second's Authorization with SIPp's
    own digest code (``verifyauth``): 200 (then its BYE) when right, 403 when not. A 407: SIPp
    3.6's verifyauth refused the right password in Proxy-Authorization, so the 407 path is held
    by test_sip_trunks.py's callee."""
    challenge = S.send(_RESP.format(status="401 Unauthorized")
                       + '\n      WWW-Authenticate: Digest realm="sipp.test", nonce="5f2a9c1e7b", qop="auth"'
                       + "\n      Content-Length: 0", False)
    verify = ('  <recv request="INVITE">\n    <action>\n'
              '      <ereg regexp=".*" search_in="hdr" header="From:" check_it="true" assign_to="from_hdr"/>\n'
              '      <verifyauth assign_to="authvalid" username="1001" password="sipp secret"/>\n'
              '    </action>\n  </recv>\n'
              '  <nop hide="true" test="authvalid" next="good"/>\n'
              + S.send(_RESP.format(status="403 Forbidden") + "\n      Content-Length: 0", False).replace(
                  "<send>", '<send next="end">', 1)
              + '  <label id="good"/>\n')
    ok = answered_then_bye(media_port, hold_ms)
    answer = ok[ok.index("  <send", ok.index("180 Ringing")):]  # the 200, the ACK, the callee's BYE
    body = ('  <recv request="INVITE"/>\n' + challenge + '  <recv request="ACK"/>\n' + verify
            + answer.replace("</scenario>\n", "") + '  <label id="end"/>\n')
    return S.scenario(body, name="challenging")


@pytest.mark.parametrize("secret,ok", [("sipp secret", True), ("a wrong one", False)])
def test_dial_through_a_trunk_answers_a_sipp_callees_challenge(short_tmp, monkeypatch, secret, ok):
    monkeypatch.setenv("BRISVOX_TEST_SIPP_TRUNK", secret)
    port = free_port()
    m = Media()
    trunk = {"name": "sipp", "registrar": f"127.0.0.1:{port}", "register": False, "username": "1001",
             "secret_env": "BRISVOX_TEST_SIPP_TRUNK", "agent": "echo"}
    try:
        with GatewayProc(short_tmp, inbox=True, sip={"trunks": [trunk]}) as gw:
            callee = run_callee(short_tmp, challenging_callee(m.port, 300), port, timeout=15)
            time.sleep(0.3)
            reply = request_sync(gw.inbox, F.Command(name="dial", args={
                "target": "5551000", "trunk": "sipp", "agent": "echo", "ring_timeout_s": 10}), 20)
            assert isinstance(reply, F.CommandReply)
            out, err = callee.communicate(timeout=20)
            if ok:
                assert reply.ok, reply.error
                assert callee.returncode == 0, (out[-600:], err[-600:])
            else:
                assert not reply.ok and reply.error == "declined", reply.error  # SIPp's 403
            st = gw.stats()
            assert _counter(st, "sip_auth_answered") == 1, st
    finally:
        m.close()
