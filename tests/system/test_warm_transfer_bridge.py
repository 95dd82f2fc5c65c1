"""Warm transfer's gateway side over real SIP: the real gateway process, SIPp as the caller
(an inbound call) and as the person consulted (the consult leg's callee), on loopback, and
this test as the agent process.

The agent side (the ``warm_transfer`` tool and the consult actor) is not driven here: this
test speaks its frames itself through the agent link (a FakeAgent on ZeroMQ): SIPp calls the
gateway, the test dials the consult leg with ``consult_for`` and a summary (its CallStart must
carry them), sends the consult leg's ConsultVerdict (it must come back as ConsultResult for
the caller), then Bridge. From then on the caller's RTP (a speech fixture in mu-law) must
reach the person bit-exact and the person's reach the caller; when the person hangs up, the
gateway must hang the caller up (BYE, ``bridge_ended``), and the ``transfers`` command must
show both legs with their times.
"""

from __future__ import annotations

import re
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from brisvox.wire.g711 import ulaw_decode
from ipc import frames as F
from tests.system.gateway_harness import (
    FakeAgent,
    GatewayProc,
    free_port,
    free_port_pair_base,
    have,
    make_fixture,
    wait_for,
)
from tests.system.test_sip_outbound import answered_then_bye

pytestmark = [pytest.mark.system,
              pytest.mark.skipif(not (have("sipp") and have("espeak-ng") and have("sox")),
                                 reason="needs sipp, espeak-ng and sox")]


def caller_until_bye(media_port: int) -> str:
    """A SIPp caller: INVITE (SDP naming ``media_port``, this test's socket), the answer ACKed,
    then it waits for the gateway's BYE and answers it."""
    from bench.harness import sipp as S

    ok = ("      SIP/2.0 200 OK\n      [last_Via:]\n      [last_From:]\n      [last_To:]\n"
          "      [last_Call-ID:]\n      [last_CSeq:]\n      Content-Length: 0")
    return S.scenario(S.invite_answered(str(media_port)) + '  <recv request="BYE" timeout="40000"/>\n'
                      + S.send(ok, False), name="caller")


def run_caller(tmp: Path, scen: str, gateway_sip: str, port: int, timeout: int = 60) -> subprocess.Popen[str]:
    """SIPp calling the gateway from ``port``, logging its messages (the gateway's SDP answer)."""
    path = tmp / f"caller-{port}.xml"
    path.write_text(scen)
    args = ["sipp", "-sf", str(path), "-m", "1", "-s", "default", gateway_sip, "-i", "127.0.0.1",
            "-p", str(port), "-mi", "127.0.0.1", "-mp", str(free_port_pair_base(4)), "-timeout", f"{timeout}s",
            "-timeout_error", "-nostdin", "-trace_msg", "-message_file", str(tmp / f"callee-msg-{port}.log"),
            "-trace_err", "-error_file", str(tmp / f"caller-err-{port}.log")]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def run_callee(tmp: Path, scen: str, port: int, timeout: int = 60) -> subprocess.Popen[str]:
    """SIPp as a callee on ``port``, logging the messages it gets (the gateway's SDP offer)."""
    path = tmp / f"callee-{port}.xml"
    path.write_text(scen)
    args = ["sipp", "-sf", str(path), "-m", "1", "-i", "127.0.0.1", "-p", str(port),
            "-mi", "127.0.0.1", "-mp", str(free_port_pair_base(4)), "-timeout", f"{timeout}s",
            "-timeout_error", "-nostdin", "-trace_msg", "-message_file", str(tmp / f"callee-msg-{port}.log"),
            "-trace_err", "-error_file", str(tmp / f"callee-err-{port}.log")]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def gateway_rtp_port(tmp: Path, port: int, ours: int) -> int:
    """The RTP port the gateway's SDP (its offer to a callee, its answer to a caller) names in
    the messages SIPp on ``port`` logged (``ours``: the port our own SDP names)."""
    log = (tmp / f"callee-msg-{port}.log").read_text(errors="replace")
    theirs = [int(p) for p in re.findall(r"m=audio (\d+) ", log) if int(p) != ours]
    assert theirs, "no SDP of the gateway in SIPp's log"
    return theirs[0]


