"""The SBC profile: brisvoxd on a private address behind the shipped Kamailio + rtpengine (deploy/sbc), on loopback.

One brisvoxd (gateway, one worker with the real Silero VAD, one agent process
with the scripted providers) on 127.0.0.22, plain UDP, ``[sip] allow`` = the
SBC's private address (and the direct caller of the baseline). In front of it
rtpengine (``deploy/sbc/rtpengine.conf``: user space, interfaces ``pub``
127.0.0.20 and ``priv`` 127.0.0.21) and Kamailio (``deploy/sbc/kamailio.cfg``
run as shipped with ``-A`` defines; TLS on the public side, UDP on the
private side, its credentials in a db_text directory). The upstream trunk is
a second Kamailio (``tests/system/peers/kamailio_registrar.cfg`` over TLS,
digest; its outbound calls go to a SIPp callee). Harness: ``tests/system/sbc_harness.py``. What each check proves:

* the SBC registers with the trunk (uac, the ``uacreg`` row, the trunk's
  digest challenge answered with the row's HA1) and a SIPp call the trunk
  routes to that registration reaches brisvoxd (the trunk is admitted by its
  address, not challenged) and is answered, its media anchored in rtpengine;
* brisvoxd dials ``sip:5550100@<SBC private address>``: the SBC sends it on
  to the trunk with rtpengine's public address in the SDP (plain RTP/AVP: the
  trunk is not SRTP), answers the trunk's 407 with the ``uacreg`` row's HA1
  (the trunk logs the challenge and the authenticated retry), and the
  callee's answer and its BYE come back along the route set;
* a TLS INVITE without credentials, and one with a wrong password, get 407;
  one with the right password but a plain RTP/AVP offer gets 488 (a
  caller's media must be SRTP); none of them reaches brisvoxd; an INVITE on
  the private side from an address that is not a brisvoxd host gets 403; a
  flood of OPTIONS from one public address is cut short by pike while the
  callers (other addresses) go on;
* baresip over TLS with ``mediaenc=srtp-mand`` (SRTP mandatory) calls
  through the SBC: its offer (RTP/SAVP, a=crypto) reaches brisvoxd as
  RTP/AVP without crypto, with rtpengine's private address and
  telephone-event; the answer the caller gets is RTP/SAVP with a=crypto; the
  caller hears the agent's answers (loud audio in its decoded stream after
  each turn); it talks over the long first answer and the agent stops (the
  bot's audio ends within ``STOP_MS`` of the caller's first loud frame, the
  record counts one interrupt and keeps the cut answer); the keys 1 2 3 #
  it sends as RFC 4733 events reach the agent (the record's keypad entry
  "1 2 3" and four keys counted); brisvoxd ends the call (``max_call_s``)
  and its BYE reaches the caller over the caller's own TLS connection (the
  Contact alias);
* the same call placed at the same time by a second baresip straight to
  brisvoxd over UDP (plain RTP) is the baseline: both calls' turn latencies
  (caller's speech end -> first answer audio at the caller, from the times
  baresip wrote its sndfile dumps) are printed, and the path part of them
  (the turn latency minus the agent's own speech-end -> first-audio time
  from the call record, same host clock): the SBC's added latency is the
  difference of the paths; then one rtpengine hop alone, per packet
  (:func:`~tests.system.sbc_harness.relay_probe`: both directions plain, and
  towards an SRTP leg, whose packets grow by the 10-byte auth tag). Printed
  with ``pytest -s``.

Skipped only when kamailio (with its tls module), rtpengine, baresip (with
srtp), sipp or openssl is missing (``make test`` installs them:
scripts/apt-packages.txt). Every process is stopped by its process group and
the daemon's shared memory removed, also on failure.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from bench.harness import sipp as S
from bench.harness.call_daemon import SPEECH
from bench.harness.daemon import Daemon
from brisvox.agent.host.call_record import read_records
from brisvox.cli.brisvoxd import dial
from ipc.bus import endpoint
from tests.system import sbc_harness as H
from tests.system.gateway_harness import free_port, free_port_pair_base, make_fixture, rtp_range
from tests.system.test_sip_outbound import run_callee

MISSING = H.missing()

pytestmark = [pytest.mark.system, pytest.mark.timeout(300),
              pytest.mark.serial_light,  # the turn latencies it prints are wall-clock figures
              pytest.mark.skipif(bool(MISSING), reason=f"needs {', '.join(MISSING)} (make test installs them)")]

STOP_MS = 600  # the caller's first loud frame of the barge-in -> the agent's audio stopped at the caller
TRUNK_SECRET = "kamailio trunk secret"


def sdp_of(msgs: list[H.Dumped], *, tag: str, dst: str, first_line: str, call_id: str) -> str:
    """The SDP of the first message sipdump saw ``tag`` (rcv/snd) to ``dst`` in call ``call_id``."""
    found = [m for m in msgs if m.tag == tag and m.dst_ip == dst and m.first_line.startswith(first_line)
             and m.header("Call-ID") == call_id and "application/sdp" in m.header("Content-Type")]
    assert found, f"no {first_line} with SDP {tag} to {dst} in {[(m.tag, m.dst_ip, m.first_line) for m in msgs]}"
    return found[0].body


def tls_invite(port: int, call_id: str, auth: str = "") -> str:
    """One INVITE over a fresh TLS connection to the SBC: the status line of the final answer."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection((H.PUB, port), timeout=3, source_address=(H.CALLER, 0))
    with ctx.wrap_socket(raw, server_hostname=H.PUB) as s:
        lport = s.getsockname()[1]
        sdp = ("v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
               "m=audio 40000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n")
        msg = (f"INVITE sip:agent@{H.PUB}:{port} SIP/2.0\r\n"
               f"Via: SIP/2.0/TLS {H.CALLER}:{lport};branch=z9hG4bK{call_id}{len(auth)};rport\r\n"
               f"From: <sip:alice@{H.REALM}>;tag=t{call_id}\r\nTo: <sip:agent@{H.PUB}>\r\nCall-ID: {call_id}\r\n"
               f"CSeq: {2 if auth else 1} INVITE\r\nContact: <sip:alice@{H.CALLER}:{lport};transport=tls>\r\n"
               f"Max-Forwards: 70\r\n{auth}Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}")
        s.sendall(msg.encode())
        s.settimeout(3)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(4096)
        return data.split(b"\r\n", 1)[0].decode() + "\n" + data.decode(errors="replace")


