"""Answering-machine detection through the whole daemon (gateway, a worker with the real Silero
VAD, an agent process), `brisvoxd dial` calling SIPp far ends that answer and play pcaps made
here from SIPp's own speech sample:

* a person: "hello?" (0.6 s of speech), then silence. The verdict is ``human``; the agent
  speaks first only after it (its greeting), and the call record says so.
* a voicemail: a greeting of about 4 s, a 1 kHz beep, then silence (a machine recording). The
  verdict is ``machine``; the agent leaves its message after the beep and hangs up
  (``amd_message_left``); the greeting is never said.
"""

from __future__ import annotations

import shutil
import struct
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.harness import sipp as S
from bench.harness.daemon import Daemon, agents_config, cli, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.wire.g711 import CODECS
from tests.system.gateway_harness import free_port, have, rtp_range
from tests.system.test_sip_media import _BODY, _RESP, CALLEE_BYE, PCAP, _sdp, pcap_speech, run_peer
from tests.system.test_sip_media import agent_file as sip_media_agent

pytestmark = [pytest.mark.system, pytest.mark.timeout(240),
              pytest.mark.skipif(not have("sipp") or not PCAP.exists(), reason="needs sipp (sip-tester)")]

GREETING = "Hello, this is brisvox calling about your order."
MESSAGE = "Hello, this is brisvox. Your order is ready. Please call us back. Goodbye."
RATE = 8000


def agent_file() -> str:
    """The scripted agent of the SIP media tests, screening what it dials."""
    return sip_media_agent("caller", GREETING, 800) + f"""
[amd]
enabled = true
on_machine = "leave_message"
message = "{MESSAGE}"
"""


