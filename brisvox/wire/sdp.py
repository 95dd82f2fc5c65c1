"""SDP offer/answer for one audio stream (RFC 4566, RFC 3264, RFC 4733 payload, RFC 4568 SDES).

Owns the parsing of a remote session description and the building of ours:
which codec (PCMU or PCMA), which telephone-event payload type, the remote
RTP address, the direction (hold is ``sendonly``/``inactive`` or the old
``c=0.0.0.0`` form) and whether the stream is SRTP, with which of the
offer's ``a=crypto`` lines (:mod:`brisvox.wire.srtp` parses them).

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

SRTP (:class:`SrtpPolicy`: ``[sip] srtp`` and whether SDES keys may travel on
signalling that is not TLS). A stream is SRTP when its profile is
``RTP/SAVP``/``RTP/SAVPF``, or ``RTP/AVP``/``RTP/AVPF`` with ``a=crypto``
lines (best-effort SRTP, as baresip's ``mediaenc srtp`` offers it). Of the
offer's ``a=crypto`` lines the first (offer order) that
:func:`~brisvox.wire.srtp.parse_crypto` takes is chosen (at most
``MAX_CRYPTO`` lines are kept per stream). For an offer:

* ``"off"``: an ``RTP/SAVP`` stream is refused; ``a=crypto`` on ``RTP/AVP`` is
  ignored (answered plain, without crypto: the offerer falls back to RTP);
* ``"optional"``: SRTP taken when the stream has a usable line, plain
  ``RTP/AVP`` taken plain; ``RTP/SAVP`` without a usable line refused;
* ``"required"``: only SRTP (either profile, with a usable line);
* keys over clear signalling (``secure_signalling`` False: UDP, TCP) without
  ``allow_insecure_signalling``: a stream that can only be SRTP (``RTP/SAVP``,
  or any under ``"required"``) is refused; a best-effort ``RTP/AVP`` offer with
  ``a=crypto`` under ``"optional"`` is taken plain (its keys, already seen in
  clear, are never used).

A refusal raises :class:`SrtpRefused` (an :class:`SdpError`, 488) naming its
reason (:data:`SRTP_REFUSALS`) when no other audio stream is usable. The
answer mirrors the chosen stream's profile and carries our own attribute
(a fresh key, never the offerer's; the chosen line's tag and suite). For an
answer to our offer (``offered``: the lines we sent), the chosen line must
carry one of our tags with its suite; an answer without crypto is plain
unless we required SRTP or offered ``RTP/SAVP``.

Our offers (the gateway's ``SipCall.offer_sdp``) carry one line per suite of
:data:`~brisvox.wire.srtp.OFFER_ORDER`: ``RTP/SAVP`` under ``"required"``,
``RTP/AVP`` under ``"optional"``. That is what baresip (1.0, its ``srtp``
module) interoperates with: ``mediaenc=srtp`` offers ``RTP/AVP`` with one
``AES_CM_128_HMAC_SHA1_80`` line (tag 1) and accepts an offer in any of
``RTP/AVP``, ``RTP/AVPF``, ``RTP/SAVP``, ``RTP/SAVPF``, taking the first line
of a suite it knows; ``mediaenc=srtp-mand`` offers ``RTP/SAVP`` and accepts
only ``RTP/SAVP``. So a ``"required"`` offer is taken by both, an
``"optional"`` one by ``srtp`` (as SRTP) and by a plain endpoint (as RTP),
not by ``srtp-mand``.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import Literal

from brisvox.wire import srtp

STATIC_PT = {0: "PCMU", 8: "PCMA"}
DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")
_ANSWER_DIR = {"sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive", "sendrecv": "sendrecv"}
_DIGITS_RE = re.compile(r"^[0-9]{1,5}$")
MAX_MEDIA = 8
PLAIN_PROTOS = ("RTP/AVP", "RTP/AVPF")
SECURE_PROTOS = ("RTP/SAVP", "RTP/SAVPF")
RTP_PROTOS = PLAIN_PROTOS + SECURE_PROTOS
MAX_CRYPTO = 16  # a=crypto lines kept per stream; later ones are ignored
# why an offer or answer was refused for SRTP (sip_refused_<reason> in the gateway)
SRTP_REFUSALS = ("srtp_off", "srtp_required", "srtp_no_suite", "srtp_insecure_signalling", "srtp_bad_answer")


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


class SrtpRefused(SdpError):
    """The SRTP rules refuse the description (488); ``reason`` is one of :data:`SRTP_REFUSALS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class SrtpPolicy:
    """``[sip] srtp`` and ``[sip] srtp_allow_insecure_signalling`` (see the module docstring)."""

    mode: Literal["off", "optional", "required"] = "off"
    allow_insecure_signalling: bool = False

    def keys_allowed(self, secure_signalling: bool) -> bool:
        """Whether SDES keys may be sent and taken on this signalling (TLS, or the override)."""
        return secure_signalling or self.allow_insecure_signalling


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
    crypto: list[str] = field(default_factory=list)  # a=crypto values, in order (at most MAX_CRYPTO)


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
            elif cur is not None and name == "crypto" and len(cur.crypto) < MAX_CRYPTO:
                cur.crypto.append(val)
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
    proto: str = "RTP/AVP"  # the stream's profile (the answer mirrors it)
    crypto: srtp.Crypto | None = None  # the peer's chosen a=crypto (its key): the stream is SRTP

    @property
    def secure(self) -> bool:
        """The stream is SRTP."""
        return self.crypto is not None

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


def _chosen_crypto(m: Media, offered: tuple[srtp.Crypto, ...] | None) -> srtp.Crypto | None:
    """The first of ``m``'s a=crypto lines we take (an answer's: one naming a tag and suite we offered)."""
    ours = {(c.tag, c.suite) for c in offered} if offered is not None else None
    for value in m.crypto:
        try:
            c = srtp.parse_crypto(value)
        except srtp.SrtpError:
            continue
        if ours is None or (c.tag, c.suite) in ours:
            return c
    return None


def _srtp_choice(m: Media, policy: SrtpPolicy, secure_signalling: bool,
                 offered: tuple[srtp.Crypto, ...] | None) -> srtp.Crypto | SrtpRefused | None:
    """The stream's SRTP outcome: the peer's line (SRTP), None (plain) or why it is refused."""
    savp = m.proto.upper() in SECURE_PROTOS
    chosen = _chosen_crypto(m, offered) if (policy.mode != "off" or offered) else None
    if offered is not None:  # m is the answer to our offer
        if offered:
            if chosen is not None:
                return chosen
            if m.crypto:
                return SrtpRefused("srtp_bad_answer", "the answer's a=crypto names no line we offered")
            if savp or policy.mode == "required":
                return SrtpRefused("srtp_required", "the answer has no a=crypto and SRTP is required")
            return None
        if savp:
            return SrtpRefused("srtp_bad_answer", "RTP/SAVP answer to an offer without SRTP")
        return None
    if policy.mode == "off":
        return SrtpRefused("srtp_off", "RTP/SAVP offered and [sip] srtp = \"off\"") if savp else None
    must = savp or policy.mode == "required"
    if chosen is None:
        if not must:
            return None
        if m.crypto:
            return SrtpRefused("srtp_no_suite", "no usable a=crypto (AES_CM_128_HMAC_SHA1_80/_32, inline key)")
        return SrtpRefused("srtp_required", "SRTP required and the offer has no a=crypto")
    if not policy.keys_allowed(secure_signalling):
        if must:
            return SrtpRefused("srtp_insecure_signalling", "SDES keys over signalling that is not TLS")
        return None  # best-effort offer over clear signalling: its keys are never used
    return chosen


def negotiate(offer: SessionDescription, codecs: tuple[str, ...] = ("PCMU", "PCMA"), *,
              policy: SrtpPolicy = SrtpPolicy(), secure_signalling: bool = False,
              offered: tuple[srtp.Crypto, ...] | None = None) -> Negotiated:
    """Choose codec, DTMF payload, direction and SRTP for the first usable audio stream.

    ``offer`` is the peer's offer, or (``offered`` given: the a=crypto lines we sent, possibly
    none) the answer to our offer; ``secure_signalling``: it came over TLS (see the module
    docstring for the SRTP rules)."""
    refused: SrtpRefused | None = None
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
        choice = _srtp_choice(m, policy, secure_signalling, offered)
        if isinstance(choice, SrtpRefused):
            refused = refused or choice
            continue
        direction = _ANSWER_DIR[m.direction or offer.direction or "sendrecv"]
        host = m.connection or offer.connection
        if not host:
            raise SdpError("no connection address")
        return Negotiated(codec, pt, dtmf, host, m.port, direction, idx, m.proto.upper(), choice)
    if refused is not None:
        raise refused
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
    crypto: tuple[srtp.Crypto, ...] = (),
    proto: str = "RTP/AVP",
) -> bytes:
    """Our SDP: the answer to ``offer`` for ``neg``, or (``neg`` None) an offer.

    ``crypto``: our a=crypto lines (an answer for an SRTP ``neg``: exactly our one, with the
    chosen tag; an offer: each suite we offer); ``proto``: an offer's profile (an answer
    mirrors the offer's). ValueError for an SRTP answer without our line (never sent)."""
    if neg is not None and offer is not None and neg.secure and len(crypto) != 1:
        raise ValueError("an SRTP answer carries exactly our one a=crypto line")
    ip = "IP6" if ":" in host else "IP4"
    lines = [
        "v=0",
        f"o=brisvox {session_id} {version} IN {ip} {host}",
        "s=brisvox",
        f"c=IN {ip} {host}",
        "t=0 0",
    ]

    def audio(pts: list[tuple[int, str]], te: int, direction: str, profile: str) -> None:
        fmts = [str(p) for p, _ in pts] + ([str(te)] if te >= 0 else [])
        lines.append(f"m=audio {port} {profile} {' '.join(fmts)}")
        for p, name in pts:
            lines.append(f"a=rtpmap:{p} {name}/8000")
        if te >= 0:
            lines.append(f"a=rtpmap:{te} telephone-event/8000")
            lines.append(f"a=fmtp:{te} 0-16")
        lines.append("a=ptime:20")
        lines.append(f"a={direction}")
        for c in crypto:
            lines.append(f"a=crypto:{c.value()}")

    if neg is None or offer is None:
        pts = [(0 if c == "PCMU" else 8, c) for c in codecs]
        audio(pts, dtmf_pt, "sendrecv", proto)
    else:
        if not neg.secure:
            crypto = ()
        for idx, m in enumerate(offer.media):
            if idx == neg.audio_index:
                audio([(neg.payload_type, neg.codec)], neg.dtmf_pt, neg.direction, neg.proto)
            else:
                fmts = " ".join(m.formats) or "0"
                lines.append(f"m={m.kind} 0 {m.proto} {fmts}")
    return ("\r\n".join(lines) + "\r\n").encode()