def options_flood(port: int, source: str, n: int) -> int:
    """``n`` OPTIONS to the SBC on one TLS connection from ``source``, as fast as it takes them:
    how many were answered 200 within a second of the last."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    raw = socket.create_connection((H.PUB, port), timeout=3, source_address=(source, 0))
    with ctx.wrap_socket(raw, server_hostname=H.PUB) as s:
        lport = s.getsockname()[1]
        for i in range(n):
            s.sendall((f"OPTIONS sip:{H.PUB}:{port} SIP/2.0\r\n"
                       f"Via: SIP/2.0/TLS {source}:{lport};branch=z9hG4bKflood{i};rport\r\n"
                       f"From: <sip:flood@{source}>;tag=f{i}\r\nTo: <sip:{H.PUB}:{port}>\r\n"
                       f"Call-ID: flood{i}\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n").encode())
        data = b""
        s.settimeout(1.0)
        with contextlib.suppress(TimeoutError, OSError):
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
    return data.count(b"SIP/2.0 200")


def digest_header(challenge: str, call_id: str, port: int, password: str) -> str:
    from brisvox.wire.sip_digest import DigestCredentials, authorization, parse_challenge

    value = authorization(parse_challenge(challenge), DigestCredentials("alice", password), "INVITE",
                          f"sip:agent@{H.PUB}:{port}", 1, f"c{call_id}")
    return f"Proxy-Authorization: {value}\r\n"


class Trunk:
    """The upstream trunk: the registrar peer over TLS, and ``CALLEE`` (a SIPp callee on
    ``callee_port``) for the calls it is asked to place."""

    def __new__(cls, tmp: Path, port: int, tls_port: int, callee_port: int) -> Any:
        from tests.system.test_sip_kamailio_registrar import Kamailio as Registrar

        class WithCallee(Registrar):
            def args(self) -> list[str]:
                return [*super().args(), "-A", f'CALLEE="sip:127.0.0.1:{callee_port}"']

            def close(self) -> None:
                self.stop()

        return WithCallee(tmp, port, tls_port)


class Layout:
    """Every process of the test (module docstring), closed in reverse order by ``close``."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.parts: list[Any] = []
        self.daemon: Daemon | None = None

    def add(self, part: Any) -> Any:
        self.parts.append(part)
        return part

    def logs(self) -> str:
        out = []
        for p in self.parts:
            out.append(f"--- {type(p).__name__}\n{p.log()}")
        if self.daemon is not None:
            out.append(f"--- brisvoxd\n{self.daemon.logs()[-4000:]}")
        return "\n".join(out)

    def close(self) -> None:
        for p in reversed(self.parts):
            try:
                p.close()
            except Exception:  # noqa: BLE001 - every part is stopped whatever one did
                pass
        if self.daemon is not None:
            self.daemon.close()


