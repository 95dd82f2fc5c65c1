"""The gateway's transport seam: the dispatch table, the registry, the CallHost protocol, the leg base.

* the core's frame table handles exactly ``received_by("gateway")``; a frame
  without a handler, a late reply and a frame of an unknown call are each
  counted the way they were before the table;
* the transport registry drives config validation (a route's protocol) and
  names, for every transport, either each capability or why it lacks it;
* ``GatewayCore`` satisfies ``CallHost`` (checked by mypy too: the
  transports are typed against the protocol), and ``audio_in`` is the one
  writer of the ``in`` ring and its counters (audio after the transport
  ended is dropped, still counted as a packet);
* the leg base class refuses the optional capabilities by default.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import GatewaySettings, WebSocketConfig
from brisvox.gateway.core.host import CallHost
from brisvox.gateway.core.leg import TransportLeg
from brisvox.gateway.transports import (
    CAPABILITIES,
    LISTENERS,
    TRANSPORTS,
    assemble,
    websocket_protocols,
)
from ipc import frames as F
from ipc.codec import received_by


@pytest.fixture
def core():
    c = assemble(GatewaySettings(), instance=f"seam{os.getpid()}")
    yield c
    for call in list(c.table.calls.values()):
        c.table.release(call)
    c.links.close()
    c.ctx.term()


def test_the_gateway_table_handles_exactly_the_frames_the_gateway_receives(core):
    assert set(core.router.handlers) == received_by("gateway")
    assert F.WorkerTick not in core.router.handlers  # a worker's ticks go to subscribers, never to the gateway


def test_frames_without_a_handler_late_replies_and_unknown_calls_are_counted(core):
    core._on_frame(F.Ping(seq=1, sent_ns=0), "agent-0", None)
    core._on_frame(F.CallAccepted(call_id=""), "agent-0", None)
    core._on_frame(F.Clear(call_id="gone", epoch=1, sent_ns=0), "agent-0", None)
    core._on_frame(F.Mark(call_id="gone", name="m", position=0), "agent-0", None)
    core._on_frame(F.OutUtterance(call_id="gone", utterance=1, epoch=1, out_pos=0), "worker-0", None)
    assert core.metrics.counters["frames_unexpected_ping"] == 1
    assert core.links.late_replies == 1
    assert core.metrics.counters["frames_unknown_call"] == 2  # not the OutUtterance


def test_the_command_handler_answers(core):
    got = []
    core.links.reply = lambda peer, f, cid: got.append((peer, f, cid)) or True  # type: ignore[method-assign]
    core._on_frame(F.Command(name="stats"), "cli", 3)
    (peer, reply, cid), = got
    assert peer == "cli" and cid == 3 and reply.ok and reply.data["calls_active"] == 0


def test_the_registry_names_every_transport_its_listener_and_capabilities():
    assert set(TRANSPORTS) == {"twilio", "native", "plivo", "telnyx", "vonage", "exotel", "asterisk_ws", "freeswitch",
                              "sip", "audiosocket"}
    assert set(websocket_protocols()) == {"twilio", "native", "plivo", "telnyx", "vonage", "exotel", "asterisk_ws",
                                          "freeswitch"}
    for t in TRANSPORTS.values():
        assert t.section in LISTENERS
        assert set(t.lacks) <= set(CAPABILITIES)
        assert all(why for why in t.lacks.values())
    assert not TRANSPORTS["sip"].offers("marks_echo") and TRANSPORTS["native"].offers("marks_echo")
    assert TRANSPORTS["audiosocket"].session is None and LISTENERS["audiosocket"] is not None


def test_config_validation_takes_route_protocols_from_the_registry():
    cfg = WebSocketConfig.from_section({"routes": [{"path": "/n", "protocol": "native"}]})
    assert cfg.route("/n").protocol == "native"
    with pytest.raises(ConfigError, match="twilio, native"):
        WebSocketConfig.from_section({"routes": [{"path": "/s", "protocol": "sip"}]})


def test_audio_in_owns_the_in_ring_and_its_counters(core):
    host: CallHost = core  # the core is the transports' host
    call = host.admit("native", "echo", 16000)
    pcm = np.arange(320, dtype=np.int16)
    host.audio_in(call, pcm, 16000, 640)
    host.audio_in(call, pcm[:160], 16000, -1, gap=40)
    host.packet_in(call, 12)
    assert call.in_ring.write_pos == 320 + 40 + 160
    st = call.stats
    assert (st.packets_in, st.bytes_in, st.samples_in) == (2, 652, 520)
    host.audio_in(call, pcm, 8000, 640)  # not the call's rate: dropped, counted
    assert call.in_ring.write_pos == 520 and core.metrics.counters["audio_in_wrong_rate"] == 1
    host.transport_ended(call, "bye")
    host.audio_in(call, pcm, 16000, 640)
    assert call.in_ring.write_pos == 520 and st.packets_in == 4


def test_abandon_releases_a_call_whose_agent_side_never_started(core):
    call = core.admit("sip", "echo", 8000)
    core.transport_ended(call, "no rtp port")
    assert core.table.get(call.call_id) is call  # the start task would finish it; there is none
    core.abandon(call)
    assert core.table.get(call.call_id) is None and core.table.released == 1


def test_the_leg_base_refuses_optional_capabilities():
    class Leg(TransportLeg):
        transport = "x"

    leg = Leg()
    got: list[tuple[bool, str]] = []
    leg.transfer("sip:x@y", lambda ok, why: got.append((ok, why)))
    assert got == [(False, "a x call cannot be transferred")]
    assert leg.send_dtmf("12") == 2 and leg.tick_dtmf(0.0) is False and leg.marks_by_echo is False
    with pytest.raises(NotImplementedError):
        leg.send_audio(np.zeros(160, np.int16), 0.0)
