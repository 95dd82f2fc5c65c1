"""The refusal of an open SIP port (brisvox/config/exposure.py) and ``[sip] allow_env`` (env_values.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from brisvox.config.daemon import load_config, parse_config
from brisvox.config.env_values import resolve_env_networks
from brisvox.config.errors import ConfigError
from brisvox.config.exposure import check_open_sip, wide_networks
from brisvox.daemon.command_plane import reload_config

ROOT = Path(__file__).resolve().parents[2]
CONTAINER = ROOT / "configs" / "brisvoxd.container.toml"


@pytest.mark.parametrize("allow", [["0.0.0.0/0"], ["::/0"], ["0.0.0.0/1", "128.0.0.0/1"], ["::ffff:0:0/96"],
                                   ["2000::/3"], ["0.0.0.0/1"], ["10.0.0.0/8", "0.0.0.0/0"]])
def test_allow_lists_that_admit_the_internet(allow):
    assert wide_networks(allow)


@pytest.mark.parametrize("allow", [["127.0.0.0/8"], ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"],
                                   ["203.0.113.0/24", "198.51.100.7"], ["fc00::/7"], ["2001:db8::/32"],
                                   ["44.0.0.0/8"], ["::ffff:203.0.113.0/120"], []])
def test_allow_lists_that_do_not(allow):
    assert wide_networks(allow) == []


def _cfg(sip: dict, daemon: dict | None = None, path: str | None = None):
    return parse_config({"sip": sip, **({"daemon": daemon} if daemon else {})}, path)


def test_a_public_sip_listener_open_to_the_internet_is_a_config_error_naming_the_key_and_the_fix():
    with pytest.raises(ConfigError) as e:
        check_open_sip(_cfg({"host": "0.0.0.0", "allow": ["0.0.0.0/0"]}))
    assert e.value.key == "sip.allow"
    msg = str(e.value)
    assert "0.0.0.0/0" in msg and "paid agent calls" in msg and "daemon.unsafe_open_sip" in msg
    assert "BRISVOX_SIP_ALLOW" in msg


def test_loopback_disabled_or_narrow_sip_passes_and_the_override_is_a_warning():
    assert check_open_sip(_cfg({"host": "127.0.0.1", "allow": ["0.0.0.0/0"]})) == []
    assert check_open_sip(_cfg({"host": "0.0.0.0", "enabled": False, "allow": ["0.0.0.0/0"]})) == []
    assert check_open_sip(_cfg({"host": "0.0.0.0", "allow": ["203.0.113.0/24"]})) == []
    lines = check_open_sip(_cfg({"host": "0.0.0.0", "allow": ["::/0"]}, {"unsafe_open_sip": True}))
    assert len(lines) == 1 and "unsafe_open_sip = true" in lines[0]


def test_allow_env_replaces_allow_when_set_and_keeps_it_when_unset():
    table = {"host": "0.0.0.0", "allow": ["127.0.0.0/8"], "allow_env": "X_ALLOW"}
    assert resolve_env_networks(table, "sip", {}) == {"host": "0.0.0.0", "allow": ["127.0.0.0/8"]}
    assert resolve_env_networks(table, "sip", {"X_ALLOW": "  "})["allow"] == ["127.0.0.0/8"]
    got = resolve_env_networks(table, "sip", {"X_ALLOW": "203.0.113.0/24, 198.51.100.7 2001:db8::/32"})
    assert got["allow"] == ["203.0.113.0/24", "198.51.100.7", "2001:db8::/32"] and "allow_env" not in got
    with pytest.raises(ConfigError) as e:
        resolve_env_networks(table, "sip", {"X_ALLOW": "203.0.113.0/24,nope"})
    assert e.value.key == "sip.allow_env" and "X_ALLOW" in str(e.value) and "'nope'" in str(e.value)
    with pytest.raises(ConfigError):
        resolve_env_networks({"allow_env": "not a name"}, "sip", {})
    with pytest.raises(ConfigError):  # only the registered keys take the form: the section refuses the rest
        parse_config({"sip": {"host_env": "X"}})


def test_the_container_config_answers_no_one_outside_without_the_variable(monkeypatch):
    monkeypatch.setenv("BRISVOX_NATIVE_SECRET", "s" * 32)
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "t" * 32)
    monkeypatch.delenv("BRISVOX_SIP_ALLOW", raising=False)
    cfg = load_config(CONTAINER)
    sip = cfg.section("sip")
    assert sip.host == "0.0.0.0" and sip.allow == ("127.0.0.0/8",) and check_open_sip(cfg) == []
    monkeypatch.setenv("BRISVOX_SIP_ALLOW", "203.0.113.0/24")
    assert load_config(CONTAINER).section("sip").allow == ("203.0.113.0/24",)
    monkeypatch.setenv("BRISVOX_SIP_ALLOW", "0.0.0.0/0")
    with pytest.raises(ConfigError) as e:
        check_open_sip(load_config(CONTAINER))
    assert e.value.key == "sip.allow" and str(CONTAINER) in str(e.value)


def test_a_reload_to_an_open_sip_port_is_refused(tmp_path):
    path = tmp_path / "brisvoxd.toml"
    path.write_text('[sip]\nhost = "0.0.0.0"\nallow = ["203.0.113.0/24"]\n')
    running = load_config(path)
    path.write_text('[sip]\nhost = "0.0.0.0"\nallow = ["0.0.0.0/0"]\n')
    with pytest.raises(ConfigError) as e:
        reload_config(running, (None, None))
    assert e.value.key == "sip.allow" and e.value.line == 3
