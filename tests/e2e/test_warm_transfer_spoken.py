"""Warm transfer accepted by voice: the person consulted says "yes" and the local Whisper hears it.

The whole daemon (gateway, a worker with the local Whisper, an agent process) and two SIPp
legs with this test's own RTP (``Media``), as in tests/system/test_warm_transfer_daemon.py,
but the desk agent's STT is ``local_whisper`` (a job on the worker), not a scripted one:

* the caller presses 5; the scripted model answers with ``warm_transfer`` to the person;
* the person's SIPp answers; the person's RTP hears the summary and the prompt, then speaks
  "Yes, put them through." (espeak-ng, mu-law) and nothing else: no RFC 4733 key;
* the consult leg's screen takes the Whisper transcript as the answer (``detail = "speech"``),
  the gateway bridges the legs, and the caller hears the person's next words;
* the person hangs up: the caller is back with the agent (outcome ``bridge_lost``) until it
  hangs up itself.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from bench.harness.daemon import Daemon, agents_config, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.agent.host.consult_screen import answer_of
from brisvox.wire.g711 import ulaw_decode
from tests.system.gateway_harness import free_port, have, make_fixture, rtp_range
from tests.system.test_sip_media import gateway
from tests.system.test_sip_outbound import answered_then_bye
from tests.system.test_sip_outbound import run_callee as run_person
from tests.system.test_warm_transfer_bridge import Media, contains
from tests.system.test_warm_transfer_daemon import (
    REASON,
    agent_file,
    caller_hanging_up,
    new_records,
    quiet_for,
    start_call,
    stop,
    wait,
)

# in the local-models unit (tests/conftest.py): real-time audio into the local Whisper, never beside
# another model run. The agent file's timeout_s is 5 s (the ring); the verdict may come later on a
# loaded host: the caller's side waits the consult screen's longest run after the answer
pytestmark = [pytest.mark.system, pytest.mark.e2e, pytest.mark.timeout(150),
              pytest.mark.skipif(not (have("sipp") and have("espeak-ng") and have("sox")),
                                 reason="needs sipp, espeak-ng and sox")]

SCRIPTED_STT = 'provider = "scripted_stt"\n[stt.options]\ntext = "hello"\n'


def _whisper_ok() -> bool:
    try:
        from workers import models

        d = models.default_models_dir()
        return all((d / models.CATALOGUE[n].filename).is_file() for n in ("silero_vad", "whisper_tiny_en"))
    except Exception:  # noqa: BLE001 - any failure means "not installed"
        return False


def spoken(tmp: Path, text: str) -> bytes:
    """``text`` said by espeak-ng as 8 kHz mu-law, whole 20 ms packets, 0.6 s of silence after."""
    wav, ulaw = tmp / "yes.wav", tmp / "yes.ulaw"
    subprocess.run(["espeak-ng", "-s", "150", "-w", str(wav), text], check=True, capture_output=True)
    subprocess.run(["sox", str(wav), "-r", "8000", "-c", "1", "-t", "raw", "-e", "mu-law", str(ulaw)],
                   check=True, capture_output=True)
    data = ulaw.read_bytes()
    return data[: len(data) // 160 * 160] + b"\xff" * 160 * 30


@pytest.fixture
def desk(short_tmp: Path):  # type: ignore[no-untyped-def]
    if not _whisper_ok():
        pytest.skip("local models are not installed (brisvox models install)")
    port = free_port()
    text = agent_file({"5": f"sip:person@127.0.0.1:{port}"})
    assert SCRIPTED_STT in text
    agents = short_tmp / "agents"
    agents.mkdir()
    (agents / "desk.toml").write_text(text.replace(SCRIPTED_STT, 'provider = "local_whisper"\n'))
    lo, hi = rtp_range(20)
    extra = agents_config(agents, short_tmp / "records", default_agent="desk",
                          sip=f"port = 0\nrtp_port_min = {lo}\nrtp_port_max = {hi}")
    # the person's "yes" is transcribed by the worker's job lane: at its shipped nice 10 beside the
    # other test workers it could miss the bridge's 7 s (a loaded host: once in four runs)
    extra += "\n[workers]\njob_nice = 0\n"
    d = Daemon(short_tmp, config=write_config(short_tmp, workers=1, agents=1, extra=extra), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(120)
        sip = int(d.child(snap, "gateway-0")["endpoints"]["sip"].rsplit(":", 1)[1])
        yield d, short_tmp, sip, port
    finally:
        d.close()


def test_the_person_says_yes_and_the_legs_are_bridged(desk):  # type: ignore[no-untyped-def]
    d, tmp, sip, port = desk
    yes = spoken(tmp, "Yes, put them through.")
    speech = make_fixture(tmp)["ulaw"].read_bytes()[: 160 * 100]  # 2 s the person says once bridged
    before = {r["call_id"] for r in read_records(tmp / "records")}
    caller_media, person_media = Media(0xFF), Media(0xFF)
    person = run_person(tmp, answered_then_bye(person_media.port, 24000), port, timeout=60)
    caller = None
    try:
        caller = start_call(tmp, sip, caller_hanging_up(caller_media.port, 44000), caller_media)
        caller_media.dtmf("5")
        wait(lambda: quiet_for(person_media, 1.2), 20, "the summary and the prompt to the person")
        person_media.payload = yes
        person_media.play.set()

        def bridged() -> bool:
            calls = gateway(d, "calls")
            return sum(1 for c in calls.values() if isinstance(c, dict) and c.get("bridged_with")) == 2
        try:  # the local Whisper's final of the "yes", then the verdict and the bridge (a loaded host: seconds)
            wait(bridged, 12, "the bridge after the spoken yes")
        except AssertionError:
            print(gateway(d, "calls"), d.logs()[-6000:])
            raise
        # the person's words once bridged: appended to what it plays (its sender goes on from where it is)
        person_media.played.clear()
        person_media.payload = yes + speech
        assert person_media.played.wait(12)
        time.sleep(0.3)  # the last packets through the bridge
        assert contains(ulaw_decode(bytes(caller_media.got)), ulaw_decode(speech)), "person -> caller not bit-exact"

        out, err = person.communicate(timeout=30)  # its BYE: the caller is back with the agent
        assert person.returncode == 0, (out[-2000:], err[-2000:])
        out, err = caller.communicate(timeout=40)  # the caller's own BYE
        assert caller.returncode == 0, (out[-2000:], err[-2000:])
        d.wait_for(lambda s: len(new_records(tmp, before)) >= 2, 20, "both call records")
        recs = new_records(tmp, before)
        mine = next(r for r in recs if r.get("warm_transfer"))
        leg = next(r for r in recs if r.get("consult"))
        assert mine["warm_transfer"]["outcome"] == "bridge_lost", mine["warm_transfer"]
        assert leg["consult"]["verdict"] == "accepted" and leg["consult"]["detail"] == "speech", leg["consult"]
        said = [m["text"] for m in leg["conversation"] if m["role"] == "assistant" and m.get("text")]
        heard = [m["content"] for m in leg["conversation"] if m["role"] == "user" and m.get("content")]
        assert REASON in said[0], said
        assert any(answer_of(h) is True for h in heard), heard  # Whisper heard an accept (e.g. "Yeah. Put them through.")
        print("spoken yes:", heard, leg["consult"])
    finally:
        stop(person, *([caller] if caller else []))
        caller_media.close()
        person_media.close()
