"""SIP digest authentication (RFC 3261 section 22, RFC 7616, RFC 8760), pure: no I/O, no clock reads.

Owns the digest maths of both directions and the server's nonces:

* the client side: :func:`pick_challenge` chooses the best usable challenge of
  a 401/407 (SHA-256 before MD5, RFC 8760 section 2.4), :func:`authorization`
  builds the (Proxy-)Authorization value for it;
* the server side: :class:`DigestServer` issues challenges
  (:func:`challenge_value`, always ``qop="auth"``) and judges an
  Authorization (:meth:`DigestServer.verify` -> :class:`Verdict`), holding a
  :class:`NonceMint` (stateless nonces bound to the time they were minted and
  the source they were minted for) and :class:`NonceCounts` (replay
  protection: a nonce count is accepted once, and only increasing).

Invariants:

* Every input is bounded before it is parsed: a header value longer than
  :data:`MAX_VALUE` bytes, a parameter longer than :data:`MAX_PARAM` or more
  than :data:`MAX_PARAMS` parameters is a :class:`DigestError`; the parsers
  raise nothing else.
* A nonce carries its mint time and a truncated HMAC-SHA256 of that time and
  the source under a process key; a nonce for another source, modified,
  forged or from the future is ``bad``, a genuine one older than the
  lifetime ``stale`` (the client re-answers a challenge with
  ``stale=true`` without asking its user again).
* The digest-uri must be a SIP URI when the request's is (:func:`_both_sip`).
* The server checks the response before the nonce count, so a forger who
  cannot compute a response cannot burn a nonce's counts; responses are
  compared in constant time (:func:`hmac.compare_digest`).
* Nothing here logs, formats or reprs a secret (``DigestCredentials.secret``
  is left out of its repr).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "ALGORITHMS", "Authorization", "Challenge", "DigestCredentials", "DigestError", "DigestServer",
    "NonceCounts", "NonceMint", "Verdict", "authorization", "challenge_value", "parse_authorization",
    "parse_challenge", "pick_challenge", "response_for",
]

ALGORITHMS: tuple[str, ...] = ("SHA-256", "MD5")  # the server offers, the client prefers, in this order
_HASHES = {"MD5": hashlib.md5, "SHA-256": hashlib.sha256}
MAX_VALUE = 4096
MAX_PARAM = 1024
MAX_PARAMS = 32
_PARAM = re.compile(r'\s*([A-Za-z][A-Za-z0-9_-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s",]+))\s*(?:,|$)')


class DigestError(ValueError):
    """A challenge or an Authorization that cannot be used (syntax, bounds, scheme, algorithm)."""


def _params(value: str, what: str) -> dict[str, str]:
    """``Digest k=v, k="v"`` -> {k: v} (names lowercased); DigestError unless it is one."""
    if len(value) > MAX_VALUE:
        raise DigestError(f"{what} longer than {MAX_VALUE} bytes")
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "digest":
        raise DigestError(f"{what}: not the Digest scheme")
    out: dict[str, str] = {}
    pos, rest = 0, rest.strip()
    while pos < len(rest):
        m = _PARAM.match(rest, pos)
        if m is None or m.end() == pos:
            raise DigestError(f"{what}: bad syntax at {pos}")
        name = m.group(1).lower()
        raw = m.group(2)
        val = re.sub(r"\\(.)", r"\1", raw) if raw is not None else m.group(3)
        if len(val) > MAX_PARAM:
            raise DigestError(f"{what}: {name} longer than {MAX_PARAM}")
        if name in out:
            raise DigestError(f"{what}: {name} given twice")
        out[name] = val
        if len(out) > MAX_PARAMS:
            raise DigestError(f"{what}: more than {MAX_PARAMS} parameters")
        pos = m.end()
    return out


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _algorithm(name: str) -> tuple[str, bool]:
    """("SHA-256" | "MD5", is -sess); DigestError for any other."""
    base = name.upper()
    sess = base.endswith("-SESS")
    if sess:
        base = base[:-5]
    if base not in _HASHES:
        raise DigestError(f"unsupported algorithm {name[:40]!r}")
    return base, sess


def _h(alg: str, data: str) -> str:
    return _HASHES[alg](data.encode("utf-8")).hexdigest()


def _response(algorithm: str, username: str, realm: str, secret: str, method: str, uri: str, nonce: str,
              qop: str, nc: int, cnonce: str) -> str:
    """RFC 7616 section 3.4.1 (qop=auth) or RFC 2069 (no qop)."""
    alg, sess = _algorithm(algorithm)
    ha1 = _h(alg, f"{username}:{realm}:{secret}")
    if sess:
        ha1 = _h(alg, f"{ha1}:{nonce}:{cnonce}")
    ha2 = _h(alg, f"{method}:{uri}")
    if qop:
        return _h(alg, f"{ha1}:{nonce}:{nc:08x}:{cnonce}:{qop}:{ha2}")
    return _h(alg, f"{ha1}:{nonce}:{ha2}")


# -- the client side -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Challenge:
    """One WWW-Authenticate / Proxy-Authenticate value."""

    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: tuple[str, ...] = ()
    opaque: str = ""
    stale: bool = False


def parse_challenge(value: str) -> Challenge:
    p = _params(value, "challenge")
    if not p.get("realm") and "realm" not in p:
        raise DigestError("challenge without realm")
    if not p.get("nonce"):
        raise DigestError("challenge without nonce")
    algorithm = p.get("algorithm", "MD5")
    _algorithm(algorithm)
    qop = tuple(q.strip().lower() for q in p.get("qop", "").split(",") if q.strip())
    return Challenge(realm=p["realm"], nonce=p["nonce"], algorithm=algorithm, qop=qop,
                     opaque=p.get("opaque", ""), stale=p.get("stale", "").lower() == "true")


def pick_challenge(values: Iterable[str]) -> Challenge | None:
    """The best usable challenge of a response's headers (SHA-256 before MD5; a challenge
    offering only ``auth-int`` is unusable); None when none is."""
    best: Challenge | None = None
    rank = -1
    for v in values:
        try:
            ch = parse_challenge(v)
        except DigestError:
            continue
        if ch.qop and "auth" not in ch.qop:
            continue
        alg, _ = _algorithm(ch.algorithm)
        r = len(ALGORITHMS) - ALGORITHMS.index(alg)
        if r > rank:
            best, rank = ch, r
    return best


@dataclass(frozen=True, slots=True)
class DigestCredentials:
    """A user's name and secret for ``realm`` (``""``: whatever realm challenges)."""

    username: str
    secret: str = field(repr=False)
    realm: str = ""


