"""Warm transfer through the whole daemon with both legs on Twilio Media Streams: gateway, a
worker, an agent process (scripted providers), and Twilio's loopback stand-in
(:mod:`tests.system.twilio_api_fake`) as the carrier of both legs.

The caller's call comes as Twilio delivers one (the signed webhook POST to the gateway's
TwiML, then the ``<Connect><Stream>`` with its one-time token); the caller presses 5 or 7 (a
``dtmf`` event); the scripted model answers with ``warm_transfer(target, reason)`` to a listed
number, ``[warm_transfer] via = "twilio"``: the consult leg is a REST calls create, and the
stand-in places it as Twilio does once the person answers (webhook, then the stream carrying
the new CallSid). Each stream is this test's :class:`StreamLeg` (paced 20 ms frames, keys,
hang-up), run on the stand-in's threads.

* accepted (5): the person hears the summary and the prompt, presses 1; the gateway bridges
  the legs (``calls``: each ``bridged_with`` the other); speech both ways arrives sample for
  sample (as exact as G.711 allows; below); the person hangs up (their
  stream's ``stop``): the caller's stream stays, and the agent's ``bridge_lost_message`` is on
  its wire within 2 s; the records and ``transfers`` show both legs with their times and
  ``bridge_lost``;
* declined (7): the person presses 2: the caller hears the declined message, and the gateway
  hangs the consult leg up through the REST API (a calls update ``Status=completed`` of its
  CallSid, authorized, which the stand-in recorded) and closes its stream.

Why the comparison is exact and in linear PCM: both legs are mu-law 8 kHz, the gateway keeps
each leg's ``in`` ring as the decoded samples and the bridge writes them to the other leg
unchanged, re-encoded to mu-law. G.711 mu-law decode then encode is the identity on every code
but the two zeros (0x7F, -0, is encoded back as 0xFF, +0), which decode to the same sample:
the decoded samples the other side receives are the decoded samples sent, with no tolerance.
The one loss the gateway allows itself is documented and counted: a relay more than
``RELAY_BACKLOG`` frames behind (a late tick on a loaded machine, a burst from a sender that
stalled) drops whole frames (``bridge_samples_dropped``). So: with nothing counted dropped,
the whole 2 s run must arrive as one contiguous run, sample for sample; with drops counted,
every frame that arrived must be exact and in order, each missing one covered by the count,
and at least 80 % of them must have arrived (:func:`relayed`).
"""

from __future__ import annotations

import asyncio
import queue
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from bench.harness.daemon import Daemon, write_config
from brisvox.agent.host.call_record import read_records
from brisvox.client.transport import BotEvents
from brisvox.wire.g711 import ulaw_decode
from tests.system.gateway_harness import free_port, have, make_fixture
from tests.system.test_sip_media import agent_file as scripted_agent
from tests.system.test_sip_media import gateway
from tests.system.test_warm_transfer_bridge import contains, relayed
from tests.system.twilio_api_fake import FakeTwilioApi, PlacedCall

pytestmark = [pytest.mark.system, pytest.mark.timeout(120),
              pytest.mark.skipif(not (have("espeak-ng") and have("sox")), reason="needs espeak-ng and sox")]

TIMEOUT_S = 10  # [warm_transfer] timeout_s: the dial to the verdict (Twilio rings for what is left)
ANSWER_MS = 600  # every scripted utterance: this much tone
REASON = "a refund for order 12"
DECLINED = "They cannot take it, I am back."
LOST = "The line to my colleague dropped, I am back."
DESK, CALLER = "+4930555000", "+4930222111"  # the number called, the caller's
ACCEPTS, DECLINES = "+4930111005", "+4930111007"  # the person's number, per keypad digit
FROM = "+4930999000"  # [websocket] twilio_from: the consult legs' caller id
LIMIT_S = 40.0  # a stream leg's longest life (the test hangs each up well before)


