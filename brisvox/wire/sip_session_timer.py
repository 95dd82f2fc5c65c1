"""SIP session timers (RFC 4028): the headers, the negotiation of each role, one dialog's timer.

Owns the grammar of ``Session-Expires`` (compact ``x``) and ``Min-SE`` (sections 4
and 5), the ``timer`` option tag of ``Supported``/``Require``, what a user agent
answers to a session refresh request (:func:`uas_answer`, section 9: an
INVITE, a re-INVITE or an UPDATE it receives), what it asks and reads as the
requester (:func:`uac_headers`, :func:`uac_result`, :func:`uac_after_422`,
sections 7.1 to 7.4) and :class:`SessionTimer`, the pure machine of one
dialog's timer (section 10): events in with ``now``, actions out
(:class:`SendRefresh`, :class:`SendBye`, :class:`Count`). No I/O, no clock.

On the wire ``refresher=uac|uas`` names a role in *the transaction that
negotiated it* (the refresh's requester or answerer), not in the dialog; the
negotiation functions translate it to ``we_refresh`` at once, and nothing
past them speaks of ``uac``/``uas``.

Invariants:

* Every interval the machine runs on is at least :data:`MIN_SE_FLOOR` (90 s,
  section 4): a peer's smaller value is raised, never obeyed, so no call is
  ended sooner than the RFC allows.
* A UAS answer never holds ``Require: timer`` nor ``refresher=uac`` for a
  requester that did not list ``timer`` in ``Supported`` or ``Require``
  (section 9): such a session is refreshed by us or by no one.
* :func:`uas_answer` refuses (422 with our ``Min-SE``) only a requester that
  supports the timer and asked for less than our minimum; one that does not
  support it cannot act on a 422, so its interval is raised to our minimum
  instead (section 8.1's rule, RFC 4028 erratum 1687).
* The UAS never answers a longer interval than the requester asked for and
  never a shorter one than the requester's ``Min-SE`` (section 9).
* :class:`SessionTimer`: the refresher refreshes at half the interval
  (section 10) and, with no refresh answered by the interval's end, ends the
  session; the other side ends it at ``interval - min(32, interval / 3)``
  after the last refresh (section 10). A refresh that times out or gets
  408/481 ends the session at once (section 10); a 422 is retried once at
  once with its larger ``Min-SE`` (section 7.4); a 491 is retried after the
  RFC 3261 section 14.1 delay (2.1-4 s for the Call-ID's owner, 0-2 s
  otherwise, in 10 ms steps); an UPDATE the peer refuses 405/501 is sent again
  as a re-INVITE; any other refusal (a 488, a 500, a second 422) answers for a
  live peer whose session stays as it was (RFC 3261 section 14.1; only 408 and
  481 end a dialog, RFC 5057): the clock restarts as after a refresh. At most
  one refresh of ours is in flight; the machine sends one :class:`SendBye` at
  most, and nothing after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from brisvox.wire.sip_message import SipMessage, is_digits

TIMER = "timer"
MIN_SE_FLOOR = 90  # section 4: no session interval below 90 s
MAX_DELTA = 2**31 - 1  # delta-seconds as RFC 3261 bounds them in practice
EXPIRED = "session timer expired"  # the reason of a session ended for want of a refresh
REFRESH_FAILED = "session refresh failed"  # the reason of one whose refresh timed out, 408 or 481
Refresher = Literal["uac", "uas", ""]


@dataclass(frozen=True, slots=True)
class SessionExpires:
    """``Session-Expires: <interval>[;refresher=uac|uas]``; ``refresher`` "" when absent."""

    interval: int
    refresher: Refresher = ""

    def format(self) -> str:
        return f"{self.interval};refresher={self.refresher}" if self.refresher else str(self.interval)


def _delta(text: str) -> int:
    text = text.strip()
    if not text or len(text) > 10 or not is_digits(text) or int(text) > MAX_DELTA:
        raise ValueError(f"bad delta-seconds {text[:20]!r}")
    return int(text)


def parse_session_expires(value: str) -> SessionExpires:
    """Section 4's grammar; ValueError for a value that is not one (a refresher other than
    ``uac``/``uas`` included). Other parameters are ignored."""
    head, *params = value.split(";")
    interval = _delta(head)
    refresher: Refresher = ""
    for p in params:
        k, _, v = p.partition("=")
        if k.strip().lower() == "refresher":
            who = v.strip().lower()
            if who not in ("uac", "uas"):
                raise ValueError(f"bad refresher {v[:20]!r}")
            refresher = "uac" if who == "uac" else "uas"
    return SessionExpires(interval, refresher)


def parse_min_se(value: str) -> int:
    """Section 5's grammar (parameters ignored); ValueError for a value that is not one."""
    return _delta(value.split(";")[0])


