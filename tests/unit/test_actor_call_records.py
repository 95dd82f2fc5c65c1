"""Call records: what a record holds (never tool arguments), storage, and `brisvox calls`."""

from __future__ import annotations

import orjson

from brisvox.agent.host.call_record import read_records, write_record
from brisvox.cli.brisvox import main as cli
from brisvox.sim.harness import simulate
from brisvox.sim.scenarios import s08
from brisvox.sim.vloop import run_virtual


def test_record_has_the_conversation_tools_and_latencies_but_no_arguments(tmp_path, capsys):
    call, _ = s08()
    res = run_virtual(lambda: simulate(call))
    rec = res.record
    assert rec["call_id"] == "sim1" and rec["transport_ids"] == {"sim": "sim1"}
    roles = [m["role"] for m in rec["conversation"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert rec["conversation"][2]["tool_calls"] == [{"id": "t1.0", "name": "get_weather"}]
    assert rec["tools"][0]["name"] == "get_weather" and rec["tools"][0]["duration_ms"] > 0
    blob = orjson.dumps(rec, option=orjson.OPT_NON_STR_KEYS)
    assert b"Paris\"}" not in blob.split(b'"conversation"')[0]  # no arguments outside the tool result
    assert b'"arguments"' not in blob
    t = rec["turns"][0]
    assert t["rounds"] == 2 and t["response_ms"] is not None
    assert rec["stats"]["turn"]["turns"] == 1

    d = tmp_path / "calls"
    write_record(rec, d)
    rec2 = dict(rec, call_id="other-call", started="2099-01-01T00:00:00+00:00")
    write_record(rec2, d)
    assert [r["call_id"] for r in read_records(d)] == ["sim1", "other-call"]
    j = tmp_path / "all.jsonl"
    write_record(rec, j)
    write_record(rec2, j)
    assert len(read_records(j)) == 2

    assert cli(["calls", "--path", str(d), "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and "sim1" in out[0] and "tools=1" in out[0]
    assert cli(["calls", "--path", str(d), "show", "sim1", "--conversation"]) == 0
    conv = orjson.loads(capsys.readouterr().out)
    assert conv[-1]["text"] == "It is sunny in Paris today."
    assert cli(["calls", "--path", str(d), "show", "nope"]) == 1
