"""Hold and early media through the whole daemon (gateway, worker, agent process), SIPp as the peer.

* Early media: ``brisvoxd dial`` calls a SIPp callee that answers 180, then 183 with SDP and
  plays a pcap of speech (SIPp's ``play_pcap_audio``), then 200 after the pcap ended. While
  the call is in early media the gateway counts the callee's packets on the call and has sent
  none (the agent, whose file has a greeting, said nothing); after the 200 the greeting goes
  out. ``brisvoxd dial --json`` and the call record's ``media.dial`` hold the ringing,
  progress and answer times in that order; the record says the call started ``early`` and was
  ``answered``; the announcement reached the agent's VAD (the pump's muted events) and opened
  no turn.
* Hold: a SIPp caller puts its call on hold (re-INVITE ``a=sendonly``) while the agent's
  6 s greeting plays, and takes it off (``a=sendrecv``); its SDP names this test's RTP socket,
  which sends silence, speech as music on hold while held, and speech once after. The gateway
  sends that socket no RTP while held, and RTP again after (the agent answers the caller's
  speech); the record has ``held`` then ``answered``, one hold, the greeting cut where the
  caller stopped hearing it (a hold, not a barge-in), and every user turn ended after the
  resume (the music on hold opened none).
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.harness import sipp as S
from bench.harness.daemon import Daemon, agents_config, cli, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.wire.g711 import CODECS
from ipc.bus import RequestTimeout, endpoint, request_sync
from ipc.frames import Command, CommandReply
from tests.system.gateway_harness import free_port, free_port_pair_base, have, rtp_range

PCAP = Path("/usr/share/sip-tester/g711a.pcap")  # 7 s of speech, PCMA, 30 ms packets (SIPp's sample)
GREETING = "Hello, this is brisvox calling about your order."

pytestmark = [pytest.mark.system, pytest.mark.timeout(240),
              pytest.mark.skipif(not have("sipp") or not PCAP.exists(), reason="needs sipp (sip-tester)")]

LONG_GREETING = ("Hello, this is brisvox calling about your order. It is ready, and I can tell you "
                 "when and where to pick it up, or book a delivery for tomorrow morning.")


def agent_file(name: str, greeting: str, answer_ms: int) -> str:
    """A scripted agent: every utterance is ``answer_ms`` of tone carrying its words."""
    return f"""name = "{name}"
system_prompt = "Scripted agent."
greeting = "{greeting}"

[stt]
provider = "scripted_stt"
[stt.options]
text = "hello"

[llm]
provider = "scripted"
[llm.options]
fallback = "I see."

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = {answer_ms}
"""


def daemon(tmp: Path) -> Daemon:
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "callee.toml").write_text(agent_file("callee", GREETING, 600))
    (agents / "holder.toml").write_text(agent_file("holder", LONG_GREETING, 6000))  # a greeting 6 s long
    lo, hi = rtp_range(100)
    sip = f"port = 0\nrtp_port_min = {lo}\nrtp_port_max = {hi}\nusers = {{ callee = \"callee\", holder = \"holder\" }}"
    extra = agents_config(agents, tmp / "records", default_agent="callee", sip=sip)
    return Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)


def gateway(d: Daemon, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    try:
        reply = request_sync(endpoint(d.run_dir, "gateway-0"), Command(name=name, args=args), 3.0)
    except RequestTimeout:
        return {}
    assert isinstance(reply, CommandReply)
    return dict(reply.data or {})


def sip_port(d: Daemon) -> int:
    gw = d.child(d.status(), "gateway-0")
    return int(gw["endpoints"]["sip"].rsplit(":", 1)[1])


def record(d: Daemon, tmp: Path) -> dict[str, Any]:
    d.wait_for(lambda s: any(r["transport"] == "sip" for r in read_records(tmp / "records")), 30, "the call record")
    return next(r for r in read_records(tmp / "records") if r["transport"] == "sip")


def pcap_speech() -> np.ndarray:
    """The pcap's audio as 8 kHz PCM (its RTP payloads, PCMA, decoded)."""
    data = PCAP.read_bytes()
    off, out = 24, []
    while off + 16 <= len(data):
        incl = struct.unpack("<I", data[off + 8:off + 12])[0]
        pkt = data[off + 16:off + 16 + incl]
        off += 16 + incl
        out.append(CODECS["PCMA"].decode(pkt[42 + 12:]))  # Ethernet, IPv4, UDP, RTP headers
    return np.concatenate(out)


