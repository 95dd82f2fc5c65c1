"""The browser playground's pure parts: its switch, its token endpoint, its upgrade checks,
the call events on the native protocol (frames, the leg's bounds, the agent's tap).

The browser itself is tests/system/test_playground.py (a real Chromium against brisvoxd).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from brisvox.agent.conversation.context import AssistantMessage, Context, UserMessage
from brisvox.agent.conversation.timeline import RoundMarks, TurnMarks
from brisvox.agent.host import call_events
from brisvox.agent.host.call_events import CallEvents
from brisvox.config.errors import ConfigError
from brisvox.gateway.carriers.native import NativeSession
from brisvox.gateway.config import WebSocketConfig, WsRoute
from brisvox.gateway.transports import TRANSPORTS
from brisvox.gateway.ws import playground
from brisvox.gateway.ws.server import WebSocketServer, WsConnection
from brisvox.wire import native
from ipc.codec import decode, encode
from ipc.frames import CallEvent, CallStart
from tests.unit.test_gateway_ws_fastpath import Transport, feed, loop  # noqa: F401 - loop: its autouse event loop
from tests.unit.test_gateway_ws_faults import Conn, Host

ROUTES = [{"path": "/ws", "protocol": "native", "agent": "default", "agents": ["sales"]},
          {"path": "/twilio", "protocol": "twilio", "agent": "support"}]


class _Transport(Transport):
    def __init__(self) -> None:
        super().__init__()
        self.closed = False

    def close(self) -> None:
        self.closed = True


def _server(**ws: Any) -> WebSocketServer:
    # a trusted loopback listener (make run's): the page mints without a credential
    trust = {"trust_loopback": True} if ws.get("host", "127.0.0.1") == "127.0.0.1" else {}
    cfg = WebSocketConfig.from_section({"routes": ROUTES, "handshakes_per_s": 0, **trust, **ws})
    return WebSocketServer(SimpleNamespace(), cfg, TRANSPORTS)  # type: ignore[arg-type]


def _send(server: WebSocketServer, raw: bytes) -> tuple[int, bytes, _Transport]:
    conn = WsConnection(server)
    t = _Transport()
    conn.connection_made(t)  # type: ignore[arg-type]
    for i in range(0, len(raw), 7):  # a request arrives in pieces
        feed(conn, raw[i:i + 7])
    head, _, body = bytes(t.out).partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head else 0
    return status, body, t


def _post(server: WebSocketServer, path: str, origin: str | None, host: str = "127.0.0.1:8765",
          body: bytes = b"") -> tuple[int, bytes, _Transport]:
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: {len(body)}\r\n"
    if origin is not None:
        head += f"Origin: {origin}\r\n"
    return _send(server, head.encode() + b"\r\n" + body)


def _get(server: WebSocketServer, path: str, host: str = "127.0.0.1:8765", **headers: str) -> tuple[int, bytes]:
    extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
    raw = (f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n" + extra + "\r\n")
    status, body, _ = _send(server, raw.encode())
    return status, body


# -- the switch -------------------------------------------------------------------------------


def test_on_by_default_only_on_loopback_and_never_public_without_a_secret() -> None:
    assert playground.enabled(WebSocketConfig.from_section({}))
    public = {"host": "0.0.0.0", "native_secret": "s" * 32, "twilio_auth_token": "t"}
    assert not playground.enabled(WebSocketConfig.from_section(public))
    assert playground.enabled(WebSocketConfig.from_section({**public, "playground": True}))
    assert not playground.enabled(WebSocketConfig.from_section({"playground": False}))
    with pytest.raises(ConfigError, match="websocket.playground"):
        WebSocketConfig.from_section({"host": "0.0.0.0", "allow_unauthenticated": True, "playground": True})
    assert _server(playground=False).playground is None


def test_the_agents_are_those_of_the_native_routes() -> None:
    server = _server()
    assert playground.native_agents(server.cfg) == ["default", "sales"]
    status, body = _get(server, "/playground/agents")
    assert status == 200 and orjson.loads(body) == {"agents": ["default", "sales"], "rate": 16000, "ttl_s": 60}
    status, body = _get(server, "/playground")
    assert status == 200 and b"/playground/app.js" in body
    for f in ("app.js", "worklet.js", "style.css"):
        assert _get(server, f"/playground/{f}")[0] == 200
    assert _get(server, "/playground/../config.py")[0] == 404
    assert _get(server, "/playground", host="rebound.example:8765")[0] == 403  # DNS rebinding
    assert server.counters["ws_refused_playground_host"] == 1


# -- the token endpoint -----------------------------------------------------------------------


def test_the_token_endpoint_mints_only_for_its_own_origin() -> None:
    server = _server()
    own = "http://127.0.0.1:8765"
    status, body, t = _post(server, "/playground/token?agent=sales", own)
    assert status == 200 and t.closed
    answer = orjson.loads(body)
    assert answer["path"] == "/playground/ws/sales" and answer["ttl_s"] == 60
    assert server.playground is not None
    tok = native.open_token(server.playground.key, answer["token"], time.time())
    assert tok.agent == "sales" and tok.exp <= time.time() + 61
    assert _post(server, "/playground/token?agent=sales", "http://attacker.example")[0] == 403
    assert _post(server, "/playground/token?agent=sales", None)[0] == 403  # no Origin: not the page's
    assert _post(server, "/playground/token?agent=sales", "null")[0] == 403
    assert _post(server, "/playground/token?agent=sales", own, host="attacker.example")[0] == 403
    assert _post(server, "/playground/token?agent=support", own)[0] == 404  # a Twilio route's agent
    assert _post(server, "/playground/nothing", own)[0] == 404
    assert server.counters["ws_refused_origin"] == 3 and server.counters["ws_playground_tokens"] == 1


def test_on_a_public_listener_only_the_operator_credential_mints() -> None:
    secret = "s" * 32
    server = _server(host="192.0.2.7", native_secret=secret, twilio_auth_token="t", playground=True)
    own = "http://192.0.2.7:8765"

    def post(auth: str | None) -> int:
        head = (f"POST /playground/token?agent=default HTTP/1.1\r\nHost: 192.0.2.7:8765\r\nOrigin: {own}\r\n"
                "Content-Length: 0\r\n" + (f"Authorization: {auth}\r\n" if auth is not None else "") + "\r\n")
        return _send(server, head.encode())[0]

    assert post(None) == 401  # loading the page is not enough to place calls
    assert post("Bearer wrong") == 401 and post(f"Basic {secret}") == 401
    assert post(f"Bearer {secret}") == 200
    assert server.counters["ws_refused_auth"] == 3 and server.counters["ws_playground_tokens"] == 1


def test_an_allowed_origin_may_mint_but_a_star_does_not() -> None:
    server = _server(allowed_origins=["https://app.example.com", "*"])
    assert _post(server, "/playground/token?agent=default", "https://app.example.com")[0] == 200
    assert _post(server, "/playground/token?agent=default", "https://other.example")[0] == 403


def test_a_post_that_is_too_large_or_malformed_is_refused_and_closed() -> None:
    server = _server()
    own = "http://127.0.0.1:8765"
    status, _, t = _post(server, "/playground/token?agent=sales", own, body=b"x" * 2000)
    assert status == 413 and t.closed
    raw = b"POST /playground/token HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Pad: " + b"p" * 9000 + b"\r\n\r\n"
    assert _send(server, raw)[0] == 431
    assert _send(server, b"POST /playground/token HTTP/1.1\r\nbroken header\r\n\r\n")[0] == 400
    chunked = b"POST /playground/token HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n"
    assert _send(server, chunked)[0] == 413
    # a POST elsewhere without a TwiML webhook: refused as the websockets library refuses it
    assert _post(server, "/ws", own)[0] == 400 and server.counters["ws_refused_handshake"] == 1


def test_a_post_elsewhere_goes_to_the_twiml_webhook_when_there_is_one() -> None:
    server = _server(twiml_path="/twiml")
    raw = (b"POST /twiml HTTP/1.1\r\nHost: 127.0.0.1:8765\r\nContent-Type: application/x-www-form-urlencoded\r\n"
           b"Content-Length: 36\r\n\r\nFrom=%2B1&CallSid=CA1&AccountSid=AC1")  # the webhook binds the call's SIDs
    status, body, _ = _send(server, raw)
    assert status == 200 and b"<Stream" in body and server.counters["ws_twiml"] == 1  # the webhook answered
    assert _post(server, "/playground/token?agent=sales", "http://127.0.0.1:8765")[0] == 200


# -- the WebSocket route ----------------------------------------------------------------------


def test_the_upgrade_needs_a_live_token_for_its_agent_and_its_own_origin() -> None:
    server = _server()
    assert server.playground is not None
    key = server.playground.key
    own = "http://127.0.0.1:8765"
    sales = native.sign_token(key, "sales", int(time.time()) + 60)
    assert _get(server, "/playground/ws/sales", Origin=own)[0] == 401
    assert _get(server, "/playground/ws/sales?token=junk", Origin=own)[0] == 401
    assert _get(server, f"/playground/ws/sales?token={native.sign_token('other key', 'sales', 2**40)}",
                Origin=own)[0] == 401
    assert _get(server, f"/playground/ws/sales?token={native.sign_token(key, 'sales', 1000)}",
                Origin=own)[0] == 401  # expired
    assert _get(server, f"/playground/ws/default?token={sales}", Origin=own)[0] == 401  # another agent
    assert _get(server, f"/playground/ws/sales?token={sales}", Origin="http://attacker.example")[0] == 403
    assert _get(server, f"/playground/ws/support?token={sales}", Origin=own)[0] == 404
    assert _get(server, f"/playground/ws/sales?token={sales}", Origin=own)[0] == 101
    assert _get(server, f"/playground/ws/sales?token={sales}", Origin=own)[0] == 401  # single-use
    again = native.sign_token(key, "sales", int(time.time()) + 60)
    assert _get(server, "/playground/ws/sales", Origin=own, Authorization=f"Bearer {again}")[0] == 101
    assert server.counters["ws_refused_token_expired"] == 1 and server.counters["ws_refused_token_agent"] == 1
    assert server.counters["ws_refused_token_replay"] == 1
    assert server.counters["ws_playground_calls"] == 2


def test_without_a_secret_the_key_is_the_process_own_and_with_one_it_is_the_secret() -> None:
    a, b = _server(), _server()
    assert a.playground and b.playground and a.playground.key != b.playground.key
    s = _server(native_secret="k" * 32)
    assert s.playground is not None and s.playground.key == "k" * 32


# -- call events: frames, the native leg, the agent's tap -----------------------------------


def test_call_event_frames_round_trip_and_the_start_asks_for_them() -> None:
    ev = CallEvent(call_id="c1", name="tool_call", data={"epoch": 2, "tool": "end_call", "outcome": "ok"})
    assert decode(encode(ev)) == ev
    start = CallStart(call_id="c1", agent="a", transport="native", call_rate=16000, tts_rate=22050, worker=0,
                      instance="i", started_ns=1, events=True)
    assert decode(encode(start)) == start
    assert native.parse_start({"event": "start", "rate": 16000, "events": True}).events
    assert not native.parse_start({"event": "start", "rate": 16000}).events
    with pytest.raises(native.NativeError, match="bad_start"):
        native.parse_start({"event": "start", "rate": 16000, "events": "yes"})
    msg = orjson.loads(native.call_event("user_turn", {"text": "hi", "event": "spoof", "name": "x"}))
    assert msg == {"event": "call_event", "name": "user_turn", "text": "hi"}
    read = native.server_message(msg)
    assert read.event == "call_event" and read.name == "user_turn" and read.fields == msg
    assert '"events":true' in native.NativeStream(16000, events=True).start()


class _BusyTransport:
    def __init__(self) -> None:
        self.size = 0

    def get_write_buffer_size(self) -> int:
        return self.size


def test_the_native_leg_sends_events_only_when_asked_and_never_into_a_backed_up_connection() -> None:
    host, conn = Host(), Conn()
    conn.transport, conn.max_buffer = _BusyTransport(), 1000  # type: ignore[attr-defined]
    s = NativeSession(host, conn, WsRoute("/ws", "native", "echo"))  # type: ignore[arg-type]
    s.on_text(native.NativeStream(16000).start().encode())
    assert not s.send_call_event("user_turn", {"text": "hi"})  # not asked for
    s2 = NativeSession(host, conn, WsRoute("/ws", "native", "echo"))  # type: ignore[arg-type]
    s2.on_text(native.NativeStream(16000, events=True).start().encode())
    assert s2.send_call_event("user_turn", {"epoch": 1, "text": "hi"})
    assert b'"name":"user_turn"' in conn.texts[-1]
    conn.transport.size = 501  # type: ignore[attr-defined]  # more than half the send buffer unsent
    assert not s2.send_call_event("user_turn", {"text": "dropped"})
    conn.transport.size = 0  # type: ignore[attr-defined]
    conn.close()
    assert not s2.send_call_event("user_turn", {"text": "closed"})


def test_the_gateway_forwards_or_counts_each_event() -> None:
    from brisvox.gateway.core.peers import PeerRouter

    sent: list[tuple[str, dict[str, Any]]] = []
    leg = SimpleNamespace(send_call_event=lambda n, d: sent.append((n, d)) or len(sent) < 2)
    call = SimpleNamespace(leg=leg, transport_done=False, agent_proc="agent-0", bridged_with="")
    counts: dict[str, int] = {}
    core = SimpleNamespace(table=SimpleNamespace(get=lambda cid: call if cid == "c1" else None),
                           metrics=SimpleNamespace(inc=lambda k: counts.__setitem__(k, counts.get(k, 0) + 1)))
    core._call = lambda cid: PeerRouter._call(core, cid)  # type: ignore[arg-type]
    core._hosted = lambda cid, sender: PeerRouter._hosted(core, cid, sender)  # type: ignore[arg-type]
    handle = PeerRouter._on_call_event
    for cid in ("c1", "c1", "gone"):
        handle(core, CallEvent(call_id=cid, name="bot_turn", data={"text": "x"}), "agent-0", None)  # type: ignore[arg-type]
    call.transport_done = True
    handle(core, CallEvent(call_id="c1", name="bot_turn", data={}), "agent-0", None)  # type: ignore[arg-type]
    handle(core, CallEvent(call_id="c1", name="bot_turn", data={}), "agent-9", None)  # type: ignore[arg-type]
    assert counts == {"call_events_sent": 1, "call_events_dropped": 2, "frames_unknown_call": 1,
                      "frames_refused_foreign": 1}
    assert len(sent) == 2


class _Inner:
    """An agent link's observer: every call must still reach it."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_user_turn(self, epoch: int, text: str) -> None:
        self.calls.append("user")

    def on_settled(self, ctx: Context) -> list[Any]:
        self.calls.append("settled")
        return []

    def on_tool_outcome(self, epoch: int, call_id: str, tool: str, outcome: str) -> None:
        self.calls.append("tool")

    def offered(self, specs: list[Any]) -> list[Any]:
        self.calls.append("offered")
        return specs[:1]

    def screened(self, name: str) -> bool:
        return name == "hidden"


