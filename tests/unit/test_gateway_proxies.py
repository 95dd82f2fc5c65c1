"""brisvox/gateway/proxies.py, pure, and the ``trusted_proxies`` keys of the config.

* :func:`canonical`: one spelling per address (ports and brackets dropped, IPv4-mapped
  IPv6 as IPv4); names, garbage, scoped and over-long text are not addresses;
* :func:`forwarded_client`: from a trusted peer the rightmost entry that is not a
  proxy, the caller's own entries to its left never read (garbage there is harmless);
  from any other peer the peer, ``ignored``; garbage on the trusted part: the peer,
  ``malformed``;
* :func:`via_client`: under a trusted proxy's Via, ``received`` before the host;
  untrusted senders and a proxy's own request (one Via) are the sender;
* ``[sip] trusted_proxies`` / ``[websocket] trusted_proxies``: a bad entry is a
  ConfigError naming its key; ``/healthz`` cannot be a WebSocket route.
"""

from __future__ import annotations

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import SipConfig, WebSocketConfig
from brisvox.gateway.proxies import (
    DIRECT,
    FORWARDED,
    IGNORED,
    MALFORMED,
    TrustedProxies,
    canonical,
    forwarded_client,
    via_client,
)

LB = TrustedProxies(["10.0.0.5", "10.1.0.0/16", "fd00::/8"])


@pytest.mark.parametrize(("text", "want"), [
    ("192.0.2.1", "192.0.2.1"), (" 192.0.2.1 ", "192.0.2.1"), ("192.0.2.1:8443", "192.0.2.1"),
    ("2001:DB8::1", "2001:db8::1"), ("[2001:db8::1]", "2001:db8::1"), ("[2001:db8::1]:443", "2001:db8::1"),
    ("::ffff:192.0.2.9", "192.0.2.9"), ("[::ffff:c000:209]:1", "192.0.2.9"),
    ("", None), ("unknown", None), ("gw.example", None), ("192.0.2.1:", None), ("192.0.2.1:x", None),
    ("192.0.2.1:\u00b2", None), ("[2001:db8::1", None), ("[2001:db8::1]x", None), ("fe80::1%eth0", None),
    ("1" * 80, None), ("192.0.2.256", None), ("_", None),
])
def test_canonical(text, want):
    assert canonical(text) == want


def test_trusts_networks_and_mapped_addresses():
    assert LB.trusts("10.0.0.5") and LB.trusts("10.1.200.3") and LB.trusts("::ffff:10.0.0.5")
    assert LB.trusts("fd12::1") and not LB.trusts("10.0.0.6") and not LB.trusts("junk")
    assert not TrustedProxies([]) and LB


@pytest.mark.parametrize(("peer", "values", "want"), [
    ("10.0.0.5", [], ("10.0.0.5", DIRECT)),
    ("10.0.0.5", ["192.0.2.1"], ("192.0.2.1", FORWARDED)),
    ("10.0.0.5", ["198.51.100.7, 192.0.2.1"], ("192.0.2.1", FORWARDED)),  # the rightmost: what the LB saw
    ("10.0.0.5", ["garbage, 192.0.2.1"], ("192.0.2.1", FORWARDED)),  # the client's own claims: not read
    ("10.0.0.5", ["192.0.2.1, 10.1.4.4", "10.0.0.5"], ("192.0.2.1", FORWARDED)),  # proxies skipped, in order
    ("10.0.0.5", ["10.1.4.4"], ("10.1.4.4", FORWARDED)),  # only proxies: the farthest
    ("10.0.0.5", ["[2001:db8::7]:5555"], ("2001:db8::7", FORWARDED)),
    ("::ffff:10.0.0.5", ["192.0.2.1"], ("192.0.2.1", FORWARDED)),
    ("203.0.113.9", ["192.0.2.1"], ("203.0.113.9", IGNORED)),  # not a proxy: never believed
    ("203.0.113.9", ["unknown"], ("203.0.113.9", IGNORED)),
    ("10.0.0.5", ["unknown"], ("10.0.0.5", MALFORMED)),
    ("10.0.0.5", ["192.0.2.1, bad"], ("10.0.0.5", MALFORMED)),
    ("10.0.0.5", ["192.0.2.1,"], ("10.0.0.5", MALFORMED)),
    ("10.0.0.5", [""], ("10.0.0.5", MALFORMED)),
    ("10.0.0.5", ["192.0.2.1", "x" * 5000], ("10.0.0.5", MALFORMED)),
])
def test_forwarded_client(peer, values, want):
    assert forwarded_client(LB, peer, values) == want


