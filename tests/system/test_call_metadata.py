"""Call metadata from each transport to the agent process, against the real gateway process:
the ``CallStart`` a fake agent receives carries the caller, the called number, the transport
ids and the parameters, from the repo's client transports (``brisvox.client``):

* native WebSocket: ``start.params`` (``caller``/``called`` name the numbers); an oversized
  and a malformed parameter are dropped and counted (``call_params_dropped``), the call goes
  on; with a signed token its parameters (and so its numbers) win over the client's;
* Twilio Media Streams: ``customParameters`` with the ``From``/``To`` TwiML passes, and
  ``streamSid``/``callSid``/``accountSid`` as the transport ids;
* SIP: the From and To users (the client's ``from_user``), both URIs as ``from``/``to``,
  the Call-ID.
"""

from __future__ import annotations

import asyncio

import pytest

from brisvox.client.native import NativeTransport
from brisvox.client.sip import SipTransport
from brisvox.client.transport import BotEvents
from brisvox.client.twilio import TwilioTransport
from brisvox.gateway.ws.auth import mint_token
from ipc import frames as F
from tests.system.gateway_harness import FakeAgent, GatewayProc

pytestmark = pytest.mark.system

SECRET = "s3cret-for-tests"


async def start_of(agent: FakeAgent, t, seen: set[str]) -> F.CallStart:  # noqa: ANN001
    """Open the call, take its CallStart (one not seen yet), hang up."""
    await t.open(BotEvents())
    try:
        return await asyncio.to_thread(agent.wait_for, F.CallStart, lambda f: f.call_id not in seen, 10.0)
    finally:
        await t.close()


def test_each_transport_brings_the_numbers_ids_and_parameters_to_call_start(short_tmp):
    with FakeAgent(short_tmp) as agent, GatewayProc(short_tmp, inbox=True, peers={"agent-0": agent.endpoint},
                                                     websocket={"native_secret": SECRET}) as gw:
        seen: set[str] = set()

        def call(t) -> F.CallStart:  # noqa: ANN001
            start = asyncio.run(start_of(agent, t, seen))
            seen.add(start.call_id)
            return start

        ws = f"ws://127.0.0.1:{gw.ws_port}"
        # native, the static secret: the start message's parameters, a bad one dropped
        start = call(NativeTransport(f"{ws}/ws", rate=16000, token=SECRET, params={
            "caller": "+15550100", "called": "sales", "tier": "gold", "n": 5,  # type: ignore[dict-item]
            "long": "v" * 300, "x" * 65: "name too long"}))
        assert (start.transport, start.caller, start.called) == ("native", "+15550100", "sales")
        assert start.params == {"caller": "+15550100", "called": "sales", "tier": "gold", "n": "5"}
        assert gw.stats()["call_params_dropped"] == 2
        # native, a signed token: its parameters, not the client's
        token = mint_token(SECRET, "default", 60, {"caller": "+15550111", "tier": "silver"})
        start = call(NativeTransport(f"{ws}/ws", rate=16000, token=token, params={"caller": "+1999", "to": "x"}))
        assert (start.caller, start.called) == ("+15550111", "")
        assert start.params == {"caller": "+15550111", "tier": "silver"}
        # Twilio: customParameters, From/To as TwiML's <Parameter> passes them, the sids
        tw = TwilioTransport(f"{ws}/twilio", {"From": "+15550122", "To": "+15550199", "customer": "42"})
        start = call(tw)
        assert (start.transport, start.caller, start.called) == ("twilio", "+15550122", "+15550199")
        assert start.params == {"From": "+15550122", "To": "+15550199", "customer": "42"}
        assert start.transport_ids == {"streamSid": tw.stream.stream_sid, "callSid": tw.stream.call_sid,
                                       "accountSid": tw.stream.account_sid}
        # SIP: the From and To users, both URIs, the Call-ID
        sip = SipTransport(f"sip:default@127.0.0.1:{gw.sip_port}", from_user="+15550133")
        start = call(sip)
        assert (start.transport, start.caller, start.called) == ("sip", "+15550133", "default")
        assert start.params == {"from": "sip:+15550133@127.0.0.1", "to": sip.request_uri}
        assert start.transport_ids == {"sip_call_id": sip.sip_call_id}
        assert gw.stats()["call_params_dropped"] == 2  # nothing more was dropped