def authorization(ch: Challenge, creds: DigestCredentials, method: str, uri: str, nc: int, cnonce: str) -> str:
    """The (Proxy-)Authorization value answering ``ch`` for a ``method`` request to ``uri``."""
    qop = "auth" if ch.qop else ""
    resp = _response(ch.algorithm, creds.username, ch.realm, creds.secret, method, uri, ch.nonce, qop, nc, cnonce)
    parts = [f"username={_quote(creds.username)}", f"realm={_quote(ch.realm)}", f"nonce={_quote(ch.nonce)}",
             f"uri={_quote(uri)}", f"response={_quote(resp)}", f"algorithm={ch.algorithm}"]
    if qop:
        parts += [f"qop={qop}", f"nc={nc:08x}", f"cnonce={_quote(cnonce)}"]
    if ch.opaque:
        parts.append(f"opaque={_quote(ch.opaque)}")
    return "Digest " + ", ".join(parts)


# -- the server side -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Authorization:
    """A parsed Authorization / Proxy-Authorization value."""

    username: str
    realm: str
    nonce: str
    uri: str
    response: str
    algorithm: str = "MD5"
    qop: str = ""
    nc: int = 0
    cnonce: str = ""
    opaque: str = ""


def parse_authorization(value: str) -> Authorization:
    p = _params(value, "authorization")
    for k in ("username", "realm", "nonce", "uri", "response"):
        if k not in p:
            raise DigestError(f"authorization without {k}")
    qop = p.get("qop", "").lower()
    nc = 0
    if qop:
        try:
            nc = int(p.get("nc", ""), 16)
        except ValueError:
            raise DigestError("authorization: nc is not 8 hex digits") from None
        if len(p.get("nc", "")) != 8 or not p.get("cnonce"):
            raise DigestError("authorization: qop without nc (8 hex digits) and cnonce")
    algorithm = p.get("algorithm", "MD5")
    _algorithm(algorithm)
    return Authorization(username=p["username"], realm=p["realm"], nonce=p["nonce"], uri=p["uri"],
                         response=p["response"].lower(), algorithm=algorithm, qop=qop, nc=nc,
                         cnonce=p.get("cnonce", ""), opaque=p.get("opaque", ""))


