"""SIP transactions over UDP (RFC 3261 section 17, RFC 6026), as pure state machines.

Owns retransmission and timeout behaviour: which bytes to (re)send when, and
when a transaction is over. No I/O and no clock reads: every method takes
``now`` and returns a list of actions (:class:`Send`, :class:`Deliver`,
:class:`TimedOut`); the user agent performs them and calls :meth:`on_timer`
when :attr:`deadline` passes.

Timers (UDP): INVITE server: G (final non-2xx retransmit, T1 doubling to
T2), H (64*T1: no ACK), I (T4 after the ACK), L (64*T1 after a 2xx, absorbing
INVITE retransmissions, RFC 6026). Non-INVITE server: J (64*T1). Non-INVITE
client: E (retransmit, T1 doubling to T2; T2 once a 1xx came), F (64*T1:
timeout), K (T4 after the final response). INVITE client: A (retransmit, T1
doubling, until a response), B (64*T1: no response), D (64*T1 after a non-2xx
final, which it ACKs itself), M (64*T1 after a 2xx, RFC 6026: each 2xx
retransmission is delivered, so the TU repeats its ACK). The UAS core's 2xx retransmission
(13.3.1.4): T1 doubling to T2 until the ACK, 64*T1 then give up.

Over a reliable transport (``Timers.reliable``: TCP, TLS; 17.1.1.2, 17.1.2.2,
17.2.1, 17.2.2) nothing is retransmitted by a transaction (A, E, G unarmed) and
D, I, J, K are 0; B, F, H, L and M keep their 64*T1. The UAS core's 2xx
retransmission (13.3.1.4) is kept on every transport.

Invariants: a transaction never sends after it terminated; every timer it
arms is bounded by 64*T1; retransmissions of a request are answered with
the last response byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass

from brisvox.wire.sip_message import SipMessage

Addr = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Timers:
    """T1, T2, T4; ``reliable``: the transport (TCP, TLS) retransmits itself, so no request or
    final response is retransmitted (timers A, E, G are not armed) and D, I, J, K are 0."""

    t1: float = 0.5
    t2: float = 4.0
    t4: float = 5.0
    reliable: bool = False

    @property
    def t4_or_0(self) -> float:
        """Timers I and K: T4 over UDP, 0 over a reliable transport."""
        return 0.0 if self.reliable else self.t4

    @property
    def wait_or_0(self) -> float:
        """Timers D and J: 64*T1 over UDP (absorbing retransmissions), 0 over a reliable transport."""
        return 0.0 if self.reliable else 64 * self.t1


@dataclass(frozen=True, slots=True)
class Send:
    data: bytes
    addr: Addr


@dataclass(frozen=True, slots=True)
class Deliver:
    """A response for the transaction user (client transactions)."""

    msg: SipMessage


@dataclass(frozen=True, slots=True)
class TimedOut:
    """The transaction gave up (no ACK, no response)."""

    what: str


Action = Send | Deliver | TimedOut


class Transaction:
    __slots__ = ("key", "addr", "timers", "state", "deadline")

    def __init__(self, key: tuple, addr: Addr, timers: Timers) -> None:
        self.key = key
        self.addr = addr
        self.timers = timers
        self.state = ""
        self.deadline: float | None = None

    @property
    def done(self) -> bool:
        return self.state == "terminated"

    def on_timer(self, now: float) -> list[Action]:  # pragma: no cover - overridden
        return []

    def _terminate(self) -> None:
        self.state = "terminated"
        self.deadline = None


class ServerInvite(Transaction):
    """INVITE server transaction (17.2.1 with the RFC 6026 Accepted state)."""

    __slots__ = ("last", "g_at", "g_int", "h_at", "end_at", "final_status")

    def __init__(self, key: tuple, addr: Addr, timers: Timers) -> None:
        super().__init__(key, addr, timers)
        self.state = "proceeding"
        self.last: bytes = b""
        self.g_at: float | None = None
        self.g_int = timers.t1
        self.h_at: float | None = None
        self.end_at: float | None = None
        self.final_status = 0

    def respond(self, msg: SipMessage, now: float) -> list[Action]:
        if self.state != "proceeding":
            return []
        data = msg.serialize()
        self.last = data
        st = msg.status
        if st >= 200:
            self.final_status = st
            if st < 300:
                self.state = "accepted"
                self.end_at = now + 64 * self.timers.t1  # Timer L
            else:
                self.state = "completed"
                self.g_int = self.timers.t1
                self.g_at = None if self.timers.reliable else now + self.g_int
                self.h_at = now + 64 * self.timers.t1
        self._arm()
        return [Send(data, self.addr)]

    def on_retransmit(self, now: float) -> list[Action]:
        """The INVITE came again: repeat the last provisional or final non-2xx."""
        if self.state in ("proceeding", "completed") and self.last:
            return [Send(self.last, self.addr)]
        return []  # accepted: the UAS core retransmits the 2xx itself

    def on_ack(self, now: float) -> list[Action]:
        """ACK of a non-2xx final (same branch)."""
        if self.state == "completed":
            self.state = "confirmed"
            self.g_at = self.h_at = None
            self.end_at = now + self.timers.t4_or_0  # Timer I
            self._arm()
        return []

    def on_timer(self, now: float) -> list[Action]:
        out: list[Action] = []
        if self.h_at is not None and now >= self.h_at:
            self._terminate()
            return [TimedOut("ack")]
        if self.end_at is not None and now >= self.end_at:
            self._terminate()
            return []
        if self.g_at is not None and now >= self.g_at:
            out.append(Send(self.last, self.addr))
            self.g_int = min(2 * self.g_int, self.timers.t2)
            self.g_at = now + self.g_int
        self._arm()
        return out

    def _arm(self) -> None:
        ds = [d for d in (self.g_at, self.h_at, self.end_at) if d is not None]
        self.deadline = min(ds) if ds else None


class ServerNonInvite(Transaction):
    """Non-INVITE server transaction (17.2.2)."""

    __slots__ = ("last",)

    def __init__(self, key: tuple, addr: Addr, timers: Timers) -> None:
        super().__init__(key, addr, timers)
        self.state = "trying"
        self.last: bytes = b""

    def respond(self, msg: SipMessage, now: float) -> list[Action]:
        if self.state in ("completed", "terminated"):
            return []
        self.last = msg.serialize()
        if msg.status >= 200:
            self.state = "completed"
            self.deadline = now + self.timers.wait_or_0  # Timer J
        else:
            self.state = "proceeding"
        return [Send(self.last, self.addr)]

    def on_retransmit(self, now: float) -> list[Action]:
        return [Send(self.last, self.addr)] if self.last else []

    def on_timer(self, now: float) -> list[Action]:
        if self.deadline is not None and now >= self.deadline:
            self._terminate()
        return []


class ClientNonInvite(Transaction):
    """Non-INVITE client transaction (17.1.2): BYE, REFER, NOTIFY we send."""

    __slots__ = ("request", "method", "e_at", "e_int", "f_at", "k_at")

    def __init__(self, key: tuple, addr: Addr, timers: Timers, request: SipMessage) -> None:
        super().__init__(key, addr, timers)
        self.request = request.serialize()
        self.method = request.method
        self.state = "trying"
        self.e_at: float | None = None
        self.e_int = timers.t1
        self.f_at: float | None = None
        self.k_at: float | None = None

    def start(self, now: float) -> list[Action]:
        self.e_at = None if self.timers.reliable else now + self.e_int
        self.f_at = now + 64 * self.timers.t1
        self._arm()
        return [Send(self.request, self.addr)]

    def on_response(self, msg: SipMessage, now: float) -> list[Action]:
        if self.state in ("completed", "terminated"):
            return []
        if msg.status < 200:
            self.state = "proceeding"
            return [Deliver(msg)]
        self.state = "completed"
        self.e_at = self.f_at = None
        self.k_at = now + self.timers.t4_or_0
        self._arm()
        return [Deliver(msg)]

    def on_timer(self, now: float) -> list[Action]:
        if self.k_at is not None and now >= self.k_at:
            self._terminate()
            return []
        if self.f_at is not None and now >= self.f_at:
            self._terminate()
            return [TimedOut(self.method)]
        out: list[Action] = []
        if self.e_at is not None and now >= self.e_at:
            out.append(Send(self.request, self.addr))
            self.e_int = self.timers.t2 if self.state == "proceeding" else min(2 * self.e_int, self.timers.t2)
            self.e_at = now + self.e_int
        self._arm()
        return out

    def _arm(self) -> None:
        ds = [d for d in (self.e_at, self.f_at, self.k_at) if d is not None]
        self.deadline = min(ds) if ds else None


class ClientInvite(Transaction):
    """INVITE client transaction (17.1.1 with the RFC 6026 Accepted state): the outbound call's.

    A non-2xx final is ACKed here (same branch, 17.1.1.3) and delivered once; every 2xx
    (the first and its retransmissions) is delivered, the ACK for a 2xx is the TU's."""

    __slots__ = ("invite", "request", "a_at", "a_int", "b_at", "end_at", "ack", "final_status")

    def __init__(self, key: tuple, addr: Addr, timers: Timers, request: SipMessage) -> None:
        super().__init__(key, addr, timers)
        self.invite = request
        self.request = request.serialize()
        self.state = "calling"
        self.a_at: float | None = None
        self.a_int = timers.t1
        self.b_at: float | None = None
        self.end_at: float | None = None
        self.ack = b""
        self.final_status = 0

    def start(self, now: float) -> list[Action]:
        self.a_at = None if self.timers.reliable else now + self.a_int
        self.b_at = now + 64 * self.timers.t1
        self._arm()
        return [Send(self.request, self.addr)]

    def on_response(self, msg: SipMessage, now: float) -> list[Action]:
        st = msg.status
        if self.state == "terminated":
            return []
        if self.state == "completed":  # the non-2xx final again: ACK again, nothing new for the TU
            return [Send(self.ack, self.addr)] if st >= 300 else []
        if self.state == "accepted":
            return [Deliver(msg)] if 200 <= st < 300 else []
        if st < 200:
            self.state = "proceeding"
            self.a_at = self.b_at = None  # a provisional stops retransmission; the TU times the ringing
            self._arm()
            return [Deliver(msg)]
        self.final_status = st
        self.a_at = self.b_at = None
        # Timer M (2xx: 64*T1 on every transport, RFC 6026) or D (non-2xx: 0 on a reliable one)
        self.end_at = now + (64 * self.timers.t1 if st < 300 else self.timers.wait_or_0)
        if st < 300:
            self.state = "accepted"
            self._arm()
            return [Deliver(msg)]
        self.state = "completed"
        self.ack = self._ack_for(msg).serialize()
        self._arm()
        return [Send(self.ack, self.addr), Deliver(msg)]

    def _ack_for(self, resp: SipMessage) -> SipMessage:
        """17.1.1.3: the ACK of a non-2xx final, in this transaction (the INVITE's branch)."""
        inv = self.invite
        ack = SipMessage(method="ACK", uri=inv.uri)
        h = ack.headers
        h.append(("via", inv.get("via")))
        h.append(("max-forwards", "70"))
        h.append(("from", inv.get("from")))
        h.append(("to", resp.get("to")))
        h.append(("call-id", inv.get("call-id")))
        h.append(("cseq", f"{inv.cseq[0]} ACK"))
        for r in inv.get_all("route"):
            h.append(("route", r))
        return ack

    def on_timer(self, now: float) -> list[Action]:
        if self.end_at is not None and now >= self.end_at:
            self._terminate()
            return []
        if self.b_at is not None and now >= self.b_at:
            self._terminate()
            return [TimedOut("INVITE")]
        out: list[Action] = []
        if self.a_at is not None and now >= self.a_at:
            out.append(Send(self.request, self.addr))
            self.a_int = 2 * self.a_int
            self.a_at = now + self.a_int
        self._arm()
        return out

    def _arm(self) -> None:
        ds = [d for d in (self.a_at, self.b_at, self.end_at) if d is not None]
        self.deadline = min(ds) if ds else None


class Retransmit2xx(Transaction):
    """The UAS core's 2xx retransmission until the ACK (13.3.1.4)."""

    __slots__ = ("data", "next_at", "interval", "give_up_at")

    def __init__(self, key: tuple, addr: Addr, timers: Timers, response: bytes, now: float) -> None:
        super().__init__(key, addr, timers)
        self.state = "waiting"
        self.data = response
        self.interval = timers.t1
        self.next_at = now + self.interval
        self.give_up_at = now + 64 * timers.t1
        self.deadline = self.next_at

    def acked(self) -> None:
        self._terminate()

    def on_timer(self, now: float) -> list[Action]:
        if self.done:
            return []
        if now >= self.give_up_at:
            self._terminate()
            return [TimedOut("ack")]
        out: list[Action] = []
        if now >= self.next_at:
            out.append(Send(self.data, self.addr))
            self.interval = min(2 * self.interval, self.timers.t2)
            self.next_at = now + self.interval
        self.deadline = min(self.next_at, self.give_up_at)
        return out