def v(sent_by: str, params: str = "") -> str:
    return f"SIP/2.0/UDP {sent_by};branch=z9hG4bKx{params}"


@pytest.mark.parametrize(("source", "vias", "want"), [
    ("10.0.0.5", [v("10.0.0.5")], ("10.0.0.5", DIRECT)),  # the proxy's own OPTIONS ping
    ("10.0.0.5", [v("10.0.0.5"), v("192.0.2.1:5062")], ("192.0.2.1", FORWARDED)),
    ("10.0.0.5", [v("10.0.0.5"), v("192.168.1.2:5060", ";received=192.0.2.1;rport=1")], ("192.0.2.1", FORWARDED)),
    ("10.0.0.5", [v("10.0.0.5"), v("[2001:db8::3]:5060")], ("2001:db8::3", FORWARDED)),
    ("10.0.0.5", [v("10.0.0.5"), v("10.1.0.9", ";received=10.1.0.9"), v("pc.lan", ";received=192.0.2.8")],
     ("192.0.2.8", FORWARDED)),  # two proxy tiers
    ("10.0.0.5", [v("10.0.0.5"), v("192.0.2.1"), v("10.9.9.9;received=junk")], ("192.0.2.1", FORWARDED)),
    ("203.0.113.9", [v("203.0.113.9"), v("192.0.2.1")], ("203.0.113.9", DIRECT)),  # forged: not read
    ("10.0.0.5", [v("10.0.0.5"), v("pc.lan")], ("10.0.0.5", MALFORMED)),
    ("10.0.0.5", [v("10.0.0.5"), v("192.0.2.1", ";received=")], ("10.0.0.5", MALFORMED)),
    ("10.0.0.5", [v("10.0.0.5"), "garbage"], ("10.0.0.5", MALFORMED)),
])
def test_via_client(source, vias, want):
    assert via_client(LB, source, vias) == want


@pytest.mark.parametrize(("cls", "table", "key"), [
    (SipConfig, {"trusted_proxies": ["10.0.0.1", "kamailio.lan"]}, "sip.trusted_proxies[1]"),
    (SipConfig, {"trusted_proxies": ["10.0.0.0/33"]}, "sip.trusted_proxies[0]"),
    (SipConfig, {"trusted_proxies": "10.0.0.1"}, "sip.trusted_proxies"),
    (WebSocketConfig, {"trusted_proxies": ["haproxy"]}, "websocket.trusted_proxies[0]"),
    (WebSocketConfig, {"trusted_proxies": [5]}, "websocket.trusted_proxies[0]"),
    (WebSocketConfig, {"routes": [{"path": "/healthz/", "protocol": "native"}]}, "websocket.routes[0].path"),
])
def test_bad_trusted_proxies_name_their_key(cls, table, key):
    with pytest.raises(ConfigError) as e:
        cls.from_section(table)
    assert e.value.key == key


def test_trusted_proxies_default_to_none_and_take_addresses_and_networks():
    assert SipConfig().trusted_proxies == () and WebSocketConfig().trusted_proxies == ()
    assert SipConfig.from_section({"trusted_proxies": ["10.0.0.1", "10.2.0.0/16", "fd00::/8"]}).trusted_proxies == (
        "10.0.0.1", "10.2.0.0/16", "fd00::/8")
    assert WebSocketConfig.from_section({"trusted_proxies": ["10.0.0.9/24"]}).trusted_proxies == ("10.0.0.9/24",)
