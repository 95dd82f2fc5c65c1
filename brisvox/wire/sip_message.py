"""SIP message parser and serializer (RFC 3261 section 7, 20, 25; UDP only).

Owns the bytes <-> :class:`SipMessage` conversion and the small header
grammars the user agent needs (Via, name-addr with tag, CSeq, SIP URI).

Invariants:

* :func:`parse` raises only :class:`SipParseError`, whatever the bytes; its
  ``kind`` is a stable counter label and ``can_reply`` says whether the
  headers needed for a 400 response (Via, From, To, Call-ID, CSeq) were read,
  so the caller can answer 400 (513 for ``oversized``) or silently drop. A
  message it returns has a well-formed start line, Via, From, To, CSeq and
  (when present) Contact and Max-Forwards, so the properties below
  (``cseq``, ``top_via``, ``from_tag``, ``to_tag``) cannot raise on it.
* Numbers are ASCII digits only (never ``str.isdigit``, which accepts
  ``'²'``) and range-checked: CSeq 0..2**31-1, ports 1..65535, status
  100..699, Max-Forwards 0..255, Content-Length at most the bytes received.
* Bounds: a datagram is at most ``max_bytes``; at most ``MAX_HEADERS`` header
  fields; a Content-Length beyond the datagram is an error (RFC 3261 18.3),
  never a wait for more data. Header names are tokens; header values hold no
  control characters (a lone CR or a NUL is refused, not passed on).
* Output: :meth:`SipMessage.serialize` never writes a CR, LF or other control
  character inside a start line or header value (they become spaces), so no
  value can start a header of its own; :func:`quoted_string` is the escape
  for text from a model or a caller inside a quoted-string.
* Header names are stored lower-case in their long form (compact forms such
  as ``v``, ``i``, ``m`` are expanded); order and repetition are kept, so a
  proxy's Via and Record-Route chains survive a round trip.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

MAX_HEADERS = 128
MAX_LINE = 4096

COMPACT = {
    "v": "via", "f": "from", "t": "to", "i": "call-id", "m": "contact",
    "l": "content-length", "c": "content-type", "k": "supported", "s": "subject",
    "e": "content-encoding", "o": "event", "r": "refer-to", "b": "referred-by",
    "x": "session-expires", "u": "allow-events",
}
# canonical spelling for serialization
CANON = {
    "via": "Via", "from": "From", "to": "To", "call-id": "Call-ID", "cseq": "CSeq",
    "contact": "Contact", "content-length": "Content-Length", "content-type": "Content-Type",
    "max-forwards": "Max-Forwards", "record-route": "Record-Route", "route": "Route",
    "www-authenticate": "WWW-Authenticate", "refer-to": "Refer-To", "referred-by": "Referred-By",
    "allow-events": "Allow-Events", "rseq": "RSeq", "rack": "RAck", "mime-version": "MIME-Version",
    "session-expires": "Session-Expires", "min-se": "Min-SE",
}
# headers whose comma-separated values are separate entries (RFC 3261 7.3.1)
MULTI = {"via", "route", "record-route", "contact", "allow", "supported", "require", "accept"}
REQUIRED = ("via", "from", "to", "call-id", "cseq")
_METHOD_RE = re.compile(r"^[A-Za-z!%*_+`'~.-]{1,32}$")
_TOKEN_RE = re.compile(r"^[A-Za-z0-9!%*_+`'~.-]{1,64}$")
_DIGITS_RE = re.compile(r"^[0-9]+$")
_CTL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # control characters but HTAB
_TEXT_CTL_RE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
BRANCH_MAGIC = "z9hG4bK"
MAX_CSEQ = 2**31 - 1
MAX_DATAGRAM = 65535


class SipParseError(Exception):
    """Malformed SIP. ``kind`` is the counter label; ``msg`` the partial message, if any."""

    def __init__(self, kind: str, detail: str, msg: SipMessage | None = None) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.msg = msg

    @property
    def can_reply(self) -> bool:
        m = self.msg
        return m is not None and m.is_request and all(m.get(h) for h in REQUIRED)


@dataclass(slots=True)
class SipMessage:
    """A request (``method``/``uri``) or a response (``status``/``reason``)."""

    method: str = ""
    uri: str = ""
    status: int = 0
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        return bool(self.method)

    # -- headers ----------------------------------------------------------

    def get(self, name: str, default: str = "") -> str:
        name = name.lower()
        for k, v in self.headers:
            if k == name:
                return v
        return default

    def get_all(self, name: str) -> list[str]:
        name = name.lower()
        return [v for k, v in self.headers if k == name]

    def set(self, name: str, value: str) -> None:
        name = name.lower()
        for i, (k, _) in enumerate(self.headers):
            if k == name:
                self.headers[i] = (k, value)
                self.headers = [h for j, h in enumerate(self.headers) if j <= i or h[0] != name]
                return
        self.headers.append((name, value))

    def add(self, name: str, value: str) -> None:
        self.headers.append((name.lower(), value))

    def remove(self, name: str) -> None:
        name = name.lower()
        self.headers = [h for h in self.headers if h[0] != name]

    # -- common fields ----------------------------------------------------

    @property
    def call_id(self) -> str:
        return self.get("call-id")

    @property
    def cseq(self) -> tuple[int, str]:
        return parse_cseq(self.get("cseq"))

    @property
    def top_via(self) -> Via:
        return parse_via(self.get("via"))

    @property
    def from_tag(self) -> str:
        return parse_name_addr(self.get("from")).params.get("tag", "")

    @property
    def to_tag(self) -> str:
        return parse_name_addr(self.get("to")).params.get("tag", "")

    # -- wire -------------------------------------------------------------

    def serialize(self) -> bytes:
        if self.is_request:
            lines = [f"{self.method} {self.uri} SIP/2.0"]
        else:
            lines = [f"SIP/2.0 {self.status} {self.reason}"]
        for k, v in self.headers:
            if k == "content-length":
                continue
            lines.append(f"{CANON.get(k, _title(k))}: {v}")
        lines.append(f"Content-Length: {len(self.body)}")
        for i, line in enumerate(lines):
            if _CTL_RE.search(line):  # defence in depth: no value starts a header of its own
                lines[i] = _CTL_RE.sub(" ", line)
        return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + self.body


def _title(name: str) -> str:
    return "-".join(p[:1].upper() + p[1:] for p in name.split("-"))


def _split_commas(value: str) -> list[str]:
    """Split a header value at commas outside quotes and <...>."""
    out: list[str] = []
    depth = 0
    quoted = False
    start = 0
    i = 0
    n = len(value)
    while i < n:
        c = value[i]
        if quoted:
            if c == "\\":
                i += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        elif c == "<":
            depth += 1
        elif c == ">":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            out.append(value[start:i].strip())
            start = i + 1
        i += 1
    out.append(value[start:].strip())
    return [v for v in out if v]


def is_digits(s: str) -> bool:
    """ASCII digits only (``str.isdigit`` also accepts ``'²'``, which ``int`` refuses)."""
    return _DIGITS_RE.match(s) is not None


def parse(data: bytes, max_bytes: int = MAX_DATAGRAM) -> SipMessage:
    """One UDP datagram -> message. Raises :class:`SipParseError` only.

    A datagram over ``max_bytes`` (but within a UDP datagram) is still parsed,
    so the ``oversized`` error carries the headers a 513 response needs."""
    n = len(data)
    if n > max_bytes:
        detail = f"{n} bytes > {max_bytes}"
        if n > MAX_DATAGRAM:
            raise SipParseError("oversized", detail)
        try:
            msg = _parse(data)
        except SipParseError as e:
            raise SipParseError("oversized", detail, e.msg) from None
        raise SipParseError("oversized", detail, msg)
    return _parse(data)


def _parse(data: bytes) -> SipMessage:
    sep = data.find(b"\r\n\r\n")
    if sep >= 0:
        head, body_start = data[:sep], sep + 4
    else:
        sep = data.find(b"\n\n")
        if sep < 0:
            raise SipParseError("truncated", "no end of headers")
        head, body_start = data[:sep], sep + 2
    try:
        text = bytes(head).decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError("bad_encoding", "headers are not UTF-8") from None
    raw_lines = text.replace("\r\n", "\n").split("\n")
    while raw_lines and not raw_lines[0].strip():
        raw_lines.pop(0)  # RFC 3261 7.5: ignore leading CRLFs
    if not raw_lines:
        raise SipParseError("garbage", "empty message")
    start = raw_lines[0]
    if len(start) > MAX_LINE or _CTL_RE.search(start):
        raise SipParseError("garbage", "start line too long or with control characters")
    msg = SipMessage()
    parts = start.split(" ", 2)
    if start.startswith("SIP/2.0 "):
        if len(parts) < 2 or len(parts[1]) != 3 or not is_digits(parts[1]):
            raise SipParseError("garbage", "bad status line")
        msg.status = int(parts[1])
        msg.reason = parts[2] if len(parts) > 2 else ""
        if not 100 <= msg.status <= 699:
            raise SipParseError("garbage", "status out of range")
    else:
        if len(parts) != 3 or parts[2] != "SIP/2.0" or not _METHOD_RE.match(parts[0]) or not parts[1]:
            raise SipParseError("garbage", "bad request line")
        msg.method = parts[0]
        msg.uri = parts[1]
    # unfold continuation lines
    lines: list[str] = []
    for line in raw_lines[1:]:
        if line[:1] in (" ", "\t") and lines:
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    if len(lines) > MAX_HEADERS:
        raise SipParseError("too_many_headers", f"{len(lines)} header lines", msg)
    for line in lines:
        if len(line) > MAX_LINE:
            raise SipParseError("bad_header", "header line too long", msg)
        name, colon, value = line.partition(":")
        name = name.strip().lower()
        if not colon or not _TOKEN_RE.match(name):
            raise SipParseError("bad_header", f"malformed header line {line[:40]!r}", msg)
        if _CTL_RE.search(value):
            raise SipParseError("bad_header", f"control character in {name}", msg)
        name = COMPACT.get(name, name)
        value = value.strip()
        if name in MULTI:
            for v in _split_commas(value):
                msg.headers.append((name, v))
        else:
            msg.headers.append((name, value))
    body = data[body_start:]
    cl = msg.get("content-length")
    if cl:
        if len(cl) > 9 or not is_digits(cl):
            raise SipParseError("bad_content_length", f"Content-Length {cl[:20]!r}", msg)
        n = int(cl)
        if n > len(body):
            raise SipParseError("bad_content_length", f"Content-Length {n} > {len(body)} bytes received", msg)
        body = body[:n]
    msg.body = bytes(body)
    for h in REQUIRED:
        if not msg.get(h):
            raise SipParseError("missing_header", f"missing {h}", msg)
    _check_headers(msg)
    return msg


def _check_headers(msg: SipMessage) -> None:
    """The header grammars the user agent relies on; :class:`SipParseError` ``bad_header``."""
    try:
        _, method = parse_cseq(msg.get("cseq"))
    except ValueError:
        raise SipParseError("bad_header", "bad CSeq", msg) from None
    if msg.is_request and method != msg.method:
        raise SipParseError("bad_header", "CSeq method differs from the request method", msg)
    try:
        parse_via(msg.get("via"))
    except ValueError:
        raise SipParseError("bad_header", "bad Via", msg) from None
    for h in ("from", "to", "contact"):
        v = msg.get(h)
        if not v:
            continue
        try:
            na = parse_name_addr(v)
        except ValueError:
            raise SipParseError("bad_header", f"bad {h}", msg) from None
        if not na.uri and not (h == "contact" and v.strip() == "*"):
            raise SipParseError("bad_header", f"bad {h}", msg)
    mf = msg.get("max-forwards")
    if mf and (len(mf) > 3 or not is_digits(mf) or int(mf) > 255):
        raise SipParseError("bad_header", "bad Max-Forwards", msg)


# -- small grammars -------------------------------------------------------


def parse_cseq(value: str) -> tuple[int, str]:
    num, _, method = value.strip().partition(" ")
    method = method.strip()
    if len(num) > 10 or not is_digits(num) or int(num) > MAX_CSEQ or not _METHOD_RE.match(method):
        raise ValueError(f"bad CSeq {value[:40]!r}")
    return int(num), method


def _params(s: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in s.split(";"):
        p = p.strip()
        if not p:
            continue
        k, _, v = p.partition("=")
        out[k.strip().lower()] = v.strip()
    return out


@dataclass(frozen=True, slots=True)
class Via:
    transport: str
    host: str
    port: int  # 0 when absent
    params: dict[str, str]

    @property
    def branch(self) -> str:
        return self.params.get("branch", "")


def parse_via(value: str) -> Via:
    proto, _, rest = value.strip().partition(" ")
    parts = proto.split("/")
    if len(parts) != 3 or parts[0].upper() != "SIP":
        raise ValueError(f"bad Via {value!r}")
    sent_by, _, params = rest.strip().partition(";")
    host, port = split_hostport(sent_by.strip())
    if not host:
        raise ValueError(f"bad Via {value!r}")
    return Via(parts[2].upper(), host, port, _params(params))


def split_hostport(s: str) -> tuple[str, int]:
    s = s.strip()
    if s.startswith("["):
        end = s.find("]")
        if end < 0:
            raise ValueError(f"bad host in {s[:40]!r}")
        host, rest = s[1:end], s[end + 1 :]
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad host in {s[:40]!r}")
        port = rest[1:]
        if rest and not port:
            raise ValueError(f"bad port in {s[:40]!r}")
    else:
        host, colon, port = s.partition(":")
        if colon and not port:
            raise ValueError(f"bad port in {s[:40]!r}")
    if port and (len(port) > 5 or not is_digits(port) or not 0 < int(port) < 65536):
        raise ValueError(f"bad port in {s[:40]!r}")
    return host, int(port) if port else 0


@dataclass(frozen=True, slots=True)
class NameAddr:
    display: str
    uri: str
    params: dict[str, str]


def parse_name_addr(value: str) -> NameAddr:
    """``"Alice" <sip:a@h>;tag=x`` or ``sip:a@h;tag=x`` (params then belong to the header)."""
    v = value.strip()
    lt = v.find("<")
    if lt >= 0:
        gt = v.find(">", lt)
        if gt < 0:
            raise ValueError(f"bad name-addr {value!r}")
        display = v[:lt].strip().strip('"')
        uri = v[lt + 1 : gt].strip()
        params = _params(v[gt + 1 :])
    else:
        display = ""
        uri, _, p = v.partition(";")
        params = _params(p)
    return NameAddr(display, uri.strip(), params)


@dataclass(frozen=True, slots=True)
class SipUri:
    scheme: str
    user: str
    host: str
    port: int
    params: dict[str, str]


def parse_uri(uri: str) -> SipUri:
    scheme, colon, rest = uri.partition(":")
    if not colon or scheme.lower() not in ("sip", "sips", "tel"):
        raise ValueError(f"bad URI {uri!r}")
    rest = rest.split("?", 1)[0]
    main, _, params = rest.partition(";")
    user, at, hostport = main.rpartition("@")
    if not at:
        user, hostport = "", main
    host, port = split_hostport(hostport) if scheme.lower() != "tel" else (hostport, 0)
    return SipUri(scheme.lower(), user, host, port, _params(params))


def uri_number(uri: str) -> str:
    """The number (or name) a URI addresses: a SIP URI's user part (``sip:+15550100@h`` ->
    ``+15550100``), a ``tel:`` URI's number; "" when it has none or is no SIP or tel URI."""
    try:
        u = parse_uri(uri)
    except ValueError:
        return ""
    return u.host if u.scheme == "tel" else u.user


def quoted_string(text: str, limit: int = 128) -> str:
    """``text`` made safe inside an RFC 3261 quoted-string (the caller adds the quotes).

    Control characters (CR, LF, NUL, C1, the Unicode line separators) become
    spaces, runs of whitespace collapse, ``"`` and ``\\`` are escaped as
    quoted-pairs, and the result is cut to at most ``limit`` UTF-8 bytes on a
    character boundary (never inside a quoted-pair). For any input the output
    holds no control character and no unescaped quote, so it can end neither
    the string nor the header."""
    clean = " ".join(_TEXT_CTL_RE.sub(" ", text).split())
    clean = clean.encode("utf-8")[:limit].decode("utf-8", "ignore")
    out = clean.replace("\\", "\\\\").replace('"', '\\"')
    while len(out.encode("utf-8")) > limit:
        clean = clean[:-1]
        out = clean.replace("\\", "\\\\").replace('"', '\\"')
    return out


def new_tag() -> str:
    return secrets.token_hex(6)


def new_branch() -> str:
    return BRANCH_MAGIC + secrets.token_hex(8)


def new_call_id(host: str) -> str:
    return f"{secrets.token_hex(10)}@{host}"