def _actor(observer: Any = None) -> Any:
    ctx = Context()
    timeline = SimpleNamespace(turns=OrderedDict())
    tasks = SimpleNamespace(spawn=lambda coro, name: coro.close())  # the look task: not run here
    return SimpleNamespace(runner=SimpleNamespace(observer=observer, ctx=ctx), timeline=timeline,
                           idle=lambda: True, interrupts=lambda: 0, tasks=tasks, clock=None)


def test_the_tap_passes_everything_on_and_emits_names_and_outcomes_only() -> None:
    frames: list[CallEvent] = []
    inner = _Inner()
    actor = _actor(inner)
    ev = CallEvents("c1", frames.append, actor)
    ev.install(actor)
    tap = actor.runner.observer
    tap.on_user_turn(1, "book a table")
    tap.on_tool_outcome(1, "t1", "book_table", "ok")
    assert tap.offered(["a", "b"]) == ["a"] and tap.screened("hidden") and not tap.screened("book_table")
    actor.runner.ctx.push(UserMessage("book a table"))
    actor.runner.ctx.push(AssistantMessage("Booked for eight."))
    assert tap.on_settled(actor.runner.ctx) == []
    assert inner.calls == ["user", "tool", "offered", "settled"]
    assert [(f.name, f.data) for f in frames] == [
        ("user_turn", {"epoch": 1, "text": "book a table"}),
        ("tool_call", {"epoch": 1, "tool": "book_table", "outcome": "ok"}),
        ("bot_turn", {"epoch": 1, "text": "Booked for eight."}),
    ]
    tap.on_settled(actor.runner.ctx)  # nothing new was said
    ev.poll()
    assert len(frames) == 3