class Media:
    """One callee's RTP: sends ``payload`` (mu-law) in 20 ms packets once told to, to the address
    the gateway's RTP comes from, and keeps every payload the gateway sends."""

    def __init__(self, fill: int) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.01)
        self.port = self.sock.getsockname()[1]
        self.fill = bytes([fill]) * 160  # what it says when it has nothing to play (a keep-alive)
        self.got = bytearray()
        self.peer: tuple[str, int] | None = None
        self.payload = b""
        self.heard: list[tuple[float, bytes]] = []  # (monotonic arrival, payload) of each mu-law packet
        self.events: list[bytes] = []  # RFC 4733 payloads queued by dtmf(), sent on the grid before audio
        self.play = threading.Event()
        self.played = threading.Event()
        self.stop = threading.Event()
        self.th = threading.Thread(target=self._run, daemon=True)
        self.th.start()

    def _run(self) -> None:
        seq, ts, pos, event_ts = 1, 0, 0, 0
        next_at = time.monotonic()
        while not self.stop.is_set():
            try:
                data, addr = self.sock.recvfrom(2048)
                if len(data) > 12 and data[0] >> 6 == 2 and (data[1] & 0x7F) == 0:
                    self.peer = addr
                    self.got += data[12:]
                    self.heard.append((time.monotonic(), data[12:]))
            except TimeoutError:
                pass
            except OSError:
                return
            now = time.monotonic()
            if self.peer is None:
                next_at = now  # the 20 ms grid starts with the first packet
                continue
            if now < next_at:
                continue
            next_at += 0.02
            if self.events:  # one RFC 4733 event: its packets share the timestamp of its start
                event = self.events.pop(0)
                first = event[2:4] == b"\x00\xa0"
                event_ts = ts if first else event_ts
                self.sock.sendto(struct.pack("!BBHII", 0x80, 101 | (0x80 if first else 0), seq & 0xFFFF, event_ts,
                                             0x5EED0000 + self.port) + event, self.peer)
                seq, ts = seq + 1, ts + 160
                continue
            if self.play.is_set() and pos < len(self.payload):
                chunk, pos = self.payload[pos:pos + 160], pos + 160
                if pos >= len(self.payload):
                    self.played.set()
            else:
                chunk = self.fill
            self.sock.sendto(struct.pack("!BBHII", 0x80, 0, seq & 0xFFFF, ts, 0x5EED0000 + self.port) + chunk,
                             self.peer)
            seq, ts = seq + 1, ts + 160

    def dtmf(self, digit: str) -> None:
        """Press ``digit`` (0-9): an RFC 4733 event of 100 ms on the RTP stream, its end sent 3 times."""
        code = int(digit)
        self.events += [struct.pack("!BBH", code, 10, 160 * k) for k in range(1, 6)]
        self.events += [struct.pack("!BBH", code, 0x80 | 10, 800)] * 3

    def close(self) -> None:
        self.stop.set()
        self.th.join(2)
        self.sock.close()


def contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    """``needle`` occurs in ``haystack`` as one contiguous run, sample for sample."""
    if len(needle) == 0 or len(haystack) < len(needle):
        return False
    for start in np.flatnonzero(haystack[: len(haystack) - len(needle) + 1] == needle[0]):
        if np.array_equal(haystack[start:start + len(needle)], needle):
            return True
    return False


def relayed(heard: list[np.ndarray], sent: np.ndarray) -> tuple[int, int]:
    """``(arrived, missing)``: of the 20 ms frames of ``sent`` that are not silence, how many
    are among the ``heard`` frames sample for sample and in order (each after the one before),
    and how many are not. The relay moves whole frames from a frame boundary on (the bridge's
    position; a lag drop keeps the last frame), so an arrived frame is one heard frame."""
    arrived = missing = 0
    j = 0
    for i in range(0, len(sent) - 159, 160):
        frame = sent[i:i + 160]
        if not frame.any():
            continue  # silence: the leg's own silence looks the same
        k = next((k for k in range(j, len(heard)) if np.array_equal(heard[k], frame)), None)
        if k is None:
            missing += 1
        else:
            arrived, j = arrived + 1, k + 1
    return arrived, missing


def command(agent: FakeAgent, args: dict, n: int, timeout: float = 20.0) -> F.CommandReply:
    """A ``dial`` Command from the agent process; its reply (the ``n``-th CommandReply)."""
    agent.send(F.Command(name="dial", args=args))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        replies = agent.of(F.CommandReply)
        if len(replies) >= n:
            return replies[n - 1]
        time.sleep(0.02)
    raise AssertionError(f"no reply to dial {args}")


