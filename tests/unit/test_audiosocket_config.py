"""``[audiosocket]``: AudioSocket has no authentication, so its allow list is checked at load."""

from __future__ import annotations

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import AudioSocketConfig, GatewaySettings


def test_the_default_is_off_and_loopback_only():
    cfg = AudioSocketConfig()
    assert not cfg.enabled and cfg.host == "127.0.0.1" and cfg.allow == ("127.0.0.0/8", "::1/128")
    assert GatewaySettings.from_tables({"audiosocket": {"enabled": True}}).audiosocket.enabled


@pytest.mark.parametrize("allow", [["0.0.0.0/0"], ["::/0"], ["0.0.0.0/1", "128.0.0.0/1"], ["8.0.0.0/7"]])
def test_a_public_listener_open_to_the_internet_is_refused(allow):
    with pytest.raises(ConfigError, match="audiosocket.allow.*no authentication"):
        AudioSocketConfig.from_section({"enabled": True, "host": "0.0.0.0", "allow": allow})


def test_a_public_listener_with_a_narrow_allow_list_loads():
    cfg = AudioSocketConfig.from_section({"enabled": True, "host": "0.0.0.0", "allow": ["10.1.2.3/32", "192.168.0.0/16"]})
    assert cfg.allow == ("10.1.2.3/32", "192.168.0.0/16")
    # on loopback only this machine connects: a wide list is harmless there
    assert AudioSocketConfig.from_section({"enabled": True, "allow": ["0.0.0.0/0"]}).allow == ("0.0.0.0/0",)


@pytest.mark.parametrize(("table", "key"), [
    ({"allow": []}, "audiosocket.allow"),
    ({"allow": ["not a network"]}, "audiosocket.allow[0]"),
    ({"rate": 22050}, "audiosocket.rate"),
    ({"agent": "../etc"}, "audiosocket.agent"),
    ({"max_message_bytes": 65536}, "audiosocket.max_message_bytes"),
    ({"max_connections_per_source": 0}, "audiosocket.max_connections_per_source"),
    ({"first_message_s": 0}, "audiosocket.first_message_s"),
    ({"secret": "x"}, "audiosocket.secret"),
])
def test_bad_values_name_their_key(table, key):
    with pytest.raises(ConfigError) as e:
        AudioSocketConfig.from_section(table)
    assert e.value.key == key, e.value


def test_brisvoxd_check_names_who_may_connect_and_refuses_an_open_listener(tmp_path, capsys):
    from brisvox.cli.brisvoxd import main as brisvoxd

    ok = tmp_path / "ok.toml"
    ok.write_text('[audiosocket]\nenabled = true\nhost = "0.0.0.0"\nallow = ["10.0.0.2/32"]\n')
    assert brisvoxd(["check", str(ok)]) == 0
    assert "audiosocket: 0.0.0.0:9092 answers 10.0.0.2/32 (audiosocket.allow)" in capsys.readouterr().out
    open_ = tmp_path / "open.toml"
    open_.write_text('[audiosocket]\nenabled = true\nhost = "0.0.0.0"\nallow = ["0.0.0.0/0"]\n')
    assert brisvoxd(["check", str(open_)]) == 2
    assert "open.toml:4: audiosocket.allow: admits 0.0.0.0/0" in capsys.readouterr().err