def test_without_an_observer_the_tap_keeps_the_runner_defaults() -> None:
    actor = _actor(None)
    CallEvents("c1", lambda f: None, actor).install(actor)
    tap = actor.runner.observer
    assert tap.offered(["a", "b"]) == ["a", "b"] and not tap.screened("x") and tap.on_settled(Context()) == []


def test_the_answer_goes_out_when_the_call_is_idle_and_the_latencies_once_per_turn() -> None:
    frames: list[CallEvent] = []
    actor = _actor()
    ev = CallEvents("c1", frames.append, actor)
    ev.install(actor)
    actor.runner.ctx.push(UserMessage("hi"))
    actor.runner.ctx.push(AssistantMessage("Hello there."))
    t = TurnMarks(1, speech_end=10.0, turn_end=10.4, rounds={0: RoundMarks(request=10.41, first_token=10.6)},
                  first_audio_out=10.9)
    actor.timeline.turns[1] = t
    actor.timeline.turns[0] = TurnMarks(0)  # a turn without audio: no figures
    ev.poll()
    ev.poll()
    assert [f.name for f in frames] == ["bot_turn", "turn_metrics"]
    assert frames[1].data == {"epoch": 1, "voice_to_voice_ms": 900.0, "end_of_turn_ms": 400.0,
                              "llm_first_token_ms": 190.0, "tts_first_audio_ms": 300.0}
    actor.interrupts = lambda: 1  # a barge-in since: the settle says what was heard, not the poll
    actor.runner.ctx.push(AssistantMessage("Let me"))
    ev.poll()
    assert len(frames) == 2


