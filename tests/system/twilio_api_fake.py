"""A loopback stand-in for Twilio's REST API (the calls update), checking requests as Twilio would.

``POST /2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json`` with HTTP
Basic auth (the account SID and the auth token) and a form body: a wrong
path is 404, a wrong account or password 401 (Twilio's code 20003), a
body that is not ``application/x-www-form-urlencoded`` 400; otherwise the
answer is :attr:`FakeTwilioApi.status` of the CallSid (default 200: a JSON
call resource; 404 is Twilio's 20404 "not found"; 5xx an error body).
Every request is recorded (:attr:`FakeTwilioApi.requests`). Runs on a thread.
"""

from __future__ import annotations

import base64
import json
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

ACCOUNT = "AC" + "0123456789abcdef" * 2
TOKEN = "twilio-test-token"
PATH_RE = re.compile(r"^/2010-04-01/Accounts/([A-Za-z0-9]+)/Calls/([A-Za-z0-9]+)\.json$")


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
        self._lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n).decode()
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

    def __enter__(self) -> FakeTwilioApi:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
