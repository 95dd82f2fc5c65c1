"""SIP over TCP and TLS (``[[sip.listeners]]``) on the real gateway process, as a caller and as an
attacker would use them.

A call over TCP and one over TLS (a certificate made here with openssl) are answered 200 on the
connection they came on; RTP flows; when the caller sends no RTP the gateway's BYE comes back on
the caller's own connection (its Contact is an alias of it), and our 200 ends the call. The
limits: a Content-Length of 10 MB gets 513 and the connection is closed before a byte of body is
read; a head without end is closed at max_message_bytes; a keepalive ping gets its pong; garbage
instead of a TLS handshake, and a handshake that stalls, are closed without costing a call; a
source over max_connections_per_source is closed at accept while another source connects; a
connection that sends nothing is closed after first_message_s. Nothing is left afterwards.
baresip, a real SIP stack, calls over TLS (verifying the certificate), hears RTP and hangs up.
brisvox opens TLS itself to register with a trunk and dial through it (one connection reused,
the peer verified against tls_ca_file; without that CA nothing is sent and the dial fails).
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from brisvox.wire.sip_message import SipMessage, parse
from brisvox.wire.sip_stream import StreamFramer
from tests.system.gateway_harness import (
    GatewayProc,
    free_port,
    free_port_pair_base,
    have,
    make_fixture,
)

pytestmark = [pytest.mark.system, pytest.mark.skipif(not have("openssl"), reason="needs openssl")]


def make_cert(tmp: Path) -> tuple[str, str]:
    cert, key = tmp / "sip-cert.pem", tmp / "sip-key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                    "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


class StreamUac:
    """A caller on one TCP or TLS connection."""

    def __init__(self, port: int, tls: bool = False, host: str = "127.0.0.1") -> None:
        raw = socket.create_connection(("127.0.0.1", port), timeout=3, source_address=(host, 0))
        if tls:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
            raw = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        self.sock = raw
        self.transport = "TLS" if tls else "TCP"
        self.host, self.port = raw.getsockname()[:2]
        self.framer = StreamFramer(65536)
        self.pending: list[bytes] = []
        self.gw_port = port

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, timeout: float = 3.0) -> SipMessage:
        self.sock.settimeout(timeout)
        while not self.pending:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("closed")
            self.pending += [m for m in self.framer.feed(data) if m != b"\r\n\r\n"]
        return parse(self.pending.pop(0))

    def request(self, method: str, call_id: str, cseq: int, *, to: str = "<sip:echo@127.0.0.1>",
                frm: str = "", body: bytes = b"", branch: str = "") -> bytes:
        frm = frm or f"<sip:caller@{self.host}>;tag=c{call_id}"
        t = self.transport
        head = (f"{method} sip:echo@127.0.0.1:{self.gw_port};transport={t.lower()} SIP/2.0\r\n"
                f"Via: SIP/2.0/{t} {self.host}:{self.port};branch={branch or f'z9hG4bK{method}{call_id}{cseq}'}"
                f";rport\r\nFrom: {frm}\r\nTo: {to}\r\nCall-ID: {call_id}\r\nCSeq: {cseq} {method}\r\n"
                f"Contact: <sip:caller@{self.host}:{self.port};transport={t.lower()}>\r\nMax-Forwards: 70\r\n"
                + ("Content-Type: application/sdp\r\n" if body else "") + f"Content-Length: {len(body)}\r\n\r\n")
        return head.encode() + body


def offer(port: int) -> bytes:
    return (f"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n").encode()


def closed(sock: socket.socket, timeout: float) -> bool:
    """Whether the peer closes ``sock`` within ``timeout`` (reading and dropping what comes)."""
    sock.settimeout(timeout)
    deadline = time.monotonic() + timeout
    with contextlib.suppress(TimeoutError, ssl.SSLError, OSError):
        while time.monotonic() < deadline:
            if not sock.recv(65536):
                return True
        return False
    return True


def call(uac: StreamUac, call_id: str, gw: GatewayProc) -> None:
    media = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    media.bind(("127.0.0.1", 0))
    with contextlib.closing(media):
        uac.send(uac.request("INVITE", call_id, 1, body=offer(media.getsockname()[1])))
        resp = uac.recv()
        while resp.status < 200:
            resp = uac.recv()
        assert resp.status == 200, resp.status
        assert f";transport={uac.transport.lower()}" in resp.get("contact")
        assert resp.top_via.transport == uac.transport
        uac.send(uac.request("ACK", call_id, 1, to=resp.get("to"), branch=f"z9hG4bKack{call_id}"))
        media.settimeout(3)
        assert len(media.recv(2048)) >= 12  # the gateway's RTP flows
        calls = gw.command("calls")
        assert len(calls) == 1
        # we send no RTP: after rtp_timeout_s the gateway hangs up, its BYE on our own connection
        bye = uac.recv(timeout=6)
        assert bye.method == "BYE" and bye.call_id == call_id and bye.top_via.transport == uac.transport
        vias = "".join(f"Via: {v}\r\n" for v in bye.get_all("via"))
        uac.send((f"SIP/2.0 200 OK\r\n{vias}From: {bye.get('from')}\r\nTo: {bye.get('to')}\r\n"
                  f"Call-ID: {bye.call_id}\r\nCSeq: {bye.get('cseq')}\r\nContent-Length: 0\r\n\r\n").encode())


def _sip(tcp: int, tls: int, cert: tuple[str, str], **kw: Any) -> dict[str, Any]:
    return {"rtp_timeout_s": 1.5, "listeners": [
        {"transport": "tcp", "host": "127.0.0.1", "port": tcp},
        {"transport": "tls", "host": "127.0.0.1", "port": tls, "cert_file": cert[0], "key_file": cert[1]}], **kw}


def test_calls_over_tcp_and_tls_are_answered_on_their_connection(short_tmp):
    cert = make_cert(short_tmp)
    tcp, tls = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    with GatewayProc(short_tmp, inbox=True, sip=_sip(tcp, tls, cert)) as gw:
        for port, secure in ((tcp, False), (tls, True)):
            uac = StreamUac(port, tls=secure)
            try:
                call(uac, f"stream-{port}", gw)
                uac.send(b"\r\n\r\n")  # RFC 5626 keepalive ping: one CRLF back
                uac.sock.settimeout(2)
                assert uac.sock.recv(16) == b"\r\n"
            finally:
                uac.close()
        deadline = time.monotonic() + 5
        while gw.command("calls") and time.monotonic() < deadline:
            time.sleep(0.05)
        st = gw.stats()
        assert gw.command("calls") == {} and st["calls_admitted"] == 2
        assert st["sip_stream_accepted_tcp"] == 1 and st["sip_stream_accepted_tls"] == 1
    assert gw.leaked == []


def test_hostile_streams_are_closed_and_cost_nothing(short_tmp):
    cert = make_cert(short_tmp)
    tcp, tls = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    sip = _sip(tcp, tls, cert, max_connections_per_source=4, first_message_s=1.0, tls_handshake_timeout_s=1.0)
    with GatewayProc(short_tmp, inbox=True, sip=sip) as gw:
        # a Content-Length of 10 MB: 513, closed before any body is read
        uac = StreamUac(tcp)
        uac.send(uac.request("INVITE", "big", 1).replace(b"Content-Length: 0", b"Content-Length: 10000000"))
        assert uac.recv().status == 513 and closed(uac.sock, 2)
        uac.close()
        # headers without end: closed once max_message_bytes are buffered
        s = socket.create_connection(("127.0.0.1", tcp), timeout=3)
        with contextlib.suppress(OSError):
            s.sendall(b"INVITE sip:echo@127.0.0.1 SIP/2.0\r\n" + b"X-Filler: aaaaaaaaaaaaaaaaaaaa\r\n" * 2000)
        assert closed(s, 3)
        s.close()
        # garbage instead of a TLS ClientHello, and a handshake that never starts: both closed
        g = socket.create_connection(("127.0.0.1", tls), timeout=3)
        g.sendall(b"INVITE sip:x SIP/2.0\r\n\r\n" * 4)
        assert closed(g, 3)
        g.close()
        stall = socket.create_connection(("127.0.0.1", tls), timeout=3)
        t0 = time.monotonic()
        assert closed(stall, 4) and time.monotonic() - t0 < 3.5
        stall.close()
        # a connection that never sends a message: closed after first_message_s
        quiet = socket.create_connection(("127.0.0.1", tcp), timeout=3)
        assert closed(quiet, 3)
        quiet.close()
        # one source holding its share: the fifth is closed at accept, another source still connects
        held = [socket.create_connection(("127.0.0.1", tcp), timeout=3, source_address=("127.0.0.2", 0))
                for _ in range(4)]
        try:
            time.sleep(0.2)
            extra = socket.create_connection(("127.0.0.1", tcp), timeout=3, source_address=("127.0.0.2", 0))
            assert closed(extra, 2)
            extra.close()
            other = StreamUac(tcp, host="127.0.0.3")
            other.send(b"OPTIONS sip:echo@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TCP 127.0.0.3:5060;branch=z9hG4bKo1\r\n"
                       b"From: <sip:o@127.0.0.3>;tag=o\r\nTo: <sip:echo@127.0.0.1>\r\nCall-ID: o1\r\n"
                       b"CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n")
            assert other.recv().status == 200
            other.close()
        finally:
            for h in held:
                h.close()
        st = gw.stats()
        assert st["calls_admitted"] == 0
        assert st["sip_stream_framing_oversized"] == 1 and st["sip_stream_framing_head_too_long"] == 1
        assert st["sip_refused_source_connections"] >= 1 and st["sip_stream_idle"] >= 1
        deadline = time.monotonic() + 3
        while (gw.stats().get("sip_stream_connections_tcp", 0) or gw.stats().get("sip_stream_connections_tls", 0)) \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        st = gw.stats()
        assert st.get("sip_stream_connections_tcp", 0) == 0 and st.get("sip_stream_connections_tls", 0) == 0
    assert gw.leaked == []


def baresip_conf(conf: Path, cert: tuple[str, str], wav: Path, port: int, answer: bool = False) -> Path:
    """A baresip config dir: a TLS account trusting our certificate; ``answer``: it also listens
    on TLS (port + 1, baresip's rule) with that certificate and answers every call."""
    conf.mkdir()
    both = conf / "cert.pem"  # baresip's sip_certificate: the certificate and its key in one file
    both.write_text(Path(cert[0]).read_text() + Path(cert[1]).read_text())
    rtp_lo = free_port_pair_base(8)
    (conf / "config").write_text(f"""poll_method epoll
sip_listen 127.0.0.1:{port}
sip_cafile {cert[0]}
{f"sip_certificate {both}" if answer else ""}
audio_player aubridge,nowhere
audio_source aufile,{wav}
audio_alert aubridge,nowhere
audio_srate 8000
audio_channels 1
rtp_ports {rtp_lo}-{rtp_lo + 8}
module_path /usr/lib/baresip/modules
module g711.so
module aufile.so
module aubridge.so
module_app account.so
module_app menu.so
""")
    (conf / "accounts").write_text("<sip:bs@127.0.0.1;transport=tls>;regint=0;audio_codecs=PCMU"
                                   + (";answermode=auto" if answer else "") + "\n")
    return conf


@pytest.mark.skipif(not (have("baresip") and have("espeak-ng") and have("sox")), reason="needs baresip, espeak-ng, sox")
def test_baresip_calls_over_tls_and_its_bye_ends_the_call(short_tmp):
    """A real SIP stack over TLS (baresip, verifying our certificate against its CA file)."""
    cert = make_cert(short_tmp)
    fx = make_fixture(short_tmp, "Hello over TLS from baresip. One two three.")
    tls = free_port(socket.SOCK_STREAM)
    # baresip writes its interface's address in the SDP but sends from loopback: latch the first source
    sip = {"rtp_latch": "first", "nat": "signalling_source", "listeners": [
        {"transport": "tls", "host": "127.0.0.1", "port": tls, "cert_file": cert[0], "key_file": cert[1]}]}
    with GatewayProc(short_tmp, inbox=True, gateway={"echo_delay_ms": 300}, sip=sip) as gw:
        conf = baresip_conf(short_tmp / "baresip", cert, fx["wav"], free_port())
        p = subprocess.run(["baresip", "-f", str(conf), "-e", f"/dial sip:echo@127.0.0.1:{tls};transport=tls",
                            "-t", "8"], capture_output=True, text=True, timeout=30)
        assert "Call established" in p.stdout and "incoming rtp for 'audio' established" in p.stdout, \
            p.stdout[-2000:]
        assert "terminated" in p.stdout  # baresip hung up when its file ended: its BYE over TLS
        st = gw.stats()
        assert st["sip_stream_accepted_tls"] == 1 and st["calls_admitted"] == 1 and gw.command("calls") == {}
    assert gw.leaked == []


class TlsPeer:
    """A registrar and callee on TLS (our test certificate): answers REGISTER 200 and INVITE 200
    with SDP on the connection brisvox opened, and records what came (the requests, their Vias)."""

    def __init__(self, cert: tuple[str, str]) -> None:
        import threading

        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(*cert)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.ctx = ctx
        self.requests: list[SipMessage] = []
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def close(self) -> None:
        self.stop.set()
        self.th.join(3)
        self.listener.close()

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                raw, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            try:
                conn = self.ctx.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError):
                raw.close()
                continue
            conn.settimeout(0.2)
            framer = StreamFramer(65536)
            with contextlib.closing(conn):
                while not self.stop.is_set():
                    try:
                        data = conn.recv(65536)
                    except TimeoutError:
                        continue
                    except (OSError, ssl.SSLError):
                        break
                    if not data:
                        break
                    for m in framer.feed(data):
                        if m == b"\r\n\r\n":
                            continue
                        req = parse(m)
                        if not req.is_request:
                            continue
                        self.requests.append(req)
                        if req.method == "ACK":
                            continue
                        body = b""
                        extra = ""
                        if req.method == "INVITE":
                            body = offer(40000)
                            extra = (f"Contact: <sip:callee@127.0.0.1:{self.port};transport=tls>\r\n"
                                     "Content-Type: application/sdp\r\n")
                        elif req.method == "REGISTER":
                            extra = f"Contact: {req.get('contact')};expires=60\r\n"
                        vias = "".join(f"Via: {v}\r\n" for v in req.get_all("via"))
                        to = req.get("to") + ("" if "tag=" in req.get("to") else ";tag=p")
                        conn.sendall((f"SIP/2.0 200 OK\r\n{vias}From: {req.get('from')}\r\nTo: {to}\r\n"
                                      f"Call-ID: {req.call_id}\r\nCSeq: {req.get('cseq')}\r\n{extra}"
                                      f"Content-Length: {len(body)}\r\n\r\n").encode() + body)


