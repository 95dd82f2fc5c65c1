"""The SIP half of the fuzz campaign: mutated datagrams, sent from many loopback addresses.

:func:`datagrams` builds ``n`` datagrams from a seeded ``random.Random``
(:data:`KINDS`, weights in parentheses): INVITEs with one header class
mutated -- Via, From, To, Contact, Call-ID, CSeq, Max-Forwards,
Content-Type, Content-Length, or one of the SDP body's v/o/c/m/a lines (the
Content-Length kept right, so the SDP parser sees the mutation) -- and
whole-INVITE mutations; OPTIONS; BYE, ACK, INFO with dtmf-relay bodies and
re-INVITEs, half of them in the dialog of a live call (the victim call);
mutated responses; raw random bytes; truncated, oversized and near-64 KiB
datagrams; Unicode digits in CSeq, Content-Length, Max-Forwards and ports;
CR/LF/NUL injections; keep-alives; and datagrams from sources outside
``[sip] allow``. The mutations are :mod:`bench.harness.mutations`.

:func:`send` sends them from :data:`SOURCES` (127.0.0.2-127.0.0.250, one
socket each, round robin: the per-source rate limits are keyed by address),
paced, and keeps every reply; :func:`replies` counts the final answers by
status, each request once (responses are retransmitted).

Invariants: every IP literal a datagram names is in 127.0.0.0/8
(:func:`loopback_only`: the gateway answers to Via, sends BYE to Contact and
RTP to the SDP's address, and this campaign sends nothing beyond loopback);
every socket is closed when :func:`send` returns; the send is bounded by the
count and by ``deadline`` (monotonic).
"""

from __future__ import annotations

import asyncio
import ipaddress
import random
import re
import time
from dataclasses import dataclass, field

from bench.harness.mutations import UNICODE_DIGITS, RandomPicker, mutate_line, mutate_sip

SOURCES = [f"127.0.0.{i}" for i in range(2, 251)]
OUTSIDE = [f"127.0.1.{i}" for i in range(2, 10)]  # not in the campaign's [sip] allow (127.0.0.0/24)
HEADERS = {"via": b"Via:", "from": b"From:", "to": b"To:", "contact": b"Contact:", "call_id": b"Call-ID:",
           "cseq": b"CSeq:", "max_forwards": b"Max-Forwards:", "content_type": b"Content-Type:",
           "content_length": b"Content-Length:"}
SDP_LINES = {"sdp_v": b"v=", "sdp_o": b"o=", "sdp_c": b"c=", "sdp_m": b"m=", "sdp_a": b"a="}
KINDS: dict[str, int] = {**{f"invite_{h}": 3 for h in [*HEADERS, *SDP_LINES]}, "invite_any": 8, "options": 6,
                         "bye": 5, "ack": 4, "info_dtmf": 7, "reinvite": 3, "response": 3, "raw": 5,
                         "truncated": 4, "oversized": 3, "unicode_digits": 4, "crlf": 4, "keepalive": 1,
                         "outside_allow": 1}
DEAD_RTP_PORT = 9  # the offers' media port: nothing listens there


@dataclass(frozen=True)
class Dialog:
    """A live call the in-dialog datagrams aim at (from the victim call's client)."""

    call_id: str
    from_tag: str
    to_tag: str


@dataclass
class Datagram:
    idx: int
    kind: str
    src: str
    data: bytes


def sdp(host: str = "127.0.0.1", port: int | str = DEAD_RTP_PORT) -> bytes:
    return (f"v=0\r\no=- 1 1 IN IP4 {host}\r\ns=-\r\nc=IN IP4 {host}\r\nt=0 0\r\n"
            f"m=audio {port} RTP/AVP 0 8 101\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\n"
            f"a=fmtp:101 0-16\r\na=sendrecv\r\n").encode()


def request(method: str, gw_port: int, src: str, n: int, *, body: bytes = b"", user: str = "echo",
            call_id: str = "", from_tag: str = "", to_tag: str = "", cseq: int = 1,
            ctype: str = "application/sdp") -> tuple[bytes, bytes]:
    """(head, body) of a valid request from ``src`` (its Content-Length matches the body)."""
    to = f"<sip:{user}@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
    head = (f"{method} sip:{user}@127.0.0.1:{gw_port} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {src}:5070;branch=z9hG4bKfz{n}{method[:2].lower()};rport\r\n"
            f"From: \"Fuzz {n}\" <sip:fuzz@{src}>;tag={from_tag or f'f{n}'}\r\nTo: {to}\r\n"
            f"Call-ID: {call_id or f'fz{n}@{src}'}\r\nCSeq: {cseq} {method}\r\n"
            f"Contact: <sip:fuzz@{src}:5070>\r\nMax-Forwards: 70\r\nUser-Agent: brisvox-fuzz\r\n"
            + (f"Content-Type: {ctype}\r\n" if body else "")
            + f"Content-Length: {len(body)}\r\n\r\n").encode()
    return head, body


