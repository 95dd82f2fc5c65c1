"""The transport registry: one table naming every caller-facing transport.

Owns :data:`TRANSPORTS` (``twilio``, ``native``, ``plivo``, ``telnyx``, ``vonage``, ``exotel``,
``asterisk_ws``, ``freeswitch``, ``sip``, ``audiosocket``: the name a call's
``transport`` field and the ``calls_admitted_<name>`` counter carry, the
config section of the listener that serves it, the session factory a
WebSocket route uses, the handshake check of its routes (``auth``:
:mod:`brisvox.gateway.ws.auth`), and the capabilities it lacks) and :data:`LISTENERS`
(one per config section: the socket server that carries the transports of
that section). Config validation (the protocols a ``[websocket]`` route may
name), the WebSocket server's route -> session choice and the core's
start/stop/stats all iterate over these tables; adding a transport is a row
here plus its module.

Invariants:

* The registry is the top of the gateway: it imports every leg (lazily, in its
  factories) and nothing below imports it. The core receives :data:`LISTENERS` and
  :data:`DIALERS` (:func:`assemble`), the WebSocket server receives :data:`TRANSPORTS`,
  and ``brisvox.gateway.config`` names the WebSocket protocols itself
  (``WEBSOCKET_PROTOCOLS``): this module refuses to load when its rows disagree with it.
* A dial names a ``via`` of :data:`DIALERS`: the listener section that places it and
  the function that does, given that listener and the call host.
* Every capability in :data:`CAPABILITIES` is either offered by a transport
  or named in its ``lacks`` with the reason; the conformance suite
  (``tests/system/test_transport_conformance.py``) runs every offered one
  and reports every lacking one as not applicable, with that reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from brisvox.gateway.config import WEBSOCKET_PROTOCOLS
from brisvox.gateway.core.host import DialAdmitted, DialDone, Dialer, Listener, ListenerFactory
from brisvox.gateway.ws.auth import (
    asterisk_ws_auth,
    exotel_auth,
    freeswitch_auth,
    native_auth,
    plivo_auth,
    telnyx_auth,
    twilio_auth,
    vonage_auth,
)
from brisvox.wire.jsontext import dial_params

if TYPE_CHECKING:
    from brisvox.gateway.config import GatewaySettings, WsRoute
    from brisvox.gateway.core.gateway_core import GatewayCore
    from brisvox.gateway.core.host import CallHost
    from brisvox.gateway.ws.server import AuthCheck, Session, SessionFactory, WsConnection


# what a transport can do; the conformance suite has one case per capability
CAPABILITIES = (
    "clear",  # Clear stops the bot's audio at the peer at once
    "lazy_clear",  # a lazy Clear that finds the new response already playing stops nothing
    "pause",  # Pause holds the audio, Resume continues from the held position
    "marks_release",  # a mark is reported played when the release position passes it
    "marks_echo",  # the peer echoes a mark once it played it
    "dtmf_in",  # the caller's digits reach the agent
    "dtmf_out",  # the agent's digits reach the caller
    "transfer",  # the agent can hand the call over
    "hangup",  # the agent's Hangup ends the call at the peer; the peer's end reaches the agent
    "oversize",  # an oversized message is refused and counted, without touching other calls
    "malformed",  # malformed input is refused and counted, without touching other calls
    "fault_budget",  # a live call drops malformed messages (counted) until its fault budget is exceeded
)




@dataclass(frozen=True, slots=True)
class Transport:
    """One row of the registry (see the module docstring)."""

    name: str
    section: str  # the config section (and endpoint name) of the listener that serves it
    session: SessionFactory | None  # a WebSocket route's session; None: the listener makes its legs
    lacks: Mapping[str, str] = field(default_factory=dict)  # capability -> why this transport has not it
    auth: AuthCheck | None = None  # a WebSocket route's handshake check (brisvox/gateway/ws/auth.py)
    subprotocol: str = ""  # the WebSocket subprotocol a route answers when the peer offers it

    def offers(self, capability: str) -> bool:
        return capability not in self.lacks


def _twilio_session(host: CallHost, conn: WsConnection, route: WsRoute) -> Session:
    from brisvox.gateway.carriers.twilio import TwilioSession

    return TwilioSession(host, conn, route)


def _native_session(host: CallHost, conn: WsConnection, route: WsRoute) -> Session:
    from brisvox.gateway.carriers.native import NativeSession

    return NativeSession(host, conn, route)


def _plivo_session(host: CallHost, conn: WsConnection, route: WsRoute) -> Session:
    from brisvox.gateway.carriers.plivo import PlivoSession

    return PlivoSession(host, conn, route)


def _telnyx_session(host: CallHost, conn: WsConnection, route: WsRoute) -> Session:
    from brisvox.gateway.carriers.telnyx import TelnyxSession

    return TelnyxSession(host, conn, route)


def _vonage_session(host: CallHost, conn: WsConnection, route: WsRoute) -> Session:
    from brisvox.gateway.carriers.vonage import VonageSession

    return VonageSession(host, conn, route)


def _exotel_session(host: CallHost, conn: WsConnection, route: WsRoute) -> Session:
    from brisvox.gateway.carriers.exotel import ExotelSession

    return ExotelSession(host, conn, route)


def _asterisk_ws_session(host: CallHost, conn: WsConnection, route: WsRoute) -> Session:
    from brisvox.gateway.carriers.asterisk_ws import AsteriskWsSession

    return AsteriskWsSession(host, conn, route)


def _freeswitch_session(host: CallHost, conn: WsConnection, route: WsRoute) -> Session:
    from brisvox.gateway.carriers.freeswitch import FreeSwitchSession

    return FreeSwitchSession(host, conn, route)


def _websocket_listener(host: CallHost, cfg: Any) -> Listener:
    from brisvox.gateway.ws.server import WebSocketServer

    return WebSocketServer(host, cfg, TRANSPORTS)


def _sip_listener(host: CallHost, cfg: Any) -> Listener:
    from brisvox.gateway.sip.ua import SipUserAgent

    return SipUserAgent(host, cfg)


def _audiosocket_listener(host: CallHost, cfg: Any) -> Listener:
    from brisvox.gateway.audiosocket.listener import AudioSocketServer

    return AudioSocketServer(host, cfg)


TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        Transport("twilio", "websocket", _twilio_session, auth=twilio_auth, lacks={
            "marks_release": "Twilio echoes every mark: a mark is reported played on its echo",
        }),  # transfer: the REST API's calls update ([websocket] twilio_account_sid; else refused)
        Transport("native", "websocket", _native_session, auth=native_auth),
        Transport("plivo", "websocket", _plivo_session, auth=plivo_auth, lacks={
            "marks_release": "Plivo answers every checkpoint (playedStream): a mark is reported played on it",
            "transfer": "a Plivo audio stream cannot transfer (the REST API's Transfer a call does)",
        }),
        Transport("telnyx", "websocket", _telnyx_session, auth=telnyx_auth, lacks={
            "marks_release": "Telnyx echoes every mark: a mark is reported played on its echo",
            "transfer": "a Telnyx media stream cannot transfer (Call Control's transfer command does)",
        }),
        Transport("vonage", "websocket", _vonage_session, auth=vonage_auth, lacks={
            "marks_release": "Vonage answers every notify (websocket:notify): a mark is reported played on it",
            "transfer": "a Vonage WebSocket cannot transfer (the Voice API's PUT /v1/calls/{uuid} does)",
        }),
        Transport("exotel", "websocket", _exotel_session, auth=exotel_auth, lacks={
            "marks_release": "Exotel echoes every mark: a mark is reported played on its echo",
            "transfer": "an Exotel Voicebot stream cannot transfer (the call flow's next applet, "
                        "e.g. Connect, runs once the stream closes)",
        }),
        Transport("asterisk_ws", "websocket", _asterisk_ws_session, auth=asterisk_ws_auth, subprotocol="media", lacks={
            "marks_echo": "chan_websocket answers MARK_MEDIA only from 20.18/22.8/23.2 in its JSON format: "
                          "the gateway paces in real time and reports a mark on release",
            "transfer": "a chan_websocket channel cannot transfer (AMI Redirect or ARI on the bridged channel does)",
        }),
        Transport("freeswitch", "websocket", _freeswitch_session, auth=freeswitch_auth, lacks={
            "marks_echo": "mod_audio_stream echoes nothing: a mark is reported on release",
            "transfer": "a mod_audio_stream stream cannot transfer (the dialplan or ESL's uuid_transfer does)",
        }),
        Transport("sip", "sip", None, lacks={
            "marks_echo": "SIP peers do not echo marks: they are reported on release",
            "fault_budget": "UDP has no connection to close: SIP and RTP drop and count every malformed "
                            "datagram, and no call ever ends over them",
        }),
        # clear: AudioSocket has no flush message; the pacer stops sending and Asterisk plays what it
        # reads as it reads it, so the bot's audio stops at once (docs/TRANSPORTS.md, "AudioSocket")
        Transport("audiosocket", "audiosocket", None, lacks={
            "marks_echo": "AudioSocket has no mark message: a mark is reported played on release",
            "transfer": "AudioSocket has no transfer message (the dialplan goes on once AudioSocket() returns: "
                        "hang up and let its next priority route the call)",
            "fault_budget": "a TCP stream that carried a malformed AudioSocket message is out of step: the "
                            "message is refused, counted, and the leg ends",
        }),
    )
}

# config section -> the listener serving it, in start order
LISTENERS: dict[str, ListenerFactory] = {
    "sip": _sip_listener,
    "websocket": _websocket_listener,
    "audiosocket": _audiosocket_listener,
}


def transport(name: str) -> Transport:
    """The registry row of ``name`` (KeyError for an unknown transport)."""
    return TRANSPORTS[name]


def served_by(section: str) -> tuple[str, ...]:
    """The transports carried by the listener of config section ``section``."""
    return tuple(t.name for t in TRANSPORTS.values() if t.section == section)


def websocket_protocols() -> tuple[str, ...]:
    """The protocols a ``[websocket]`` route may name."""
    return tuple(t.name for t in TRANSPORTS.values() if t.section == "websocket" and t.session is not None)


if websocket_protocols() != WEBSOCKET_PROTOCOLS:  # the config's list and the rows, in one order
    raise RuntimeError(f"brisvox.gateway.config.WEBSOCKET_PROTOCOLS {WEBSOCKET_PROTOCOLS} != the registry's "
                       f"WebSocket rows {websocket_protocols()}")


def _sip_dial(listener: Any, host: CallHost, target: str, agent: str, ring_s: float, done: DialDone,
              trunk: str = "", params: Any = None, admitted: DialAdmitted | None = None,
              await_answer: bool = True) -> None:
    # ``await_answer``: a SIP dial always answers once the callee did (or the dial failed)
    checked, why = dial_params(params)  # the call's parameters (a campaign row's variables): CallStart.params
    if why:
        done(None, why)
        return
    listener.dial(target, agent, done, ring_s, trunk, checked, admitted)


def _twilio_dial(listener: Any, host: CallHost, target: str, agent: str, ring_s: float, done: DialDone,
                 trunk: str = "", params: Any = None, admitted: DialAdmitted | None = None,
                 await_answer: bool = False) -> None:
    # ``admitted`` is never called: the call is admitted when Twilio's stream arrives (a consult
    # leg is then claimed by its CallSid: brisvox/gateway/core/consults.py). ``params`` reach the
    # call as its stream's parameters (the webhook's TwiML); ``await_answer``: the reply waits for
    # the call's first decisive status (brisvox/gateway/control/twilio_status.py)
    if trunk:
        done(None, "a trunk is a [[sip.trunks]] entry: dial it via sip")
        return
    checked, why = dial_params(params)
    if why:
        done(None, why)
        return
    from brisvox.gateway.control.twilio_dial import dial_twilio

    dial_twilio(listener, host, target, agent, ring_s, done, checked, await_answer)


# via -> how it is dialled
DIALERS: dict[str, Dialer] = {
    "sip": Dialer("sip", _sip_dial, "SIP is not enabled"),
    "twilio": Dialer("websocket", _twilio_dial, "the WebSocket listener is not enabled"),
}


def assemble(settings: GatewaySettings, **kwargs: Any) -> GatewayCore:
    """The gateway core with every listener and dialer of this registry (the process,
    the standalone gateway and the tests build it this way)."""
    from brisvox.gateway.core.gateway_core import GatewayCore

    return GatewayCore(settings, listeners=LISTENERS, dialers=DIALERS, **kwargs)
