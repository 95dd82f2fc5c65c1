"""Agent files are checked offline and fail closed: ``brisvoxd check`` and ``brisvoxd start``.

* ``brisvoxd check AGENT.toml`` validates an agent file (exit 2 naming its
  line and key), ``brisvoxd check brisvoxd.toml`` a daemon config together
  with every agent file it names (routes, SIP users, "default" =
  ``[agents] default_agent``), and the shipped configs pass.
* ``brisvoxd start`` with a daemon config whose default agent file is broken
  does not serve calls with it: the agent process fails its boot with the
  config exit code, the daemon stops with exit 2 and the log names the agent
  file, the line, the bad key and the daemon key that references it. The
  same for a default agent with no file at all.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.harness.daemon import Daemon, cli, write_config

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
# the shipped local agent with a misspelt option in its [llm.options] table
BAD_LOCAL = (ROOT / "configs" / "agents" / "local.toml").read_text().replace(
    "[llm.options]\n", "[llm.options]\ntemprature = 0.3\n", 1)
assert "temprature" in BAD_LOCAL


def _agents(tmp: Path, broken: bool) -> Path:
    d = tmp / "agents"
    d.mkdir()
    shutil.copy(ROOT / "configs" / "agents" / "scripted.toml", d / "scripted.toml")
    (d / "local.toml").write_text(BAD_LOCAL if broken else (ROOT / "configs" / "agents" / "local.toml").read_text())
    return d


def _config(tmp: Path, agents: Path, default: str = "local") -> Path:
    return write_config(tmp, workers=1, agents=1, extra=f"""
[sip]
enabled = false

[websocket]
port = 0
trust_loopback = true

[agents]
agents_dir = "{agents}"
default_agent = "{default}"
""")


def _bad_line() -> int:
    return next(i for i, line in enumerate(BAD_LOCAL.splitlines(), start=1) if line.startswith("temprature"))


def test_check_validates_agent_files_and_the_agents_a_daemon_config_names(short_tmp):
    for f in ("configs/brisvoxd.toml", "configs/brisvoxd.bench.toml", "configs/agents/local.toml",
              "configs/agents/bench.toml"):
        r = cli("check", str(ROOT / f))
        assert r.returncode == 0, (f, r.stdout, r.stderr)
    agents = _agents(short_tmp, broken=True)
    r = cli("check", str(agents / "local.toml"))
    assert r.returncode == 2
    assert f"local.toml:{_bad_line()}: error: llm.options.temprature: unknown option" in r.stdout
    r = cli("check", str(_config(short_tmp, agents)))
    assert r.returncode == 2
    assert f"local.toml:{_bad_line()}: error: llm.options.temprature" in r.stderr
    assert "agents.default_agent" in r.stderr and "websocket.routes[0].agent" in r.stderr


@pytest.mark.parametrize("case", ["broken_file", "missing_file"])
def test_start_fails_closed_on_a_bad_default_agent(short_tmp, case):
    agents = _agents(short_tmp, broken=case == "broken_file")
    cfg = _config(short_tmp, agents, default="local" if case == "broken_file" else "nosuchagent")
    d = Daemon(short_tmp, config=cfg, real_roles=True)
    try:
        d.start()
        assert d.wait_exit(60) == 2
        log = d.logs()
        if case == "broken_file":
            assert f"local.toml:{_bad_line()}: error: llm.options.temprature: unknown option" in log
        else:
            assert "no agent file" in log and "nosuchagent.toml" in log
        assert "agents.default_agent" in log
    finally:
        d.close()
