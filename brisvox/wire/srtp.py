"""SRTP (RFC 3711) keyed by SDES (RFC 4568): the ``a=crypto`` attribute and one call's SRTP contexts.

Owns :class:`Crypto` (one ``a=crypto`` attribute: tag, suite, master key and
salt), its parse (:func:`parse_crypto`) and text (:meth:`Crypto.value`), the
generation of our keys (:func:`new_crypto`, from :mod:`secrets`), and
:class:`SrtpSession`, the two libsrtp contexts of one call (through pylibsrtp,
the maintained binding of libsrtp 2): our sending stream under our key, the
peer's under its key. The crypto is libsrtp's; nothing here reimplements AES,
HMAC, the replay window or the rollover counter (ROC).

The attribute (``a=crypto:<tag> <suite> inline:<base64 key||salt>[|lifetime][|MKI:len]
[<session params>]``) is taken only when all of this holds, else
:func:`parse_crypto` raises :class:`SrtpError` (the SDP layer then skips the
line and tries the next one):

* the tag is 1 to 9 ASCII digits, 1..999999999;
* the suite is ``AES_CM_128_HMAC_SHA1_80`` or ``AES_CM_128_HMAC_SHA1_32``
  (written as RFC 4568 writes them);
* exactly one key parameter, method ``inline``, whose base64 (strict
  alphabet, padding as base64 has it) decodes to exactly 30 bytes (16 bytes
  of master key, 14 of master salt);
* a lifetime (``|2^n`` or ``|<decimal>``) is accepted and ignored when it is
  at least 2^31 packets (no call reaches that: at 50 packets/s it is 497
  days), refused when shorter (we never re-key within a call);
* an MKI (``|<value>:<length>``) is refused: our contexts carry one key
  without MKI, and RFC 4568 section 6.1 lets the answerer refuse a crypto
  attribute whose parameters it does not support (with more than one key
  parameter, which needs an MKI, likewise);
* session parameters are refused (``UNENCRYPTED_SRTP``,
  ``UNAUTHENTICATED_SRTP``, ``KDR``, ``FEC_ORDER`` ... would weaken or change
  the transform), except ``WSH=<n>`` (a window size hint, RFC 4568 6.3.7),
  which is ignored: the replay window is libsrtp's (128 packets).

Invariants (:class:`SrtpSession`):

* Keys never leave through ``repr`` (:class:`Crypto` hides the key), logs or
  exceptions; our keys are 30 bytes of :func:`secrets.token_bytes`.
* :meth:`SrtpSession.unprotect` returns the plain RTP packet bit-exact or
  raises :class:`SrtpDrop` with a reason of :data:`DROP_REASONS`:
  ``malformed`` (shorter than an RTP header and the suite's tag, longer than
  ``MAX_PACKET``, not RTP version 2, or anything libsrtp refuses as such),
  ``replayed`` (libsrtp's replay check: the index is in the window already or
  older than it; libsrtp checks the index before the tag, so a forged packet
  that names a seen index is ``replayed`` too), ``auth_failed`` (the tag does
  not verify: a wrong key, a forged or damaged packet), ``ssrc_limit`` (a
  new SSRC beyond ``MAX_SSRCS`` streams, refused before libsrtp sees it).
  A refused packet changes no state: the replay window and the ROC advance
  only with a packet that authenticated, and a stream for a new SSRC is
  created (libsrtp's template) only by one.
* libsrtp estimates the ROC (RFC 3711 3.3.1), so a stream decrypts across
  the sequence wrap 65535 -> 0 and in any order within the window.
* :meth:`SrtpSession.rekey_inbound` with the key and suite already in use
  changes nothing (replay window and ROC kept); another key or suite
  replaces the inbound context. The outbound context is replaced only by a
  new session (a new suite for our side).
* :meth:`SrtpSession.close` drops both contexts (libsrtp deallocates them,
  zeroing its key material); protect and unprotect refuse afterwards.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass, field

import pylibsrtp

SUITES: dict[str, int] = {
    "AES_CM_128_HMAC_SHA1_80": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_80,
    "AES_CM_128_HMAC_SHA1_32": pylibsrtp.Policy.SRTP_PROFILE_AES128_CM_SHA1_32,
}
TAG_BYTES = {"AES_CM_128_HMAC_SHA1_80": 10, "AES_CM_128_HMAC_SHA1_32": 4}
OFFER_ORDER = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")  # our preference when we offer
KEY_SALT_BYTES = 30
MIN_LIFETIME = 1 << 31
MAX_PACKET = 1500 - pylibsrtp.SRTP_MAX_TRAILER_LEN  # pylibsrtp's buffer holds 1500 bytes
MAX_SSRCS = 16  # inbound streams (SSRCs) one call's context may hold
DROP_REASONS = ("malformed", "replayed", "auth_failed", "ssrc_limit")
_RTP_HEADER = 12
_TAG_RE = re.compile(r"^[0-9]{1,9}$")
_B64_RE = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")
_LIFETIME_RE = re.compile(r"^(?:2\^([0-9]{1,2})|([0-9]{1,20}))$")
_REPLAY = ("replay check failed (bad index)", "replay check failed (index too old)",
           "packet index is too old to consider")
_AUTH = ("authentication failure",)


class SrtpError(Exception):
    """An ``a=crypto`` attribute we do not take (the reason is safe to log: it holds no key)."""


class SrtpDrop(Exception):
    """An SRTP packet refused; ``reason`` is one of :data:`DROP_REASONS` (or ``protect_failed``)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Crypto:
    """One ``a=crypto`` attribute: ``tag``, ``suite`` (a key of :data:`SUITES`), ``key`` (30 bytes)."""

    tag: int
    suite: str
    key: bytes = field(repr=False)

    def value(self) -> str:
        """The attribute's value (after ``a=crypto:``)."""
        return f"{self.tag} {self.suite} inline:{base64.b64encode(self.key).decode('ascii')}"

    def same_key(self, other: Crypto | None) -> bool:
        """Whether ``other`` names the same suite and key (the tag may differ)."""
        return other is not None and other.suite == self.suite and secrets.compare_digest(other.key, self.key)


