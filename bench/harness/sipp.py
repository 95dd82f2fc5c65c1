"""SIPp scenarios for the gateway's system tests and bench (generated per test)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from xml.sax.saxutils import escape as xml_escape

HEAD = '<?xml version="1.0" encoding="ISO-8859-1" ?>\n<!DOCTYPE scenario SYSTEM "sipp.dtd">\n'

_HDRS = """      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: sipp <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag00[call_number]
      To: <sip:[service]@[remote_ip]:[remote_port]>{peer}
      Call-ID: [call_id]
      CSeq: {cseq} {method}
      Contact: sip:sipp@[local_ip]:[local_port]
      Max-Forwards: 70"""


def _req(method: str, cseq: int, peer: bool, body: str = "", extra: str = "") -> str:
    hdrs = _HDRS.format(peer="[peer_tag_param]" if peer else "", cseq=cseq, method=method)
    lines = [f"      {method} sip:[service]@[remote_ip]:[remote_port] SIP/2.0", hdrs]
    if extra:
        lines.append(extra)
    if body:
        lines.append("      Content-Type: application/sdp\n      Content-Length: [len]\n\n" + body)
    else:
        lines.append("      Content-Length: 0")
    return "\n".join(lines)


def _sdp(port: str = "[media_port]", direction: str = "sendrecv") -> str:
    return f"""      v=0
      o=user1 53655765 2353687637 IN IP[local_ip_type] [local_ip]
      s=-
      c=IN IP[media_ip_type] [media_ip]
      t=0 0
      m=audio {port} RTP/AVP 0 101
      a=rtpmap:0 PCMU/8000
      a=rtpmap:101 telephone-event/8000
      a=fmtp:101 0-16
      a={direction}"""


def send(msg: str, retrans: bool = True) -> str:
    r = ' retrans="500"' if retrans else ""
    return f"  <send{r}>\n    <![CDATA[\n{msg}\n    ]]>\n  </send>\n"


def invite_answered(port: str = "[media_port]") -> str:
    return (send(_req("INVITE", 1, False, _sdp(port)))
            + '  <recv response="100" optional="true"/>\n  <recv response="180" optional="true"/>\n'
            + '  <recv response="200" rtd="true"/>\n'
            + send(_req("ACK", 1, True), retrans=False))


def authenticated_call(hold_ms: int = 500, cseq: int = 2) -> str:
    """An INVITE that the gateway challenges (401), ACKed in its transaction, sent again with
    SIPp's ``[authentication]`` (-au/-ap), answered 200, held, then BYE."""
    ack = _req("ACK", 1, True).replace("branch=[branch]", "branch=[branch-2]")  # the INVITE's branch
    again = _req("INVITE", cseq, False, _sdp(), extra="      [authentication]")
    return scenario(send(_req("INVITE", 1, False, _sdp()))
                    + '  <recv response="100" optional="true"/>\n  <recv response="401" auth="true"/>\n'
                    + send(ack, retrans=False) + send(again)
                    + '  <recv response="100" optional="true"/>\n  <recv response="180" optional="true"/>\n'
                    + '  <recv response="200" rtd="true"/>\n' + send(_req("ACK", cseq, True), retrans=False)
                    + f'  <pause milliseconds="{hold_ms}"/>\n' + bye(cseq + 1), "authenticated")


def bye(cseq: int) -> str:
    return send(_req("BYE", cseq, True)) + '  <recv response="200" crlf="true"/>\n'


def scenario(body: str, name: str = "brisvox") -> str:
    return HEAD + f'<scenario name="{name}">\n{body}</scenario>\n'


def rtp_stream_call(ulaw: Path, play_ms: int) -> str:
    return scenario(invite_answered("[rtpstream_audio_port]")
                    + f'  <nop><action><exec rtp_stream="{ulaw},1,0"/></action></nop>\n'
                    + f'  <pause milliseconds="{play_ms}"/>\n' + bye(2))


def load_call(ulaw: Path, hold_ms: int) -> str:
    """One call of the load scenario: answered, streams audio, hangs up."""
    return rtp_stream_call(ulaw, hold_ms)