def test_brisvox_opens_tls_to_register_and_dial_and_verifies_the_peer(short_tmp, monkeypatch):
    from ipc import frames as F
    from ipc.bus import request_sync

    cert = make_cert(short_tmp)
    peer = TlsPeer(cert)
    tls = free_port(socket.SOCK_STREAM)
    monkeypatch.setenv("BRISVOX_TEST_TLS_TRUNK", "pw")
    trunk = {"name": "secure", "registrar": f"127.0.0.1:{peer.port}", "transport": "tls", "username": "1001",
             "secret_env": "BRISVOX_TEST_TLS_TRUNK", "agent": "echo", "keepalive_s": 1.0}
    sip = {"tls_ca_file": cert[0], "trunks": [trunk], "listeners": [
        {"transport": "tls", "host": "127.0.0.1", "port": tls, "cert_file": cert[0], "key_file": cert[1]}]}
    try:
        with GatewayProc(short_tmp, inbox=True, sip=sip) as gw:
            deadline = time.monotonic() + 8
            while gw.stats().get("sip_trunk_secure_registered") != 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            [reg] = [r for r in peer.requests if r.method == "REGISTER"][:1]
            assert reg.top_via.transport == "TLS" and f":{tls};transport=tls>" in reg.get("contact")
            assert gw.stats()["sip_trunk_secure_registered"] == 1
            reply = request_sync(gw.inbox, F.Command(name="dial", args={
                "target": "5550100", "trunk": "secure", "agent": "echo", "ring_timeout_s": 5}), 15)
            assert isinstance(reply, F.CommandReply) and reply.ok, reply
            invite = next(r for r in peer.requests if r.method == "INVITE")
            assert invite.top_via.transport == "TLS" and "transport=tls" in invite.get("contact")
            assert any(r.method == "ACK" for r in peer.requests)  # the 2xx's ACK on the same connection
            st = gw.stats()
            assert st["sip_stream_connected_tls"] == 1  # one connection reused for REGISTER, INVITE, ACK
            # this peer never answers an RFC 5626 ping: the flow counts as dead, brisvox registers again
            n = len([r for r in peer.requests if r.method == "REGISTER"])
            deadline = time.monotonic() + 5
            while not gw.stats().get("sip_trunk_keepalive_lost") and time.monotonic() < deadline:
                time.sleep(0.05)
            assert gw.stats()["sip_trunk_keepalive_lost"] >= 1
            deadline = time.monotonic() + 3
            while len([r for r in peer.requests if r.method == "REGISTER"]) == n and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len([r for r in peer.requests if r.method == "REGISTER"]) > n
        assert gw.leaked == []
        # without our CA the peer's certificate is not trusted: no connection, nothing sent, the dial
        # fails when its INVITE transaction times out (Timer B, 64 x T1)
        n = len(peer.requests)
        untrusting = {**sip, "tls_ca_file": "", "t1_ms": 40, "trunks": [{**trunk, "register": False}]}
        with GatewayProc(short_tmp, inbox=True, sip=untrusting) as gw2:
            reply = request_sync(gw2.inbox, F.Command(name="dial", args={
                "target": "5550101", "trunk": "secure", "agent": "echo", "ring_timeout_s": 10}), 15)
            assert isinstance(reply, F.CommandReply) and not reply.ok and reply.error == "timeout", reply
            st = gw2.stats()
            assert st["sip_stream_connect_failed"] >= 1 and st.get("sip_stream_connected_tls", 0) == 0
        assert len(peer.requests) == n
    finally:
        peer.close()


