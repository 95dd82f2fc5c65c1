"""``[gateway] max_calls``: "auto" by default, an explicit integer accepted, all else refused.

"auto" is 60 per usable core, and fewer on a host where the workers' boot
self-benchmark measured a dear Smart Turn inference (1200 ms of it per core):
the gateway's call table follows the slowest worker's figure from the Topology
rows, keeps a restarting worker's last figure, forgets a worker scaled away,
and never touches an explicit number.
"""

from __future__ import annotations

import asyncio
import os
import tomllib
from pathlib import Path

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway import config as gc
from brisvox.gateway.config import GatewayConfig

ROOT = Path(__file__).resolve().parents[2]


def test_auto_is_60_per_usable_core():
    from brisvox.runtime.cpu import quota_cores

    cores = len(os.sched_getaffinity(0)) if quota_cores() is None else gc.usable_cores()  # the affinity, or the quota
    assert gc.usable_cores() == cores
    assert gc.auto_max_calls() == gc.AUTO_CALLS_PER_CORE * cores == 60 * cores
    assert gc.auto_max_calls(2) == 120
    assert GatewayConfig().max_calls == "auto" and GatewayConfig().call_limit() == 60 * cores
    assert GatewayConfig.from_section({}).call_limit() == 60 * cores
    assert GatewayConfig.from_section({"max_calls": "auto"}).call_limit(cores=3) == 180


def test_auto_follows_the_measured_smart_turn_time():
    assert gc.AUTO_SMART_TURN_MS_PER_CORE == 1200.0
    cfg = GatewayConfig()
    assert cfg.call_limit(smart_turn_ms=19.6, cores=2) == 120  # a fast host: the 60 per core cap
    assert cfg.call_limit(smart_turn_ms=28.0, cores=2) == 85  # 1200 / 28 = 42.9 per core
    assert cfg.call_limit(smart_turn_ms=66.0, cores=2) == 36  # the AVX2 host of 2026-12-01
    assert cfg.call_limit(smart_turn_ms=5000.0, cores=1) == 1  # never 0
    assert cfg.call_limit(smart_turn_ms=0.0, cores=2) == 120  # no figure: the static rule
    assert GatewayConfig(max_calls=7).call_limit(smart_turn_ms=66.0) == 7  # explicit: never changed


def _rows(*workers: tuple[int, str, float | None]) -> list[dict]:
    out: list[dict] = [{"role": "gateway", "index": 0, "pid": 1, "state": "ready"}]
    for idx, state, ms in workers:
        row = {"role": "worker", "index": idx, "pid": 10 + idx, "state": state}
        if ms is not None:
            row["measured"] = {"smart_turn_ms": ms}
        out.append(row)
    return out


@pytest.mark.parametrize("explicit", [None, 9])
def test_the_call_table_follows_the_slowest_workers_figure(tmp_path, explicit):
    asyncio.run(_follows(tmp_path, explicit))


async def _follows(tmp_path: Path, explicit: int | None) -> None:
    from brisvox.gateway.config import GatewaySettings
    from brisvox.gateway.transports import assemble

    cfg = GatewayConfig() if explicit is None else GatewayConfig(max_calls=explicit)
    core = assemble(GatewaySettings(gateway=cfg), instance=f"mc{os.getpid()}", runtime_dir=tmp_path)
    core.links.start(asyncio.get_running_loop(), None)
    try:
        cores = gc.usable_cores()
        static = 60 * cores if explicit is None else explicit
        assert core.table.max_calls == static and core.stats()["max_calls"] == static
        core.update_topology(_rows((0, "ready", 30.0), (1, "ready", 20.0)))
        want = int(1200 / 30.0 * cores) if explicit is None else explicit
        assert core.table.max_calls == min(static, want)  # the slowest worker counts
        core.update_topology(_rows((0, "starting", None), (1, "ready", 20.0)))  # worker 0 restarts
        assert core.table.max_calls == min(static, want)  # its last figure is kept while it boots
        core.update_topology(_rows((0, "ready", 120.0), (1, "ready", 20.0)))  # the new incarnation is slower
        assert core.table.max_calls == (max(1, int(10 * cores)) if explicit is None else explicit)
        core.update_topology(_rows((1, "ready", 20.0)))  # worker 0 scaled away
        assert core.table.max_calls == (min(static, int(60 * cores)) if explicit is None else explicit)
        assert core.stats()["max_calls"] == core.table.max_calls
    finally:
        core.links.close()


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
