"""Trusted proxies in front of the gateway: whose word names the caller of a request.

Owns :class:`TrustedProxies` (``[sip] trusted_proxies``, ``[websocket]
trusted_proxies``: IP addresses and CIDR networks) and the two ways a proxy
names the caller it forwards: :func:`forwarded_client` (HTTP
``X-Forwarded-For``, e.g. HAProxy's ``option forwardfor``) and
:func:`via_client` (SIP: a proxy such as Kamailio puts its own Via on top
and leaves the caller's under it, with ``received=`` when the caller's
sent-by was not the address the packet came from). The per-source limits
(SIP INVITE/OPTIONS rates, WebSocket handshake rate and open connections)
key on the address these return.

Invariants:

* A header names the caller only when the request's sender (the UDP source,
  the TCP peer) is a trusted proxy. From any other sender the header is never
  read for an address: the answer is the sender (``forwarded_client`` says
  ``IGNORED`` when the header was there, so the caller can count it).
* The trusted part of a header is walked from the sender's side (the
  rightmost X-Forwarded-For entry, the second Via and down): the first entry
  that is not itself a trusted proxy is the caller. Entries beyond it are the
  caller's own claims and are never parsed. When every entry is a trusted
  proxy the farthest one is the caller (a proxy's own request).
* The answer is an IP address in canonical text (:func:`canonical`: one
  spelling per address, an IPv4-mapped IPv6 address as IPv4), so one caller
  is one key; or the sender itself. An entry of the walked part that is not
  an IP address (a name, ``unknown``, garbage, an empty entry) gives the
  sender with ``MALFORMED``. Nothing here raises on what a peer sent.
* Matching an address against the networks is cached per address, at most
  :data:`CACHE_MAX` entries (then computed each time).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from brisvox.wire.sip_message import parse_via

CACHE_MAX = 4096
MAX_ENTRY = 64  # longer than any IP address text with a port: not one

DIRECT = ""  # the sender is the caller (no header, or a trusted proxy's own request)
FORWARDED = "forwarded"  # a trusted proxy named the caller
IGNORED = "ignored"  # the header came from a sender that is not a trusted proxy
MALFORMED = "malformed"  # a trusted proxy's header held something that is not an IP address


def canonical(text: str) -> str | None:
    """``text`` as an IP address in canonical form (``[v6]``, ``[v6]:port``, ``v4:port``
    accepted, the port dropped; IPv4-mapped IPv6 as IPv4), or None if it is not one."""
    t = text.strip()
    if not t or len(t) > MAX_ENTRY:
        return None
    if t.startswith("["):
        host, sep, rest = t[1:].partition("]")
        if not sep or (rest and not (rest[:1] == ":" and rest[1:].isascii() and rest[1:].isdigit())):
            return None
        t = host
    elif t.count(":") == 1:
        host, _, port = t.partition(":")
        if not (port.isascii() and port.isdigit()):
            return None
        t = host
    try:
        ip = ipaddress.ip_address(t)
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id is not None:
            return None
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
    return str(ip)


class TrustedProxies:
    """The networks of one ``trusted_proxies`` key (validated by the config)."""

    def __init__(self, nets: Iterable[str]) -> None:
        self.nets = [ipaddress.ip_network(n, strict=False) for n in nets]
        self._cache: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.nets)

    def trusts(self, host: str) -> bool:
        """``host`` (an address as a socket or a header gave it) is one of the proxies."""
        ok = self._cache.get(host)
        if ok is None:
            ip = canonical(host)
            ok = ip is not None and any(ipaddress.ip_address(ip) in n for n in self.nets)
            if len(self._cache) < CACHE_MAX:
                self._cache[host] = ok
        return ok


def forwarded_client(trusted: TrustedProxies, peer: str, values: list[str]) -> tuple[str, str]:
    """(the client's address, how it was found) for a request from ``peer`` whose
    X-Forwarded-For headers are ``values`` (in order; see the module invariants)."""
    if not values:
        return peer, DIRECT
    if not trusted.trusts(peer):
        return peer, IGNORED
    entries = ",".join(values).split(",")
    found = peer
    for entry in reversed(entries):
        ip = canonical(entry)
        if ip is None:
            return peer, MALFORMED
        found = ip
        if not trusted.trusts(ip):
            break
    return found, FORWARDED


def via_client(trusted: TrustedProxies, source: str, vias: list[str]) -> tuple[str, str]:
    """(the caller's address, how it was found) for a SIP request from ``source`` whose Via
    values are ``vias`` (top first): under a trusted proxy's own Via, each Via's
    ``received`` (else its host) is the hop that sent it to the proxy above."""
    if len(vias) < 2 or not trusted.trusts(source):
        return source, DIRECT
    found = source
    for value in vias[1:]:
        try:
            via = parse_via(value)
        except ValueError:
            return source, MALFORMED
        ip = canonical(via.params.get("received", via.host))
        if ip is None:
            return source, MALFORMED
        found = ip
        if not trusted.trusts(ip):
            break
    return found, FORWARDED
