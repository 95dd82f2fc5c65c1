"""The start-time refusal of an open SIP port: a public SIP listener must not admit the whole Internet.

Under ``[sip] auth = "ip"`` (the default) every INVITE that passes ``[sip]
allow`` becomes a call to an agent, which costs provider money. So a SIP listener on an address other people can reach
(``[sip] host`` not a loopback address: ``0.0.0.0``, a private or a public
address) whose allow list admits the whole Internet is a configuration
error for ``brisvoxd start``, ``brisvoxd check`` and a reload, unless
``[daemon] unsafe_open_sip = true`` says a firewall in front filters the
sources (then it is one warning line). Under ``auth = "digest"`` every new
INVITE must answer a digest challenge, so an open allow list is accepted;
under ``"ip_or_digest"`` the networks that need no challenge
(``auth_networks``) are judged as ``allow`` is otherwise.

"Admits the whole Internet" (:func:`wide_networks`): after IPv4-mapped IPv6
entries are read as IPv4 and the list is collapsed (so ``0.0.0.0/1`` plus
``128.0.0.0/1`` counts as ``0.0.0.0/0``), some network is wider than
:data:`WIDEST` (a ``/8`` of IPv4, a ``/16`` of IPv6: no carrier or SBC needs
more) and does not lie inside one non-public block (:data:`NON_PUBLIC`:
private, shared, loopback, link-local, multicast, reserved). ``0.0.0.0/0``,
``::/0``, ``2000::/3`` and ``::ffff:0:0/96`` are all refused;
``10.0.0.0/8`` and ``fc00::/7`` are not.

Invariants: pure (the parsed config in, a list of lines or a
:class:`ConfigError` naming ``sip.allow`` out); reads the config file only
to name the line of the key.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

from brisvox.config.errors import ConfigError

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

WIDEST = {4: 8, 6: 16}  # a public network with a shorter prefix than this admits "the Internet"
NON_PUBLIC: tuple[IpNetwork, ...] = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
    "::1/128", "fc00::/7", "fe80::/10", "ff00::/8",
))
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")
OVERRIDE_KEY = "daemon.unsafe_open_sip"
DOC = "docs/SECURITY.md, \"SIP and RTP\""


def as_networks(entry: str) -> list[IpNetwork]:
    """One allow entry as the networks it admits, IPv4-mapped IPv6 addresses read as IPv4."""
    net = ipaddress.ip_network(entry, strict=False)
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96 and net.subnet_of(_MAPPED):
        mapped = net.network_address.ipv4_mapped
        assert mapped is not None
        return [ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}", strict=False)]
    if isinstance(net, ipaddress.IPv6Network) and _MAPPED.subnet_of(net):
        return [net, ipaddress.ip_network("0.0.0.0/0")]  # it holds every IPv4-mapped address too
    return [net]


def wide_networks(allow: tuple[str, ...] | list[str]) -> list[str]:
    """The networks of ``allow`` (collapsed) that admit the whole Internet, as strings; [] when none does."""
    nets = [n for e in allow for n in as_networks(e)]
    wide: list[str] = []
    for version in (4, 6):
        family: list[Any] = [n for n in nets if n.version == version]
        for net in ipaddress.collapse_addresses(family):
            if net.prefixlen >= WIDEST[version]:
                continue
            blocks: list[Any] = [b for b in NON_PUBLIC if b.version == version]
            if any(net.subnet_of(block) for block in blocks):
                continue
            wide.append(str(net))
    return wide


def _line(path: str | None, key: str) -> int:
    if not path:
        return 0
    from brisvox.config.lines import key_lines, line_of, split_key

    try:
        return line_of(key_lines(Path(path).read_text(encoding="utf-8")), split_key(key))
    except (OSError, UnicodeDecodeError):
        return 0


def check_open_sip(cfg: Any) -> list[str]:
    """Raise :class:`ConfigError` (``sip.allow``) for a public SIP listener open to the Internet; with the
    override set, return the warning line instead; [] when the listener is not open."""
    from brisvox.gateway.config import is_loopback

    sip = cfg.section("sip")
    if not sip.enabled or is_loopback(sip.host):
        return []
    if sip.auth == "digest":  # every new INVITE is challenged: the allow list may be open
        return []
    wide = wide_networks(sip.auth_networks if sip.auth == "ip_or_digest" else sip.allow)
    if not wide:
        return []
    key = "sip.auth_networks" if sip.auth == "ip_or_digest" else "sip.allow"
    what = (f"admits {', '.join(wide)}, the whole Internet, on the SIP listener {sip.host}:{sip.port} (sip.host) "
            f"without a challenge ({key}, sip.auth = {sip.auth!r}): an open SIP port answers anyone with paid "
            "agent calls")
    if cfg.daemon.unsafe_open_sip:
        return [f"sip.allow {what}; started anyway because {OVERRIDE_KEY} = true (a firewall in front must "
                "admit only your carrier's or SBC's addresses)"]
    msg = (f"{what}. Narrow sip.allow to your carrier's or SBC's networks (e.g. allow = [\"203.0.113.0/24\"]; "
           "in the container: -e BRISVOX_SIP_ALLOW=203.0.113.0/24), bind sip.host to 127.0.0.1 behind a SIP "
           f"proxy, or set sip.enabled = false; only behind a firewall that filters the sources: "
           f"{OVERRIDE_KEY} = true; or make callers authenticate: sip.auth = \"digest\" ({DOC})")
    raise ConfigError("sip.allow", msg, cfg.path, _line(cfg.path, "sip.allow"))
