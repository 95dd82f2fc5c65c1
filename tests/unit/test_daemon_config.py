"""The daemon config: strict parsing, errors that name the key, file and docs in sync."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Literal

import pytest
from pydantic import Field

from brisvox.config.daemon import (
    DaemonConfig,
    DaemonSection,
    load_config,
    parse_config,
    parse_listen,
)
from brisvox.config.errors import ConfigError
from brisvox.config.schema import from_table, problems, section

ROOT = Path(__file__).resolve().parents[2]


def err(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as ei:
        parse_config(data, "f.toml")
    return ei.value


@pytest.mark.parametrize(
    ("data", "key", "fragment"),
    [
        ({"daemon": {"workers": "x"}}, "daemon.workers", "expected an integer"),
        ({"daemon": {"workers": True}}, "daemon.workers", "expected an integer"),
        ({"daemon": {"workers": 0}}, "daemon.workers", ">= 1"),
        ({"daemon": {"agents": 1.5}}, "daemon.agents", "expected an integer"),
        ({"daemon": {"nope": 1}}, "daemon.nope", "unknown key"),
        ({"daemon": {"restart": {"backoff_max_s": "1"}}}, "daemon.restart.backoff_max_s", "expected a number"),
        ({"daemon": {"restart": {"boot_failures_max": 0}}}, "daemon.restart.boot_failures_max", ">= 1"),
        ({"daemon": {"restart": 3}}, "daemon.restart", "expected a table"),
        ({"daemon": {"health": {"pong_timeout_s": 0.5}}}, "daemon.health.pong_timeout_s", "longer than"),
        ({"daemon": {"memory": {"worker": {"limit_mb": -1}}}}, "daemon.memory.worker.limit_mb", ">= 0"),
        ({"daemon": {"memory": {"agent": {"warn_mb": 9, "limit_mb": 5}}}}, "daemon.memory.agent.warn_mb", "limit_mb"),
        ({"daemon": {"memory": {"robot": {}}}}, "daemon.memory.robot", "unknown key"),
        ({"daemon": {"metrics": {"listen": "10.0.0.1:9"}}}, "daemon.metrics.listen", "loopback"),
        ({"daemon": {"metrics": {"listen": "127.0.0.1"}}}, "daemon.metrics.listen", "host:port"),
        ({"daemon": {"log": {"level": "loud"}}}, "daemon.log.level", "one of"),
        ({"bogus": {}}, "bogus", "unknown section"),
        ({"daemon": 1}, "daemon", "expected a table"),
    ],
)
def test_errors_name_the_key(data, key, fragment):
    e = err(data)
    assert e.key == key and fragment in e.message
    assert str(e).startswith(f"f.toml: {key}: ")


def test_defaults_and_overrides():
    c = parse_config({"daemon": {"workers": 4, "restart": {"backoff_max_s": 5}}})
    assert c.daemon.workers == 4 and c.daemon.agents == 1
    assert c.daemon.restart.backoff_max_s == 5.0 and c.daemon.restart.backoff_initial_s == 0.1
    assert c.count("gateway") == 1 and c.count("worker") == 4
    assert c.with_counts(workers=7).daemon.workers == 7
    with pytest.raises(ConfigError, match="daemon.agents"):
        c.with_counts(agents=0)
    assert c.section("daemon") is c.daemon
    with pytest.raises(KeyError):
        c.section("no_such_section")


def test_shipped_file_matches_the_code_defaults():
    c = load_config(ROOT / "configs" / "brisvoxd.toml")
    assert c.daemon == DaemonSection()
    for name, parsed in c.sections.items():  # every other section in the file parses and has defaults
        assert dataclasses.is_dataclass(parsed), name


def test_toml_syntax_and_missing_file(tmp_path):
    p = tmp_path / "x.toml"
    p.write_text("[daemon\nworkers = 2\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert ei.value.key == "(syntax)" and str(p) in str(ei.value)
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    assert load_config(None) == DaemonConfig()


def test_parse_listen():
    assert parse_listen("localhost:0", "k") == ("127.0.0.1", 0)
    assert parse_listen("[::1]:9464", "k") == ("::1", 9464)
    assert parse_listen("127.0.0.9:80", "k") == ("127.0.0.9", 80)
    with pytest.raises(ConfigError):
        parse_listen("127.0.0.1:70000", "k")


@section
class _Inner:
    n: int = 1


@section
class _Sample:
    name: str
    tags: tuple[str, ...] = ()
    limits: dict[str, int] = dataclasses.field(default_factory=dict)
    maybe: float | None = None
    inner: _Inner = dataclasses.field(default_factory=_Inner)
    ratio: float = Field(default=0.5, ge=0.0, le=1.0)
    mode: Literal["a", "b"] = "a"


def test_schema_types():
    s = from_table(_Sample, {"name": "x", "tags": ["a", "b"], "limits": {"q": 1}, "maybe": 2, "inner": {"n": 3}},
                   "sec")
    assert s == _Sample("x", ("a", "b"), {"q": 1}, 2.0, _Inner(3))
    with pytest.raises(ConfigError, match=r"sec.name: required"):
        from_table(_Sample, {}, "sec")
    with pytest.raises(ConfigError) as ei:
        from_table(_Sample, {"name": "x", "tags": ["a", 1]}, "sec")
    assert ei.value.key == "sec.tags[1]"
    with pytest.raises(ConfigError) as ei:
        from_table(_Sample, {"name": "x", "limits": {"q": "1"}}, "sec")
    assert ei.value.key == "sec.limits.q"
    with pytest.raises(ConfigError) as ei:
        from_table(_Sample, {"name": "x", "inner": {"m": 1}}, "sec")
    assert ei.value.key == "sec.inner.m"
    with pytest.raises(ConfigError, match="<= 1.0"):
        from_table(_Sample, {"name": "x", "ratio": 2}, "sec")
    with pytest.raises(ConfigError, match="one of"):
        from_table(_Sample, {"name": "x", "mode": "c"}, "sec")
    with pytest.raises(ConfigError, match="expected an integer, got True"):  # TOML's bool is never a number
        from_table(_Sample, {"name": "x", "inner": {"n": True}}, "sec")
    with pytest.raises(ConfigError, match="expected an integer, got 1.5"):  # nor a float an integer
        from_table(_Sample, {"name": "x", "inner": {"n": 1.5}}, "sec")
    assert from_table(_Sample, {"name": "x", "ratio": 1}, "sec").ratio == 1.0  # an integer is a number


def test_schema_refuses_dates_and_reports_every_problem():
    import datetime

    with pytest.raises(ConfigError) as ei:
        from_table(_Sample, {"name": "x", "tags": ["a", datetime.date(2026, 1, 2)]}, "sec")
    assert ei.value.key == "sec.tags[1]" and "date" in ei.value.message
    obj, errs = problems(_Sample, {"name": 3, "ratio": 7, "zz": 1}, "sec")
    assert obj is None
    assert {(e.key, e.message.split(" (")[0]) for e in errs} == {
        ("sec.name", "expected a string, got 3"), ("sec.ratio", "must be <= 1.0, got 7"), ("sec.zz", "unknown key")}


def test_a_file_error_names_its_line(tmp_path):
    p = tmp_path / "b.toml"
    p.write_text("# brisvoxd\n[daemon]\nworkers = 2\n\n[daemon.restart]\nbackoff_max_s = -1\n\n[sip]\nport = 99999\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert ei.value.key == "daemon.restart.backoff_max_s" and ei.value.line == 6
    assert str(ei.value) == f"{p}:6: daemon.restart.backoff_max_s: must be >= 0.0, got -1"
    p.write_text("[sip]\nport = 99999\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert (ei.value.key, ei.value.line) == ("sip.port", 2) and "<= 65535" in ei.value.message
    p.write_text("[websocket]\nport = 8765\n[[websocket.routes]]\npath = \"/a\"\nprotocol = \"native\"\n"
                 "[[websocket.routes]]\npath = \"b\"\nprotocol = \"native\"\n")
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert (ei.value.key, ei.value.line) == ("websocket.routes[1].path", 7)


def _leaf_keys(cls: type, prefix: str) -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            keys += _leaf_keys(type(default), f"{prefix}.{f.name}")
        else:
            keys.append(f"{prefix}.{f.name}")
    return keys


def test_every_daemon_key_is_documented_and_in_the_shipped_file():
    doc = (ROOT / "docs" / "CONFIGURATION.md").read_text()
    toml = (ROOT / "configs" / "brisvoxd.toml").read_text()
    for key in _leaf_keys(DaemonSection, "daemon"):
        leaf = key.rsplit(".", 1)[1]
        assert f"`{leaf}`" in doc, f"{key} is not documented in docs/CONFIGURATION.md"
        assert re.search(rf"\b{leaf}\s*=", toml), f"{key} is missing from configs/brisvoxd.toml"
