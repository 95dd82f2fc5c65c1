"""One source floods the real gateway's SIP port over UDP loopback with requests that used to
hold a server transaction for 64*T1 each (REGISTER, MESSAGE, SUBSCRIBE, an unknown method,
out-of-dialog BYE/INFO/CANCEL, a BYE to a dialog that does not exist) while another source
places a call: the call is answered during the flood, every flood request is answered
statelessly (405/481/501) or refused (503, then dropped once plainly flooding), counted per
reason with a bounded log, and the transaction table holds nothing of the flood afterwards.
Then the per-source share of the table: a source holding its share gets 503 while another
source is still served."""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time

import pytest

from brisvox.wire.sip_message import parse
from tests.system.gateway_harness import GatewayProc

pytestmark = pytest.mark.system

FLOODER = "127.0.0.2"
CALLER = "127.0.0.3"
FLOOD_S = 2.5
FLOOD_RATE = 400.0  # datagrams a second
_n = itertools.count(1)
NO_WS = {"enabled": False}  # SIP only: nothing else listens


def udp(host: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((host, 0))
    s.settimeout(2.0)
    return s


def request(method: str, gw_port: int, local: tuple[str, int], *, to_tag: str = "", call_id: str = "",
            cseq: int = 1, body: bytes = b"", branch: str = "", to: str = "") -> bytes:
    n = next(_n)
    host, port = local
    to = to or "<sip:echo@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
    head = (f"{method} sip:echo@127.0.0.1:{gw_port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {host}:{port};branch={branch or f'z9hG4bKtf{n}x{time.monotonic_ns()}'};rport\r\n"
            f"From: <sip:peer@{host}>;tag=p{n}\r\nTo: {to}\r\nCall-ID: {call_id or f'tf{n}@{host}'}\r\n"
            f"CSeq: {cseq} {method}\r\nContact: <sip:peer@{host}:{port}>\r\nMax-Forwards: 70\r\n"
            + ("Content-Type: application/sdp\r\n" if body else "") + f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def offer(port: int) -> bytes:
    return (f"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=sendrecv\r\n").encode()


FLOOD_KINDS = ("REGISTER", "MESSAGE", "SUBSCRIBE", "FROBNICATE", "BYE", "INFO", "CANCEL", "BYE-tag")


def flood(sock: socket.socket, gw_port: int, seconds: float, stop: threading.Event) -> dict[str, int]:
    """Send the flood (paced, bounded by ``seconds``) and count the answers by status."""
    local = sock.getsockname()
    codes: dict[str, int] = {"sent": 0}
    sock.setblocking(False)
    t0 = time.monotonic()
    for k in itertools.count():
        now = time.monotonic()
        if now - t0 >= seconds or stop.is_set():
            break
        kind = FLOOD_KINDS[k % len(FLOOD_KINDS)]
        data = request("BYE", gw_port, local, to_tag="nosuchdialog") if kind == "BYE-tag" else \
            request(kind, gw_port, local)
        sock.sendto(data, ("127.0.0.1", gw_port))
        codes["sent"] += 1
        with contextlib.suppress(BlockingIOError):
            while True:
                d = sock.recv(65535)
                codes[d[8:11].decode()] = codes.get(d[8:11].decode(), 0) + 1
        delay = t0 + (k + 1) / FLOOD_RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    time.sleep(0.2)
    with contextlib.suppress(BlockingIOError):
        while True:
            d = sock.recv(65535)
            codes[d[8:11].decode()] = codes.get(d[8:11].decode(), 0) + 1
    return codes


def final(sock: socket.socket, timeout: float = 3.0) -> tuple[object, float]:
    """The first final response on ``sock`` (parsed) and how long it took."""
    t0 = time.monotonic()
    sock.settimeout(timeout)
    while True:
        msg = parse(sock.recv(65535))
        if msg.status >= 200:
            return msg, time.monotonic() - t0


def test_a_flood_of_out_of_dialog_requests_holds_nothing_and_another_caller_is_answered(short_tmp):
    # a small table, so that the flood would fill it in well under a second if it held transactions
    with contextlib.ExitStack() as stack, \
            GatewayProc(short_tmp, inbox=True, sip={"max_transactions": 64}, websocket=NO_WS) as gw:
        port = gw.sip_port
        bad = stack.enter_context(udp(FLOODER))
        sig = stack.enter_context(udp(CALLER))
        media = stack.enter_context(udp(CALLER))
        stop = threading.Event()
        result: dict[str, dict[str, int]] = {}
        th = threading.Thread(target=lambda: result.setdefault("codes", flood(bad, port, FLOOD_S, stop)))
        th.start()
        try:
            time.sleep(1.0)  # the flood is at full rate
            cid = f"caller{time.monotonic_ns()}@{CALLER}"
            sig.sendto(request("INVITE", port, sig.getsockname(), call_id=cid, body=offer(media.getsockname()[1]),
                               branch="z9hG4bKcaller1"), ("127.0.0.1", port))
            resp, took = final(sig)
            assert resp.status == 200, (resp.status, resp.reason)  # type: ignore[attr-defined]
            assert took < 2.0, took
            during = gw.stats()
        finally:
            stop.set()
            th.join(10)
        codes = result["codes"]
        assert set(codes) - {"sent"} <= {"405", "481", "501", "503"}, codes
        assert codes.get("405") and codes.get("481") and codes.get("501") and codes.get("503"), codes
        to = resp.get("to")  # type: ignore[attr-defined]
        sig.sendto(request("ACK", port, sig.getsockname(), call_id=cid, to=to, branch="z9hG4bKcaller1ack"),
                   ("127.0.0.1", port))
        st = gw.stats()
        # nothing of the flood is held: the caller's INVITE transaction is the only one (and it was during it)
        assert st["sip_server_transactions"] == 1 and st["sip_server_transaction_sources"] == 1, st
        assert during["sip_server_transactions"] <= 1, during
        assert st.get("sip_refused_tx_table_full", 0) == 0 and st.get("sip_refused_tx_source_full", 0) == 0
        for reason in ("method", "unknown_method", "no_dialog", "no_transaction", "rate_limit", "flood"):
            assert st.get(f"sip_refused_{reason}", 0) > 0, (reason, st)
        answered = sum(n for c, n in codes.items() if c != "sent")
        refused = sum(st[f"sip_refused_{r}"] for r in ("method", "unknown_method", "no_dialog", "no_transaction",
                                                       "rate_limit"))
        assert answered == refused and refused + st["sip_refused_flood"] == codes["sent"], (codes, st)
        # the log: one line per refusal reason, not one per request
        lines = [ln for ln in gw.stderr().splitlines() if "SIP refused" in ln]
        assert len(lines) <= 6, lines[:10]
        sig.sendto(request("BYE", port, sig.getsockname(), call_id=cid, to=to, cseq=2), ("127.0.0.1", port))
        bye, _ = final(sig)
        assert bye.status == 200  # type: ignore[attr-defined]
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and gw.stats()["calls_active"]:
            time.sleep(0.05)
        assert gw.stats()["calls_active"] == 0
    assert gw.leaked == []


def test_a_source_holding_its_share_of_the_table_is_refused_while_another_is_served(short_tmp):
    sip = {"max_transactions": 64, "max_transactions_per_source": 8, "options_rate": ["1000/second"]}
    with contextlib.ExitStack() as stack, GatewayProc(short_tmp, inbox=True, sip=sip, websocket=NO_WS) as gw:
        port = gw.sip_port
        bad = stack.enter_context(udp(FLOODER))
        for _ in range(40):  # OPTIONS are answered in a transaction (64*T1 each)
            bad.sendto(request("OPTIONS", port, bad.getsockname()), ("127.0.0.1", port))
        time.sleep(0.3)
        bad.settimeout(0.2)
        statuses = []
        with contextlib.suppress(TimeoutError):
            while True:
                statuses.append(parse(bad.recv(65535)).status)
        assert statuses.count(200) == 8 and statuses.count(503) == 10, statuses  # then dropped: refusal_rate
        good = stack.enter_context(udp(CALLER))
        good.sendto(request("OPTIONS", port, good.getsockname()), ("127.0.0.1", port))
        ok, _ = final(good)
        assert ok.status == 200  # type: ignore[attr-defined]
        st = gw.stats()
        assert st["sip_server_transactions"] == 9 and st["sip_server_transaction_sources"] == 2, st
        assert st["sip_refused_tx_source_full"] == 10 and st["sip_refused_flood"] == 22, st
    assert gw.leaked == []