def has_timer(values: Iterable[str]) -> bool:
    """Whether ``Supported``/``Require`` values (one option tag each) list ``timer``."""
    return any(v.strip().lower() == TIMER for v in values)


@dataclass(frozen=True, slots=True)
class TimerRequest:
    """What a session refresh request said about timers: whether its sender supports them
    (``timer`` in ``Supported`` or ``Require``), its ``Session-Expires`` and ``Min-SE``."""

    supported: bool = False
    session_expires: SessionExpires | None = None
    min_se: int | None = None

    @classmethod
    def of(cls, msg: SipMessage) -> TimerRequest:
        """From a request; ValueError for a malformed ``Session-Expires`` or ``Min-SE``."""
        se = msg.get("session-expires")
        mse = msg.get("min-se")
        return cls(has_timer(msg.get_all("supported")) or has_timer(msg.get_all("require")),
                   parse_session_expires(se) if se else None, parse_min_se(mse) if mse else None)


@dataclass(frozen=True, slots=True)
class TimerPolicy:
    """Ours: the interval we ask for (0: none, though a peer's request is honoured) and our
    minimum (at least :data:`MIN_SE_FLOOR`)."""

    session_expires: int = 1800
    min_se: int = MIN_SE_FLOOR


@dataclass(frozen=True, slots=True)
class Reject422:
    """Answer 422 (Session Interval Too Small) with ``Min-SE: min_se``."""

    min_se: int

    @property
    def headers(self) -> list[tuple[str, str]]:
        return [("min-se", str(self.min_se))]


@dataclass(frozen=True, slots=True)
class Accept:
    """Answer 2xx with ``headers``; the session runs ``interval`` s (0: no timer), refreshed
    by us when ``we_refresh``."""

    interval: int
    we_refresh: bool
    headers: tuple[tuple[str, str], ...]


def uas_answer(req: TimerRequest, policy: TimerPolicy) -> Accept | Reject422:
    """Section 9: the timer part of our answer to a session refresh request.

    The interval is the request's (raised to our minimum for a requester that does not
    support timers), shortened to ours when ours is shorter (never below the request's
    ``Min-SE``); without a ``Session-Expires`` in the request, ours when we ask for one.
    The refresher is the one the request named, else us (a requester without ``timer``
    support cannot refresh: always us, and no ``Require``)."""
    se = req.session_expires
    floor = max(MIN_SE_FLOOR, req.min_se or 0)
    interval = 0
    if se is not None:
        interval = se.interval
        if interval < policy.min_se:
            if req.supported:
                return Reject422(policy.min_se)
            interval = max(policy.min_se, floor)
        if 0 < policy.session_expires < interval:  # shorter, never below their Min-SE nor above theirs
            interval = min(interval, max(policy.session_expires, floor))
    elif policy.session_expires > 0:
        interval = max(policy.session_expires, floor, policy.min_se)
    supported: tuple[tuple[str, str], ...] = (("supported", TIMER),)
    if interval <= 0:
        return Accept(0, False, supported)
    refresher: Refresher = (se.refresher if se is not None and se.refresher and req.supported else "uas")
    headers = supported + (("session-expires", SessionExpires(interval, refresher).format()),)
    if req.supported:  # "uac" must be Required, "uas" should be (section 9)
        headers += (("require", TIMER),)
    return Accept(interval, refresher == "uas", headers)