def _sdp(direction: str, port: str = "[media_port]", pt: int = 8) -> str:
    name = "PCMA" if pt == 8 else "PCMU"
    return "\n".join(f"      {line}" for line in (
        "v=0", "o=peer 1 1 IN IP4 127.0.0.1", "s=-", "c=IN IP4 127.0.0.1", "t=0 0",
        f"m=audio {port} RTP/AVP {pt} 101", f"a=rtpmap:{pt} {name}/8000",
        "a=rtpmap:101 telephone-event/8000", f"a={direction}"))


_RESP = """      SIP/2.0 {status}
      [last_Via:]
      [last_From:]
      [last_To:];tag=[pid]SIPpTag01[call_number]
      [last_Call-ID:]
      [last_CSeq:]
      Contact: <sip:callee@[local_ip]:[local_port]>"""
_BODY = "\n      Content-Type: application/sdp\n      Content-Length: [len]\n\n"


# SIPp as a callee hanging up: its BYE in the dialog the INVITE opened (``from_hdr``: the INVITE's From)
CALLEE_BYE = """      BYE sip:brisvox@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:callee@[local_ip]:[local_port]>;tag=[pid]SIPpTag01[call_number]
      To:[$from_hdr]
      [last_Call-ID:]
      CSeq: 2 BYE
      Contact: <sip:callee@[local_ip]:[local_port]>
      Max-Forwards: 70
      Content-Length: 0"""


def early_media_callee(early_ms: int, talk_ms: int) -> str:
    """SIPp as the callee: 180, 183 with SDP and the pcap played, 200 ``early_ms`` later, its BYE
    ``talk_ms`` after the ACK."""
    invite = ('  <recv request="INVITE">\n    <action>\n'
              '      <ereg regexp=".*" search_in="hdr" header="From:" check_it="true" assign_to="from_hdr"/>\n'
              '    </action>\n  </recv>\n')
    bye = CALLEE_BYE
    return S.scenario(
        invite
        + S.send(_RESP.format(status="180 Ringing") + "\n      Content-Length: 0", False)
        + '  <pause milliseconds="400"/>\n'
        + S.send(_RESP.format(status="183 Session Progress") + _BODY + _sdp("sendrecv"), False)
        + f'  <nop><action><exec play_pcap_audio="{PCAP}"/></action></nop>\n'
        + f'  <pause milliseconds="{early_ms}"/>\n'
        + S.send(_RESP.format(status="200 OK") + _BODY + _sdp("sendrecv"))
        + '  <recv request="ACK"/>\n'
        + f'  <pause milliseconds="{talk_ms}"/>\n'
        + S.send(bye) + '  <recv response="200"/>\n'
        + '  <Reference variables="from_hdr"/>\n', name="early-media-callee")


def run_peer(tmp: Path, scen: str, port: int, *args: str, timeout: int = 60) -> subprocess.Popen[str]:
    path = tmp / f"peer-{port}.xml"
    path.write_text(scen)
    cmd = ["sipp", "-sf", str(path), "-m", "1", "-i", "127.0.0.1", "-p", str(port),
           "-mi", "127.0.0.1", "-mp", str(free_port_pair_base(4)), "-timeout", f"{timeout}s",
           "-timeout_error", "-nostdin", "-trace_err", "-error_file", str(tmp / f"peer-err-{port}.log"), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp)