def agent_file() -> str:
    """The scripted desk (each utterance ``ANSWER_MS`` of tone): keypad 5 warm-transfers to
    ``ACCEPTS``, 7 to ``DECLINES``, via Twilio; it is also the consult legs' agent."""
    rules = "".join(f"""
[[llm.options.rules]]
match = "^\\\\[keypad\\\\] {digit}$"
steps = [
  {{ reply = "One moment.", tools = [{{ name = "warm_transfer", arguments = {{ target = "{to}", reason = "{REASON}" }} }}] }},
  {{ reply = "Anything else?" }},
]
""" for digit, to in (("5", ACCEPTS), ("7", DECLINES)))
    top = (f'tools = ["warm_transfer"]\ntransfer_targets = ["{ACCEPTS}", "{DECLINES}"]\n'
           "confirm_transfer = false\n")
    base = scripted_agent("desk", "Hello.", ANSWER_MS)
    return base.replace('greeting = "Hello."\n', 'greeting = "Hello."\n' + top) + rules + f"""
[warm_transfer]
via = "twilio"
timeout_s = {TIMEOUT_S}
declined_message = "{DECLINED}"
bridge_lost_message = "{LOST}"

[dtmf]
text = "[keypad] {{digits}}"
"""


class StreamLeg:
    """The test's side of one Twilio Media Stream (the caller's or the person's), run on the
    stand-in's thread: a paced 20 ms frame each tick (silence, or :attr:`payload` once
    :attr:`play` is set, :attr:`played` when all of it went), the digits put in :attr:`keys`
    as ``dtmf`` events, the hang-up (the stream's ``stop``, then the close) once
    :attr:`hang_up` is set. What the gateway sends is kept decoded with its arrival time
    (:attr:`heard`); the gateway's end of the stream sets :attr:`ended`."""

    def __init__(self) -> None:
        self.heard: list[tuple[float, np.ndarray]] = []
        self.payload = np.zeros(0, np.int16)
        self.play, self.played = threading.Event(), threading.Event()
        self.keys: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.hang_up, self.opened, self.ended, self.closed = (threading.Event() for _ in range(4))
        self.end = ""
        self.sid = ""
        self._lock = threading.Lock()

    def audio(self) -> list[tuple[float, np.ndarray]]:
        with self._lock:
            return list(self.heard)

    def frames(self) -> list[np.ndarray]:
        """What the gateway sent, one media message (20 ms) each."""
        return [p for _, p in self.audio()]

    def pcm(self) -> np.ndarray:
        got = self.frames()
        return np.concatenate(got) if got else np.zeros(0, np.int16)

    async def run(self, call: PlacedCall, t: Any) -> None:
        self.sid = call.sid

        def on_audio(pcm: np.ndarray, now: float) -> None:
            with self._lock:
                self.heard.append((now, pcm.copy()))

        def on_end(reason: str, now: float) -> None:
            self.end = reason
            self.ended.set()

        await t.open(BotEvents(on_audio=on_audio, on_end=on_end))
        self.opened.set()
        silence = np.zeros(160, np.int16)
        t0, n, i = time.monotonic(), 0, 0
        try:
            while not self.hang_up.is_set() and not self.ended.is_set() and n * 0.02 < LIMIT_S:
                while not self.keys.empty():
                    await t.send_dtmf(self.keys.get())
                frame = silence
                if self.play.is_set() and i + 160 <= len(self.payload):
                    frame, i = self.payload[i:i + 160], i + 160
                    if i + 160 > len(self.payload):
                        self.played.set()
                await t.send_audio(frame)
                n += 1
                await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
        finally:
            await t.close()
            self.closed.set()


def bot_audio(pcm: np.ndarray) -> bool:
    """A frame that is not silence (the gateway's fill and the legs' silence decode to 0)."""
    return bool(np.any(pcm != 0))


def first_audio_after(leg: StreamLeg, t: float) -> float | None:
    return next((at for at, p in leg.audio() if at >= t and bot_audio(p)), None)


