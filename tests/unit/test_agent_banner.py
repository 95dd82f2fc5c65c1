"""The "where to call" banner of ``brisvoxd start``: bound addresses, the default agent, how to stop."""

from __future__ import annotations

from brisvox.cli.banner import lines
from brisvox.config.daemon import parse_config


def test_banner_names_the_bound_addresses_the_agents_and_how_to_stop():
    cfg = parse_config({})
    snap = {"children": [{"role": "gateway", "endpoints": {"websocket": "127.0.0.1:40001", "sip": "127.0.0.1:40002"}}]}
    text = "\n".join(lines(snap, cfg, foreground=True))
    assert "ws://127.0.0.1:40001/twilio" in text and "Twilio Media Streams, agent local" in text
    assert "ws://127.0.0.1:40001/ws" in text and "native protocol, agent local" in text
    assert "sip:agent@127.0.0.1:40002" in text and "sip:echo@127.0.0.1:40002" in text
    assert "Ctrl-C" in text and "brisvoxd stop" in text
    assert 'brisvox call ws://127.0.0.1:40001/twilio --say' in text
    daemonized = "\n".join(lines(snap, cfg, foreground=False))
    assert "Ctrl-C" not in daemonized and "brisvoxd stop" in daemonized


def test_banner_without_listeners_says_so():
    cfg = parse_config({"websocket": {"enabled": False}, "sip": {"enabled": False}})
    text = "\n".join(lines({"children": [{"role": "gateway", "endpoints": {}}]}, cfg, foreground=True))
    assert "no WebSocket or SIP listener" in text
