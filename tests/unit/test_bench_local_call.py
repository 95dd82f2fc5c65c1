"""``python -m bench local_call`` measures `make run`'s stack: its config is the shipped one with the bench's edits only.

* every edit matches the shipped ``configs/brisvoxd.toml`` exactly once and the result loads as a
  daemon config (a changed shipped line fails here, not silently in the benchmark);
* the compared agent is ``configs/agents/local.toml`` with its name and ``early = true`` only;
* the table join: a client turn joins the record turn whose speech end is nearest, and each step
  is the mark's distance from the one before it on the critical path.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from bench.bench_local_call import ROOT, VARIANT, make_run_config, turn_rows
from brisvox.config.daemon import load_config


def test_the_config_is_make_runs_with_the_bench_edits(tmp_path: Path) -> None:
    path = make_run_config(tmp_path)
    cfg = tomllib.loads(path.read_text())
    shipped = tomllib.loads((ROOT / "configs" / "brisvoxd.toml").read_text())
    assert cfg["daemon"]["workers"] == shipped["daemon"]["workers"] and cfg["smart_turn"] == shipped["smart_turn"]
    assert cfg["sip"]["enabled"] is False and cfg["websocket"]["port"] == 0
    assert cfg["agents"]["agents_dir"] == str(tmp_path / "agents")
    assert cfg["calls"]["path"] == str(tmp_path / "records")
    ws = next(r for r in cfg["websocket"]["routes"] if r["path"] == "/ws")
    assert VARIANT in ws["agents"]
    load_config(path)  # the daemon accepts it
    local = tomllib.loads((tmp_path / "agents" / "local.toml").read_text())
    var = tomllib.loads((tmp_path / "agents" / f"{VARIANT}.toml").read_text())
    assert var["stt"]["options"].pop("early") is True and local["stt"]["options"].pop("early") is False
    assert var.pop("name") == VARIANT and local.pop("name") == "local"
    assert var == local


def test_a_client_turn_joins_the_nearest_record_turn() -> None:
    res = {"t0_monotonic": 100.0, "turns": [
        {"kind": "greeting", "index": 0, "latency_ms": None, "caller_end_s": None, "bot_start_s": None},
        {"kind": "line", "index": 1, "latency_ms": 1500.0, "caller_end_s": 10.0, "bot_start_s": 11.5}]}
    marks = {"t_speech_end": 109.95, "t_vad_stop": 110.25, "t_verdict": 110.4, "t_stt_final": 110.7,
             "t_turn_end": 110.7, "t_request": 110.72, "t_first_token": 111.1, "t_first_audio": 111.45}
    far = {**marks, "t_speech_end": 105.0}
    rec = {"clock_offset_s": 0.0, "turns": [far, marks]}
    (row,) = turn_rows(res, rec)
    assert row["joined"] and row["latency"] == 1500.0
    assert row["end of turn"] == 750.0 and row["STT final"] == 750.0 and row["VAD stop"] == 300.0
    assert row["LLM first token"] == 380.0 and row["first token -> TTS first audio"] == 350.0
    assert row["first audio -> client"] == 50.0