def quiet_for(leg: StreamLeg, s: float) -> bool:
    """Audio was heard, and none for the last ``s`` seconds."""
    heard = [at for at, p in leg.audio() if bot_audio(p)]
    return bool(heard) and time.monotonic() - heard[-1] >= s


def wait(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


Desk = tuple[Daemon, Path, FakeTwilioApi, int]


@pytest.fixture(scope="module")
def desk() -> Iterator[Desk]:
    tmp = Path(tempfile.mkdtemp(prefix="bvwtt", dir="/tmp"))
    ws = free_port(socket.SOCK_STREAM)
    agents = tmp / "agents"
    agents.mkdir()
    (agents / "desk.toml").write_text(agent_file())
    with FakeTwilioApi() as api:
        api.place_calls, api.place_seconds = True, LIMIT_S
        tw = api.config()
        extra = f"""
[gateway]
echo_use_workers = false
max_calls_per_source = 100000

[websocket]
port = {ws}
trust_loopback = true
public_url = "ws://127.0.0.1:{ws}"
twiml_path = "/twiml"
twilio_from = "{FROM}"
twilio_account_sid = "{tw['twilio_account_sid']}"
twilio_auth_token = "{tw['twilio_auth_token']}"
twilio_api_base = "{tw['twilio_api_base']}"
[[websocket.routes]]
path = "/twilio"
protocol = "twilio"
agent = "desk"

[sip]
enabled = false

[smart_turn]
enabled = false

[agents]
providers = "definitions"
default_agent = "desk"
agents_dir = "{agents}"
smart_turn = false

[calls]
path = "{tmp / 'records'}"
"""
        d = Daemon(tmp, config=write_config(tmp, workers=1, agents=1, extra=extra), real_roles=True)
        try:
            d.start()
            d.wait_ready(90)
            yield d, tmp, api, ws
        finally:
            d.close()
            shutil.rmtree(tmp, ignore_errors=True)


def legs(api: FakeTwilioApi) -> dict[str, StreamLeg]:
    """A fresh :class:`StreamLeg` per number: the caller's (to ``DESK``) and each person's; the
    stand-in runs the one its call is to."""
    by_to = {DESK: StreamLeg(), ACCEPTS: StreamLeg(), DECLINES: StreamLeg()}

    async def script(call: PlacedCall, form: dict[str, str], t: Any) -> None:
        await by_to[form["To"]].run(call, t)

    api.script = script
    return by_to


def call_in(desk: Desk, caller: StreamLeg) -> None:
    """The caller calls the desk as Twilio delivers a call (webhook, then stream); returns once
    the greeting was heard and is over."""
    _, _, api, ws = desk
    api.place("CA" + secrets.token_hex(16), {"To": DESK, "From": CALLER, "Url": f"http://127.0.0.1:{ws}/twiml"},
              direction="inbound")
    assert caller.opened.wait(10), f"the caller's stream did not open: {list(api.placed.values())[-1]}"
    wait(lambda: quiet_for(caller, 0.4), 10, "the greeting")


def new_records(tmp: Path, before: set[str]) -> list[dict[str, Any]]:
    return [r for r in read_records(tmp / "records") if r["call_id"] not in before]


def hang_up_all(by_to: dict[str, StreamLeg]) -> None:
    for leg in by_to.values():
        leg.hang_up.set()
    for leg in by_to.values():
        if leg.opened.is_set():
            leg.closed.wait(5)


def tool_result(rec: dict[str, Any]) -> dict[str, Any]:
    """The warm_transfer tool's result in the caller's conversation (what the model was told)."""
    return dict(orjson.loads(next(m for m in rec["conversation"] if m["role"] == "tool")["content"]))


def test_accepted_twilio_legs_are_bridged_exactly_and_the_persons_hang_up_brings_the_caller_back(desk):
    d, tmp, api, _ = desk
    speech = ulaw_decode(make_fixture(tmp)["ulaw"].read_bytes()[: 160 * 100])  # 2 s of speech, as decoded
    before = {r["call_id"] for r in read_records(tmp / "records")}
    creates = len(api.creates())
    by_to = legs(api)
    caller, person = by_to[DESK], by_to[ACCEPTS]
    try:
        call_in(desk, caller)
        caller.keys.put("5")
        assert person.opened.wait(TIMEOUT_S), f"the consult leg was not placed: {api.creates()[-1:]}"
        wait(lambda: quiet_for(person, 1.2), 15, "the summary and the prompt to the person")
        person.keys.put("1")

        def bridged() -> list[dict[str, Any]]:
            return [c for c in gateway(d, "calls").values() if isinstance(c, dict) and c.get("bridged_with")]
        wait(lambda: len(bridged()) == 2, 10, "the bridge")
        pair = {c["ids"]["callSid"]: c for c in bridged()}
        assert set(pair) == {caller.sid, person.sid}, pair
        assert pair[person.sid]["consult_for"] and pair[caller.sid]["transport"] == "twilio", pair

        dropped_before = gateway(d, "stats").get("bridge_samples_dropped", 0)
        caller.payload, person.payload = speech, speech[::-1].copy()
        caller.play.set()
        person.play.set()
        assert caller.played.wait(5) and person.played.wait(5)
        time.sleep(0.3)  # the last frames through the bridge
        dropped = gateway(d, "stats").get("bridge_samples_dropped", 0) - dropped_before
        to_person, to_caller = relayed(person.frames(), speech), relayed(caller.frames(), speech[::-1])
        missing = to_person[1] + to_caller[1]
        if dropped == 0:  # nothing dropped for lag: the whole run, sample for sample, both ways
            assert contains(person.pcm(), speech), ("caller -> person not exact", to_person)
            assert contains(caller.pcm(), speech[::-1]), ("person -> caller not exact", to_caller)
        # else: every frame that came is exact and in order; each missing one is a frame the
        # gateway counted dropped (a relay lagging more than RELAY_BACKLOG frames: a late tick)
        assert missing * 160 <= dropped, (to_person, to_caller, dropped)
        assert all(got >= 0.8 * (got + lost) for got, lost in (to_person, to_caller)), (to_person, to_caller, dropped)

        gone = time.monotonic()
        person.hang_up.set()  # the person hangs up: their stream's stop
        assert person.closed.wait(5)
        wait(lambda: first_audio_after(caller, gone) is not None, 5, "the agent's apology")
        back = first_audio_after(caller, gone)
        assert back is not None and back - gone <= 2.0, back - gone
        assert not caller.ended.is_set(), f"the caller was hung up with the person: {caller.end}"
        (me,) = [c for c in gateway(d, "calls").values() if isinstance(c, dict) and c.get("times", {}).get("bridge_lost")]
        assert me["bridged_with"] == "" and me["ids"]["callSid"] == caller.sid, me
        assert me["times"]["bridged"] <= me["times"]["bridge_lost"], me
        wait(lambda: quiet_for(caller, 0.4), 5, "the end of the apology")
        caller.hang_up.set()
        assert caller.closed.wait(5)

        d.wait_for(lambda s: len(new_records(tmp, before)) >= 2, 20, "both call records")
        recs = new_records(tmp, before)
        mine = next(r for r in recs if r.get("warm_transfer"))
        leg = next(r for r in recs if r.get("consult"))
        assert mine["transport_ids"]["callSid"] == caller.sid and leg["transport_ids"]["callSid"] == person.sid
        wt = mine["warm_transfer"]
        assert wt["outcome"] == "bridge_lost", wt
        caller_leg, consult_leg = wt["legs"]
        assert consult_leg["call_id"] == leg["call_id"] and consult_leg["verdict"] == "accepted", wt
        assert caller_leg["held_ms"] <= consult_leg["dialled_ms"] <= consult_leg["answered_ms"] \
            <= consult_leg["verdict_ms"] <= consult_leg["bridged_ms"] == caller_leg["bridged_ms"] \
            < caller_leg["bridge_lost_ms"], wt
        assert "failed after the bridge" in orjson.dumps(mine["conversation"]).decode()
        said = [m["text"] for m in mine["conversation"] if m["role"] == "assistant" and m.get("text")]
        assert said[-1] == LOST, said  # the apology, the bot's own turn
        assert leg["consult"]["detail"] == "dtmf" and leg["consult"]["verdict"] == "accepted", leg["consult"]
        assert leg["consult"]["consult_for"] == mine["call_id"], leg["consult"]
        opening = [m["text"] for m in leg["conversation"] if m["role"] == "assistant" and m.get("text")]
        assert REASON in opening[0], opening  # the person heard the summary first

        (create,) = api.creates()[creates:]  # the consult leg: one calls create, Twilio's rules
        assert create.authorized and create.fields["To"] == [ACCEPTS] and create.fields["From"] == [FROM], create
        assert 1 <= int(create.fields["Timeout"][0]) <= TIMEOUT_S, create
        assert api.placed[person.sid].webhook_status == 200 and not api.placed[person.sid].error

        d.wait_for(lambda s: bool(gateway(d, "transfers").get("transfers")), 10, "the transfer's history")
        transfer = gateway(d, "transfers")["transfers"][-1]
        assert transfer["caller"] == mine["call_id"] and set(transfer["legs"]) == {mine["call_id"], leg["call_id"]}
        assert transfer["legs"][mine["call_id"]]["times"]["bridge_lost"] >= \
            transfer["legs"][mine["call_id"]]["times"]["bridged"], transfer
        for t in (x["times"] for x in transfer["legs"].values()):
            assert t["admitted"] <= t["answered"] <= t["bridged"] <= t["ended"], transfer
        print("accepted:", wt, leg["consult"])
    finally:
        hang_up_all(by_to)


def test_declined_the_caller_is_back_and_the_consult_leg_is_completed_through_the_rest_api(desk):
    d, tmp, api, _ = desk
    before = {r["call_id"] for r in read_records(tmp / "records")}
    by_to = legs(api)
    caller, person = by_to[DESK], by_to[DECLINES]
    try:
        call_in(desk, caller)
        caller.keys.put("7")
        assert person.opened.wait(TIMEOUT_S), f"the consult leg was not placed: {api.creates()[-1:]}"
        wait(lambda: quiet_for(person, 1.2), 15, "the summary and the prompt to the person")
        pressed = time.monotonic()
        person.keys.put("2")
        wait(lambda: first_audio_after(caller, pressed) is not None, 5, "the agent again")

        def completed() -> list[Any]:
            return [r for r in api.of(person.sid) if r.fields.get("Status") == ["completed"]]
        wait(lambda: bool(completed()), 5, "the REST hang-up of the consult leg")
        assert all(r.authorized for r in completed()), completed()
        assert person.ended.wait(5), "the gateway did not close the consult leg's stream"
        wait(lambda: quiet_for(caller, 0.4), 5, "the declined message")
        assert not caller.ended.is_set(), caller.end
        caller.hang_up.set()
        assert caller.closed.wait(5)

        d.wait_for(lambda s: len(new_records(tmp, before)) >= 2, 20, "both call records")
        recs = new_records(tmp, before)
        mine = next(r for r in recs if r.get("warm_transfer"))
        leg = next(r for r in recs if r.get("consult"))
        wt = mine["warm_transfer"]
        assert wt["outcome"] == "declined" and wt["legs"][1]["call_id"] == leg["call_id"], wt
        heard = tool_result(mine)
        assert heard["status"] == "declined" and heard["caller_heard"][-1] == DECLINED, heard
        assert leg["consult"]["verdict"] == "declined" and leg["consult"]["detail"] == "dtmf", leg["consult"]
        wait(lambda: not [c for c in gateway(d, "calls").values() if isinstance(c, dict)], 5, "both legs released")
        print("declined:", wt, leg["consult"])
    finally:
        hang_up_all(by_to)
