"""SDP offer/answer for one audio stream (RFC 4566, RFC 3264, RFC 4733 payload).

Owns the parsing of a remote session description and the building of ours:
which codec (PCMU or PCMA), which telephone-event payload type, the remote
RTP address and the direction (hold is ``sendonly``/``inactive`` or the old
``c=0.0.0.0`` form).

Invariants:

* :func:`negotiate` picks the first codec of the OFFER's order that we
  support (the offerer's preference, RFC 3264 6.1), restricted to our
  configured list; nothing acceptable raises :class:`SdpError` (-> 488).
* The answer has exactly as many ``m=`` lines as the offer: streams we do not
  take (video, a second audio) are answered with port 0.
* The direction of the answer mirrors the offer: sendonly -> recvonly,
  recvonly -> sendonly, inactive -> inactive, otherwise sendrecv.
* :func:`parse` raises only :class:`SdpError`, whatever the bytes. What it
  returns is checked: every connection address is an IP literal of the
  ``c=`` line's family, unicast (no hostname: using one would mean a DNS
  lookup per RTP packet), stored in its normalised form; every ``m=`` port is
  0..65535 (ASCII digits); an RTP stream's payload types are 0..127; at most
  ``MAX_MEDIA`` streams (a longer offer is refused: the answer must mirror
  every ``m=`` line). Attributes with a malformed number are ignored.
* :func:`negotiate` skips streams with port 0 (declined by the offerer), so a
  :class:`Negotiated` has a port 1..65535 and an IP address.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field

STATIC_PT = {0: "PCMU", 8: "PCMA"}
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_ANSWER_DIR = {"sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive", "sendrecv": "sendrecv"}
_DIGITS_RE = re.compile(r"^[0-9]{1,5}$")
MAX_MEDIA = 8
RTP_PROTOS = ("RTP/AVP", "RTP/AVPF")


def _num(s: str, hi: int) -> int:
    """ASCII digits within 0..hi, else -1."""
    if _DIGITS_RE.match(s) is None:
        return -1
    n = int(s)
    return n if n <= hi else -1


def _address(family: str, text: str) -> str:
    """The normalised unicast IP literal of a ``c=`` line; SdpError otherwise."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        raise SdpError(f"connection address is not an IP literal: {text[:40]!r}") from None
    if (ip.version == 4) != (family == "IP4"):
        raise SdpError(f"connection address {text[:40]!r} is not {family}")
    if ip.is_multicast:
        raise SdpError("multicast connection address")
    return str(ip)


class SdpError(Exception):
    """Unusable or unacceptable session description (answer 488 or 400)."""


@dataclass(slots=True)
class Media:
    kind: str
    port: int
    proto: str
    formats: list[str]
    rtpmap: dict[int, str] = field(default_factory=dict)  # pt -> "name/rate"
    fmtp: dict[int, str] = field(default_factory=dict)
    direction: str = ""
    connection: str = ""
    ptime: int = 0


@dataclass(slots=True)
class SessionDescription:
    origin: str = ""
    connection: str = ""
    direction: str = "sendrecv"
    media: list[Media] = field(default_factory=list)


def parse(body: bytes) -> SessionDescription:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SdpError("SDP is not UTF-8") from None
    sd = SessionDescription()
    cur: Media | None = None
    for raw in text.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        t, v = line[0], line[2:]
        if t == "o":
            sd.origin = v
        elif t == "c":
            parts = v.split()
            if len(parts) != 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
                raise SdpError(f"bad c= line {v[:60]!r}")
            addr = _address(parts[1], parts[2].split("/")[0])
            if cur is None:
                sd.connection = addr
            else:
                cur.connection = addr
        elif t == "m":
            parts = v.split()
            port_s, _, count = parts[1].partition("/") if len(parts) > 1 else ("", "", "")
            port = _num(port_s, 65535)
            if len(parts) < 4 or port < 0 or (count and _num(count, 65535) < 1):
                raise SdpError(f"bad m= line {v[:60]!r}")
            if len(sd.media) >= MAX_MEDIA:
                raise SdpError(f"more than {MAX_MEDIA} m= lines")
            cur = Media(parts[0], port, parts[2], parts[3:])
            if cur.proto.upper() in RTP_PROTOS and any(_num(f, 127) < 0 for f in cur.formats):
                raise SdpError(f"bad payload type in m= line {v[:60]!r}")
            sd.media.append(cur)
        elif t == "a":
            name, _, val = v.partition(":")
            if name in DIRECTIONS:
                if cur is None:
                    sd.direction = name
                else:
                    cur.direction = name
            elif cur is not None and name == "rtpmap":
                pt, _, enc = val.partition(" ")
                if _num(pt, 127) >= 0:
                    cur.rtpmap[int(pt)] = enc.strip()
            elif cur is not None and name == "fmtp":
                pt, _, params = val.partition(" ")
                if _num(pt, 127) >= 0:
                    cur.fmtp[int(pt)] = params.strip()
            elif cur is not None and name == "ptime" and 0 < _num(val.strip(), 1000):
                cur.ptime = int(val.strip())
    if not sd.media:
        raise SdpError("no m= line")
    return sd