def test_sbc_tls_srtp_caller_reaches_brisvox_with_barge_in_and_dtmf(short_tmp):
    from tests.system.test_sip_kamailio_registrar import HOST as TRUNK_HOST

    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == H.RATE
    wav = H.caller_wav(short_tmp, np.asarray(speech, dtype=np.int16))
    bv_port = free_port()
    lay = Layout(short_tmp)
    try:
        t0 = time.monotonic()
        lay.daemon = Daemon(short_tmp / "brisvox", config=H.brisvox_config(short_tmp / "brisvox", bv_port,
                                                                            rtp_range(200)),
                            real_roles=True, env={"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}).start()
        callee_port = free_port()
        trunk = lay.add(Trunk(short_tmp / "trunk", free_port(), free_port(socket.SOCK_STREAM), callee_port))
        trunk.start()
        ng = free_port()
        rtpengine = lay.add(H.Rtpengine(short_tmp / "rtpengine", ng, rtp_range(100)))
        rtpengine.start()
        cert = H.make_cert(short_tmp, H.PUB)
        accounts = H.SbcAccounts(trunk_user="1001", trunk_realm="kamailio.test", trunk_password=TRUNK_SECRET,
                                 trunk_proxy=f"sip:{TRUNK_HOST}:{trunk.tls_port};transport=tls",
                                 trunk_host=TRUNK_HOST)
        dest = f"sip:{H.BRISVOX}:{bv_port}"
        sbc = lay.add(H.Sbc(short_tmp / "sbc", free_port(socket.SOCK_STREAM), free_port(), ng, {"a": dest}, cert,
                            short_tmp / "trunk" / "c.pem", accounts))
        lay.daemon.wait_ready(60)
        sbc.start()
        H.wait_until(lambda: sbc.active(dest), 10, f"brisvoxd active in the SBC's dispatcher: {sbc.dispatcher()}")
        print(f"\nSBC layout up in {time.monotonic() - t0:.1f} s")

        # -- the trunk: the SBC registers (digest), the trunk's call reaches brisvoxd -------------------
        def reg_flags() -> int:
            out = sbc.rpc("uac.reg_info", "l_uuid", "trunk")
            return int(next(iter([ln.split(":")[1] for ln in out.splitlines() if ln.strip().startswith("flags")]),
                            "0"))

        H.wait_until(lambda: reg_flags() & 4, 10, f"the SBC registered with the trunk\n{trunk.log()}")
        assert "challenged" in trunk.log()  # the trunk asked for digest, the SBC answered it
        fx = make_fixture(short_tmp, "A call from the trunk.")
        r = S.run_sipp(short_tmp, S.routed_call(fx["ulaw"], 800), f"{TRUNK_HOST}:{trunk.port}", service="1001",
                       timeout=15, media_port=free_port_pair_base(4), local_port=free_port())
        assert r.returncode == 0, (r.stdout[-800:], r.stderr[-800:], lay.logs())

        # -- brisvoxd dials out through the SBC: the trunk's challenge is answered with the uacreg HA1 --
        callee = run_callee(short_tmp, H.routed_callee(free_port_pair_base(2), 500), callee_port, timeout=20)
        try:
            time.sleep(0.3)
            ok, _, error = dial(endpoint(lay.daemon.run_dir, "gateway-0"), f"sip:5550100@{H.PRIV}:{sbc.udp_port}",
                                   ring_timeout_s=10)
            out, err = callee.communicate(timeout=20)
        finally:
            if callee.poll() is None:
                callee.kill()
                callee.wait(5)
        assert ok, (error, trunk.log())
        assert callee.returncode == 0, (out[-800:], err[-800:])  # answered; its BYE came back through both
        assert "for sip:5550100@kamailio.test: challenged" in trunk.log(), trunk.log()
        assert "for sip:5550100@kamailio.test: authenticated" in trunk.log(), trunk.log()

        # -- who may call: digest on the public side, only brisvoxd hosts on the private side ------------
        plain = tls_invite(sbc.tls_port, "noauth")
        assert plain.startswith("SIP/2.0 407") and f'realm="{H.REALM}"' in plain, plain
        challenge = next(ln.split(":", 1)[1].strip() for ln in plain.splitlines()
                         if ln.lower().startswith("proxy-authenticate:"))
        wrong = tls_invite(sbc.tls_port, "noauth", digest_header(challenge, "noauth", sbc.tls_port, "not-it"))
        assert wrong.startswith("SIP/2.0 407"), wrong
        # the right password, but plain RTP: a caller's media must be SRTP
        again = tls_invite(sbc.tls_port, "plainrtp")
        challenge = next(ln.split(":", 1)[1].strip() for ln in again.splitlines()
                         if ln.lower().startswith("proxy-authenticate:"))
        plain_rtp = tls_invite(sbc.tls_port, "plainrtp",
                               digest_header(challenge, "plainrtp", sbc.tls_port, accounts.password))
        assert plain_rtp.startswith("SIP/2.0 488 SRTP Required"), plain_rtp
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.bind((H.CALLER, 0))
            u.settimeout(3)
            lport = u.getsockname()[1]
            u.sendto((f"INVITE sip:5550100@{H.PRIV} SIP/2.0\r\nVia: SIP/2.0/UDP {H.CALLER}:{lport};branch=z9hG4bKpriv\r\n"
                      f"From: <sip:x@{H.CALLER}>;tag=p\r\nTo: <sip:5550100@{H.PRIV}>\r\nCall-ID: priv-side\r\n"
                      f"CSeq: 1 INVITE\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n").encode(),
                     (H.PRIV, sbc.udp_port))
            assert u.recv(4096).startswith(b"SIP/2.0 403"), "an INVITE on the private side from a stranger"

        # a flood from one public address is cut by pike; callers from other addresses go on
        answered = options_flood(sbc.tls_port, "127.0.0.31", 80)
        print(f"pike: {answered} of 80 OPTIONS from one address answered, the rest dropped")
        assert 0 < answered < 80, answered
        assert "flood from 127.0.0.31" in sbc.log(20000), "pike did not drop the flood"

        # -- the calls: baresip TLS + SRTP through the SBC, and the same call direct over UDP -----------
        via_sbc = lay.add(H.Baresip(short_tmp / "caller-sbc",
                                    f"<sip:alice@{H.REALM};transport=tls>;auth_user=alice;"
                                    f"auth_pass={accounts.password};regint=0;audio_codecs=PCMU;mediaenc=srtp-mand",
                                    wav, ca=cert[0], sip_port=free_port(), ctrl_port=free_port(socket.SOCK_STREAM),
                                    rtp_ports=rtp_range(10)))
        direct = lay.add(H.Baresip(short_tmp / "caller-direct", f"<sip:bob@{H.CALLER}>;regint=0;audio_codecs=PCMU",
                                   wav, sip_port=free_port(), ctrl_port=free_port(socket.SOCK_STREAM),
                                   rtp_ports=rtp_range(10)))
        via_sbc.start()
        direct.start()
        times: dict[str, H.CallTimes] = {}
        errors: list[BaseException] = []

        def baseline() -> None:
            try:
                times["direct"] = H.run_call(direct, f"sip:agent@{H.BRISVOX}:{bv_port}")
            except BaseException as e:  # noqa: BLE001 - re-raised on the test's thread
                errors.append(e)

        th = threading.Thread(target=baseline, name="direct-call")
        th.start()
        try:
            times["sbc"] = H.run_call(via_sbc, f"sip:agent@{H.PUB}:{sbc.tls_port}")
        finally:
            th.join(60)
        if errors:
            raise errors[0]

        # -- what crossed the SBC ----------------------------------------------------------------
        def bye_answered() -> bool:  # sipdump's writer is a process of its own: until it caught up
            msgs = sbc.dumped()
            ids = {m.header("Call-ID") for m in msgs if m.header("User-Agent").startswith("baresip")}
            return any(m.tag == "rcv" and m.first_line.startswith("SIP/2.0 200") and "BYE" in m.header("CSeq")
                       and m.header("Call-ID") in ids for m in msgs)

        H.wait_until(bye_answered, 5, "sipdump's record of the caller's 200 to brisvoxd's BYE")
        msgs = sbc.dumped()
        call_id = next(m.header("Call-ID") for m in msgs if m.header("User-Agent").startswith("baresip"))
        offer_in = sdp_of(msgs, tag="rcv", dst=H.PUB, first_line="INVITE sip:agent@", call_id=call_id)
        assert "RTP/SAVP" in offer_in and "a=crypto:" in offer_in, offer_in  # the caller's SRTP offer
        to_brisvox = [m for m in msgs if m.tag == "snd" and m.dst_ip == H.BRISVOX and m.first_line.startswith("INVITE")
                      and m.header("Call-ID") == call_id]
        assert len(to_brisvox) == 1, [m.first_line for m in to_brisvox]
        offer = to_brisvox[0].body
        assert "m=audio" in offer and "RTP/AVP" in offer and "RTP/SAVP" not in offer, offer
        assert "a=crypto" not in offer and "a=ice-" not in offer and "a=candidate" not in offer, offer
        assert f"c=IN IP4 {H.PRIV}" in offer and "telephone-event/8000" in offer, offer
        answer_out = sdp_of(msgs, tag="snd", dst=H.CALLER, first_line="SIP/2.0 200", call_id=call_id)
        assert "RTP/SAVP" in answer_out and "a=crypto:" in answer_out, answer_out  # SRTP back to the caller
        assert f"c=IN IP4 {H.PUB}" in answer_out, answer_out
        trunk_offer = [m for m in msgs if m.tag == "snd" and m.dst_ip == H.BRISVOX and m.first_line.startswith("INVITE")
                       and "sipp" in m.header("From")]
        assert trunk_offer and f"c=IN IP4 {H.PRIV}" in trunk_offer[0].body  # the trunk's call: anchored too
        out_id = next(m.header("Call-ID") for m in msgs if m.tag == "rcv" and m.first_line.startswith("INVITE sip:5550100"))
        to_trunk = sdp_of(msgs, tag="snd", dst=TRUNK_HOST, first_line="INVITE sip:5550100@", call_id=out_id)
        assert f"c=IN IP4 {H.PUB}" in to_trunk and "RTP/AVP" in to_trunk and "a=crypto" not in to_trunk, to_trunk
        assert f"c=IN IP4 {H.PRIV}" in sdp_of(msgs, tag="snd", dst=H.BRISVOX, first_line="SIP/2.0 200", call_id=out_id)
        strangers = [m for m in msgs if m.tag == "snd" and m.dst_ip == H.BRISVOX
                     and m.header("Call-ID") in ("noauth", "plainrtp")]
        assert not strangers, "a refused INVITE reached brisvoxd"

        # -- what the callers heard and the agent recorded ----------------------------------------
        lay.daemon.wait_for(lambda s: len(read_records(short_tmp / "brisvox" / "records")) >= 4, 15,
                            "the four call records")
        records = {r["call"]["caller"]: r for r in read_records(short_tmp / "brisvox" / "records")}
        figures: dict[str, dict[str, float | None]] = {}
        for name, who in (("sbc", "alice"), ("direct", "bob")):
            ct, rec = times[name], records[who]
            f = ct.figures()
            assert f["turn_ms"] is not None, (name, ct, lay.logs())  # the caller heard the first answer
            assert len(ct.heard) >= 3, (name, ct.heard)  # ... and the second and the keypad answer
            # barge-in: the caller talked over the long answer and the agent stopped
            assert f["stop_ms"] is not None and f["stop_ms"] <= STOP_MS, (name, f, ct)
            assert f["turn2_ms"] is not None and f["turn2_ms"] > 0, (name, f)  # no answer before the caller ended
            st = rec["stats"]["turn"]
            assert st["interrupts"] == 1, (name, st)
            said = [m for m in rec["conversation"] if m["role"] == "assistant"]
            full = H.SCRIPT["bot"][0]
            assert said and full.startswith(said[0]["text"]) and len(said[0]["text"]) < len(full), said[:1]
            # DTMF: the four keys reached the agent, the entry ended by # is its own user turn
            users = [m["content"] for m in rec["conversation"] if m["role"] == "user"]
            assert "The caller pressed 1 2 3 on the keypad." in users, users
            assert st["dtmf"] == 4 and st["keypad_entries"] == 1 and st["keypad_by_terminator"] == 1, st
            assert f["keypad_ms"] is not None, (name, f)  # the keypad answer was heard
            t1, t2 = rec["turns"][0], rec["turns"][1]
            agent1 = (t1["t_first_audio"] - t1["t_speech_end"]) * 1000
            agent2 = (t2["t_first_audio"] - t2["t_speech_end"]) * 1000
            assert f["turn2_ms"] is not None
            figures[name] = {**f, "agent_ms": agent1, "path_ms": f["turn_ms"] - agent1,
                             "path2_ms": f["turn2_ms"] - agent2}
        # brisvoxd hung both calls up; its BYE reached the SRTP caller over the caller's own TLS connection
        assert records["alice"]["end_reason"] == records["bob"]["end_reason"] == "max call duration", records
        byes = [m for m in msgs if m.header("Call-ID") == call_id and m.first_line.startswith("BYE ")]
        assert [(m.tag, m.dst_ip) for m in byes] == [("rcv", H.PRIV), ("snd", H.CALLER)], byes
        assert any(m.tag == "rcv" and m.first_line.startswith("SIP/2.0 200") and "BYE" in m.header("CSeq")
                   and m.header("Call-ID") == call_id for m in msgs)
        d, s = figures["direct"], figures["sbc"]

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.0f}"

        print("\nturn latency at the caller (ms)   direct   via SBC (TLS + SRTP)")
        for key, label in (("turn_ms", "question -> first answer"), ("turn2_ms", "barge-in end -> second answer"),
                           ("keypad_ms", "# -> keypad answer"), ("stop_ms", "barge-in start -> bot stopped"),
                           ("path_ms", "path, first turn"), ("path2_ms", "path, second turn")):
            print(f"  {label:<32} {ms(d[key]):>6}   {ms(s[key]):>6}")
        added = ((s["path_ms"] or 0) + (s["path2_ms"] or 0) - (d["path_ms"] or 0) - (d["path2_ms"] or 0)) / 2
        print(f"  added by the SBC (mean of the two turns' path difference): {added:+.0f} ms")

        # -- one rtpengine hop, per packet: what the turn figures above cannot resolve --------------
        hop = H.relay_probe(rtpengine)
        print("\none rtpengine hop per RTP packet (us)   p50     p99   arrived")
        for key, v in hop.items():
            print(f"  {key:<36} {v['p50_us']:>6.0f}  {v['p99_us']:>6.0f}   {v['got']:.0%}")
        assert all(v["got"] >= 0.95 for v in hop.values()), hop
        assert hop["priv->pub SRTP"]["grew"] == 10 and hop["priv->pub"]["grew"] == 0, hop  # the SRTP auth tag
        print(f"  (run took {time.monotonic() - t0:.1f} s)")
    except BaseException:
        print(lay.logs())
        raise
    finally:
        lay.close()