def with_length(head: bytes, body: bytes) -> bytes:
    """``head`` + ``body`` with the Content-Length rewritten to the body's length."""
    return re.sub(rb"Content-Length: [^\r]*", b"Content-Length: %d" % len(body), head, count=1) + body


_RUN = re.compile(rb"[0-9A-Fa-f:.]+")


def _foreign_v4(part: bytes) -> bool:
    if part.count(b".") != 3:
        return False
    try:
        return not ipaddress.IPv4Address(part.decode()).is_loopback
    except ValueError:
        return False


def loopback_only(data: bytes) -> bytes:
    """``data`` with every IPv4 literal outside 127.0.0.0/8 made 127.0.0.1 and no IPv6 literal
    (a run of address characters with two colons gets dashes instead)."""
    def fix(m: re.Match[bytes]) -> bytes:
        run = m.group(0)
        if run.count(b":") >= 2:
            run = run.replace(b":", b"-")
        return b":".join(b"127.0.0.1" if _foreign_v4(p) else p for p in run.split(b":"))
    return _RUN.sub(fix, data)


class _Gen:
    def __init__(self, rng: random.Random, gw_port: int, dialog: Dialog | None) -> None:
        self.rng = rng
        self.p = RandomPicker(rng)
        self.port = gw_port
        self.dialog = dialog
        self.kinds = list(KINDS)
        self.weights = [KINDS[k] for k in self.kinds]

    def invite(self, src: str, n: int) -> tuple[bytes, bytes]:
        user = "echo" if self.rng.random() < 0.9 else "agent"
        return request("INVITE", self.port, src, n, body=sdp(), user=user)

    def in_dialog(self, method: str, src: str, n: int, body: bytes = b"", ctype: str = "") -> tuple[bytes, bytes]:
        d = self.dialog if self.rng.random() < 0.5 else None
        cseq = self.rng.choice((2, 3, 50, 1000 + n))
        if d is None:
            return request(method, self.port, src, n, body=body, to_tag=f"t{n}", cseq=cseq, ctype=ctype)
        return request(method, self.port, src, n, body=body, call_id=d.call_id, from_tag=d.from_tag,
                       to_tag=d.to_tag, cseq=cseq, ctype=ctype)

    def dtmf_body(self) -> bytes:
        r = self.rng
        sig = r.choice(["5", "#", "*", "A", "x", "55", "", "-1", r.choice(UNICODE_DIGITS), "\u0665"])
        dur = r.choice(["160", "0", "60000", "60001", "-5", "99999999999", "1\u00b2", "", "abc"])
        body = f"Signal={sig}\r\nDuration={dur}\r\n".encode()
        return mutate_sip(body, self.p, 2) if r.random() < 0.4 else body

    def make(self, idx: int) -> Datagram:
        r, p = self.rng, self.p
        kind = r.choices(self.kinds, self.weights)[0]
        src = SOURCES[idx % len(SOURCES)]
        n = idx
        if kind.startswith("invite_") and kind != "invite_any":
            head, body = self.invite(src, n)
            what = kind[len("invite_"):]
            if what in HEADERS:
                data = mutate_line(head, HEADERS[what], p) + body
            else:
                data = with_length(head, mutate_line(body, SDP_LINES[what], p))
        elif kind == "invite_any":
            data = mutate_sip(b"".join(self.invite(src, n)), p, 4)
        elif kind == "options":
            data = b"".join(request("OPTIONS", self.port, src, n))
            data = data if r.random() < 0.3 else mutate_sip(data, p, 3)
        elif kind in ("bye", "ack"):
            data = b"".join(self.in_dialog(kind.upper(), src, n))
            data = data if r.random() < 0.3 else mutate_sip(data, p, 3)
        elif kind == "info_dtmf":
            data = b"".join(self.in_dialog("INFO", src, n, self.dtmf_body(), "application/dtmf-relay"))
        elif kind == "reinvite":
            head, body = self.in_dialog("INVITE", src, n, sdp(), "application/sdp")
            data = with_length(head, mutate_line(body, r.choice(list(SDP_LINES.values())), p))
        elif kind == "response":
            data = mutate_sip(b"SIP/2.0 200 OK\r\n" + b"".join(request("BYE", self.port, src, n)).split(b"\r\n", 1)[1],
                              p, 3)
        elif kind == "raw":
            data = r.randbytes(r.randint(1, 1500))
        elif kind == "truncated":
            whole = b"".join(self.invite(src, n))
            data = whole[:r.randint(1, len(whole) - 1)]
        elif kind == "oversized":
            head, body = self.invite(src, n)
            size = r.choice((16385, 20000, 40000, 65000))
            data = with_length(head, body + b"a=x-pad:" + b"y" * (size - len(head) - len(body)) + b"\r\n")
        elif kind == "unicode_digits":
            head, body = self.invite(src, n)
            field_ = r.choice((b"CSeq: 1", b"Content-Length: ", b"Max-Forwards: 7", b":5070", b"m=audio 9"))
            digit = r.choice(UNICODE_DIGITS).encode()
            whole = head + body
            data = whole.replace(field_, field_[:-1] + digit, 1) if field_ != b"Content-Length: " \
                else whole.replace(field_, field_ + digit, 1)
        elif kind == "crlf":
            head, body = self.invite(src, n)
            inj = r.choice((b"Subject: a\rX-Injected: 1", b"Subject: a\nX-Injected: 1", b"Subject: a\x00b",
                            b"Subject: a\r\n\r\nINVITE sip:x@127.0.0.1 SIP/2.0", b" folded continuation",
                            b"X-Bad\r\n: value", b"Subject:\r\n\r\n\r\n", b"\r\n\r\n"))
            data = head.replace(b"Max-Forwards: 70\r\n", b"Max-Forwards: 70\r\n" + inj + b"\r\n", 1) + body
        elif kind == "keepalive":
            data = r.choice((b"\r\n\r\n", b"\r\n", b" \t\r\n"))
        else:  # outside_allow: a valid OPTIONS from a source [sip] allow does not hold
            src = OUTSIDE[idx % len(OUTSIDE)]
            data = b"".join(request("OPTIONS", self.port, src, n))
        return Datagram(idx, kind, src, loopback_only(data))