def uac_headers(interval: int, min_se: int, *, refreshing: bool = False) -> list[tuple[str, str]]:
    """Sections 7.1 and 7.4: the timer headers of a session refresh request we send:
    ``Supported: timer`` always, ``Session-Expires`` when we ask for ``interval`` (with
    ``refresher=uac`` when ``refreshing``: we are the refresher sending the refresh),
    ``Min-SE`` with it, or alone when above the default."""
    out = [("supported", TIMER)]
    if interval > 0:
        out.append(("session-expires", SessionExpires(interval, "uac" if refreshing else "").format()))
    if interval > 0 or min_se > MIN_SE_FLOOR:
        out.append(("min-se", str(min_se)))
    return out


def uac_result(resp: SipMessage, asked: int) -> tuple[int, bool]:
    """Section 7.2: ``(interval, we_refresh)`` after a 2xx to a session refresh request of ours
    that asked for ``asked`` s (0: none). A ``Session-Expires`` in the 2xx decides (its
    refresher ``uas`` is the peer, ``uac`` or none is us); without one (a peer without timer
    support) the session runs what we asked for, refreshed by us; without either, no timer.
    A malformed value counts as absent."""
    try:
        se = parse_session_expires(resp.get("session-expires")) if resp.get("session-expires") else None
    except ValueError:
        se = None
    if se is not None:
        return max(se.interval, MIN_SE_FLOOR), se.refresher != "uas"
    if asked > 0:
        return max(asked, MIN_SE_FLOOR), True
    return 0, False


def uac_after_422(resp: SipMessage, asked: int, min_se: int) -> tuple[int, int] | None:
    """Section 7.3: ``(interval, min_se)`` to ask again after a 422 to a request that asked
    for ``asked`` s with ``Min-SE: min_se``: the largest ``Min-SE`` seen and an interval at
    least that; None when the 422 names none usable (the request is not retried)."""
    try:
        theirs = parse_min_se(resp.get("min-se"))
    except ValueError:
        return None
    new_min = max(min_se, theirs, MIN_SE_FLOOR)
    return max(asked, new_min), new_min


def bye_lead(interval: int) -> float:
    """Section 10: how long before the expiry the side that does not refresh sends its BYE."""
    return min(32.0, interval / 3)


# -- the machine -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Negotiated:
    """A 2xx to a session refresh request of the peer's, or to the dialog's INVITE, was sent
    or received at ``now``: the session runs ``interval`` s (0: no timer from now on)."""

    now: float
    interval: int
    we_refresh: bool


@dataclass(frozen=True, slots=True)
class RefreshAnswered:
    """The 2xx to our own refresh (:func:`uac_result` of it)."""

    now: float
    interval: int
    we_refresh: bool


@dataclass(frozen=True, slots=True)
class RefreshFailed:
    """Our refresh's final non-2xx ``status`` (0: its transaction timed out); ``min_se``: a
    422's ``Min-SE`` (0: none usable); ``draw``: a uniform draw in [0, 1) for the 491 delay."""

    now: float
    status: int
    min_se: int = 0
    draw: float = 0.0


@dataclass(frozen=True, slots=True)
class PeerAllows:
    """The peer's ``Allow`` (of its INVITE, its 2xx, a later target refresh): UPDATE or not."""

    update: bool


@dataclass(frozen=True, slots=True)
class Tick:
    now: float


Event = Negotiated | RefreshAnswered | RefreshFailed | PeerAllows | Tick


@dataclass(frozen=True, slots=True)
class SendRefresh:
    """Send a refresh: an UPDATE without a body, or a re-INVITE with our unchanged SDP, with
    :func:`uac_headers` ``(interval, min_se, refreshing=True)``."""

    method: Literal["UPDATE", "INVITE"]
    interval: int
    min_se: int


@dataclass(frozen=True, slots=True)
class SendBye:
    """End the session (BYE) for ``reason``; the machine is done."""

    reason: str


@dataclass(frozen=True, slots=True)
class Count:
    name: str


Action = SendRefresh | SendBye | Count