def test_a_listener_that_requires_client_certificates_refuses_a_client_without_one(short_tmp):
    cert = make_cert(short_tmp)  # the client presents the same self-signed pair: it is its own CA
    tls = free_port(socket.SOCK_STREAM)
    sip = {"listeners": [{"transport": "tls", "host": "127.0.0.1", "port": tls, "cert_file": cert[0],
                          "key_file": cert[1], "client_ca_file": cert[0], "require_client_cert": True}]}
    options = (b"OPTIONS sip:echo@127.0.0.1 SIP/2.0\r\nVia: SIP/2.0/TLS 127.0.0.1:5061;branch=z9hG4bKc1\r\n"
               b"From: <sip:o@127.0.0.1>;tag=o\r\nTo: <sip:echo@127.0.0.1>\r\nCall-ID: c1\r\n"
               b"CSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n")
    with GatewayProc(short_tmp, inbox=True, sip=sip) as gw:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        raw = socket.create_connection(("127.0.0.1", tls), timeout=3)
        with contextlib.suppress(ssl.SSLError, OSError):  # TLS 1.3: the refusal may come after the handshake
            anon = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
            anon.sendall(options)
            assert closed(anon, 3)
        raw.close()
        ctx.load_cert_chain(*cert)
        good = socket.create_connection(("127.0.0.1", tls), timeout=3)
        with ctx.wrap_socket(good, server_hostname="127.0.0.1") as s:
            s.sendall(options)
            s.settimeout(3)
            assert s.recv(4096).startswith(b"SIP/2.0 200")
        assert gw.stats()["sip_stream_accepted_tls"] == 1  # only the client with a certificate


