"""The whole daemon (gateway, workers, agent process) serving simultaneous WebSocket calls
with scripted providers, each call with a barge-in.

Each client speaks a real recorded question (so the real Silero VAD in the
worker hears it), waits for the bot's long answer, talks over it, and later
hangs up. Checks, per call, from outside the daemon:

* the call record's conversation: the interrupted answer is cut to exactly the
  words whose audio the client received before the clear (+-1 frame), and
  the second answer is whole;
* no stale audio after the clear: nothing of the cut answer arrives after the
  client got the clear (every frame after it until the second answer starts
  is silence);
* every record has one interrupt and both user turns;
* with Smart Turn, the gateway's ``max_calls = "auto"`` is the limit for the Smart Turn
  time the worker measured at boot (its Topology row's ``measured``);
* ``/metrics`` has the turn-latency histogram with every call's turns, the
  barge-in histogram and the calls by end reason (summed over the agent processes).

Run twice: 20 calls with the fixed end-of-turn silence, and 4 calls with
Smart Turn on (the turn ends come from the worker's job lane).
The word boundaries the client judges by come from the scripted TTS's
deterministic word durations (``brisvox.providers.word_codec.word_seconds``).
"""

from __future__ import annotations

import asyncio
import os

import orjson
import pytest
import soundfile as sf

from bench.harness.call_daemon import SPEECH, config
from bench.harness.daemon import Daemon, ws_port
from brisvox.agent.host.call_record import read_records
from brisvox.sim.ws_caller import ANSWER, RATE, SECOND, judge, one_call
from tests.system.daemon_promparse import parse, value

pytestmark = pytest.mark.system


@pytest.mark.parametrize(
    ("n_calls", "smart_turn"), [(int(os.environ.get("BRISVOX_TEST_CALLS", "20")), False), (4, True)]
)
def test_simultaneous_calls_with_barge_in_context_equals_what_each_client_heard(short_tmp, n_calls, smart_turn):
    """With Smart Turn on, the turn ends come from the worker's job lane (verdicts)."""
    speech, rate = sf.read(SPEECH, dtype="int16")
    assert rate == RATE
    script = short_tmp / "script.json"
    script.write_bytes(orjson.dumps({"user": ["what time do you close", "wait a moment"], "bot": [ANSWER, SECOND]}))
    d = Daemon(short_tmp, config=config(short_tmp, script, smart_turn), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(60)
        gw = d.child(snap, "gateway-0")
        port = ws_port(gw)

        async def all_calls():
            async def staggered(i: int):
                await asyncio.sleep(i * 0.05)
                return await one_call(port, speech, seed=i)

            return await asyncio.gather(*(staggered(i) for i in range(n_calls)))

        results = asyncio.run(all_calls())
        want = {r["call_id"] for r in results}
        d.wait_for(lambda s: len({r["call_id"] for r in read_records(short_tmp / "records")} & want) == n_calls,
                   30, "every call record")
        records = {r["call_id"]: r for r in read_records(short_tmp / "records")}
        failures = {}
        for res in results:
            bad = judge(res, records[res["call_id"]])
            if bad:
                failures[res["call_id"]] = bad
        assert not failures, failures
        check_call_metrics(d, n_calls)
        if smart_turn:
            assert all(r["stats"]["turn"]["analyses"] >= 2 for r in records.values() if r["call_id"] in want)
            assert sum(r["stats"]["turn"]["analyses_failed"] for r in records.values() if r["call_id"] in want) == 0
            check_auto_call_limit(d)
    finally:
        d.close()


def check_auto_call_limit(d: Daemon) -> None:
    """``max_calls = "auto"``: the gateway's limit follows the Smart Turn time the worker measured at boot."""
    from brisvox.gateway.config import GatewayConfig

    def limit_known(snap: dict) -> bool:
        st = d.child(snap, "gateway-0").get("stats") or {}
        return "max_calls" in st and bool(d.child(snap, "worker-0").get("measured"))

    snap = d.wait_for(limit_known, 10, "the gateway's call limit and the worker's boot figure")
    ms = d.child(snap, "worker-0")["measured"]["smart_turn_ms"]
    assert 0 < ms < 1000
    want = GatewayConfig().call_limit(ms)
    d.wait_for(lambda s: d.child(s, "gateway-0")["stats"]["max_calls"] == want, 10, f"max_calls {want} for {ms} ms")


def check_call_metrics(d: Daemon, n_calls: int) -> None:
    """The agents report their telemetry with their pongs: /metrics catches up within a second."""
    fams: dict = {}

    def scraped(_snap: dict) -> bool:
        nonlocal fams
        status, text = d.metrics_text()
        fams = parse(text) if status == 200 else {}
        return bool(fams) and sum(v for (n, _), v in fams["brisvox_calls_ended_total"]["samples"].items()) >= n_calls

    d.wait_for(scraped, 15, "the ended calls on /metrics")
    assert fams["brisvox_turn_latency_seconds"]["type"] == "histogram"
    turns = value(fams, "brisvox_turn_latency_seconds_count")
    assert turns >= 2 * n_calls  # both user turns of every call were answered
    assert value(fams, "brisvox_turn_latency_seconds_bucket", le="+Inf") == turns
    assert 0 < value(fams, "brisvox_turn_latency_seconds_sum") < 10 * turns
    assert value(fams, "brisvox_llm_first_token_seconds_count") >= 2 * n_calls
    assert value(fams, "brisvox_barge_in_stop_seconds_count") >= 1  # every call talked over the bot