def new_crypto(tag: int, suite: str) -> Crypto:
    """Our side's attribute for ``suite`` under ``tag``: a fresh master key and salt."""
    if suite not in SUITES:
        raise SrtpError(f"unsupported suite {suite[:40]!r}")
    return Crypto(tag, suite, secrets.token_bytes(KEY_SALT_BYTES))


def offer_cryptos() -> tuple[Crypto, ...]:
    """The attributes of an offer of ours: one per supported suite (tags 1, 2, ...), each its own key."""
    return tuple(new_crypto(i + 1, s) for i, s in enumerate(OFFER_ORDER))


def _lifetime_ok(text: str) -> bool:
    m = _LIFETIME_RE.match(text)
    if m is None:
        raise SrtpError("bad key lifetime")
    n = (1 << int(m.group(1))) if m.group(1) is not None else int(m.group(2))
    return n >= MIN_LIFETIME


def parse_crypto(value: str) -> Crypto:
    """The attribute of ``a=crypto:<value>`` (see the module docstring); SrtpError when not taken."""
    parts = value.strip().split()
    if len(parts) < 3:
        raise SrtpError("a=crypto needs a tag, a suite and a key parameter")
    tag_s, suite, key_param, *session = parts
    if _TAG_RE.match(tag_s) is None or not 0 < int(tag_s):
        raise SrtpError("bad crypto tag")
    if suite not in SUITES:
        raise SrtpError(f"unsupported crypto suite {suite[:40]!r}")
    for p in session:
        if not p.startswith("WSH="):
            raise SrtpError(f"unsupported session parameter {p.split('=')[0][:24]!r}")
    if ";" in key_param:
        raise SrtpError("more than one key parameter (needs an MKI)")
    method, _, info = key_param.partition(":")
    if method != "inline":
        raise SrtpError("key method is not inline")
    fields_ = info.split("|")
    if len(fields_) > 3:
        raise SrtpError("bad key parameter")
    b64, *rest = fields_
    if any(":" in extra for extra in rest) or len(rest) == 2:
        raise SrtpError("MKI is not supported")
    if rest and not _lifetime_ok(rest[0]):
        raise SrtpError("key lifetime below 2^31 packets")
    if _B64_RE.match(b64) is None:
        raise SrtpError("key is not base64")
    try:
        key = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise SrtpError("key is not base64") from None
    if len(key) != KEY_SALT_BYTES:
        raise SrtpError(f"key and salt are {len(key)} bytes, not {KEY_SALT_BYTES}")
    return Crypto(int(tag_s), suite, key)


