"""Outbound calls through Twilio: the gateway's ``dial`` with ``via = "twilio"``.

Owns :func:`dial_twilio`, what the gateway core runs for ``brisvoxd dial --via twilio``
(and an agent service's ``dial`` command): one calls create of Twilio's REST API
(:meth:`brisvox.gateway.control.twilio_rest.TwilioApi.create_call`) whose ``Url`` is this
gateway's own TwiML webhook (:mod:`brisvox.gateway.control.twiml`: ``public_url`` as
``https``/``http``, then ``twiml_path``, then ``?agent=<agent>`` for an agent other than the
Twilio route's own). Once the callee answers, Twilio fetches that URL, the webhook answers
``<Connect><Stream>`` and the call arrives as an ordinary Twilio Media Streams call: the
same admission, agent pipeline, call control and record as an inbound one (its
``callSid`` among the record's ``transport_ids``, ``direction = "outbound"`` among its
parameters).

Invariants:

* A dial is reported exactly once (``done(data, error)``): ``data`` once Twilio accepted
  the create (``call_sid``, Twilio's ``status``, normally ``queued``), else the reason. The
  call id of the pipeline's call does not exist yet (it is made when the stream starts):
  the CallSid is what names the call until then.
* Every create asks for status callbacks (``StatusCallback`` = the webhook's origin plus
  :func:`~brisvox.gateway.control.twilio_status.status_path`, events
  :data:`~brisvox.gateway.control.twilio_status.EVENTS`), which the webhook verifies and
  records. With ``await_answer`` the report waits for the call's first decisive status
  (:meth:`~brisvox.gateway.control.twilio_status.CallStatuses.wait`): answered (``data`` with
  ``status``, ``ringing_at_ms``, ``answered_at_ms``) or the SIP dial's words (``busy``, ``no
  answer``, ``failed``, ``canceled``); nothing decisive within the ring (Twilio's 60 s
  without one) plus :data:`STATUS_GRACE_S` is :data:`NO_STATUS` (the call may be up).
  Counted ``twilio_dial_answered``, ``twilio_dial_<status>``, ``twilio_dial_status_timeout``.
* A dial's ``params`` (checked by the dial registry, :func:`brisvox.wire.jsontext.dial_params`)
  are kept with its CallSid in that table and given to the call's stream by the webhook.
* Nothing is sent to Twilio unless every key it needs is set (the refusal names the first
  missing one: ``twilio_account_sid``, ``twilio_from``, ``public_url``, ``twiml_path``), the
  target is an E.164 number or a ``sip:`` URI (:data:`~brisvox.gateway.control.twilio_rest.E164_RE`,
  :data:`~brisvox.gateway.control.twilio_rest.SIP_RE`), the Twilio route admits the agent (the
  webhook would answer 404 otherwise) and the gateway would admit a call now (not full,
  not draining).
* The request's timeout and its single retry after a connection error are the REST
  client's (:mod:`brisvox.gateway.control.twilio_rest`); a 4xx answer is reported with Twilio's
  code and message. Counted: ``twilio_dial_attempts``, ``twilio_dial_queued``,
  ``twilio_dial_failed``, ``twilio_dial_refused_<why>`` (``config``, ``invalid_target``,
  ``agent``, ``full``, ``draining``).
* No answering-machine detection is asked for: a machine that answers gets the agent as
  a person would (docs/TRANSPORTS.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

from brisvox.gateway.control.twilio_rest import E164_RE, MAX_TARGET, SID_RE, SIP_RE, TwilioApi
from brisvox.gateway.control.twilio_status import EVENTS, verdict
from brisvox.gateway.control.twiml import origin, stream_url, webhook_of

Done = Callable[[dict[str, Any] | None, str], None]
TWILIO_DEFAULT_RING_S = 60  # Twilio rings this long without a Timeout
STATUS_GRACE_S = 30.0  # past the ring: Twilio's no-answer callback, the webhook's fetch
NO_STATUS = "no call status from Twilio"  # an awaited dial that heard nothing: the call may be up


def webhook_url(cfg: Any, agent: str) -> str:
    """The URL Twilio fetches once the callee answers: the webhook, naming ``agent``."""
    route = next((r for r in cfg.routes if r.protocol == "twilio"), None)
    query = f"?{urlencode({'agent': agent})}" if agent and (route is None or agent != route.agent) else ""
    return origin(cfg, "", False) + cfg.twiml_path + query


def refusal(cfg: Any, api: TwilioApi | None, target: str, agent: str) -> tuple[str, str]:
    """``(counter, reason)`` why this dial is not sent (``("", "")``: it may be)."""
    if api is None:
        return "config", "a Twilio dial needs the REST API: set [websocket] twilio_account_sid"
    if not cfg.twilio_from:
        return "config", "a Twilio dial needs a caller id: set [websocket] twilio_from"
    if not cfg.public_url:
        return "config", "a Twilio dial needs the webhook's public address: set [websocket] public_url"
    if not cfg.twiml_path:
        return "config", "a Twilio dial needs the TwiML webhook: set [websocket] twiml_path"
    t = target.strip()
    if len(t) > MAX_TARGET or not (E164_RE.match(t) or SIP_RE.match(t)):
        return "invalid_target", "invalid target (an E.164 number or a sip: URI)"
    if stream_url(cfg, "", agent) is None:
        return "agent", f"no twilio route admits agent {agent[:64]!r}"
    return "", ""


def dial_twilio(server: Any, host: Any, target: str, agent: str, ring_timeout_s: float, done: Done,
                params: Mapping[str, str] | None = None, await_answer: bool = False) -> None:
    """Place ``target`` through Twilio (module invariants); ``server`` is the WebSocket server.
    ``params`` (checked by the caller) reach the call as its stream's parameters;
    ``await_answer``: report the call's first decisive status, not Twilio's ``queued``."""
    cfg, api = server.cfg, server.twilio_api
    server.count("twilio_dial_attempts")
    why, reason = refusal(cfg, api, target, agent)
    hook = webhook_of(server)
    if not why and hook is None:
        why, reason = "config", "a Twilio dial needs the TwiML webhook: set [websocket] twiml_path"
    if not why and (busy := host.refusal()):
        why, reason = busy, f"refused: {busy}"
    if why:
        server.count(f"twilio_dial_refused_{why}")
        done(None, reason)
        return
    assert api is not None and hook is not None
    url = webhook_url(cfg, agent)
    callback = origin(cfg, "", False) + hook.status_path
    ring = int(ring_timeout_s)

    async def create() -> None:
        t0 = time.monotonic()
        outcome = await api.create_call(target.strip(), cfg.twilio_from, url, ring, callback, EVENTS)
        sid = (outcome.data or {}).get("sid")
        if not (outcome.ok and isinstance(sid, str) and SID_RE.match(sid)):
            server.count("twilio_dial_failed")
            done(None, outcome.detail if not outcome.ok else f"{outcome.detail} without a call sid")
            return
        server.count("twilio_dial_queued")
        if params:
            hook.statuses.carry(sid, params)
        status = (outcome.data or {}).get("status")
        data = {"via": "twilio", "call_sid": sid, "status": status if isinstance(status, str) else "",
                "target": target.strip(), "agent": agent, "from": cfg.twilio_from}
        if not await_answer:
            done(data, "")
            return
        wait_s = (ring or TWILIO_DEFAULT_RING_S) + STATUS_GRACE_S
        decided = await hook.statuses.wait(sid, wait_s)
        if decided is None:
            server.count("twilio_dial_status_timeout")
            done(None, f"{NO_STATUS} within {wait_s:g} s (call {sid})")
            return
        answered, error = verdict(decided) or (False, "failed")
        entry = hook.statuses.get(sid)
        if entry is not None and entry.ringing_at is not None:
            data["ringing_at_ms"] = max(0, int((entry.ringing_at - t0) * 1000))
        if answered:
            server.count("twilio_dial_answered")
            data["answered_at_ms"] = int((time.monotonic() - t0) * 1000)
            done({**data, "status": decided}, "")
        else:
            server.count(f"twilio_dial_{decided.replace('-', '_')}")
            done(None, error)

    host.spawn(create())
