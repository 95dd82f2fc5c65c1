"""``[gateway] max_calls``: "auto" (60 per usable core) by default, an explicit integer accepted, all else refused."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway import config as gc
from brisvox.gateway.config import GatewayConfig

ROOT = Path(__file__).resolve().parents[2]


def test_auto_is_60_per_core_of_the_affinity():
    cores = len(os.sched_getaffinity(0))
    assert gc.usable_cores() == cores
    assert gc.auto_max_calls() == gc.AUTO_CALLS_PER_CORE * cores == 60 * cores
    assert gc.auto_max_calls(2) == 120
    assert GatewayConfig().max_calls == 60 * cores
    assert GatewayConfig.from_section({}).max_calls == 60 * cores
    assert GatewayConfig.from_section({"max_calls": "auto"}).max_calls == 60 * cores
    assert gc.parse_max_calls("auto", "k", cores=3) == 180


def test_explicit_number_is_kept():
    assert GatewayConfig.from_section({"max_calls": 6}).max_calls == 6
    assert GatewayConfig.from_section({"max_calls": gc.MAX_CALLS_LIMIT}).max_calls == gc.MAX_CALLS_LIMIT


@pytest.mark.parametrize("bad", [0, -1, gc.MAX_CALLS_LIMIT + 1, "AUTO", "60", 1.5, True, [], {}])
def test_invalid_values_name_the_key(bad):
    with pytest.raises(ConfigError) as ei:
        GatewayConfig.from_section({"max_calls": bad})
    assert ei.value.key == "gateway.max_calls"


def test_shipped_config_uses_auto_and_the_bench_config_a_number():
    shipped = tomllib.loads((ROOT / "configs" / "brisvoxd.toml").read_text())
    assert shipped["gateway"]["max_calls"] == "auto"
    bench = tomllib.loads((ROOT / "configs" / "brisvoxd.bench.toml").read_text())
    assert isinstance(bench["gateway"]["max_calls"], int)
