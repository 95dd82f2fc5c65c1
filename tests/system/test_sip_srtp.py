"""SRTP with SDES keys (``[sip] srtp``) on the real gateway process, against real peers on loopback.

* A Python caller over TLS with its own libsrtp contexts streams the speech fixture as SRTP,
  interleaved with a hostile peer's packets (replays, truncated packets, another key, garbage):
  every hostile packet is dropped and counted by kind, the ``in`` ring holds the fixture
  bit-exact (SRTP decrypts to the very samples), the echo comes back protected under the key of
  our answer and decrypts to speech, the suite is in the call's transport ids, and the context
  is gone when the call ends.
* ``srtp = "required"`` refuses a plain offer over TLS with 488; an offer with keys over TCP is
  refused 488 however its Via names the transport (the rule reads the connection).
* SDES over UDP is refused 488 (``optional``) and answered with the explicit override.
* baresip (a real SIP stack, libsrtp inside) calls brisvox over TLS with ``mediaenc srtp-mand``
  (RTP/SAVP) and with ``mediaenc srtp`` (best effort: RTP/AVP with a=crypto); brisvox dials
  baresip over TLS with ``srtp = "required"`` (RTP/SAVP) and ``"optional"`` (RTP/AVP with
  a=crypto). Each time the echo agent is heard back: baresip's decoded audio correlates with
  what it sent (its sndfile dumps), and both sides say SRTP.
"""

from __future__ import annotations

import glob
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from brisvox.wire import g711, sdp, srtp
from tests.system.gateway_harness import (
    GatewayProc,
    attached_ring,
    correlate,
    free_port,
    have,
    make_fixture,
)
from tests.system.test_sip_streams import StreamUac, baresip_conf, make_cert

pytestmark = [pytest.mark.system, pytest.mark.skipif(not (have("openssl") and have("espeak-ng") and have("sox")),
                                                     reason="needs openssl, espeak-ng and sox")]
S80, S32 = "AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"
NEEDS_BARESIP = pytest.mark.skipif(not have("baresip"), reason="needs baresip")


def tls_listener(port: int, cert: tuple[str, str]) -> dict[str, Any]:
    return {"transport": "tls", "host": "127.0.0.1", "port": port, "cert_file": cert[0], "key_file": cert[1]}


def offer(port: int, crypto: tuple[srtp.Crypto, ...] = (), proto: str = "RTP/SAVP") -> bytes:
    lines = "".join(f"a=crypto:{c.value()}\r\n" for c in crypto)
    return (f"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {port} {proto} 0\r\na=rtpmap:0 PCMU/8000\r\n{lines}").encode()


def final(uac: StreamUac) -> Any:
    resp = uac.recv()
    while resp.status < 200:
        resp = uac.recv()
    return resp