@dataclass(frozen=True, slots=True)
class Negotiated:
    """What offer/answer agreed for the audio stream."""

    codec: str  # PCMU | PCMA
    payload_type: int
    dtmf_pt: int  # -1 when telephone-event was not offered
    remote_host: str
    remote_port: int
    direction: str  # OUR direction (from the answer): sendrecv, recvonly (held), ...
    audio_index: int  # index of the audio m= line

    @property
    def on_hold(self) -> bool:
        """The remote does not want our audio (it sent sendonly/inactive or c=0.0.0.0)."""
        return self.direction in ("recvonly", "inactive") or self.remote_host in ("0.0.0.0", "::")

    @property
    def we_send(self) -> bool:
        return not self.on_hold and self.remote_port > 0


def _codec_name(m: Media, pt: int) -> str:
    enc = m.rtpmap.get(pt)
    if enc:
        name, _, rest = enc.partition("/")
        rate = rest.split("/")[0]
        return f"{name.upper()}/{rate}"
    if pt in STATIC_PT:
        return f"{STATIC_PT[pt]}/8000"
    return ""


def negotiate(offer: SessionDescription, codecs: tuple[str, ...] = ("PCMU", "PCMA")) -> Negotiated:
    """Choose codec, DTMF payload and direction for the first usable audio stream."""
    for idx, m in enumerate(offer.media):
        if m.kind != "audio" or m.proto.upper() not in RTP_PROTOS or not 0 < m.port <= 65535:
            continue
        codec, pt, dtmf = "", -1, -1
        for f in m.formats:
            p = _num(f, 127)
            if p < 0:
                continue
            name = _codec_name(m, p)
            if name == "TELEPHONE-EVENT/8000" and dtmf < 0:
                dtmf = p
            elif not codec and name in (f"{c}/8000" for c in codecs):
                codec, pt = name.split("/")[0], p
        if not codec:
            continue
        direction = _ANSWER_DIR[m.direction or offer.direction or "sendrecv"]
        host = m.connection or offer.connection
        if not host:
            raise SdpError("no connection address")
        return Negotiated(codec, pt, dtmf, host, m.port, direction, idx)
    raise SdpError("no acceptable audio codec (PCMU, PCMA over RTP/AVP)")


def build(
    *,
    host: str,
    port: int,
    session_id: int,
    version: int,
    neg: Negotiated | None,
    offer: SessionDescription | None = None,
    codecs: tuple[str, ...] = ("PCMU", "PCMA"),
    dtmf_pt: int = 101,
) -> bytes:
    """Our SDP: the answer to ``offer`` for ``neg``, or (``neg`` None) an offer."""
    ip = "IP6" if ":" in host else "IP4"
    lines = [
        "v=0",
        f"o=brisvox {session_id} {version} IN {ip} {host}",
        "s=brisvox",
        f"c=IN {ip} {host}",
        "t=0 0",
    ]

    def audio(pts: list[tuple[int, str]], te: int, direction: str) -> None:
        fmts = [str(p) for p, _ in pts] + ([str(te)] if te >= 0 else [])
        lines.append(f"m=audio {port} RTP/AVP {' '.join(fmts)}")
        for p, name in pts:
            lines.append(f"a=rtpmap:{p} {name}/8000")
        if te >= 0:
            lines.append(f"a=rtpmap:{te} telephone-event/8000")
            lines.append(f"a=fmtp:{te} 0-16")
        lines.append("a=ptime:20")
        lines.append(f"a={direction}")

    if neg is None or offer is None:
        pts = [(0 if c == "PCMU" else 8, c) for c in codecs]
        audio(pts, dtmf_pt, "sendrecv")
    else:
        for idx, m in enumerate(offer.media):
            if idx == neg.audio_index:
                audio([(neg.payload_type, neg.codec)], neg.dtmf_pt, neg.direction)
            else:
                fmts = " ".join(m.formats) or "0"
                lines.append(f"m={m.kind} 0 {m.proto} {fmts}")
    return ("\r\n".join(lines) + "\r\n").encode()