def write_pcap(path: Path, pcm: np.ndarray) -> None:
    """``pcm`` (8 kHz) as a pcap of PCMA RTP in 20 ms packets, for SIPp's play_pcap_audio
    (it takes the RTP payloads and their times; the addresses are its own)."""
    out = [struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1)]
    n = len(pcm) // 160
    for k in range(n):
        payload = CODECS["PCMA"].encode(pcm[k * 160:(k + 1) * 160]).tobytes()
        rtp = struct.pack("!BBHII", 0x80, 8, k & 0xFFFF, k * 160, 0x4242) + payload
        udp = struct.pack("!HHHH", 6000, 6002, 8 + len(rtp), 0) + rtp
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), k & 0xFFFF, 0, 64, 17, 0,
                         bytes([127, 0, 0, 1]), bytes([127, 0, 0, 1])) + udp
        eth = b"\x00" * 12 + b"\x08\x00" + ip
        t_us = k * 20_000
        out.append(struct.pack("<IIII", t_us // 1_000_000, t_us % 1_000_000, len(eth), len(eth)) + eth)
    path.write_bytes(b"".join(out))


def silence(s: float) -> np.ndarray:
    return np.zeros(int(s * RATE), dtype=np.int16)


def person() -> np.ndarray:
    speech = pcap_speech()
    return np.concatenate([silence(0.3), speech[75 * 160:105 * 160], silence(8.0)])  # "hello?", then waiting


BEEP_AT = 0.3 + 2.8 + 0.15 + 1.7 + 0.1  # s into the pcap


def voicemail() -> np.ndarray:
    speech = pcap_speech()
    t = np.arange(int(0.5 * RATE)) / RATE
    beep = (9000 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    return np.concatenate([silence(0.3), speech[75 * 160:215 * 160], silence(0.15), speech[245 * 160:330 * 160],
                           silence(0.1), beep, silence(10.0)])


def callee(pcap: Path, hang_up_ms: int) -> str:
    """SIPp answering a dial at once (200 with SDP), playing ``pcap``; it takes brisvox's BYE,
    or sends its own ``hang_up_ms`` after the ACK."""
    invite = ('  <recv request="INVITE">\n    <action>\n'
              '      <ereg regexp=".*" search_in="hdr" header="From:" check_it="true" assign_to="from_hdr"/>\n'
              '    </action>\n  </recv>\n')
    bye = CALLEE_BYE
    ok = """      SIP/2.0 200 OK
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
      Content-Length: 0"""
    return S.scenario(
        invite
        + S.send(_RESP.format(status="200 OK") + _BODY + _sdp("sendrecv"))
        + '  <recv request="ACK"/>\n'
        + f'  <nop><action><exec play_pcap_audio="{pcap}"/></action></nop>\n'
        + f'  <recv request="BYE" timeout="{hang_up_ms}" ontimeout="ours"/>\n'
        + S.send(ok, False)
        + '  <nop next="done"/>\n'
        + '  <label id="ours"/>\n'
        + S.send(bye) + '  <recv response="200"/>\n'
        + '  <label id="done"/>\n'
        + '  <Reference variables="from_hdr"/>\n', name="amd-callee")


def dial_and_record(d: Daemon, tmp: Path, scen: str) -> dict[str, Any]:
    port = free_port()
    before = {r["call_id"] for r in read_records(tmp / "records")}
    peer = run_peer(tmp, scen, port)
    try:
        r = cli("dial", "--runtime-dir", str(d.run_dir), "--agent", "caller", "--ring-timeout", "10", "--json",
                f"sip:callee@127.0.0.1:{port}", timeout=30)
        assert r.returncode == 0, (r.stdout, r.stderr)
        peer.communicate(timeout=60)
        d.wait_for(lambda s: len([x for x in read_records(tmp / "records") if x["call_id"] not in before]) >= 1,
                   30, "the call record")
        return next(x for x in read_records(tmp / "records") if x["call_id"] not in before)
    finally:
        if peer.poll() is None:
            peer.kill()
            peer.wait(5)


def said(rec: dict[str, Any]) -> list[str]:
    return [m["text"] for m in rec["conversation"] if m["role"] == "assistant"]


def test_a_person_gets_the_agent_and_a_voicemail_the_message_after_its_beep():
    tmp = Path(tempfile.mkdtemp(prefix="bvamd", dir="/tmp"))
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "caller.toml").write_text(agent_file())
    lo, hi = rtp_range(40)
    sip = f"port = 0\nrtp_port_min = {lo}\nrtp_port_max = {hi}"
    extra = agents_config(agents, tmp / "records", default_agent="caller", sip=sip)
    d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)
    write_pcap(tmp / "person.pcap", person())
    write_pcap(tmp / "voicemail.pcap", voicemail())
    try:
        d.start()
        d.wait_ready(90)
        rec = dial_and_record(d, tmp, callee(tmp / "person.pcap", hang_up_ms=7000))
        amd = rec["amd"]
        assert amd["verdict"] == "human" and amd["source"] == "detector", amd
        assert amd["verdict_ms"] <= 1500 + 300, amd  # the answer to the verdict, on the agent's clock
        assert said(rec)[:1] == [GREETING], rec["conversation"]  # spoken after the verdict
        assert rec["end_reason"] != "amd_message_left"

        rec = dial_and_record(d, tmp, callee(tmp / "voicemail.pcap", hang_up_ms=25000))
        amd = rec["amd"]
        assert amd["verdict"] == "machine" and amd["action"] == "leave_message", amd
        assert amd["beep_ms"] is not None and abs(amd["beep_ms"] - BEEP_AT * 1000) <= 500, amd
        assert amd["message_ms"] == amd["beep_ms"]
        assert said(rec) == [MESSAGE], rec["conversation"]  # the message, whole; never the greeting
        assert rec["end_reason"] == "amd_message_left"
        assert rec["stats"]["pump"]["media_muted_events"] >= 1  # the greeting reached the VAD, no turn
    finally:
        d.close()
        shutil.rmtree(tmp, ignore_errors=True)


def test_the_pcap_writer_round_trips(tmp_path: Path):
    x = (np.sin(np.arange(1600) / 5) * 5000).astype(np.int16)
    write_pcap(tmp_path / "x.pcap", x)
    data = (tmp_path / "x.pcap").read_bytes()
    off, got = 24, []
    while off < len(data):
        incl = struct.unpack("<I", data[off + 8:off + 12])[0]
        got.append(CODECS["PCMA"].decode(data[off + 16 + 54:off + 16 + incl]))
        off += 16 + incl
    y = np.concatenate(got)
    assert len(y) == 1600 and np.max(np.abs(y.astype(int) - x)) < 300


def test_a_campaign_dialled_by_the_daemon_records_each_rows_verdict():
    """``[campaigns] enabled``: the outbound role runs the campaign ``brisvoxd campaign start``
    stored; the agent's AMD verdict of each answered call lands in its row (answered_human,
    answered_machine), and the export says so."""
    import json

    tmp = Path(tempfile.mkdtemp(prefix="bvamc", dir="/tmp"))
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "caller.toml").write_text(agent_file())
    lo, hi = rtp_range(40)
    sip = f"port = 0\nrtp_port_min = {lo}\nrtp_port_max = {hi}"
    extra = agents_config(agents, tmp / "records", default_agent="caller", sip=sip) + "\n[campaigns]\nenabled = true\n"
    cfg = write_config(tmp, workers=1, agents=1, extra=extra)
    d = Daemon(tmp, config=cfg, real_roles=True)
    write_pcap(tmp / "person.pcap", person())
    write_pcap(tmp / "voicemail.pcap", voicemail())
    peers = []
    try:
        d.start()
        d.wait_ready(90)
        assert d.child(d.status(), "outbound-0"), "no outbound child with [campaigns] enabled"
        ports = [free_port(), free_port()]
        peers = [run_peer(tmp, callee(tmp / "person.pcap", hang_up_ms=6000), ports[0]),
                 run_peer(tmp, callee(tmp / "voicemail.pcap", hang_up_ms=25000), ports[1])]
        leads = tmp / "leads.csv"
        leads.write_text(f"number\nsip:person@127.0.0.1:{ports[0]}\nsip:mailbox@127.0.0.1:{ports[1]}\n")
        r = cli("campaign", "start", str(leads), "--agent", "caller", "--config", str(cfg), "--hours", "00:00-24:00",
                "--days", "mon-sun", "--timezone", "UTC", "--rate", "1", timeout=30)
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert "warning" not in r.stderr, r.stderr

        def done(_: object) -> bool:
            out = cli("campaign", "export", "leads", "--format", "json", "--config", str(cfg), timeout=30)
            rows = json.loads(out.stdout)["rows"] if out.returncode == 0 else []
            shown = {row["number"]: row.get("outcome") for row in rows}
            return set(shown.values()) == {"answered_human", "answered_machine"}

        d.wait_for(done, 90, "both rows' verdicts")
        out = json.loads(cli("campaign", "export", "leads", "--format", "json", "--config", str(cfg),
                             timeout=30).stdout)["rows"]
        by = {row["number"].split("@")[0]: row["outcome"] for row in out}
        assert by == {"sip:person": "answered_human", "sip:mailbox": "answered_machine"}, out
        for p in peers:
            p.communicate(timeout=40)
    finally:
        d.close()
        for p in peers:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)