@pytest.mark.skipif(not (have("baresip") and have("espeak-ng") and have("sox")), reason="needs baresip, espeak-ng, sox")
def test_dial_over_tls_to_baresip_verifies_it_and_is_answered(short_tmp):
    """brisvox dials baresip over TLS (sip:...;transport=tls, baresip's certificate checked against
    tls_ca_file); baresip answers, hears RTP and hangs up."""
    from ipc import frames as F
    from ipc.bus import request_sync

    cert = make_cert(short_tmp)
    fx = make_fixture(short_tmp, "Hello over TLS from baresip. One two three.")
    tls, bport = free_port(socket.SOCK_STREAM), free_port(socket.SOCK_STREAM)
    sip = {"rtp_latch": "first", "nat": "signalling_source", "tls_ca_file": cert[0], "listeners": [
        {"transport": "tls", "host": "127.0.0.1", "port": tls, "cert_file": cert[0], "key_file": cert[1]}]}
    with GatewayProc(short_tmp, inbox=True, gateway={"echo_delay_ms": 300}, sip=sip) as gw:
        conf = baresip_conf(short_tmp / "baresip", cert, fx["wav"], bport, answer=True)
        bs = subprocess.Popen(["baresip", "-f", str(conf), "-t", "10"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        try:
            time.sleep(1.5)
            reply = request_sync(gw.inbox, F.Command(name="dial", args={
                "target": f"sip:bs@127.0.0.1:{bport + 1};transport=tls", "agent": "echo", "ring_timeout_s": 8}), 45)
            out, _ = bs.communicate(timeout=25)
        finally:
            if bs.poll() is None:
                bs.kill()
                bs.wait(5)
        assert isinstance(reply, F.CommandReply) and reply.ok, (reply, out[-1500:])
        assert "Call established" in out and "incoming rtp for 'audio' established" in out, out[-1500:]
        assert gw.stats()["sip_stream_connected_tls"] == 1
    assert gw.leaked == []