@pytest.mark.serial_light
def test_warm_transfer_bridges_two_sip_legs_bit_exact_and_the_persons_bye_ends_the_caller(short_tmp: Path):
    speech = make_fixture(short_tmp)["ulaw"].read_bytes()[: 160 * 100]  # 2 s of speech
    caller_media, person_media = Media(0xFF), Media(0xFE)
    caller_port, person_port = free_port(), free_port()
    with FakeAgent(short_tmp) as agent, \
            GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint}) as gw:
        person_sipp = run_callee(short_tmp, answered_then_bye(person_media.port, 9000), person_port, timeout=60)
        caller_sipp = run_caller(short_tmp, caller_until_bye(caller_media.port), f"127.0.0.1:{gw.sip_port}",
                                 caller_port)
        try:
            caller_id = agent.wait_for(F.CallStart, timeout=10).call_id  # the caller's inbound call
            assert wait_for(lambda: caller_id in gw.command("calls"), 5)
            time.sleep(0.3)  # its ACK, and SIPp's log of the answer
            caller_media.peer = ("127.0.0.1", gateway_rtp_port(short_tmp, caller_port, caller_media.port))
            # a summary with CR/LF is refused before anything is sent
            bad = command(agent, {"target": f"sip:person@127.0.0.1:{person_port}", "agent": "default",
                                  "consult_for": caller_id, "summary": "x\r\nX-Evil: 1"}, 1)
            assert not bad.ok and "control characters" in bad.error
            reply = command(agent, {"target": f"sip:person@127.0.0.1:{person_port}", "agent": "default",
                                    "ring_timeout_s": 10, "consult_for": caller_id,
                                    "summary": "Anna wants a refund for order 12"}, 2)
            assert reply.ok, (reply.error, gw.stderr())
            consult_id = reply.data["call_id"]
            person_media.peer = ("127.0.0.1", gateway_rtp_port(short_tmp, person_port, person_media.port))
            start = agent.wait_for(F.CallStart, lambda f: f.call_id == consult_id)
            assert start.consult_for == caller_id and start.consult_summary == "Anna wants a refund for order 12"
            assert agent.wait_for(F.CallStart, lambda f: f.call_id == caller_id).consult_for == ""

            agent.send(F.ConsultVerdict(call_id=consult_id, accepted=True, detail="said yes"))
            result = agent.wait_for(F.ConsultResult)
            assert (result.call_id, result.consult_id, result.outcome) == (caller_id, consult_id, "accepted")

            agent.send(F.Bridge(call_id=caller_id, other=consult_id))
            bridged = agent.wait_for(F.BridgeResult)
            assert bridged.ok, bridged.detail
            ends = [agent.wait_for(F.CallEnd, lambda f, c=c: f.call_id == c) for c in (caller_id, consult_id)]
            assert {e.reason for e in ends} == {"bridged"}
            for c in (caller_id, consult_id):  # the agents detach; the legs stay up
                agent.send(F.CallEnded(call_id=c, reason="bridged"))
            calls = gw.command("calls")
            assert calls[caller_id]["bridged_with"] == consult_id and calls[consult_id]["bridged_with"] == caller_id
            assert gw.stats()["bridged_calls_active"] == 2

            # the caller speaks the fixture, the person speaks it too: each hears the other's exactly
            caller_media.payload = speech
            person_media.payload = speech[::-1]
            caller_media.play.set()
            person_media.play.set()
            assert caller_media.played.wait(5) and person_media.played.wait(5)
            time.sleep(0.3)  # the last packets through the bridge
            sent_by_caller = ulaw_decode(speech)
            sent_by_person = ulaw_decode(speech[::-1])
            assert contains(ulaw_decode(bytes(person_media.got)), sent_by_caller), "caller -> person not bit-exact"
            assert contains(ulaw_decode(bytes(caller_media.got)), sent_by_person), "person -> caller not bit-exact"

            # the person's BYE (SIPp, after 9 s) ends the caller's leg too
            out, err = person_sipp.communicate(timeout=30)
            assert person_sipp.returncode == 0, (out[-2000:], err[-2000:])
            out, err = caller_sipp.communicate(timeout=30)
            assert caller_sipp.returncode == 0, (out[-2000:], err[-2000:], gw.stderr())
            assert wait_for(lambda: not ({caller_id, consult_id} & set(gw.command("calls"))), 10)
            st = gw.stats()
            assert st["bridges_ok"] == 1 and st["bridged_calls_active"] == 0
            assert st["consult_legs_placed"] == 1 and st["consult_verdicts_accepted"] == 1
            assert st["consult_dials_refused_summary"] == 1
            record = gw.command("transfers")["transfers"][-1]
            legs = record["legs"]
            assert record["caller"] == caller_id and set(legs) == {caller_id, consult_id}
            assert legs[caller_id]["end_reason"] == "bridge_ended"
            assert legs[consult_id]["verdict"] == "accepted"
            for leg in legs.values():
                t = leg["times"]
                assert t["admitted"] <= t["answered"] <= t["bridged"] <= t["ended"]
        finally:
            for p in (caller_sipp, person_sipp):
                if p.poll() is None:
                    p.kill()
                    p.wait(5)
            caller_media.close()
            person_media.close()