def _routed(method: str, cseq: int) -> str:
    """An in-dialog request through a proxy: the Contact of the 200 as Request-URI, the
    Record-Route set (stored by ``rrs="true"``) as Route."""
    return "\n".join([f"      {method} [next_url] SIP/2.0", "      [routes]",
                      _HDRS.format(peer="[peer_tag_param]", cseq=cseq, method=method), "      Content-Length: 0"])


def routed_call(ulaw: Path, hold_ms: int) -> str:
    """One call through a record-routing proxy (Kamailio): answered, streams ``ulaw`` once,
    holds the call ``hold_ms`` in all, then the caller's BYE. A BYE from the server before
    ours fails the call (an unexpected message)."""
    invite = (send(_req("INVITE", 1, False, _sdp("[rtpstream_audio_port]")))
              + '  <recv response="100" optional="true"/>\n  <recv response="180" optional="true"/>\n'
              + '  <recv response="200" rtd="true" rrs="true"/>\n'
              + send(_routed("ACK", 1), retrans=False))
    return scenario(invite
                    + f'  <nop><action><exec rtp_stream="{ulaw},1,0"/></action></nop>\n'
                    + f'  <pause milliseconds="{hold_ms}"/>\n'
                    + send(_routed("BYE", 2)) + '  <recv response="200" crlf="true"/>\n', "routed")


def features_call(dtmf_pcap: str, refer_summary: str = "") -> str:
    """Hold/unhold re-INVITEs, in-band RFC 4733 DTMF, INFO DTMF (``application/dtmf-relay``
    "9", ``application/dtmf`` "7", and a malformed ``application/dtmf`` body answered 400),
    then the gateway's REFER (answered 202 + NOTIFY 200; with ``refer_summary``, a regexp its
    ``X-Transfer-Summary`` header must match) and the gateway's BYE."""
    reinvite_hold = send(_req("INVITE", 2, True, _sdp("[media_port]", "sendonly")))
    reinvite_unhold = send(_req("INVITE", 3, True, _sdp("[media_port]", "sendrecv")))
    ack2 = send(_req("ACK", 2, True), retrans=False)
    ack3 = send(_req("ACK", 3, True), retrans=False)
    info = ("      INFO sip:[service]@[remote_ip]:[remote_port] SIP/2.0\n"
            + _HDRS.format(peer="[peer_tag_param]", cseq=4, method="INFO")
            + "\n      Content-Type: application/dtmf-relay\n      Content-Length: [len]\n\n"
            + "      Signal=9\n      Duration=160")

    def info_dtmf(cseq: int, body: str) -> str:
        return ("      INFO sip:[service]@[remote_ip]:[remote_port] SIP/2.0\n"
                + _HDRS.format(peer="[peer_tag_param]", cseq=cseq, method="INFO")
                + "\n      Content-Type: application/dtmf\n      Content-Length: [len]\n\n      " + body)
    notify = ("      NOTIFY sip:brisvox@[remote_ip]:[remote_port] SIP/2.0\n"
              + _HDRS.format(peer="[peer_tag_param]", cseq=7, method="NOTIFY")
              + "\n      Event: refer\n      Subscription-State: terminated;reason=noresource\n"
              "      Content-Type: message/sipfrag;version=2.0\n"
              "      Content-Length: [len]\n\n      SIP/2.0 200 OK")
    body = (invite_answered()
            + reinvite_hold
            + '  <recv response="200"><action><ereg regexp="a=recvonly" search_in="body" check_it="true" '
              'assign_to="h1"/></action></recv>\n'
            + ack2
            + '  <pause milliseconds="200"/>\n'
            + reinvite_unhold
            + '  <recv response="200"><action><ereg regexp="a=sendrecv" search_in="body" check_it="true" '
              'assign_to="h2"/></action></recv>\n'
            + ack3
            + f'  <nop><action><exec play_pcap_audio="{dtmf_pcap}"/></action></nop>\n'
            + '  <pause milliseconds="600"/>\n'
            + send(info) + '  <recv response="200"/>\n'
            + send(info_dtmf(5, "7")) + '  <recv response="200"/>\n'
            + send(info_dtmf(6, "77")) + '  <recv response="400"/>\n'
            + '  <recv request="REFER"><action><ereg regexp="sip:queue@" search_in="hdr" '
              'header="Refer-To:" check_it="true" assign_to="r1"/>'
            + (f'<ereg regexp="{xml_escape(refer_summary, {chr(34): "&quot;"})}" search_in="hdr" header="X-Transfer-Summary:" '
               'check_it="true" assign_to="r2"/>' if refer_summary else '')
            + '</action></recv>\n'
            + send("      SIP/2.0 202 Accepted\n      [last_Via:]\n      [last_From:]\n      [last_To:]\n"
                   "      [last_Call-ID:]\n      [last_CSeq:]\n      Contact: sip:sipp@[local_ip]:[local_port]\n"
                   "      Content-Length: 0", retrans=False)
            + send(notify) + '  <recv response="200"/>\n'
            + '  <recv request="BYE"/>\n'
            + send("      SIP/2.0 200 OK\n      [last_Via:]\n      [last_From:]\n      [last_To:]\n"
                   "      [last_Call-ID:]\n      [last_CSeq:]\n      Content-Length: 0", retrans=False)
            + f'  <Reference variables="h1,h2,r1{",r2" if refer_summary else ""}"/>\n')
    return scenario(body, "features")


