"""Keypad input through the whole daemon: digits pressed on every transport become the
agent's user turn.

brisvoxd runs one gateway, one inference worker and one agent process serving an agent
file (``[agents] providers = "definitions"``) made of the scripted stand-ins (no model,
no key): its LLM rule answers the keypad turn's text form, ``[dtmf]`` as the agent file
sets it. Each call, from the client transports of ``brisvox.client`` (the code ``brisvox
call`` runs), listens to silence, presses three keys and ``#``, waits for the answer and
hangs up: over native WebSocket (``dtmf`` messages), Twilio Media Streams (``dtmf``
events), SIP with RFC 4733 telephone-events, SIP INFO ``application/dtmf-relay`` and SIP
INFO ``application/dtmf``. Checks, per call, from the call record written at hang-up:
the only user turn is the entry in the text form, the agent's rule answered it whole,
and the turn driver counted the keys and one entry ended by the terminator.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest

from bench.harness.daemon import Daemon, agents_config, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.client.native import NativeTransport
from brisvox.client.sip import SipTransport
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport

pytestmark = pytest.mark.system

AGENT = """name = "keypad"
system_prompt = "Scripted keypad agent (no language model)."

[stt]
provider = "scripted_stt"

[llm]
provider = "scripted"
[llm.options]
fallback = "Please use the keypad."
first_token_ms = 100
[[llm.options.rules]]
match = "^\\\\[keypad\\\\] (?P<digits>[0-9*#A-D]+)$"
steps = [{ reply = "You entered {digits}." }]

[tts]
provider = "scripted_tts"
[tts.options]
answer_ms = 400

[dtmf]
inter_digit_timeout = 3.0
terminator = "#"
text = "[keypad] {digits}"
"""

# (transport, digits): distinct digits per call, so each record is found by its turn
CALLS = [("native", "123"), ("twilio", "456"), ("sip", "789"), ("sip_info_relay", "0*1"), ("sip_info_dtmf", "2A3")]


@pytest.fixture(scope="module")
def daemon():
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="bvk", dir="/tmp"))  # short: the daemon's socket paths
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "keypad.toml").write_text(AGENT)
    extra = agents_config(agents, tmp / "records", default_agent="keypad",
                          sip="port = 0\nrtp_port_min = 47200\nrtp_port_max = 47300")
    d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)
    try:
        d.start()
        snap = d.wait_ready(90)
        eps = d.child(snap, "gateway-0")["endpoints"]
        yield d, tmp, int(eps["websocket"].rsplit(":", 1)[1]), int(eps["sip"].rsplit(":", 1)[1])
    finally:
        d.close()
        shutil.rmtree(tmp, ignore_errors=True)


def transport(kind: str, ws: int, sip: int):  # noqa: ANN201
    if kind == "native":
        return NativeTransport(f"ws://127.0.0.1:{ws}/ws", rate=8000)
    if kind == "twilio":
        return TwilioTransport(f"ws://127.0.0.1:{ws}/twilio")
    info = {"sip": "", "sip_info_relay": "dtmf-relay", "sip_info_dtmf": "dtmf"}[kind]
    return SipTransport(f"sip:keypad@127.0.0.1:{sip}", dtmf_info=info)


async def keypad_call(t, digits: str) -> tuple[float, float]:  # noqa: ANN001
    """Silence, the keys and #, silence until the answer played out; -> (seconds of bot
    audio heard after the keys, seconds the call lasted)."""
    heard: list[float] = []
    pressed = [0.0]

    def on_audio(pcm: np.ndarray, now: float) -> None:
        if pressed[0] and now > pressed[0] and np.count_nonzero(np.abs(pcm.astype(np.int32)) > 300) > len(pcm) // 4:
            heard.append(len(pcm) / t.rate)

    await t.open(BotEvents(on_audio=on_audio))
    frame = np.zeros(t.rate // 50, np.int16)
    t0 = time.monotonic()
    n = 0
    try:
        while n * 0.02 < 5.0:
            if n == 40:  # 0.8 s in
                pressed[0] = time.monotonic()
                await t.send_dtmf(digits + "#")
            await t.send_audio(frame)
            n += 1
            await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
    finally:
        await t.close()
    return sum(heard), time.monotonic() - t0


@pytest.mark.parametrize(("kind", "digits"), CALLS, ids=[c[0] for c in CALLS])
def test_keys_pressed_over_each_transport_are_the_agents_user_turn(daemon, kind, digits):
    d, tmp, ws, sip = daemon
    t = transport(kind, ws, sip)
    audio, _ = asyncio.run(keypad_call(t, digits))
    want = f"[keypad] {digits}"

    def mine() -> list[dict]:
        return [r for r in read_records(tmp / "records")
                if any(m.get("content") == want for m in r["conversation"] if m["role"] == "user")]

    d.wait_for(lambda s: bool(mine()), 20, f"the call record of the {kind} call")
    rec = mine()[0]
    users = [m["content"] for m in rec["conversation"] if m["role"] == "user"]
    answers = [m["text"] for m in rec["conversation"] if m["role"] == "assistant"]
    assert users == [want]
    assert answers == [f"You entered {digits}."]
    turn = rec["stats"]["turn"]
    assert turn["dtmf"] == len(digits) + 1 and turn["keypad_entries"] == 1 and turn["keypad_by_terminator"] == 1
    assert rec["stats"]["pump"]["dtmf_refused"] == 0
    assert audio > 0.2, f"the answer's audio did not reach the caller ({audio:.2f} s)"
    if kind.startswith("sip_info"):
        assert t.counters["info_sent"] == t.counters["info_ok"] == len(digits) + 1
    elif kind == "sip":
        assert t.counters["dtmf_packets"] >= 5 * (len(digits) + 1)  # RFC 4733: per key, duration updates + 3 ends