def datagrams(seed: int, n: int, gw_port: int, dialog: Dialog | None = None) -> list[Datagram]:
    gen = _Gen(random.Random(seed), gw_port, dialog)
    return [gen.make(i) for i in range(n)]


@dataclass
class Sent:
    sent: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    keepalives: int = 0
    outside: int = 0
    replies: list[tuple[str, bytes]] = field(default_factory=list)
    seconds: float = 0.0
    send_errors: int = 0


class _Rx(asyncio.DatagramProtocol):
    def __init__(self, src: str, out: list[tuple[str, bytes]]) -> None:
        self.src = src
        self.out = out

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.out.append((self.src, data))

    def error_received(self, exc: Exception) -> None:
        pass


async def send(dgrams: list[Datagram], gw_port: int, rate: float, deadline: float, linger: float = 1.0) -> Sent:
    """Send ``dgrams`` at ``rate`` a second (until ``deadline``), then keep reading replies for
    ``linger`` seconds."""
    loop = asyncio.get_running_loop()
    res = Sent()
    socks: dict[str, asyncio.DatagramTransport] = {}
    try:
        for src in sorted({d.src for d in dgrams}):
            tr, _ = await loop.create_datagram_endpoint(lambda s=src: _Rx(s, res.replies),  # type: ignore[misc]
                                                        local_addr=(src, 0))
            socks[src] = tr
        t0 = time.monotonic()
        for i, d in enumerate(dgrams):
            if time.monotonic() > deadline:
                break
            try:
                socks[d.src].sendto(d.data, ("127.0.0.1", gw_port))
            except OSError:
                res.send_errors += 1
                continue
            res.sent += 1
            res.by_kind[d.kind] = res.by_kind.get(d.kind, 0) + 1
            res.keepalives += not d.data.strip()
            res.outside += d.kind == "outside_allow"
            wait = t0 + (i + 1) / rate - time.monotonic()
            if wait > 0 or i % 64 == 63:
                await asyncio.sleep(max(0.0, wait))
        res.seconds = time.monotonic() - t0
        await asyncio.sleep(linger)
    finally:
        for tr in socks.values():
            tr.close()
    return res


_CALL_ID = re.compile(rb"\r\nCall-ID: ?([^\r]*)", re.I)
_VIA = re.compile(rb"\r\nVia: ?([^\r]*)", re.I)
_CSEQ = re.compile(rb"\r\nCSeq: ?([^\r]*)", re.I)


def replies(got: list[tuple[str, bytes]]) -> dict[int, int]:
    """Final responses by status, each request once (key: its source, Via, Call-ID, CSeq);
    a 503 with Retry-After counts as ``-503`` (the rate limiter's answer)."""
    seen: set[tuple[bytes, ...]] = set()
    out: dict[int, int] = {}
    for src, d in got:
        if not d.startswith(b"SIP/2.0 ") or not d[8:11].isdigit():
            continue
        status = int(d[8:11])
        if status < 200:
            continue
        key = tuple(m.group(1) if m else b"" for m in (_VIA.search(d), _CALL_ID.search(d), _CSEQ.search(d)))
        if (src.encode(), *key) in seen:
            continue
        seen.add((src.encode(), *key))
        code = -503 if status == 503 and b"Rate Limited" in d[:40] else status
        out[code] = out.get(code, 0) + 1
    return out


def udp_drops(port: int) -> int:
    """The kernel's drop count of the UDP socket bound to ``port`` on 127.0.0.1 (0 if not found)."""
    want = f"0100007F:{port:04X}"
    try:
        with open("/proc/net/udp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if len(parts) > 12 and parts[1] == want:
                    return int(parts[-1])
    except OSError:
        pass
    return 0
