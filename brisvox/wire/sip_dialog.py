"""SIP dialogs on the UAS side (RFC 3261 section 12) and response building (8.2.6).

Owns the state one call's dialog keeps (Call-ID, tags, remote target, route
set, CSeq numbers) and how requests inside it and responses to requests are
formed. No I/O.

Invariants:

* A dialog is identified by (Call-ID, local tag); the local tag is ours,
  made once when the dialog is created, and every response in it carries it
  in To (except 100 Trying, which creates no dialog).
* In-dialog requests we send use the remote target as Request-URI, the
  route set (Record-Route of the INVITE, in order) as Route, a CSeq one above
  the last we sent, and a fresh branch.
* A request whose CSeq is below the last one seen from the peer is refused
  (500, 12.2.2).
* Where an in-dialog request goes (:meth:`Dialog.next_hop`, :meth:`Dialog.hop_for`)
  is what the message said (a route, a Contact) or, for a name or no usable
  URI, the INVITE's source; this module checks no address against an
  allow-list: the user agent does before it sends (and before it accepts a
  dialog or a target refresh that names one).
* The UAC view (an outbound call, :meth:`Dialog.for_outgoing`, then
  :meth:`Dialog.answered` with the 2xx): the local tag is our From tag, the
  remote tag the 2xx's To tag, the remote target its Contact, the route set
  its Record-Route reversed (12.1.2); our CSeq continues from the INVITE's.
* :meth:`Dialog.from_invite` raises only ``ValueError`` (a Contact or From
  whose URI is not a SIP URI); the UA builds the dialog before it admits the
  call, so a refused INVITE has taken nothing.
"""

from __future__ import annotations

import ipaddress
import random
from dataclasses import dataclass, field

from brisvox.wire.sip_message import (
    SipMessage,
    new_branch,
    parse_name_addr,
    parse_uri,
)

Addr = tuple[str, int]
ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, INFO, NOTIFY, UPDATE"  # the gateway's (UPDATE: RFC 3311)

REASONS = {
    100: "Trying", 180: "Ringing", 200: "OK", 202: "Accepted", 400: "Bad Request",
    401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
    407: "Proxy Authentication Required", 415: "Unsupported Media Type", 420: "Bad Extension",
    422: "Session Interval Too Small",
    481: "Call/Transaction Does Not Exist", 482: "Loop Detected", 483: "Too Many Hops",
    486: "Busy Here", 487: "Request Terminated", 488: "Not Acceptable Here", 491: "Request Pending",
    500: "Server Internal Error", 501: "Not Implemented", 503: "Service Unavailable",
    513: "Message Too Large",
}


def is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


def make_response(req: SipMessage, status: int, reason: str = "", *, to_tag: str = "",
                  contact: str = "", server: str = "brisvox", body: bytes = b"",
                  content_type: str = "", extra: list[tuple[str, str]] | None = None,
                  allow: str = ALLOW) -> SipMessage:
    """A response to ``req`` (8.2.6): Via/From/Call-ID/CSeq copied, To tagged; ``allow``: the
    methods its sender serves (the ``Allow`` of a 200, a 405 and an OPTIONS answer)."""
    resp = SipMessage(status=status, reason=reason or REASONS.get(status, "Unknown"))
    h = resp.headers
    for v in req.get_all("via"):
        h.append(("via", v))
    h.append(("from", req.get("from")))
    to = req.get("to")
    if to_tag and status > 100 and "tag=" not in to.lower():
        to = f"{to};tag={to_tag}"
    h.append(("to", to))
    h.append(("call-id", req.get("call-id")))
    h.append(("cseq", req.get("cseq")))
    if req.method == "INVITE" and 100 < status < 300:
        for rr in req.get_all("record-route"):
            h.append(("record-route", rr))
    if contact and (req.method == "INVITE" and 100 < status < 300):
        h.append(("contact", contact))
    h.append(("server", server))
    if status in (200, 405) or req.method == "OPTIONS":
        h.append(("allow", allow))
    for k, v in extra or []:
        h.append((k, v))
    if body:
        h.append(("content-type", content_type or "application/sdp"))
        resp.body = body
    return resp


