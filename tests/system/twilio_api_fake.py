"""A loopback stand-in for Twilio's REST API (calls update and create), checking requests as Twilio would.

``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` with HTTP
Basic auth (the account SID and the auth token) and a form body: a wrong
path is 404, a wrong account or password 401 (Twilio's code 20003), a
body that is not ``application/x-www-form-urlencoded`` 400; otherwise the
answer is :attr:`FakeTwilioApi.status` of the CallSid (default 200: a JSON
call resource; 404 is Twilio's 20404 "not found"; 5xx an error body).

``POST /2010-04-01/Accounts/{AccountSid}/Calls.json`` (the calls create), after the
same checks: ``To`` and ``From`` are required (400, codes 21201 and 21213), so is
one of ``Url``, ``Twiml``, ``ApplicationSid`` (400, 21205), ``Method`` is GET or
POST and ``Timeout`` an integer 1..600 (400, 21216 here); a ``To`` listed in
:attr:`FakeTwilioApi.create_status` gets that status (400: Twilio's 21211 "Invalid
'To' Phone Number"); otherwise 201 with the new call resource (``sid`` ``CA`` + 32
hex digits, ``status`` ``queued``, ``direction`` ``outbound-api``). With
``place=True`` the fake then places the call as Twilio does once the callee
answers (:meth:`FakeTwilioApi.place`): the signed webhook POST to ``Url``, the
``<Connect><Stream>`` of its TwiML opened as a Media Stream (``X-Twilio-Signature``,
``connected``, ``start`` with the CallSid and the TwiML's parameters), caller audio
for a while, the bot's audio measured (:class:`PlacedCall` in :attr:`FakeTwilioApi.placed`).
With :attr:`FakeTwilioApi.script` set, the stream is that coroutine's instead (a test's own
callee: what it sends, when it presses keys, when it hangs up). :meth:`FakeTwilioApi.place`
also delivers an inbound call as Twilio does (``direction="inbound"``: the webhook of a call
to ``To``, then its stream), so a test's caller comes through the gateway's TwiML webhook too.

With ``status_callbacks=True`` (default off) a create that names a ``StatusCallback`` gets the
call's progress POSTed there as Twilio does (:meth:`FakeTwilioApi.progress`): form-encoded,
signed like the webhook (``X-Twilio-Signature`` over that URL and the sorted form), the
``StatusCallbackEvent`` events asked for (``completed`` always), each with its ``CallStatus``.
:attr:`FakeTwilioApi.callee` says how the callee of a ``To`` behaves: ``answered`` (the default:
``ringing``, ``in-progress``, then the call placed when ``place_calls``, then ``completed``),
``busy``, ``no-answer`` (``ringing``, then ``no-answer`` after :attr:`FakeTwilioApi.ring_s`) or
``failed``. Every callback sent is in :attr:`FakeTwilioApi.callbacks` (CallSid, CallStatus,
the HTTP status the gateway answered).

Every request is recorded (:attr:`FakeTwilioApi.requests`). Runs on a thread.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode
from xml.etree import ElementTree

import numpy as np

ACCOUNT = "AC" + "0123456789abcdef" * 2
TOKEN = "twilio-test-token"
PATH_RE = re.compile(r"^/2010-04-01/Accounts/([A-Za-z0-9]+)/Calls/([A-Za-z0-9]+)\.json$")
CREATE_RE = re.compile(r"^/2010-04-01/Accounts/([A-Za-z0-9]+)/Calls\.json$")


@dataclass
class PlacedCall:
    """What the fake saw of one call it placed (the callee's side, as Twilio plays it)."""

    sid: str
    webhook_status: int = 0
    twiml: str = ""
    stream_url: str = ""
    params: dict[str, str] = field(default_factory=dict)
    bot_samples: int = 0  # bot audio received (8 kHz samples)
    loud_samples: int = 0  # of it, samples above the silence floor
    first_loud_s: float | None = None  # seconds from the stream's start to the first loud bot audio
    end: str = ""
    error: str = ""
    done: bool = False


@dataclass
class ApiRequest:
    path: str
    call_sid: str
    authorized: bool
    content_type: str
    fields: dict[str, list[str]]


class FakeTwilioApi:
    def __init__(self, account: str = ACCOUNT, token: str = TOKEN) -> None:
        self.account = account
        self.token = token
        self.requests: list[ApiRequest] = []
        self.status: dict[str, int] = {}  # CallSid -> the status to answer (default 200)
        self.create_status: dict[str, int] = {}  # To -> the status a calls create answers (default 201)
        self.place_calls = False  # a created call is placed (webhook, then the media stream)
        self.place_seconds = 6.0
        self.place_tone = True  # the callee says something (1 s of 440 Hz) before falling silent
        self.placed: dict[str, PlacedCall] = {}
        self.status_callbacks = False  # POST signed status callbacks to a create's StatusCallback
        self.callee: dict[str, str] = {}  # To -> answered | busy | no-answer | failed (default answered)
        self.ring_s = 0.3  # how long a callee rings before it answers or Twilio gives up (no-answer)
        self.callbacks: list[tuple[str, str, int]] = []  # (CallSid, CallStatus, the gateway's answer)
        # the placed call's stream, run by the test: (call, the create's form, the transport not yet opened)
        self.script: Callable[[PlacedCall, dict[str, str], Any], Awaitable[None]] | None = None
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n).decode()
                if CREATE_RE.match(self.path):
                    return self.create(body)
                m = PATH_RE.match(self.path)
                want = "Basic " + base64.b64encode(f"{api.account}:{api.token}".encode()).decode()
                authorized = self.headers.get("Authorization") == want
                ctype = self.headers.get("Content-Type", "")
                req = ApiRequest(self.path, m.group(2) if m else "", authorized, ctype,
                                 parse_qs(body, keep_blank_values=True))
                with api._lock:
                    api.requests.append(req)
                if m is None:
                    self.answer(404, {"code": 20404, "message": "The requested resource was not found"})
                elif not authorized or m.group(1) != api.account:
                    self.answer(401, {"code": 20003, "message": "Authenticate"})
                elif not ctype.startswith("application/x-www-form-urlencoded"):
                    self.answer(400, {"code": 21000, "message": "bad content type"})
                else:
                    status = api.status.get(req.call_sid, 200)
                    if status == 200:
                        done = req.fields.get("Status") == ["completed"]
                        self.answer(200, {"sid": req.call_sid, "account_sid": api.account,
                                          "status": "completed" if done else "in-progress"})
                    elif status == 404:
                        self.answer(404, {"code": 20404, "message": f"The requested resource "
                                          f"/2010-04-01/Accounts/{api.account}/Calls/{req.call_sid}.json "
                                          "was not found", "status": 404})
                    else:
                        self.answer(status, {"code": 20500, "message": "Internal Server Error"})

            def create(self, body: str) -> None:
                m = CREATE_RE.match(self.path)
                assert m is not None
                want = "Basic " + base64.b64encode(f"{api.account}:{api.token}".encode()).decode()
                authorized = self.headers.get("Authorization") == want
                ctype = self.headers.get("Content-Type", "")
                fields = parse_qs(body, keep_blank_values=True)
                with api._lock:
                    api.requests.append(ApiRequest(self.path, "", authorized, ctype, fields))
                one = {k: v[0] for k, v in fields.items() if len(v) == 1}
                timeout = one.get("Timeout", "60")
                if not authorized or m.group(1) != api.account:
                    return self.answer(401, {"code": 20003, "message": "Authenticate", "status": 401})
                if not ctype.startswith("application/x-www-form-urlencoded"):
                    return self.answer(400, {"code": 21000, "message": "bad content type", "status": 400})
                if not one.get("To"):
                    return self.answer(400, {"code": 21201, "message": "No 'To' number is specified", "status": 400})
                if not one.get("From"):
                    return self.answer(400, {"code": 21213, "message": "No 'From' number is specified",
                                             "status": 400})
                if not any(one.get(k) for k in ("Url", "Twiml", "ApplicationSid")):
                    return self.answer(400, {"code": 21205, "message": "Url, Twiml or ApplicationSid is required",
                                             "status": 400})
                if one.get("Method", "POST") not in ("GET", "POST") or not timeout.isdigit() \
                        or not 1 <= int(timeout) <= 600:
                    return self.answer(400, {"code": 21216, "message": "invalid Method or Timeout", "status": 400})
                status = api.create_status.get(one["To"], 201)
                if status != 201:
                    return self.answer(status, {"code": 21211, "message": f"Invalid 'To' Phone Number: {one['To']}",
                                                "status": status})
                sid = "CA" + secrets.token_hex(16)
                self.answer(201, {"sid": sid, "account_sid": api.account, "to": one["To"], "from": one["From"],
                                  "status": "queued", "direction": "outbound-api", "api_version": "2010-04-01",
                                  "uri": f"/2010-04-01/Accounts/{api.account}/Calls/{sid}.json"})
                if api.status_callbacks and one.get("StatusCallback"):
                    api.progress(sid, one, fields.get("StatusCallbackEvent", []))
                elif api.place_calls:
                    api.place(sid, one)

            def answer(self, status: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def config(self) -> dict[str, Any]:
        """The ``[websocket]`` keys that point a gateway at this API."""
        return {"twilio_account_sid": self.account, "twilio_auth_token": self.token,
                "twilio_api_base": self.base, "twilio_api_timeout_s": 2.0}

    def of(self, call_sid: str) -> list[ApiRequest]:
        with self._lock:
            return [r for r in self.requests if r.call_sid == call_sid]

    def creates(self) -> list[ApiRequest]:
        with self._lock:
            return [r for r in self.requests if CREATE_RE.match(r.path)]

    # -- placing a created call, as Twilio does once the callee answered ---------------------------

    def place(self, sid: str, form: dict[str, str], direction: str = "outbound-api") -> None:
        """Place call ``sid`` (``form``: ``To``, ``From``, ``Url``) on a thread of its own."""
        call = PlacedCall(sid)
        with self._lock:
            self.placed[sid] = call
        th = threading.Thread(target=lambda: asyncio.run(self._place(call, form, direction)), daemon=True)
        self._threads.append(th)
        th.start()

    async def _place(self, call: PlacedCall, form: dict[str, str], direction: str) -> None:
        try:
            async with asyncio.timeout(self.place_seconds + 20):
                await self._webhook_then_stream(call, form, direction)
        except Exception as e:  # noqa: BLE001 - reported to the test
            call.error = f"{type(e).__name__}: {e}"[:300]
        finally:
            call.done = True

    async def _webhook_then_stream(self, call: PlacedCall, form: dict[str, str], direction: str) -> None:
        import httpx

        from brisvox.client.transport import BotEvents
        from brisvox.client.twilio import TwilioTransport
        from brisvox.wire import twilio

        hook = {"AccountSid": self.account, "ApiVersion": "2010-04-01", "CallSid": call.sid,
                "CallStatus": "in-progress", "Called": form["To"], "Caller": form["From"],
                "Direction": direction, "From": form["From"], "To": form["To"]}
        url = form["Url"]
        headers = {"Content-Type": "application/x-www-form-urlencoded",
                   "X-Twilio-Signature": twilio.signature(self.token, url, hook)}
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
            r = await client.post(url, content=urlencode(hook), headers=headers)
        call.webhook_status, call.twiml = r.status_code, r.text
        if r.status_code != 200:
            return
        stream = ElementTree.fromstring(r.text).find("./Connect/Stream")
        assert stream is not None, r.text
        call.stream_url = stream.get("url", "")
        call.params = {p.get("name", ""): p.get("value", "") for p in stream.findall("Parameter")}
        t = TwilioTransport(call.stream_url, call.params)
        t.stream = twilio.TwilioStream(stream_sid="MZ" + call.sid[2:], call_sid=call.sid, account_sid=self.account)
        t.headers = {"X-Twilio-Signature": twilio.signature(self.token, call.stream_url)}
        if self.script is not None:
            await self.script(call, form, t)
            call.end = call.end or "the script ended"
            return
        t0 = time.monotonic()

        def on_audio(pcm: np.ndarray, now: float) -> None:
            call.bot_samples += len(pcm)
            loud = int(np.count_nonzero(np.abs(pcm.astype(np.int32)) > 500))
            if loud and call.first_loud_s is None:
                call.first_loud_s = now - t0
            call.loud_samples += loud

        ended = asyncio.Event()

        def on_end(reason: str, now: float) -> None:
            call.end = reason
            ended.set()

        await t.open(BotEvents(on_audio=on_audio, on_end=on_end))
        tone = (3000 * np.sin(2 * np.pi * 440 * np.arange(160) / 8000)).astype(np.int16)
        silence = np.zeros(160, np.int16)
        n = 0
        try:
            while n * 0.02 < self.place_seconds and not ended.is_set():
                await t.send_audio(tone if n < 50 and self.place_tone else silence)
                n += 1
                await asyncio.sleep(max(0.0, t0 + n * 0.02 - time.monotonic()))
        finally:
            await t.close()
        call.end = call.end or "callee hung up"

    # -- the status callbacks of a created call, as Twilio sends them ---------------------------

    def progress(self, sid: str, form: dict[str, str], events: list[str]) -> None:
        th = threading.Thread(target=lambda: asyncio.run(self._progress(sid, form, set(events) | {"completed"})),
                              daemon=True)
        self._threads.append(th)
        th.start()

    async def _progress(self, sid: str, form: dict[str, str], events: set[str]) -> None:
        import httpx

        from brisvox.wire import twilio

        kind = self.callee.get(form["To"], "answered")
        seq = 0
        async with httpx.AsyncClient(trust_env=False, timeout=5.0) as client:
            async def send(event: str, status: str, **extra: str) -> None:
                nonlocal seq
                if event not in events:
                    return
                cb = {"AccountSid": self.account, "ApiVersion": "2010-04-01", "CallSid": sid, "CallStatus": status,
                      "Called": form["To"], "Caller": form["From"], "Direction": "outbound-api",
                      "From": form["From"], "To": form["To"], "CallbackSource": "call-progress-events",
                      "SequenceNumber": str(seq), "Timestamp": time.strftime("%a, %d %b %Y %H:%M:%S +0000"),
                      **extra}
                seq += 1
                url = form["StatusCallback"]
                headers = {"Content-Type": "application/x-www-form-urlencoded",
                           "X-Twilio-Signature": twilio.signature(self.token, url, cb)}
                try:
                    r = await client.post(url, content=urlencode(cb), headers=headers)
                    code = r.status_code
                except httpx.HTTPError:
                    code = 0
                with self._lock:
                    self.callbacks.append((sid, status, code))

            await asyncio.sleep(0.05)  # the create's answer first, as from Twilio
            await send("initiated", "initiated")
            if kind in ("busy", "failed"):
                return await send("completed", kind, CallDuration="0")
            await send("ringing", "ringing")
            await asyncio.sleep(self.ring_s)
            if kind == "no-answer":
                return await send("completed", "no-answer", CallDuration="0")
            t0 = time.monotonic()
            await send("answered", "in-progress")
            if self.place_calls:
                call = PlacedCall(sid)
                with self._lock:
                    self.placed[sid] = call
                await self._place(call, form, "outbound-api")
            await send("completed", "completed", CallDuration=str(int(time.monotonic() - t0)))

    def __enter__(self) -> FakeTwilioApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for th in self._threads:
            th.join(self.place_seconds + 25)
        self.server.shutdown()
        self.server.server_close()