def wait_until(pred: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def rtp_packet(seq: int, ts: int, payload: bytes, ssrc: int = 0x0BADCAFE, marker: bool = False) -> bytes:
    return struct.pack("!BBHII", 0x80, (0x80 if marker else 0), seq & 0xFFFF, ts & 0xFFFFFFFF, ssrc) + payload


def test_srtp_caller_over_tls_is_bit_exact_and_a_hostile_peers_packets_are_only_counted(short_tmp):
    cert = make_cert(short_tmp)
    fx = make_fixture(short_tmp, "Secure hello over SRTP. The echo should say this back, one two three.")
    ulaw = fx["ulaw"].read_bytes()
    ref = np.fromfile(fx["ref"], dtype="<i2")
    tls = free_port(socket.SOCK_STREAM)
    sip = {"srtp": "required", "listeners": [tls_listener(tls, cert)]}
    mine = srtp.new_crypto(3, S80)
    with GatewayProc(short_tmp, inbox=True, gateway={"echo_delay_ms": 200}, sip=sip) as gw:
        media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        media.bind(("127.0.0.1", 0))
        uac = StreamUac(tls, tls=True)
        try:
            call_id = "srtp-hostile"
            uac.send(uac.request("INVITE", call_id, 1, body=offer(media.getsockname()[1], (mine,))))
            ok = final(uac)
            assert ok.status == 200, ok.status
            [m] = sdp.parse(ok.body).media
            assert m.proto == "RTP/SAVP" and len(m.crypto) == 1
            theirs = srtp.parse_crypto(m.crypto[0])
            assert (theirs.tag, theirs.suite) == (3, S80) and theirs.key != mine.key
            gw_rtp = ("127.0.0.1", m.port)
            uac.send(uac.request("ACK", call_id, 1, to=ok.get("to"), branch="z9hG4bKackhostile"))
            [call] = gw.command("calls").values()
            assert call["ids"]["srtp"] == S80
            me = srtp.SrtpSession(mine, theirs)
            stranger = srtp.SrtpSession(srtp.new_crypto(3, S80), srtp.new_crypto(3, S80))
            got: dict[str, Any] = {}
            heard: list[bytes] = []
            undecryptable = [0]
            stop = threading.Event()

            def ring_reader() -> None:
                with attached_ring(gw.instance, "in") as ring:
                    wait_until(lambda: ring.write_pos >= len(ref), timeout=len(ref) / 8000 + 10)
                    got["in"] = ring.read_range(0, ring.write_pos).samples.copy()

            def listener() -> None:
                media.settimeout(0.2)
                while not stop.is_set():
                    try:
                        data = media.recv(2048)
                    except TimeoutError:
                        continue
                    try:
                        heard.append(me.unprotect(data))
                    except srtp.SrtpDrop:
                        undecryptable[0] += 1

            threads = [threading.Thread(target=ring_reader), threading.Thread(target=listener)]
            for t in threads:
                t.start()
            hostile = {"replayed": 0, "malformed": 0, "auth_failed": 0}
            rng = np.random.default_rng(7)
            sent: list[bytes] = []
            t0 = time.monotonic()
            for i in range(len(ulaw) // 160):
                pkt = me.protect(rtp_packet(1000 + i, 160 * i, ulaw[160 * i:160 * (i + 1)], marker=i == 0))
                media.sendto(pkt, gw_rtp)
                sent.append(pkt)
                if i and i % 5 == 0:  # a storm of bad packets between two good ones
                    media.sendto(sent[-2], gw_rtp)  # a replay
                    media.sendto(pkt[:20], gw_rtp)  # truncated: no full tag
                    media.sendto(stranger.protect(rtp_packet(1000 + i + 3000, 0, b"\x55" * 160)), gw_rtp)
                    media.sendto(bytes([0x80, 0]) + rng.bytes(180), gw_rtp)  # garbage
                    media.sendto(rtp_packet(1000 + i + 4000, 0, b"\x55" * 160), gw_rtp)  # plain RTP
                    hostile["replayed"] += 1
                    hostile["malformed"] += 1
                    hostile["auth_failed"] += 3
                time.sleep(max(0.0, t0 + 0.02 * (i + 1) - time.monotonic()))
            threads[0].join(15)
            time.sleep(1.0)  # the echo's tail
            stop.set()
            threads[1].join(5)
            assert np.array_equal(got["in"][:len(ref)], ref), "the in ring differs from the fixture"
            st = gw.stats()
            for reason, n in hostile.items():
                assert st.get(f"sip_srtp_{reason}", 0) == n, (reason, st.get(f"sip_srtp_{reason}"), n)
            [call] = gw.command("calls").values()
            assert call["srtp_dropped"] == sum(hostile.values()) and call["state"] != "ended"
            assert undecryptable[0] == 0 and len(heard) > 50
            echo = np.concatenate([g711.CODECS["PCMU"].decode(np.frombuffer(p[12:], np.uint8)) for p in heard])
            assert float(np.sqrt(np.mean(echo.astype(np.float64) ** 2))) > 300  # speech came back
            _, corr = correlate(ref, echo)
            assert corr > 0.9, corr
            uac.send(uac.request("BYE", call_id, 2, to=ok.get("to"), branch="z9hG4bKbyehostile"))
            assert final(uac).status == 200
            assert wait_until(lambda: gw.command("calls") == {})
            st = gw.stats()
            assert st["sip_srtp_sessions"] == 1 and st["sip_srtp_sessions_open"] == 0
            assert st["call_srtp_dropped_total"] == sum(hostile.values())
        finally:
            uac.close()
            media.close()
    assert gw.leaked == []


def test_srtp_required_refuses_plain_over_tls_and_keys_over_tcp(short_tmp):
    cert = make_cert(short_tmp)
    tls, tcp = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    sip = {"srtp": "required", "listeners": [tls_listener(tls, cert),
                                             {"transport": "tcp", "host": "127.0.0.1", "port": tcp}]}
    with GatewayProc(short_tmp, inbox=True, sip=sip) as gw:
        uac = StreamUac(tls, tls=True)
        try:
            uac.send(uac.request("INVITE", "plain-tls", 1, body=offer(40000, proto="RTP/AVP")))
            resp = final(uac)
            assert resp.status == 488 and "SRTP required" in resp.get("warning")
        finally:
            uac.close()
        uac = StreamUac(tcp)
        try:  # keys over TCP, the Via claiming TLS: the connection decides
            req = uac.request("INVITE", "keys-tcp", 1, body=offer(40000, (srtp.new_crypto(1, S80),)))
            uac.send(req.replace(b"SIP/2.0/TCP", b"SIP/2.0/TLS"))
            assert final(uac).status == 488
        finally:
            uac.close()
        st = gw.stats()
        assert st["sip_refused_srtp_required"] == 1 and st["sip_refused_srtp_insecure_signalling"] == 1
        assert st["sip_invite_488"] == 2 and st["calls_admitted"] == 0
    assert gw.leaked == []


def udp_invite(port: int, call_id: str, body: bytes) -> Any:
    from brisvox.wire.sip_message import parse

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        lp = s.getsockname()[1]
        s.settimeout(3)
        s.sendto((f"INVITE sip:echo@127.0.0.1:{port} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{lp};branch=z9hG4bK"
                  f"{call_id};rport\r\nFrom: <sip:t@127.0.0.1>;tag=u{call_id}\r\nTo: <sip:echo@127.0.0.1>\r\n"
                  f"Call-ID: {call_id}\r\nCSeq: 1 INVITE\r\nContact: <sip:t@127.0.0.1:{lp}>\r\nMax-Forwards: 70\r\n"
                  f"Content-Type: application/sdp\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body,
                 ("127.0.0.1", port))
        while True:
            resp = parse(s.recv(65535))
            if resp.status >= 200:
                break
        if resp.status == 200:  # ACK, then BYE: the call must not outlive the test
            to = resp.get("to")
            for method, cseq in (("ACK", 1), ("BYE", 2)):
                s.sendto((f"{method} sip:echo@127.0.0.1:{port} SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:{lp};branch="
                          f"z9hG4bK{method}{call_id};rport\r\nFrom: <sip:t@127.0.0.1>;tag=u{call_id}\r\nTo: {to}\r\n"
                          f"Call-ID: {call_id}\r\nCSeq: {cseq} {method}\r\nMax-Forwards: 70\r\n"
                          "Content-Length: 0\r\n\r\n").encode(), ("127.0.0.1", port))
        return resp


def test_sdes_over_udp_is_refused_and_taken_with_the_override(short_tmp):
    body = offer(40000, (srtp.new_crypto(1, S32),))
    with GatewayProc(short_tmp, inbox=True, sip={"srtp": "optional"}) as gw:
        resp = udp_invite(gw.sip_port, "sdes-udp", body)
        assert resp.status == 488 and "TLS" in resp.get("warning")
        st = gw.stats()
        assert st["sip_refused_srtp_insecure_signalling"] == 1 and st["calls_admitted"] == 0
    assert gw.leaked == []
    with GatewayProc(short_tmp, inbox=True, sip={"srtp": "optional", "srtp_allow_insecure_signalling": True}) as gw:
        resp = udp_invite(gw.sip_port, "sdes-udp-lab", body)
        assert resp.status == 200
        [m] = sdp.parse(resp.body).media
        assert m.proto == "RTP/SAVP" and srtp.parse_crypto(m.crypto[0]).suite == S32
        assert wait_until(lambda: gw.command("calls") == {})
        assert gw.stats()["sip_srtp_sessions"] == 1 and gw.stats()["sip_srtp_sessions_open"] == 0
    assert gw.leaked == []


# -- baresip -----------------------------------------------------------------------------------------


def srtp_baresip(conf: Path, cert: tuple[str, str], wav: Path, port: int, mediaenc: str,
                 answer: bool = False) -> Path:
    """baresip over TLS (test_sip_streams.baresip_conf) with its srtp module, ``mediaenc`` on the
    account and its sndfile dumps (what it sent and what it decoded) in ``conf``."""
    baresip_conf(conf, cert, wav, port, answer=answer)
    with (conf / "config").open("a") as f:
        f.write(f"module srtp.so\nmodule sndfile.so\nsnd_path {conf}\n")
    acc = (conf / "accounts").read_text().strip()
    (conf / "accounts").write_text(f"{acc};mediaenc={mediaenc}\n")
    return conf


def heard_back(conf: Path) -> float:
    """The correlation of what baresip decoded with what it sent (its sndfile dumps)."""
    enc, dec = glob.glob(str(conf / "dump-*-enc.wav")), glob.glob(str(conf / "dump-*-dec.wav"))
    assert enc and dec, sorted(p.name for p in conf.iterdir())
    sent, _ = sf.read(enc[0], dtype="int16")
    got, _ = sf.read(dec[0], dtype="int16")
    _, corr = correlate(sent, got)
    return corr


@NEEDS_BARESIP
@pytest.mark.parametrize("mediaenc,mode", [("srtp-mand", "required"), ("srtp", "optional")])
def test_baresip_calls_over_tls_with_srtp_and_hears_the_echo(short_tmp, mediaenc, mode):
    cert = make_cert(short_tmp)
    fx = make_fixture(short_tmp, "Hello over SRTP from baresip. The echo should say this back, one two three.")
    tls = free_port(socket.SOCK_STREAM)
    # baresip writes its interface's address in the SDP but sends from loopback: latch the first source
    sip = {"srtp": mode, "rtp_latch": "first", "nat": "signalling_source", "listeners": [tls_listener(tls, cert)]}
    with GatewayProc(short_tmp, inbox=True, gateway={"echo_delay_ms": 300}, sip=sip) as gw:
        conf = srtp_baresip(short_tmp / "baresip", cert, fx["wav"], free_port(), mediaenc)
        p = subprocess.run(["baresip", "-f", str(conf), "-e", f"/dial sip:echo@127.0.0.1:{tls};transport=tls",
                            "-t", "10"], capture_output=True, text=True, timeout=40)
        out = p.stdout + p.stderr
        assert "Call established" in out, out[-2500:]
        assert "SRTP is Enabled" in out and "failed to decrypt RTP" not in out, out[-2500:]
        st = gw.stats()
        assert st["sip_srtp_sessions"] == 1 and st["calls_admitted"] == 1
        assert not any(st.get(f"sip_srtp_{r}", 0) for r in ("auth_failed", "malformed", "ssrc_limit")), st
        corr = heard_back(conf)
        print(f"baresip {mediaenc} -> brisvox srtp={mode}: echo correlation {corr:.4f}")
        assert corr > 0.9
        assert wait_until(lambda: gw.command("calls") == {}) and gw.stats()["sip_srtp_sessions_open"] == 0
    assert gw.leaked == []


@NEEDS_BARESIP
@pytest.mark.parametrize("mode,mediaenc", [("required", "srtp-mand"), ("optional", "srtp")])
def test_brisvox_dials_baresip_over_tls_with_srtp_and_is_heard(short_tmp, mode, mediaenc):
    from ipc import frames as F
    from ipc.bus import request_sync

    cert = make_cert(short_tmp)
    fx = make_fixture(short_tmp, "Hello from baresip, answering a secure call. One two three.")
    tls, bport = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    sip = {"srtp": mode, "rtp_latch": "first", "nat": "signalling_source", "tls_ca_file": cert[0],
           "listeners": [tls_listener(tls, cert)]}
    with GatewayProc(short_tmp, inbox=True, gateway={"echo_delay_ms": 300}, sip=sip) as gw:
        conf = srtp_baresip(short_tmp / "baresip", cert, fx["wav"], bport, mediaenc, answer=True)
        bs = subprocess.Popen(["baresip", "-f", str(conf), "-t", "12"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(1.5)
            reply = request_sync(gw.inbox, F.Command(name="dial", args={
                "target": f"sip:bs@127.0.0.1:{bport + 1};transport=tls", "agent": "echo", "ring_timeout_s": 8}), 45)
            out, _ = bs.communicate(timeout=30)
        finally:
            if bs.poll() is None:
                bs.kill()
                bs.wait(5)
        assert isinstance(reply, F.CommandReply) and reply.ok, (reply, out[-1500:])
        assert reply.data["srtp"] == S80, reply.data  # baresip answers with its preferred first line
        assert "SRTP is Enabled" in out and "Call established" in out, out[-2000:]
        assert "failed to decrypt RTP" not in out, out[-2000:]
        corr = heard_back(conf)
        print(f"brisvox srtp={mode} -> baresip {mediaenc}: echo correlation {corr:.4f}")
        assert corr > 0.9
        st = gw.stats()
        assert st["sip_srtp_sessions"] == 1
        assert not any(st.get(f"sip_srtp_{r}", 0) for r in ("auth_failed", "malformed", "ssrc_limit")), st
        assert wait_until(lambda: gw.command("calls") == {}, 10)
    assert gw.leaked == []