def test_early_media_reaches_the_call_unanswered_and_the_dial_reports_its_times():
    tmp = Path(tempfile.mkdtemp(prefix="bvem", dir="/tmp"))
    d = daemon(tmp)
    callee_port = free_port()
    peer = None
    try:
        d.start()
        d.wait_ready(90)
        peer = run_peer(tmp, early_media_callee(early_ms=7800, talk_ms=4000), callee_port)
        out: dict[str, subprocess.CompletedProcess[str]] = {}
        dialer = threading.Thread(target=lambda: out.setdefault("r", cli(
            "dial", "--runtime-dir", str(d.run_dir), "--agent", "callee", "--ring-timeout", "30", "--json",
            f"sip:callee@127.0.0.1:{callee_port}", timeout=60)))
        dialer.start()
        # early media: the callee's packets reach the call, nothing goes back
        early: list[dict[str, Any]] = []
        deadline = time.monotonic() + 7.0
        while time.monotonic() < deadline and not out:
            calls = list(gateway(d, "calls").values())
            if calls and calls[0]["packets_in"] > 0:
                early.append(calls[0])
            time.sleep(0.2)
        assert not out, "the dial was answered before the 200"
        assert len(early) >= 10, early[-1:]
        assert early[-1]["packets_in"] >= 150  # about 5 s of the pcap's 30 ms packets
        assert all(c["packets_out"] == 0 and c["frames_out"] == 0 for c in early), early[-1]
        dialer.join(30)
        r = out["r"]
        assert r.returncode == 0, (r.stdout, r.stderr)
        res = json.loads(r.stdout)
        times = [res["ringing_at_ms"], res["progress_at_ms"], res["answered_at_ms"]]
        assert all(isinstance(t, int) for t in times), res
        assert times == sorted(times) and times[1] - times[0] >= 300 and times[2] - times[1] >= 7000, times
        # answered: the greeting is heard
        d.wait_for(lambda s: any(c["frames_out"] > 20 for c in gateway(d, "calls").values()), 10, "the greeting out")
        so, se = peer.communicate(timeout=40)
        assert peer.returncode == 0, (so[-2000:], se[-2000:])
        rec = record(d, tmp)
        media = rec["media"]
        assert media["initial"] == "early" and [c["state"] for c in media["changes"]] == ["answered"]
        assert media["dial"] == {"ringing_at_ms": times[0], "progress_at_ms": times[1], "answered_at_ms": times[2]}
        pump = rec["stats"]["pump"]
        assert pump["vad_starts"] >= 1 and pump["media_muted_events"] >= 1, pump  # the VAD heard it, no turn
        assert pump["media_muted_samples"] >= 5 * 16000
        convo = rec["conversation"]
        assert [m["role"] for m in convo if m["role"] != "system"] == ["assistant"], convo
        assert [m["text"] for m in convo if m["role"] == "assistant"] == [GREETING]
    finally:
        d.close()
        if peer is not None and peer.poll() is None:
            peer.kill()
            peer.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)


class Phone:
    """The SIPp caller's media, on this test's socket: notes when the gateway's RTP arrives, and
    sends a 20 ms PCMA packet every 20 ms once it knows where (the gateway's first packet): the
    speech :meth:`play` queued, else silence, as a phone does."""

    SILENCE = bytes([0xD5]) * 160  # PCMA silence

    def __init__(self, speech: np.ndarray) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self.speech = [CODECS["PCMA"].encode(speech[i:i + 160]).tobytes() for i in range(0, len(speech) - 159, 160)]
        self.queue: deque[bytes] = deque()
        self.arrivals: list[float] = []
        self.peer: tuple[str, int] | None = None  # the gateway's RTP socket (from its first packet)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._recv, daemon=True), threading.Thread(target=self._send, daemon=True)]
        for t in self.threads:
            t.start()

    def _recv(self) -> None:
        while not self.stop.is_set():
            try:
                data, addr = self.sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(data) >= 12 and data[0] >> 6 == 2:
                self.arrivals.append(time.monotonic())
                self.peer = self.peer or addr

    def _send(self) -> None:
        seq, t0 = 0, time.monotonic()
        while not self.stop.is_set():
            seq += 1
            if self.peer is not None:
                payload = self.queue.popleft() if self.queue else self.SILENCE
                hdr = struct.pack("!BBHII", 0x80, 8, seq & 0xFFFF, (seq * 160) & 0xFFFFFFFF, 0x5151)
                try:
                    self.sock.sendto(hdr + payload, self.peer)
                except OSError:
                    return
            time.sleep(max(0.0, t0 + seq * 0.02 - time.monotonic()))

    def play(self, seconds: float) -> None:
        """Queue ``seconds`` of the speech (sent from the next packet on)."""
        self.queue.extend(self.speech[: int(seconds * 50)])

    def between(self, t0: float, t1: float) -> int:
        return sum(t0 <= t < t1 for t in self.arrivals)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(2)
        self.sock.close()