def glare_delay(draw: float, owner: bool) -> float:
    """RFC 3261 section 14.1: the wait before a request refused 491 is sent again, in 10 ms
    steps: 2.1-4 s when we own the dialog's Call-ID (we sent its INVITE), else 0-2 s."""
    draw = min(max(draw, 0.0), 1.0)
    lo, hi = (210, 400) if owner else (0, 200)
    return (lo + round(draw * (hi - lo))) / 100


class SessionTimer:
    """One dialog's session timer (see the module docstring); ``owner``: we sent the INVITE
    that made the dialog (its Call-ID is ours); ``update``: the peer allows UPDATE."""

    __slots__ = ("owner", "update", "min_se", "interval", "we_refresh", "refresh_at", "expire_at",
                 "pending", "retried_422", "done")

    def __init__(self, min_se: int, *, owner: bool, update: bool = False) -> None:
        self.owner = owner
        self.update = update
        self.min_se = max(min_se, MIN_SE_FLOOR)
        self.interval = 0
        self.we_refresh = False
        self.refresh_at: float | None = None
        self.expire_at: float | None = None
        self.pending = False  # a refresh of ours is in flight
        self.retried_422 = False
        self.done = False

    @property
    def deadline(self) -> float | None:
        """When the next :class:`Tick` is due (None: nothing to time)."""
        if self.done:
            return None
        ds = [d for d in (None if self.pending else self.refresh_at, self.expire_at) if d is not None]
        return min(ds) if ds else None

    @property
    def method(self) -> Literal["UPDATE", "INVITE"]:
        return "UPDATE" if self.update else "INVITE"

    def handle(self, e: Event) -> list[Action]:
        if self.done:
            return []
        if isinstance(e, Tick):
            return self._tick(e.now)
        if isinstance(e, Negotiated | RefreshAnswered):
            if isinstance(e, RefreshAnswered):
                self.pending = False
            self._run(e.now, e.interval, e.we_refresh)
            return []
        if isinstance(e, RefreshFailed):
            return self._failed(e)
        self.update = e.update
        return []

    def _run(self, now: float, interval: int, we_refresh: bool) -> None:
        self.retried_422 = False
        if interval <= 0:  # section 7.2: a 2xx without Session-Expires turns the timer off
            self.interval, self.we_refresh = 0, False
            self.refresh_at = self.expire_at = None
            return
        interval = max(interval, MIN_SE_FLOOR)
        self.interval, self.we_refresh = interval, we_refresh
        if we_refresh:
            self.refresh_at = now + interval / 2
            self.expire_at = now + interval
        else:
            self.refresh_at = None
            self.expire_at = now + interval - bye_lead(interval)

    def _tick(self, now: float) -> list[Action]:
        if self.expire_at is not None and now >= self.expire_at:
            self.done = True
            return [Count("sip_session_expired"), SendBye(EXPIRED)]
        if self.we_refresh and not self.pending and self.refresh_at is not None and now >= self.refresh_at:
            return self._send()
        return []

    def _send(self) -> list[Action]:
        self.pending = True
        self.refresh_at = None
        return [SendRefresh(self.method, self.interval, self.min_se)]

    def _failed(self, e: RefreshFailed) -> list[Action]:
        self.pending = False
        st = e.status
        if st in (0, 408, 481):
            self.done = True
            return [Count("sip_session_refresh_failed"), SendBye(REFRESH_FAILED)]
        if st == 422 and e.min_se > 0 and not self.retried_422:
            self.retried_422 = True
            self.min_se = max(self.min_se, e.min_se)
            self.interval = max(self.interval, self.min_se)
            return [Count("sip_session_422_received"), *self._send()]
        if st == 491:
            self.refresh_at = e.now + glare_delay(e.draw, self.owner)
            return [Count("sip_session_refresh_glare")]
        if st in (405, 501) and self.update:
            self.update = False
            return [Count("sip_session_update_refused"), *self._send()]
        # any other refusal: the peer's dialog is alive (only 408/481 end it, RFC 5057) and the
        # session unchanged (RFC 3261 14.1); it goes on as refreshed, on the same terms
        self._run(e.now, self.interval, self.we_refresh)
        return [Count("sip_session_refresh_rejected")]