def response_for(auth: Authorization, secret: str, method: str) -> str:
    """The response a client that knows ``secret`` computes for ``auth``'s parameters."""
    return _response(auth.algorithm, auth.username, auth.realm, secret, method, auth.uri, auth.nonce, auth.qop,
                     auth.nc, auth.cnonce)


def challenge_value(realm: str, nonce: str, algorithm: str, stale: bool = False, opaque: str = "") -> str:
    """A WWW-Authenticate / Proxy-Authenticate value (``qop="auth"``)."""
    parts = [f"realm={_quote(realm)}", f"nonce={_quote(nonce)}", f"algorithm={algorithm}", 'qop="auth"']
    if opaque:
        parts.append(f"opaque={_quote(opaque)}")
    if stale:
        parts.append("stale=true")
    return "Digest " + ", ".join(parts)


_MAC_BYTES = 16
_HEAD_BYTES = 12  # the mint time (ms) and a sequence number: two nonces are never equal
_NONCE_BYTES = _HEAD_BYTES + _MAC_BYTES
_NONCE_CHARS = 40  # base64 of _NONCE_BYTES


class NonceMint:
    """Nonces bound to time and source, checked without a table:
    base64url(mint ms || seq || HMAC-SHA256(key, ms || seq || source)[:16])."""

    def __init__(self, key: bytes, lifetime_s: float = 30.0) -> None:
        if len(key) < 16:
            raise ValueError("a nonce key of at least 16 bytes")
        self._key = key
        self.lifetime_s = lifetime_s
        self._seq = 0

    def _mac(self, stamp: bytes, source: str) -> bytes:
        return hmac.new(self._key, stamp + source.encode("utf-8", "replace"), hashlib.sha256).digest()[:_MAC_BYTES]

    def mint(self, source: str, now: float) -> str:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        stamp = struct.pack(">QI", max(0, int(now * 1000)), self._seq)
        return base64.urlsafe_b64encode(stamp + self._mac(stamp, source)).decode("ascii")

    def minted_at(self, nonce: str) -> float | None:
        """The mint time a well-formed nonce names (its MAC unchecked), else None."""
        raw = self._decode(nonce)
        return None if raw is None else struct.unpack(">Q", raw[:8])[0] / 1000

    @staticmethod
    def _decode(nonce: str) -> bytes | None:
        if len(nonce) != _NONCE_CHARS:
            return None
        try:
            raw = base64.urlsafe_b64decode(nonce.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            return None
        return raw if len(raw) == _NONCE_BYTES else None

    def check(self, nonce: str, source: str, now: float) -> Literal["ok", "stale", "bad"]:
        raw = self._decode(nonce)
        if raw is None or not hmac.compare_digest(raw[_HEAD_BYTES:], self._mac(raw[:_HEAD_BYTES], source)):
            return "bad"
        at = struct.unpack(">Q", raw[:8])[0] / 1000
        if at > now + 1.0:
            return "bad"
        return "stale" if now - at > self.lifetime_s else "ok"


class NonceCounts:
    """The highest nonce count accepted per nonce, for at most ``capacity`` nonces.

    At capacity the oldest entry is evicted and its mint time becomes the floor: a nonce
    minted at or before the floor that is not in the table is refused (a replay of an
    evicted nonce is never accepted again); its client gets a fresh challenge."""

    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._last: OrderedDict[str, tuple[int, float]] = OrderedDict()
        self.floor = -1.0

    def __len__(self) -> int:
        return len(self._last)

    def accept(self, nonce: str, nc: int, minted_at: float = 0.0) -> bool:
        seen = self._last.get(nonce)
        if seen is None:
            if minted_at <= self.floor or nc < 1:
                return False
        elif nc <= seen[0]:
            return False
        self._last[nonce] = (nc, minted_at)
        self._last.move_to_end(nonce)
        while len(self._last) > self.capacity:
            _, (_, at) = self._last.popitem(last=False)
            self.floor = max(self.floor, at)
        return True

    def forget_before(self, t: float) -> None:
        """Drop the entries of nonces minted before ``t`` (they are stale anyway)."""
        while self._last:
            nonce, (_, at) = next(iter(self._last.items()))
            if at >= t:
                return
            del self._last[nonce]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What :meth:`DigestServer.verify` decided: ``ok`` and the user, or why not."""

    ok: bool
    user: str = ""
    reason: str = "ok"  # ok no_credentials bad_header wrong_realm bad_algorithm uri_mismatch bad_nonce
    #                      stale unknown_user wrong_response replay


def _both_sip(a: str, b: str) -> bool:
    """Whether two URIs are both SIP URIs. The digest-uri of a SIP request need not be its
    Request-URI byte for byte: clients omit the user (SIPp: ``sip:host:port``) and proxies
    rewrite the Request-URI after the caller computed its answer. Replays are refused by the
    nonce (bound to the source, short-lived) and its counts, not by the uri."""
    return all(u[:4].lower() == "sip:" or u[:5].lower() == "sips:" for u in (a, b))


class DigestServer:
    """Challenges and verification for one realm (see the module docstring)."""

    def __init__(self, realm: str, key: bytes, lifetime_s: float = 30.0, max_nonces: int = 65536,
                 algorithms: tuple[str, ...] = ALGORITHMS) -> None:
        for a in algorithms:
            if _algorithm(a)[1]:
                raise ValueError("the server offers no -sess algorithm")
        self.realm = realm
        self.mint = NonceMint(key, lifetime_s)
        self.counts = NonceCounts(max_nonces)
        self.algorithms = algorithms

    def challenges(self, source: str, now: float, stale: bool = False) -> list[str]:
        nonce = self.mint.mint(source, now)
        return [challenge_value(self.realm, nonce, a, stale) for a in self.algorithms]

    def verify(self, value: str | None, method: str, request_uri: str, source: str, now: float,
               secret_of: Callable[[str], str | None]) -> Verdict:
        if not value:
            return Verdict(False, reason="no_credentials")
        try:
            auth = parse_authorization(value)
        except DigestError:
            return Verdict(False, reason="bad_header")
        if auth.realm != self.realm:
            return Verdict(False, auth.username, "wrong_realm")
        if auth.algorithm.upper() not in (a.upper() for a in self.algorithms) or auth.qop != "auth":
            return Verdict(False, auth.username, "bad_algorithm")
        if auth.uri != request_uri and not _both_sip(auth.uri, request_uri):
            return Verdict(False, auth.username, "uri_mismatch")
        state = self.mint.check(auth.nonce, source, now)
        if state == "bad":
            return Verdict(False, auth.username, "bad_nonce")
        if state == "stale":
            return Verdict(False, auth.username, "stale")
        secret = secret_of(auth.username)
        if secret is None:
            return Verdict(False, auth.username, "unknown_user")
        if not hmac.compare_digest(response_for(auth, secret, method), auth.response):
            return Verdict(False, auth.username, "wrong_response")
        self.counts.forget_before(now - self.mint.lifetime_s)
        if not self.counts.accept(auth.nonce, auth.nc, self.mint.minted_at(auth.nonce) or 0.0):
            return Verdict(False, auth.username, "replay")
        return Verdict(True, auth.username)
