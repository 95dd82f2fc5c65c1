"""Twilio call control: the REST API's calls update and create, for Twilio Media Streams calls.

Owns :class:`TwilioApi`, the gateway's one client of Twilio's Programmable
Voice REST API (``POST {api_base}/2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json``),
built by the WebSocket server when ``[websocket] twilio_account_sid`` is set
(:func:`from_config`), and the two updates a Twilio leg makes
(:mod:`brisvox.gateway.carriers.twilio`): a transfer (``Twiml=<Response><Dial>...``,
:func:`dial_twiml`) and a hang-up (``Status=completed``); and the calls create
of an outbound call (``POST .../Calls.json`` with ``To``, ``From``, ``Url``,
``Method``, optionally ``Timeout``, ``StatusCallback`` and ``StatusCallbackEvent``:
:meth:`TwilioApi.create_call`, used by :mod:`brisvox.gateway.control.twilio_dial`). The
requests themselves are built by :func:`call_request` (pure: the tests check
them byte for byte).

Invariants:

* Every request carries HTTP Basic auth (the account SID and
  ``twilio_auth_token``) and runs under ``twilio_api_timeout_s`` (connect,
  read, write and pool); the environment's proxy variables are ignored and
  redirects are not followed (``trust_env=False``, as the providers' clients).
* A request is attempted at most :data:`ATTEMPTS` times: again only after a
  connection error (the request never reached Twilio) or a 5xx answer, after
  :data:`RETRY_DELAY_S`. A 4xx answer (404: the call is gone or not this
  account's; 401: bad credentials; 429 too) is final. A calls create is attempted
  again only after a connection error: a 5xx may have created the call, and a
  second create would ring the callee twice. The policy is
  :func:`retry_policy` (:mod:`brisvox.runtime.retry`: the gateway may not
  import the providers' resilience layer, the import contracts of
  ``pyproject.toml``), run by :func:`~brisvox.runtime.retry.retry_call`.
* Every outcome is an :class:`Outcome` (never an exception): ``ok`` for a
  2xx answer (with its JSON object, at most :data:`MAX_RESOURCE` bytes read, as
  ``data``), else a ``detail`` naming the status and Twilio's own message
  (cut to :data:`MAX_DETAIL` characters) or the transport error.
* A transfer target is an E.164 number (``+`` and 2..15 digits) or a
  ``sip:``/``sips:`` URI of at most :data:`MAX_TARGET` characters without
  spaces, quotes or angle brackets; anything else is refused before any
  request. The target is XML-escaped in the TwiML all the same.
* A CallSid or AccountSid is letters and digits only (it is a path segment).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode
from xml.sax.saxutils import escape

import orjson

from brisvox.runtime.retry import RetryPolicy, retry_call

if TYPE_CHECKING:  # httpx (~9 MB in the gateway) is imported at the first REST request only
    import httpx

log = logging.getLogger("brisvox.gateway.twilio")

API_VERSION = "2010-04-01"
ATTEMPTS = 2
RETRY_DELAY_S = 0.2
MAX_TARGET = 256
MAX_DETAIL = 200
MAX_BODY = 8192  # bytes of an error answer parsed for its code and message
MAX_RESOURCE = 65536  # bytes of a 2xx answer parsed (a call resource is about 2 KiB)
SID_RE = re.compile(r"^[A-Za-z0-9]{2,64}$")
E164_RE = re.compile(r"^\+[1-9][0-9]{1,14}$")
SIP_RE = re.compile(r"^sips?:[^\s<>\"'&]+$", re.I)


@dataclass(frozen=True, slots=True)
class Outcome:
    ok: bool
    detail: str
    data: dict[str, Any] | None = field(default=None, compare=False)  # a 2xx answer's JSON object (the call)


def dial_twiml(target: str) -> str | None:
    """The TwiML that dials ``target`` (an E.164 number or a SIP URI); None if it is neither."""
    target = target.strip()
    if len(target) > MAX_TARGET:
        return None
    if E164_RE.match(target):
        noun = "Number"
    elif SIP_RE.match(target):
        noun = "Sip"
    else:
        return None
    return f"<Response><Dial><{noun}>{escape(target)}</{noun}></Dial></Response>"


def call_request(api_base: str, account_sid: str, auth_token: str, call_sid: str | None,
                 fields: Mapping[str, str | Sequence[str]]) -> tuple[str, dict[str, str], bytes]:
    """(url, headers, body) of the calls update of ``call_sid`` (None: the calls create);
    ValueError for a bad SID."""
    if not SID_RE.match(account_sid) or (call_sid is not None and not SID_RE.match(call_sid)):
        raise ValueError("a Twilio SID is letters and digits")
    calls = "Calls" if call_sid is None else f"Calls/{call_sid}"
    url = f"{api_base.rstrip('/')}/{API_VERSION}/Accounts/{account_sid}/{calls}.json"
    basic = base64.b64encode(f"{account_sid}:{auth_token}".encode()).decode()
    headers = {"Authorization": f"Basic {basic}", "Content-Type": "application/x-www-form-urlencoded",
               "Accept": "application/json"}
    return url, headers, urlencode(fields, doseq=True).encode()  # a list: the name repeated


def create_fields(to: str, from_: str, url: str, timeout_s: int = 0, status_callback: str = "",
                  events: Sequence[str] = ()) -> dict[str, str | list[str]]:
    """The form of a calls create: Twilio fetches ``url`` (POST) once the callee answers;
    ``timeout_s`` (1..600) is how long it rings (0: Twilio's default, 60 s); Twilio POSTs the
    call's progress ``events`` (``StatusCallbackEvent``, repeated; none: only ``completed``) to
    ``status_callback``. Answering-machine detection (``MachineDetection``) is not asked for
    (docs/TRANSPORTS.md)."""
    fields: dict[str, str | list[str]] = {"To": to, "From": from_, "Url": url, "Method": "POST"}
    if timeout_s:
        fields["Timeout"] = str(max(1, min(600, int(timeout_s))))
    if status_callback:
        fields["StatusCallback"] = status_callback
        fields["StatusCallbackMethod"] = "POST"
        if events:
            fields["StatusCallbackEvent"] = list(events)
    return fields


def retry_policy() -> RetryPolicy:
    """:data:`ATTEMPTS` attempts, :data:`RETRY_DELAY_S` apart (fixed, no jitter)."""
    return RetryPolicy(base=RETRY_DELAY_S, multiplier=1.0, cap=RETRY_DELAY_S, max_attempts=ATTEMPTS)


def _json_object(body: bytes, limit: int = MAX_BODY) -> dict[str, Any] | None:
    try:
        doc = orjson.loads(body[:limit]) if body else None
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None


def _detail(status: int, body: bytes) -> str:
    """``Twilio API <status>``, with the code and message of Twilio's error body if it has them."""
    out = f"Twilio API {status}"
    err = _json_object(body)
    if err is not None:
        if err.get("code") is not None:
            out += f" (code {str(err['code'])[:12]})"
        if isinstance(err.get("message"), str):
            out += f": {err['message']}"
    return out[:MAX_DETAIL]


class TwilioApi:
    """The calls update of one Twilio account (see the module docstring)."""

    def __init__(self, account_sid: str, auth_token: str, api_base: str = "https://api.twilio.com",
                 timeout_s: float = 4.0) -> None:
        self.account_sid = account_sid
        self.auth_token = auth_token
        self.api_base = api_base
        self.timeout_s = timeout_s
        self.counters: dict[str, int] = {}
        self._client: httpx.AsyncClient | None = None

    def count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def client(self) -> httpx.AsyncClient:
        import httpx

        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(trust_env=False, follow_redirects=False,
                                             timeout=httpx.Timeout(self.timeout_s),
                                             limits=httpx.Limits(max_connections=32, keepalive_expiry=30.0))
        return self._client

    async def transfer(self, call_sid: str, target: str) -> Outcome:
        twiml = dial_twiml(target)
        if twiml is None:
            return Outcome(False, "invalid target (an E.164 number or a sip: URI)")
        return await self.update(call_sid, {"Twiml": twiml}, "transfer")

    async def complete(self, call_sid: str) -> Outcome:
        return await self.update(call_sid, {"Status": "completed"}, "hangup")

    async def create_call(self, to: str, from_: str, url: str, timeout_s: int = 0,
                          status_callback: str = "", events: Sequence[str] = ()) -> Outcome:
        """The calls create (an outbound call); ``data`` is Twilio's call resource (``sid``, ``status``)."""
        return await self.update(None, create_fields(to, from_, url, timeout_s, status_callback, events), "create")

    async def update(self, call_sid: str | None, fields: Mapping[str, str | Sequence[str]], what: str) -> Outcome:
        """POST ``fields`` to the call (None: create one); at most :data:`ATTEMPTS` attempts
        (module invariants)."""
        try:
            url, headers, body = call_request(self.api_base, self.account_sid, self.auth_token, call_sid, fields)
        except ValueError as e:
            self.count(f"twilio_api_{what}_failed")
            return Outcome(False, str(e))
        outcome = await retry_call(retry_policy(),
                                   lambda: self._attempt(url, headers, body, retry_5xx=call_sid is not None),
                                   sleep=asyncio.sleep, on_retry=lambda _wait: self.count("twilio_api_retries"))
        self.count(f"twilio_api_{what}_{'ok' if outcome.ok else 'failed'}")
        if not outcome.ok:
            log.warning("twilio %s of call %s failed: %s", what, call_sid or "(new)", outcome.detail)
        return outcome

    async def _attempt(self, url: str, headers: dict[str, str], body: bytes,
                       retry_5xx: bool = True) -> tuple[bool, Outcome]:
        """(retry?, outcome) of one request."""
        import httpx

        try:
            resp = await self.client().post(url, content=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as e:
            return True, Outcome(False, f"Twilio API unreachable: {type(e).__name__}")
        except httpx.HTTPError as e:  # sent, the answer lost: another attempt could act twice
            return False, Outcome(False, f"Twilio API error: {type(e).__name__}")
        if 200 <= resp.status_code < 300:
            return False, Outcome(True, f"Twilio API {resp.status_code}", _json_object(resp.content, MAX_RESOURCE))
        return retry_5xx and resp.status_code >= 500, Outcome(False, _detail(resp.status_code, resp.content))

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def from_config(cfg: Any) -> TwilioApi | None:
    """The client of ``[websocket]`` (None without ``twilio_account_sid``)."""
    if not cfg.twilio_account_sid:
        return None
    if not cfg.stream_token_required:
        log.warning("twilio: streams are not bound to a webhook (%s): hang-up and transfer act on the callSid a "
                    "stream's start names; set twiml_path so the gateway serves the TwiML and checks its tokens",
                    "twilio_require_stream_token = false" if cfg.twiml_path else "no twiml_path")
    return TwilioApi(cfg.twilio_account_sid, cfg.twilio_auth_token, cfg.twilio_api_base, cfg.twilio_api_timeout_s)