def run_sipp(tmp: Path, scen: str, target: str, *, service: str = "echo", calls: int = 1, rate: int = 10,
             limit: int = 1, timeout: int = 60, media_port: int, local_port: int,
             extra: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    path = tmp / f"scen-{local_port}.xml"
    path.write_text(scen)
    args = ["sipp", "-sf", str(path), "-m", str(calls), "-r", str(rate), "-l", str(limit), "-s", service,
            target, "-i", "127.0.0.1", "-p", str(local_port), "-mi", "127.0.0.1", "-mp", str(media_port),
            "-timeout", f"{timeout}s", "-timeout_error", "-nostdin", "-trace_err",
            "-error_file", str(tmp / f"sipp-err-{local_port}.log"), *(extra or [])]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout + 15, cwd=tmp)


TIMER_90 = "      Supported: timer\n      Session-Expires: 90;refresher=uac"
_OK_TO_REQUEST = ("      SIP/2.0 200 OK\n      [last_Via:]\n      [last_From:]\n      [last_To:]\n"
                  "      [last_Call-ID:]\n      [last_CSeq:]\n      Content-Length: 0")


def _timer_invite() -> str:
    """An INVITE asking for a 90 s session timer that the caller refreshes (RFC 4028), answered and ACKed."""
    return (send(_req("INVITE", 1, False, _sdp(), extra=TIMER_90))
            + '  <recv response="100" optional="true"/>\n'
            + '  <recv response="200" rtd="true"><action><ereg regexp="90;refresher=uac" search_in="hdr" '
              'header="Session-Expires:" check_it="true" assign_to="se"/></action></recv>\n'
            + send(_req("ACK", 1, True), retrans=False))


def session_refresh_call(every_ms: int, refreshes: int, then_ms: int) -> str:
    """A caller that asks for a 90 s session timer and refreshes it itself: a re-INVITE (the
    same SDP, the same Session-Expires) every ``every_ms``, ``refreshes`` times, each 200 ACKed,
    then ``then_ms`` more and its BYE. A BYE from the server before ours fails the call (an
    unexpected message)."""
    body = _timer_invite()
    for i in range(refreshes):
        cseq = 2 + i
        body += (f'  <pause milliseconds="{every_ms}"/>\n'
                 + send(_req("INVITE", cseq, True, _sdp(), extra=TIMER_90))
                 + '  <recv response="100" optional="true"/>\n  <recv response="200"/>\n'
                 + send(_req("ACK", cseq, True), retrans=False))
    body += f'  <pause milliseconds="{then_ms}"/>\n' + bye(2 + refreshes) + '  <Reference variables="se"/>\n'
    return scenario(body, "session-refresh")


def session_expiry_call(wait_ms: int) -> str:
    """A caller that asks for a 90 s session timer it should refresh, and never does: the
    server's BYE must come within ``wait_ms`` with ``session timer expired`` in its Reason;
    answered 200."""
    body = (_timer_invite()
            + f'  <recv request="BYE" timeout="{wait_ms}"><action><ereg regexp="session timer expired" '
              'search_in="hdr" header="Reason:" check_it="true" assign_to="why"/></action></recv>\n'
            + send(_OK_TO_REQUEST, retrans=False)
            + '  <Reference variables="se,why"/>\n')
    return scenario(body, "session-expiry")