def hold_caller(port: int, before_ms: int, held_ms: int, after_ms: int) -> str:
    """SIPp as the caller, its SDP naming ``port`` (the test's socket): answered, a hold
    ``before_ms`` after the ACK, the unhold ``held_ms`` later, its BYE ``after_ms`` after that."""
    hold = S.send(S._req("INVITE", 2, True, _sdp("sendonly", str(port))))
    unhold = S.send(S._req("INVITE", 3, True, _sdp("sendrecv", str(port))))
    return S.scenario(
        S.send(S._req("INVITE", 1, False, _sdp("sendrecv", str(port))))
        + '  <recv response="100" optional="true"/>\n  <recv response="180" optional="true"/>\n'
        + '  <recv response="200" rtd="true"/>\n' + S.send(S._req("ACK", 1, True), retrans=False)
        + f'  <pause milliseconds="{before_ms}"/>\n'
        + hold + '  <recv response="100" optional="true"/>\n'
        + '  <recv response="200"><action><ereg regexp="a=recvonly" search_in="body" check_it="true" '
          'assign_to="h1"/></action></recv>\n'
        + S.send(S._req("ACK", 2, True), retrans=False)
        + f'  <pause milliseconds="{held_ms}"/>\n'
        + unhold + '  <recv response="100" optional="true"/>\n'
        + '  <recv response="200"><action><ereg regexp="a=sendrecv" search_in="body" check_it="true" '
          'assign_to="h2"/></action></recv>\n'
        + S.send(S._req("ACK", 3, True), retrans=False)
        + f'  <pause milliseconds="{after_ms}"/>\n'
        + S.bye(4) + '  <Reference variables="h1,h2"/>\n', name="hold-caller")


def test_a_caller_holds_and_resumes_the_bot_is_silent_while_held_and_goes_on_after():
    tmp = Path(tempfile.mkdtemp(prefix="bvho", dir="/tmp"))
    d = daemon(tmp)
    phone = Phone(pcap_speech())
    peer = None
    try:
        d.start()
        d.wait_ready(90)
        target = f"127.0.0.1:{sip_port(d)}"
        peer = run_peer(tmp, hold_caller(phone.port, before_ms=2500, held_ms=5000, after_ms=9000), free_port(),
                        "-s", "holder", target)
        # watch the gateway's hold counters: when the hold and the unhold were applied
        t_hold = t_unhold = 0.0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not t_unhold:
            st = gateway(d, "stats")
            now = time.monotonic()
            if not t_hold and st.get("sip_hold", 0) >= 1:
                t_hold = now
                assert phone.peer is not None, "no RTP from the gateway before the hold (the greeting)"
                phone.play(4.0)  # music on hold
            if not t_unhold and st.get("sip_unhold", 0) >= 1:
                t_unhold = now
            time.sleep(0.02)
        assert t_hold and t_unhold, "the hold or the unhold never reached the gateway"
        assert phone.between(0.0, t_hold) > 0  # the greeting was heard before the hold
        time.sleep(0.6)
        phone.play(2.0)  # the caller speaks after the resume
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline and phone.between(t_unhold, time.monotonic()) < 20:
            time.sleep(0.1)
        held = phone.between(t_hold + 0.15, t_unhold)
        assert held == 0, f"{held} RTP packets while held"
        after = phone.between(t_unhold, time.monotonic())
        so, se = peer.communicate(timeout=30)
        assert peer.returncode == 0, (so[-2000:], se[-2000:])
        rec = record(d, tmp)
        assert after >= 20, json.dumps([after, rec["media"], rec["conversation"], rec["stats"]["pump"], rec["stats"]["turn"], rec["stats"]["stt"]])
        media = rec["media"]
        assert media["initial"] == "answered" and media["holds"] == 1
        assert [c["state"] for c in media["changes"]] == ["held", "answered"]
        assert 4.0 <= media["held_s"] <= 6.5, media
        pump = rec["stats"]["pump"]
        assert pump["media_muted_events"] >= 1 and pump["media_muted_samples"] >= 3 * 16000, pump
        # every user turn ended after the resume (the marks are on the host's monotonic clock
        # once shifted by clock_offset_s): the music on hold opened none
        ends = [t["t_turn_end"] + rec["clock_offset_s"] for t in rec["turns"]]
        assert ends and all(t > t_unhold for t in ends), (ends, t_hold, t_unhold)
        assert [m["role"] for m in rec["conversation"]].count("user") == len(ends)
        said = [m["text"] for m in rec["conversation"] if m["role"] == "assistant"]
        assert said[-1] == "I see."
        # the hold cut the greeting where the caller stopped hearing it: a hold, not a barge-in
        assert rec["stats"]["turn"]["media_cuts"] == 1 and rec["stats"]["turn"]["interrupts"] == 0
        assert 0 < len(said[0]) < len(LONG_GREETING) and LONG_GREETING.startswith(said[0].rstrip(".,")), said
    finally:
        d.close()
        if peer is not None and peer.poll() is None:
            peer.kill()
            peer.wait(5)
        phone.close()
        shutil.rmtree(tmp, ignore_errors=True)
