"""SIP/RTP against the real gateway process with real peers on loopback: SIPp (bit-exact
audio into the ``in`` ring, a 50-call load with no leaks, hold/unhold, DTMF both
ways of signalling, REFER, BYE both ways) and baresip (echo agent round trip)."""

from __future__ import annotations

import glob
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import soundfile as sf

from bench.harness import sipp as S
from ipc import frames as F
from tests.system.gateway_harness import (
    FakeAgent,
    GatewayProc,
    attached_ring,
    correlate,
    free_port,
    free_port_pair_base,
    have,
    make_fixture,
)

pytestmark = [pytest.mark.system,
              pytest.mark.skipif(not (have("sipp") and have("espeak-ng") and have("sox")),
                                 reason="needs sipp (sip-tester), espeak-ng and sox")]

DTMF_PCAP = "/usr/share/sip-tester/dtmf_2833_1.pcap"


def sip_target(gw: GatewayProc) -> str:
    return f"127.0.0.1:{gw.sip_port}"


def wait_until(pred, timeout: float = 5.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def udp_exchange(port: int, data: bytes, timeout: float = 1.0) -> bytes | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        s.settimeout(timeout)
        s.sendto(data, ("127.0.0.1", port))
        try:
            return s.recv(65535)
        except TimeoutError:
            return None


def raw_request(method: str, port: int, *, body: bytes = b"", extra: str = "", cl: int | None = None,
                local: int = 5099) -> bytes:
    head = (f"{method} sip:echo@127.0.0.1:{port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP 127.0.0.1:{local};branch=z9hG4bK{time.monotonic_ns()};rport\r\n"
            "From: <sip:t@127.0.0.1>;tag=abc\r\nTo: <sip:echo@127.0.0.1>\r\n"
            f"Call-ID: {time.monotonic_ns()}@test\r\nCSeq: 1 {method}\r\nMax-Forwards: 70\r\n{extra}"
            f"Content-Length: {len(body) if cl is None else cl}\r\n\r\n")
    return head.encode() + body


def status_of(resp: bytes | None) -> int:
    assert resp is not None, "no response"
    return int(resp.split(b" ", 2)[1])


def test_sipp_rtp_stream_is_bit_exact_in_the_in_ring_and_malformed_sip_is_isolated(short_tmp):
    fx = make_fixture(short_tmp)
    ref = np.fromfile(fx["ref"], dtype="<i2")
    play_ms = len(ref) // 8 + 600
    with GatewayProc(short_tmp, inbox=True) as gw:
        got: dict[str, np.ndarray] = {}

        def reader() -> None:
            with attached_ring(gw.instance, "in") as ring:
                wait_until(lambda: ring.write_pos >= len(ref), timeout=play_ms / 1000 + 5)
                got["in"] = ring.read_range(0, ring.write_pos).samples.copy()

        th = threading.Thread(target=reader)
        th.start()
        result: dict[str, subprocess.CompletedProcess[str]] = {}
        sipp = threading.Thread(target=lambda: result.setdefault("r", S.run_sipp(
            short_tmp, S.rtp_stream_call(fx["ulaw"], play_ms), sip_target(gw),
            media_port=free_port_pair_base(4), local_port=free_port())))
        sipp.start()
        time.sleep(1.0)
        # malformed SIP while the call streams: counted, answered where possible, call unaffected
        port = gw.sip_port
        assert udp_exchange(port, b"\x00\xffgarbage\r\n\r\n", 0.3) is None
        assert udp_exchange(port, b"hello there\r\n\r\n", 0.3) is None
        assert udp_exchange(port, b"INVITE sip:x@y SIP/2.0\r\nVia: SIP/2.0/UDP 127.0.0.1:1\r\n", 0.3) is None
        assert status_of(udp_exchange(port, raw_request("OPTIONS", port, body=b"x", cl=10_000_000))) == 400
        assert status_of(udp_exchange(port, raw_request("FOOBAR", port))) == 501
        assert status_of(udp_exchange(port, raw_request("REGISTER", port))) == 405
        assert status_of(udp_exchange(port, raw_request("OPTIONS", port))) == 200
        assert status_of(udp_exchange(port, raw_request(
            "INVITE", port, body=b"v=0\r\nm=audio 4000 RTP/AVP 18\r\nc=IN IP4 127.0.0.1\r\n",
            extra="Content-Type: application/sdp\r\n"))) in (100, 488)
        sipp.join(60)
        th.join(10)
        r = result["r"]
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        assert np.array_equal(got["in"][: len(ref)], ref), "in-ring samples differ from the fixture"
        assert len(got["in"]) == len(ref)
        stats = gw.stats()
        assert stats["sip_malformed_garbage"] >= 1 and stats["sip_malformed_truncated"] >= 1
        assert stats["sip_malformed_bad_encoding"] >= 1
        assert stats["sip_malformed_bad_content_length"] >= 1 and stats["sip_refused_unknown_method"] >= 1
        assert stats["sip_invite_488"] >= 1
        assert wait_until(lambda: gw.stats()["calls_active"] == 0)
    assert gw.leaked == []


def test_sipp_load_50_concurrent_calls_no_leaks(short_tmp):
    fx = make_fixture(short_tmp, "Load test.")
    # 50 INVITEs in half a second from one loopback caller: above the default per-source rate
    with GatewayProc(short_tmp, inbox=True, gateway={"max_calls": 64}, sip={"invite_rate": ["1000/second"]}) as gw:
        proc = psutil.Process(gw.proc.pid)
        fds_before = proc.num_fds()
        peak: list[int] = []

        def watch() -> None:
            while not done.is_set():
                try:
                    peak.append(gw.stats(2.0)["calls_active"])
                except Exception:
                    pass
                time.sleep(0.2)

        done = threading.Event()
        w = threading.Thread(target=watch)
        w.start()
        r = S.run_sipp(short_tmp, S.load_call(fx["ulaw"], 3000), sip_target(gw), calls=50, rate=100,
                       limit=50, media_port=free_port_pair_base(4), local_port=free_port(), timeout=60,
                       extra=["-rp", "1000"])
        done.set()
        w.join()
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert max(peak) >= 40, f"calls were not concurrent: peak {max(peak)}"
        assert wait_until(lambda: gw.stats()["calls_active"] == 0, 5)
        stats = gw.stats()
        assert stats["calls_admitted"] == 50 and stats["calls_released"] == 50
        assert stats["sip_dialogs"] == 0
        assert stats["call_packets_in_total"] >= 50 * 40
        assert gw.segments() == []
        assert proc.num_fds() <= fds_before + 2  # every RTP socket closed
    assert gw.leaked == []


def test_sipp_hold_dtmf_refer_and_gateway_bye(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, peers={"agent-0": agent.endpoint}) as gw:
        result: dict[str, subprocess.CompletedProcess[str]] = {}
        sipp = threading.Thread(target=lambda: result.setdefault("r", S.run_sipp(
            short_tmp, S.features_call(DTMF_PCAP, refer_summary='"Anna: refund X-Evil: 1 [\\\\]"now[\\\\]""'),
            sip_target(gw), service="sales",
            media_port=free_port_pair_base(4), local_port=free_port(), timeout=30)))
        sipp.start()
        start = agent.wait_for(F.CallStart, timeout=10)
        assert start.transport == "sip" and start.agent == "default" and start.call_rate == 8000
        digits = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len(digits) < 3:
            digits = [d.digit for d in agent.of(F.Dtmf)]
            time.sleep(0.05)
        # RFC 4733 from the pcap, then SIP INFO dtmf-relay and dtmf (a malformed one is refused 400)
        assert digits == ["1", "9", "7"], digits
        # the summary's CR/LF cannot start a header of its own: one quoted, escaped line
        agent.send(F.Transfer(call_id=start.call_id, target="sip:queue@127.0.0.1",
                              summary='Anna: refund\r\nX-Evil: 1 "now"'))
        res = agent.wait_for(F.TransferResult, timeout=10)
        assert res.ok, res.detail
        end = agent.wait_for(F.CallEnd, timeout=10)
        assert end.reason == "transferred"
        agent.send(F.CallEnded(call_id=start.call_id, reason="ended"))
        sipp.join(30)
        r = result["r"]
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
        assert wait_until(lambda: gw.segments() == [], 5)


@pytest.mark.serial_light  # echo delay within 250-450 ms
@pytest.mark.skipif(not have("baresip"), reason="baresip not installed")
def test_baresip_call_to_the_echo_agent_correlates(short_tmp):
    fx = make_fixture(short_tmp, "Hello from baresip. The echo should say this back, one two three.")
    # baresip writes its interface's address in the SDP (outside [sip] allow) but sends from loopback:
    # a NAT'd peer's setup, RTP to the signalling source and latched on its first packet
    with GatewayProc(short_tmp, gateway={"echo_delay_ms": 300},
                     sip={"rtp_latch": "first", "nat": "signalling_source"}) as gw:
        conf = short_tmp / "baresip"
        conf.mkdir()
        rtp_lo = free_port_pair_base(8)
        (conf / "config").write_text(f"""poll_method epoll
sip_listen 127.0.0.1:{free_port()}
audio_player aubridge,nowhere
audio_source aufile,{fx['wav']}
audio_alert aubridge,nowhere
audio_srate 8000
audio_channels 1
rtp_ports {rtp_lo}-{rtp_lo + 8}
module_path /usr/lib/baresip/modules
module g711.so
module aufile.so
module aubridge.so
module sndfile.so
snd_path {conf}
module_app account.so
module_app menu.so
""")
        (conf / "accounts").write_text("<sip:bs@127.0.0.1>;regint=0;audio_codecs=PCMU\n")
        p = subprocess.run(["baresip", "-f", str(conf), "-e", f"/dial sip:echo@127.0.0.1:{gw.sip_port}", "-t", "12"],
                           capture_output=True, text=True, timeout=30)
        assert "Call established" in p.stdout, p.stdout[-2000:]
        enc = glob.glob(str(conf / "dump-*-enc.wav"))
        dec = glob.glob(str(conf / "dump-*-dec.wav"))
        assert enc and dec
        sent, _ = sf.read(enc[0], dtype="int16")
        got, _ = sf.read(dec[0], dtype="int16")
        delay_ms, corr = correlate(sent, got)
        print(f"baresip echo: delay {delay_ms:.1f} ms, correlation {corr:.4f}")
        Path(short_tmp / "delay.txt").write_text(f"{delay_ms}")
        assert corr > 0.9
        assert 250 <= delay_ms <= 450


def healthz(port: int) -> tuple[int, bytes, bytes]:
    """``GET /healthz`` on the WebSocket listener: (status, head, body); the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), head, body


def test_full_and_draining_answer_options_healthz_and_invite_with_503(short_tmp):
    import os
    import signal

    from brisvox.wire.sip_message import parse

    sdp_body = b"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\nm=audio 4000 RTP/AVP 0\r\n"

    def options() -> tuple[int, str, str]:
        resp = udp_exchange(port, raw_request("OPTIONS", port))
        assert resp is not None, "no answer to OPTIONS"
        m = parse(resp)
        return m.status, m.reason, m.get("retry-after")

    with GatewayProc(short_tmp, inbox=True, gateway={"max_calls": 1}) as gw:
        port, ws = gw.sip_port, gw.ws_port
        assert options() == (200, "OK", "")
        assert healthz(ws)[::2] == (200, b"ok\n")
        # the one call the gateway takes: OPTIONS and /healthz say full while it lasts
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            s.settimeout(2)
            invite = raw_request("INVITE", port, body=sdp_body, extra="Content-Type: application/sdp\r\n"
                                 "Contact: <sip:t@127.0.0.1>\r\n", local=s.getsockname()[1])
            s.sendto(invite, ("127.0.0.1", port))
            ok = parse(s.recv(65535))
            while ok.status < 200:
                ok = parse(s.recv(65535))
            assert ok.status == 200
            inv = parse(invite)
            dialog = (f"From: {inv.get('from')}\r\nTo: {ok.get('to')}\r\nCall-ID: {inv.call_id}\r\n"
                      "Max-Forwards: 70\r\nContent-Length: 0\r\n\r\n")
            via = f"Via: SIP/2.0/UDP 127.0.0.1:{s.getsockname()[1]};rport;branch=z9hG4bK{time.monotonic_ns()}"
            s.sendto(f"ACK sip:brisvox@127.0.0.1:{port} SIP/2.0\r\n{via}a\r\nCSeq: 1 ACK\r\n{dialog}".encode(),
                     ("127.0.0.1", port))
            assert options() == (503, "Full", "10")
            status, head, body = healthz(ws)
            assert (status, body) == (503, b"full\n") and b"Retry-After: 10" in head and b"Connection: close" in head
            s.sendto(f"BYE sip:brisvox@127.0.0.1:{port} SIP/2.0\r\n{via}b\r\nCSeq: 2 BYE\r\n{dialog}".encode(),
                     ("127.0.0.1", port))
            bye_ok = parse(s.recv(65535))
            while bye_ok.cseq[1] != "BYE":  # a 200 to the INVITE retransmitted before our ACK came
                bye_ok = parse(s.recv(65535))
            assert bye_ok.status == 200
        assert wait_until(lambda: options()[0] == 200, 3)
        assert healthz(ws)[0] == 200
        os.kill(gw.proc.pid, signal.SIGUSR1)  # the standalone gateway drains on SIGUSR1
        assert wait_until(lambda: options()[0] == 503, 3)
        assert options() == (503, "Draining", "30")
        status, head, body = healthz(ws)
        assert (status, body) == (503, b"draining\n") and b"Retry-After: 30" in head
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.1", 0))
            s.settimeout(2)
            s.sendto(raw_request("INVITE", port, body=sdp_body, extra="Content-Type: application/sdp\r\n"),
                     ("127.0.0.1", port))
            answers = [parse(s.recv(65535))]
            while answers[-1].status < 200:
                answers.append(parse(s.recv(65535)))
        assert [a.status for a in answers] == [100, 503] and answers[-1].get("retry-after") == "30"
        st = gw.stats()
        assert st["calls_refused_draining"] == 1 and "calls_refused_full" not in st
        assert st["sip_options_full"] >= 1 and st["sip_options_draining"] >= 2
        assert st["ws_healthz"] == 4 and st["ws_healthz_unavailable"] == 2