@dataclass(slots=True)
class Dialog:
    call_id: str
    local_tag: str
    remote_tag: str
    local_uri: str  # our address-of-record as the peer addressed us (To of the INVITE)
    remote_uri: str  # From of the INVITE
    remote_target: str  # Contact URI of the INVITE (updated by target refreshes)
    route_set: list[str]
    local_contact: str
    source: Addr  # where the INVITE came from (fallback for a non-IP remote target)
    local_cseq: int = field(default_factory=lambda: random.randint(1, 10_000))
    remote_cseq: int = 0
    state: str = "early"  # early -> confirmed -> terminated
    transport: str = "UDP"  # what its requests' Via says and what they go over: UDP, TCP, TLS

    @classmethod
    def from_invite(cls, inv: SipMessage, local_tag: str, local_contact: str, source: Addr) -> Dialog:
        """The dialog an INVITE creates; ValueError when its Contact (or From) is unusable."""
        contact = inv.get("contact")
        target = parse_name_addr(contact).uri if contact else parse_name_addr(inv.get("from")).uri
        if parse_uri(target).scheme not in ("sip", "sips"):
            raise ValueError("the remote target is not a SIP URI")
        if not inv.from_tag:
            raise ValueError("From has no tag")
        return cls(
            call_id=inv.call_id,
            local_tag=local_tag,
            remote_tag=inv.from_tag,
            local_uri=parse_name_addr(inv.get("to")).uri,
            remote_uri=parse_name_addr(inv.get("from")).uri,
            remote_target=target,
            route_set=list(inv.get_all("record-route")),
            local_contact=local_contact,
            source=source,
            remote_cseq=inv.cseq[0],
            transport=inv.top_via.transport if inv.top_via.transport in ("TCP", "TLS") else "UDP",
        )

    @classmethod
    def for_outgoing(cls, inv: SipMessage, local_contact: str, dest: Addr) -> Dialog:
        """The early dialog of an INVITE we send (the UAC view; :meth:`answered` completes it)."""
        return cls(
            call_id=inv.call_id,
            local_tag=inv.from_tag,
            remote_tag="",
            local_uri=parse_name_addr(inv.get("from")).uri,
            remote_uri=parse_name_addr(inv.get("to")).uri,
            remote_target=inv.uri,
            route_set=[],
            local_contact=local_contact,
            source=dest,
            local_cseq=inv.cseq[0],
        )

    def answered(self, resp: SipMessage) -> None:
        """12.1.2: the 2xx to our INVITE sets the remote tag, the target and the route set."""
        self.remote_tag = resp.to_tag
        contact = resp.get("contact")
        if contact:
            try:
                target = parse_name_addr(contact).uri
                if parse_uri(target).scheme in ("sip", "sips"):
                    self.remote_target = target
            except ValueError:
                pass
        self.route_set = list(reversed(resp.get_all("record-route")))
        self.state = "confirmed"

    def accept_cseq(self, req: SipMessage) -> bool:
        """12.2.2: a lower CSeq than the last seen is out of order."""
        num = req.cseq[0]
        if num < self.remote_cseq:
            return False
        self.remote_cseq = num
        return True

    @staticmethod
    def target_in(req: SipMessage) -> str | None:
        """The remote target a target refresh (re-INVITE) names: its Contact's URI (None: none usable)."""
        contact = req.get("contact")
        if not contact:
            return None
        try:
            return parse_name_addr(contact).uri
        except ValueError:
            return None

    def refresh_target(self, req: SipMessage) -> None:
        target = self.target_in(req)
        if target is not None:
            self.remote_target = target

    def next_hop(self) -> Addr:
        """Where an in-dialog request goes: first loose route, else the remote target."""
        return self.hop_for(self.remote_target)

    def hop_for(self, target: str) -> Addr:
        """Where an in-dialog request would go with ``target`` as the remote target: the first
        route of the route set, else ``target``; the INVITE's source when that is no IP address.
        The caller checks it against its allow-list before sending (nothing here does)."""
        try:
            uri = parse_uri(parse_name_addr(self.route_set[0]).uri if self.route_set else target)
        except ValueError:
            return self.source
        if not is_ip(uri.host):
            return self.source
        return uri.host, uri.port or 5060

    def request(self, method: str, via: str, *, body: bytes = b"", content_type: str = "",
                extra: list[tuple[str, str]] | None = None, cseq: int | None = None,
                branch: str | None = None) -> SipMessage:
        """An in-dialog request (BYE, REFER, ...) from us to the peer."""
        if cseq is None:
            self.local_cseq += 1
            cseq = self.local_cseq
        msg = SipMessage(method=method, uri=self.remote_target)
        h = msg.headers
        h.append(("via", f"SIP/2.0/{self.transport} {via};branch={branch or new_branch()};rport"))
        h.append(("max-forwards", "70"))
        h.append(("from", f"<{self.local_uri}>;tag={self.local_tag}"))
        h.append(("to", f"<{self.remote_uri}>;tag={self.remote_tag}"))
        h.append(("call-id", self.call_id))
        h.append(("cseq", f"{cseq} {method}"))
        for r in self.route_set:
            h.append(("route", r))
        h.append(("contact", self.local_contact))
        for k, v in extra or []:
            h.append((k, v))
        if body:
            h.append(("content-type", content_type))
            msg.body = body
        return msg