def test_events_are_bounded_per_call(monkeypatch) -> None:
    monkeypatch.setattr(call_events, "MAX_EVENTS", 3)
    frames: list[CallEvent] = []
    actor = _actor()
    ev = CallEvents("c1", frames.append, actor)
    ev.install(actor)
    for i in range(5):
        actor.runner.observer.on_user_turn(i, "x" * 5000)
    assert len(frames) == 3 and ev.stats() == {"sent": 3, "dropped": 2}
    assert len(frames[0].data["text"]) == call_events.MAX_TEXT


def test_a_task_of_the_call_looks_and_stops_logged_once_a_look_fails(loop, caplog) -> None:  # noqa: F811 - the fixture
    class Clock:
        async def sleep(self, s: float) -> None:
            assert s == call_events.POLL_S
            await asyncio.sleep(0)

    frames: list[CallEvent] = []
    actor = _actor()
    tasks: list[asyncio.Task[Any]] = []
    actor.tasks = SimpleNamespace(spawn=lambda coro, name: tasks.append(loop.create_task(coro)))
    actor.clock = Clock()
    actor.runner.ctx.push(UserMessage("hi"))
    actor.runner.ctx.push(AssistantMessage("Hello."))

    async def run() -> None:
        CallEvents("c1", frames.append, actor).install(actor)
        for _ in range(5):
            await asyncio.sleep(0)
        assert [f.name for f in frames] == ["bot_turn"] and not tasks[0].done()
        actor.idle = lambda: 1 / 0
        for _ in range(5):
            await asyncio.sleep(0)
        assert tasks[0].done() and tasks[0].exception() is None

    loop.run_until_complete(run())
    assert sum("call events stopped" in r.message for r in caplog.records) == 1


def test_no_route_may_take_the_playground_paths() -> None:
    with pytest.raises(ConfigError, match=r"websocket.routes\[0\].path"):
        WebSocketConfig.from_section({"routes": [{"path": "/playground", "protocol": "native"}]})
