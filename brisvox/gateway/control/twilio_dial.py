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

from collections.abc import Callable
from typing import Any
from urllib.parse import urlencode

from brisvox.gateway.control.twilio_rest import E164_RE, MAX_TARGET, SID_RE, SIP_RE, TwilioApi
from brisvox.gateway.control.twiml import origin, stream_url

Done = Callable[[dict[str, Any] | None, str], None]


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


def dial_twilio(server: Any, host: Any, target: str, agent: str, ring_timeout_s: float, done: Done) -> None:
    """Place ``target`` through Twilio (module invariants); ``server`` is the WebSocket server."""
    cfg, api = server.cfg, server.twilio_api
    server.count("twilio_dial_attempts")
    why, reason = refusal(cfg, api, target, agent)
    if not why and (busy := host.refusal()):
        why, reason = busy, f"refused: {busy}"
    if why:
        server.count(f"twilio_dial_refused_{why}")
        done(None, reason)
        return
    assert api is not None
    url = webhook_url(cfg, agent)

    async def create() -> None:
        outcome = await api.create_call(target.strip(), cfg.twilio_from, url, int(ring_timeout_s))
        sid = (outcome.data or {}).get("sid")
        if outcome.ok and isinstance(sid, str) and SID_RE.match(sid):
            server.count("twilio_dial_queued")
            status = (outcome.data or {}).get("status")
            done({"via": "twilio", "call_sid": sid, "status": status if isinstance(status, str) else "",
                  "target": target.strip(), "agent": agent, "from": cfg.twilio_from}, "")
        else:
            server.count("twilio_dial_failed")
            done(None, outcome.detail if not outcome.ok else f"{outcome.detail} without a call sid")

    host.spawn(create())