def _context(crypto: Crypto, inbound: bool) -> pylibsrtp.Session:
    policy = pylibsrtp.Policy(
        key=crypto.key, srtp_profile=SUITES[crypto.suite],
        ssrc_type=pylibsrtp.Policy.SSRC_ANY_INBOUND if inbound else pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
    return pylibsrtp.Session(policy=policy)


def _reason(e: pylibsrtp.Error) -> str:
    text = str(e)
    if text in _REPLAY:
        return "replayed"
    if text in _AUTH:
        return "auth_failed"
    return "malformed"


class SrtpSession:
    """One call's SRTP: our outbound stream under ``local``, the peer's inbound one under ``remote``."""

    __slots__ = ("local", "remote", "_tx", "_rx", "_min_len", "_ssrcs")

    def __init__(self, local: Crypto, remote: Crypto) -> None:
        self.local = local
        self.remote = remote
        self._tx: pylibsrtp.Session | None = _context(local, inbound=False)
        self._rx: pylibsrtp.Session | None = _context(remote, inbound=True)
        self._min_len = _RTP_HEADER + TAG_BYTES[remote.suite]
        self._ssrcs: set[bytes] = set()

    @property
    def suite(self) -> str:
        """The suite of our sending direction (the one the answer chose)."""
        return self.local.suite

    def rekey_inbound(self, remote: Crypto) -> bool:
        """Take the peer's attribute of a new offer or answer; True when the inbound context was
        replaced (another key or suite), False when it is the same key (its state kept)."""
        if self._rx is None or remote.same_key(self.remote):
            self.remote = remote  # the tag may have changed: it names the line, not the key
            return False
        self.remote = remote
        self._rx = _context(remote, inbound=True)
        self._min_len = _RTP_HEADER + TAG_BYTES[remote.suite]
        self._ssrcs = set()
        return True

    def protect(self, packet: bytes) -> bytes:
        """The SRTP packet of the RTP ``packet`` (SrtpDrop ``protect_failed`` when libsrtp refuses)."""
        tx = self._tx
        if tx is None:
            raise SrtpDrop("protect_failed")
        try:
            return tx.protect(packet)
        except (pylibsrtp.Error, ValueError):
            raise SrtpDrop("protect_failed") from None

    def unprotect(self, data: bytes) -> bytes:
        """The RTP packet inside the SRTP ``data``, bit-exact; SrtpDrop why not (module docstring)."""
        rx = self._rx
        n = len(data)
        if rx is None or n < self._min_len or n > MAX_PACKET or data[0] >> 6 != 2:
            raise SrtpDrop("malformed")
        ssrc = data[8:12]
        known = ssrc in self._ssrcs
        if not known and len(self._ssrcs) >= MAX_SSRCS:
            raise SrtpDrop("ssrc_limit")
        try:
            plain = rx.unprotect(data)
        except pylibsrtp.Error as e:
            raise SrtpDrop(_reason(e)) from None
        if not known:
            self._ssrcs.add(ssrc)
        return plain

    def close(self) -> None:
        """Drop both contexts (idempotent)."""
        self._tx = None
        self._rx = None
        self._ssrcs = set()

    @property
    def closed(self) -> bool:
        return self._tx is None
