"""Webhooks without the daemon: signing, the outbox (claim, ack, backoff, horizon, leases),
the writer thread, the URL refusals, the config, the routing of a call's events and the
courier against real loopback receivers (a slow one, one with a huge body, one answering 500)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from brisvox.agent.host.call_hooks import CallHooks, HookRoutes
from brisvox.config.daemon import parse_config
from brisvox.config.errors import ConfigError
from brisvox.outbound.webhooks import signing
from brisvox.outbound.webhooks.config import (
    EVENTS,
    WebhookSettings,
    check_webhooks,
    refused_addresses,
    url_problems,
)
from brisvox.outbound.webhooks.courier import Courier
from brisvox.outbound.webhooks.events import MAX_BODY, make_event
from brisvox.outbound.webhooks.outbox import Outbox, Target, after_failure
from brisvox.outbound.webhooks.writer import OutboxWriter
from brisvox.runtime.retry import RetryPolicy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "sdk" / "python" / "src"))
from brisvox_agent import WebhookError, verify_webhook  # noqa: E402

SECRET = "whsec_unit"
T = Target("daemon", "https://hooks.example.com/in")


# -- signing -------------------------------------------------------------------------------


def test_the_daemons_signature_verifies_with_both_checks_and_fails_on_tampering() -> None:
    ev = make_event("call.ended", {"call_id": "c1", "record": {"conversation": []}}, created=1767139200.0)
    h = signing.sign(SECRET, ev.body, 1767139200)
    assert h.startswith("t=1767139200,v1=") and len(h.split("v1=")[1]) == 64
    assert signing.verify(SECRET, h, ev.body, now=1767139200 + 299) is None
    assert verify_webhook(SECRET, h, ev.body, now=1767139200)["id"] == ev.id  # the SDK agrees
    assert signing.verify(SECRET, h, ev.body + b" ", now=1767139200) == "no signature matches"
    assert signing.verify("wrong", h, ev.body, now=1767139200) == "no signature matches"
    assert signing.verify(SECRET, h, ev.body, now=1767139200 + 301) == "timestamp outside the tolerance"
    assert signing.verify(SECRET, "v1=" + h.split("v1=")[1], ev.body, now=1767139200) == "malformed signature header"
    with pytest.raises(WebhookError):
        verify_webhook(SECRET, h, ev.body.replace(b"c1", b"c9"), now=1767139200)


def test_an_event_has_one_id_a_known_type_and_a_bounded_body() -> None:
    a, b = make_event("call.started", {"x": 1}), make_event("call.started", {"x": 1})
    assert a.id != b.id and a.id.startswith("evt_") and len(a.id) == 36
    env = orjson.loads(a.body)
    assert env == {"id": a.id, "type": "call.started", "created": a.created, "data": {"x": 1}}
    with pytest.raises(ValueError, match="unknown webhook event"):
        make_event("call.exploded", {})
    with pytest.raises(ValueError, match="over"):
        make_event("call.ended", {"blob": "x" * MAX_BODY})


# -- the outbox ----------------------------------------------------------------------------


def test_outbox_claim_ack_and_the_file_is_private(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "state" / "webhooks.sqlite3")
    e1, e2 = make_event("call.started", {"n": 1}, created=100.0), make_event("call.ended", {"n": 2}, created=100.0)
    other = Target("agent:sales", "https://sales.example.com/h")
    assert ob.enqueue([(e1, T), (e1, other), (e2, T)], now=100.0) == 3
    assert ob.enqueue([(e1, T)], now=100.0) == 0  # an (event, endpoint) pair is stored once
    for p in tmp_path.joinpath("state").iterdir():
        assert p.stat().st_mode & 0o777 == 0o600, p
    assert tmp_path.joinpath("state").stat().st_mode & 0o777 == 0o700
    rows = ob.claim(now=100.0, limit=2, lease_s=60.0)
    assert [(r.event_id, r.scope) for r in rows] == [(e1.id, "daemon"), (e1.id, "agent:sales")]
    assert rows[0].body == e1.body and rows[0].attempts == 0
    assert [r.event_id for r in ob.claim(now=100.0, limit=10, lease_s=60.0)] == [e2.id]
    assert ob.claim(now=159.0, limit=10, lease_s=60.0) == []  # all leased
    ob.delivered(rows[0].seq, now=101.0)
    ob.delivered(rows[0].seq, now=105.0)  # a second ack changes nothing
    st = ob.counts(now=110.0)
    assert st == {"pending": 2, "delivered": 1, "gave_up": 0, "oldest_pending_age_s": 10.0}
    # the lease ran out (the courier died mid-attempt): due again, also for a new connection
    ob.close()
    again = Outbox(tmp_path / "state" / "webhooks.sqlite3")
    assert sorted(r.seq for r in again.claim(now=161.0, limit=10, lease_s=60.0)) == sorted(
        [rows[1].seq, rows[1].seq + 1])
    assert again.rows()[0]["delivered_at"] == 101.0 and again.rows()[0]["attempts"] == 1


def test_outbox_retry_give_up_and_prune(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "o.sqlite3")
    e = make_event("tool.called", {})
    ob.enqueue([(e, T)], now=0.0)
    (r,) = ob.claim(now=0.0, limit=5, lease_s=30.0)
    ob.retry(r.seq, next_at=10.0, error="HTTP 500")
    assert ob.claim(now=9.9, limit=5, lease_s=30.0) == [] and ob.next_due() == 10.0
    (r,) = ob.claim(now=10.0, limit=5, lease_s=30.0)
    assert r.attempts == 1
    ob.give_up(r.seq, now=11.0, error="horizon")
    assert ob.claim(now=1e9, limit=5, lease_s=1.0) == [] and ob.next_due() is None
    assert ob.rows()[0]["gave_up_at"] == 11.0 and ob.rows()[0]["attempts"] == 2
    assert ob.counts(now=20.0)["gave_up"] == 1
    assert ob.prune(now=11.0 + 100, keep_s=200) == 0
    assert ob.prune(now=11.0 + 300, keep_s=200) == 1 and ob.rows() == []


def test_backoff_doubles_with_jitter_floor_honours_retry_after_and_stops_at_the_horizon() -> None:
    p = RetryPolicy(base=1.0, multiplier=2.0, cap=60.0, jitter="full")
    top = lambda: 0.999999  # noqa: E731 - the upper end of the jitter
    assert after_failure(0.0, 1, 0.0, 3600, p, random=top) == pytest.approx(1.0)
    assert after_failure(0.0, 4, 100.0, 3600, p, random=top) == pytest.approx(108.0)
    assert after_failure(0.0, 20, 100.0, 3600, p, random=top) == pytest.approx(160.0)  # capped
    assert after_failure(0.0, 4, 100.0, 3600, p, random=lambda: 0.0) == pytest.approx(101.0)  # never below base
    assert after_failure(0.0, 1, 100.0, 3600, p, retry_after=30.0, random=top) == pytest.approx(130.0)
    assert after_failure(0.0, 1, 100.0, 3600, p, retry_after=9999.0, random=top) == pytest.approx(160.0)  # cap
    # the horizon: the last attempt is placed on it, then the row is given up
    assert after_failure(0.0, 10, 3590.0, 3600, p, random=top) == pytest.approx(3600.0)
    assert after_failure(0.0, 11, 3600.0, 3600, p, random=top) is None


# -- the writer ------------------------------------------------------------------------------


def test_the_writer_never_blocks_counts_what_a_full_queue_drops_and_commits_the_rest(tmp_path: Path) -> None:
    w = OutboxWriter(tmp_path / "o.sqlite3", queue_max=3)
    events = [make_event("call.started", {"i": i}) for i in range(5)]
    t0 = time.monotonic()
    accepted = [w.submit(e, [T]) for e in events]  # the thread is not started: the queue fills
    assert time.monotonic() - t0 < 0.1
    assert accepted == [True, True, True, False, False] and w.dropped == 2
    assert not w.submit(make_event("call.started", {}), [])  # no endpoint: nothing queued, not a drop
    done: list[bool] = []
    w.start()
    assert w.flush(5.0)
    assert w.submit(make_event("call.ended", {}), [T, Target("agent:a", "https://a.example.com")], done.append)
    assert w.close(5.0)
    assert done == [True]
    assert w.stats() == {"submitted": 4, "committed": 4, "rows": 5, "dropped": 2, "failed": 0, "queued": 0}
    ob = Outbox(tmp_path / "o.sqlite3")
    assert [r["event_id"] for r in ob.rows()[:3]] == [e.id for e in events[:3]]
    assert not w.submit(make_event("call.started", {}), [T]) and w.dropped == 3  # closed


def test_a_writer_that_cannot_open_its_file_counts_every_event_failed(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    w = OutboxWriter(blocker / "o.sqlite3")  # its parent is a file
    w.start()
    done: list[bool] = []
    assert w.submit(make_event("call.started", {}), [T], done.append)
    assert w.close(5.0)
    assert done == [False] and w.failed == 1 and w.committed == 0


# -- URLs and config ---------------------------------------------------------------------------


def resolver(table: dict[str, list[str]]) -> Any:
    def resolve(host: str) -> list[str]:
        if host not in table:
            raise OSError(-2, "Name or service not known")
        return table[host]
    return resolve


def test_url_refusals() -> None:
    dns = resolver({"hooks.example.com": ["93.184.215.14"], "inside.example.com": ["10.1.2.3", "93.184.215.14"],
                    "v6.example.com": ["::ffff:192.168.1.4"]})
    assert url_problems("https://hooks.example.com/in", False, dns) == ([], [])
    for url, why in [("http://hooks.example.com/in", "http:// only to a loopback host"),
                     ("ftp://hooks.example.com/in", "expected https://"),
                     ("https://user:pw@hooks.example.com/", "no user or password"),
                     ("https://hooks.example.com/#x", "no #fragment"),
                     ("https://hooks.example.com:99999/", "not a URL"),
                     ("https:///path", "expected https://"),
                     ("https://hooks.example.com/a b", "without spaces"),
                     ("https://inside.example.com/", "resolves to 10.1.2.3"),
                     ("https://v6.example.com/", "resolves to 192.168.1.4"),
                     ("https://169.254.169.254/latest", "resolves to 169.254.169.254"),
                     ("http://127.0.0.1:9000/h", "resolves to 127.0.0.1"),  # loopback is private too
                     ("https://[::1]/h", "resolves to ::1")]:
        errors, _ = url_problems(url, False, dns)
        assert len(errors) == 1 and why in errors[0], (url, errors)
    assert url_problems("http://127.0.0.1:9000/h", True, dns) == ([], [])  # allowed
    assert url_problems("http://localhost:9000/h", True, dns) == ([], [])
    assert url_problems("https://10.0.0.5/h", True, dns) == ([], [])
    errors, warnings = url_problems("https://nowhere.example.com/", False, dns)
    assert errors == [] and "does not resolve" in warnings[0]
    assert refused_addresses(["8.8.8.8", "100.64.0.1", "fe80::1", "2001:4860:4860::8888"]) == ["100.64.0.1", "fe80::1"]


def test_daemon_webhooks_config_and_the_outbound_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", "s3cret")
    agents = tmp_path / "agents"
    agents.mkdir()
    base = {"agents": {"agents_dir": str(agents)}}
    hook = {"url": "https://hooks.example.com/in", "secret_env": "HOOK_SECRET", "events": ["call.ended"]}
    cfg = parse_config({**base, "webhooks": [hook]})
    (h,) = cfg.section("webhooks").hooks
    assert h.secret == "s3cret" and h.events == ("call.ended",) and "s3cret" not in repr(h)
    assert cfg.count("outbound") == 1
    assert parse_config(base).count("outbound") == 0 and parse_config(base).section("webhooks").hooks == ()
    (agents / "a.toml").write_text('system_prompt = "x"\n[[webhooks]]\nurl = "https://a.example.com/h"\n'
                                   'secret_env = "A"\n')
    assert parse_config(base).count("outbound") == 1  # an agent file's [[webhooks]] is enough
    for bad, key, msg in [
        ({**hook, "url": "http://hooks.example.com/in"}, "webhooks[0].url", "loopback"),
        ({**hook, "secret": "inline"}, "webhooks[0].secret", "never inline"),
        ({"url": hook["url"]}, "webhooks[0].secret_env", "signing secret"),
        ({**hook, "secret_env": "UNSET_HOOK_VAR"}, "webhooks[0].secret_env", "is not set"),
        ({**hook, "events": ["call.ended", "call.ended"]}, "webhooks[0].events", "twice"),
        ({**hook, "events": []}, "webhooks[0].events", "at least 1"),
        ({**hook, "timeout_s": 0.1}, "webhooks[0].timeout_s", ">= 0.5"),
        ({**hook, "retry_base_s": 10.0, "retry_cap_s": 5.0}, "webhooks[0].retry_cap_s", "at least retry_base_s"),
        ({**hook, "urls": "x"}, "webhooks[0].urls", "unknown key"),
    ]:
        with pytest.raises(ConfigError) as e:
            parse_config({"webhooks": [bad]})
        assert e.value.key == key and msg in e.value.message, (bad, e.value)
    with pytest.raises(ConfigError, match=r"webhooks\[1\].url: .* is given twice"):
        parse_config({"webhooks": [hook, hook]})
    with pytest.raises(ConfigError, match="expected an array of tables"):
        parse_config({"webhooks": {"url": "https://x.example.com"}})
    dns = resolver({"hooks.example.com": ["192.168.0.9"]})
    errors, _ = check_webhooks(parse_config({"webhooks": [hook]}), dns)
    assert errors and errors[0].startswith("webhooks[0].url: hooks.example.com resolves to 192.168.0.9")
    assert check_webhooks(parse_config({"webhooks": [{**hook, "allow_private": True}]}), dns) == ([], [])


# -- a call's events -----------------------------------------------------------------------------


class _Writer:
    """Records what CallHooks submits (the real writer is tested above)."""

    def __init__(self) -> None:
        self.got: list[tuple[Any, tuple[Target, ...]]] = []

    def submit(self, event: Any, targets: Any, on_commit: Any = None) -> bool:
        self.got.append((event, tuple(targets)))
        return True


def test_routes_filter_by_event_and_scope_and_answered_is_sent_once() -> None:
    daemon = [WebhookSettings(url="https://d.example.com/all"),
              WebhookSettings(url="https://d.example.com/ends", events=("call.ended",))]
    routes = HookRoutes(daemon)
    t = routes.targets("sales", [WebhookSettings(url="https://s.example.com/t", events=("tool.called",))])
    assert t["call.ended"] == (Target("daemon", "https://d.example.com/all"), Target("daemon", "https://d.example.com/ends"))
    assert t["tool.called"] == (Target("daemon", "https://d.example.com/all"), Target("agent:sales", "https://s.example.com/t"))
    assert set(t) == set(EVENTS)
    assert HookRoutes([]).targets("x", []) == {}
    w = _Writer()
    hooks = CallHooks(w, t, "c1", "sales")  # type: ignore[arg-type]
    actor = SimpleNamespace(call_info=SimpleNamespace(record=lambda: {"caller": "+1"}), transport="native",
                            transport_ids={}, started_wall=1.5, media=SimpleNamespace(state="early"))
    hooks.started(actor)
    hooks.on_media("held")
    hooks.on_media("answered", amd={"verdict": "human"})
    hooks.on_media("answered")
    tap_inner: list[tuple[Any, ...]] = []
    hooks.tap = None
    from brisvox.agent.host.call_hooks import _HookTap

    tap = _HookTap(SimpleNamespace(on_tool_outcome=lambda *a: tap_inner.append(a)), hooks)  # type: ignore[arg-type]
    tap.on_tool_outcome(2, "tc1", "book_table", "ok")
    hooks.ended({"end_reason": "hangup", "conversation": []}, "20260101T000000-c1.wav")
    types = [orjson.loads(e.body)["type"] for e, _ in w.got]
    assert types == ["call.started", "call.answered", "tool.called", "call.ended"]
    data = [orjson.loads(e.body)["data"] for e, _ in w.got]
    assert data[1]["amd"] == {"verdict": "human"} and data[0]["media"] == "early"
    assert data[2] == {"call_id": "c1", "agent": "sales", "epoch": 2, "tool_call_id": "tc1", "tool": "book_table",
                       "outcome": "ok"}
    assert data[3]["recording"] == "20260101T000000-c1.wav" and data[3]["reason"] == "hangup"
    assert tap_inner == [(2, "tc1", "book_table", "ok")]  # the inner observer still hears it
    hooks.ended({"blob": "x" * MAX_BODY}, None)
    assert hooks.too_large == 1 and len(w.got) == 4


# -- the courier against real receivers on loopback ---------------------------------------------


class Receiver:
    """An HTTP/1.1 server on 127.0.0.1 whose answers a test chooses, per request."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer  # async (headers, body, writer) -> None
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            self.requests.append((headers, body))
            await self.answer(headers, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def serve(self) -> AsyncIterator[Receiver]:
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self


def status(code: int, body: bytes = b"", extra: str = "") -> Any:
    async def answer(headers: dict[str, str], req: bytes, w: asyncio.StreamWriter) -> None:
        w.write(f"HTTP/1.1 {code} X\r\nContent-Length: {len(body)}\r\n{extra}Connection: close\r\n\r\n".encode() + body)
        await w.drain()
    return answer


def courier_for(tmp: Path, port: int, monkeypatch: pytest.MonkeyPatch, **hook: Any) -> Courier:
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    entry = {"url": f"http://127.0.0.1:{port}/in", "secret_env": "HOOK_SECRET", "allow_private": True,
             "retry_base_s": 0.05, "retry_cap_s": 0.2, **hook}
    cfg = parse_config({"agents": {"agents_dir": str(tmp)}, "webhooks": [entry]})
    return Courier(cfg, tmp / "o.sqlite3")


async def deliver(c: Courier, events: int, until: Any, timeout: float = 10.0) -> Outbox:
    ob = Outbox(c.path)
    ob.enqueue([(make_event("call.started", {"i": i}), Target("daemon", c.endpoints.daemon and
                                                                next(iter(c.endpoints.daemon)))) for i in range(events)],
               now=time.time())
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not until(c):  # noqa: ASYNC110 - polls the courier's counters
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 10)
    return ob


def test_the_courier_delivers_signed_posts_and_retries_a_500_until_a_200(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter([500, 503, 200, 200, 200])

    async def answer(headers: dict[str, str], body: bytes, w: asyncio.StreamWriter) -> None:
        await status(next(answers))(headers, body, w)

    async def main() -> tuple[Receiver, Outbox, Courier]:
        async with Receiver(answer).serve() as rx:
            c = courier_for(tmp_path, rx.port, monkeypatch)
            ob = await deliver(c, 3, lambda c: c.counters["delivered"] >= 3)
            return rx, ob, c

    rx, ob, c = asyncio.run(main())
    assert c.counters["delivered"] == 3 and c.counters["failed"] == 2 and c.failures == {"status": 2}
    assert len(rx.requests) == 5
    for headers, body in rx.requests:
        ev = verify_webhook(SECRET, headers["brisvox-signature"], body)  # signed at each attempt
        assert headers["brisvox-event-id"] == ev["id"] and headers["brisvox-event-type"] == "call.started"
        assert headers["content-type"] == "application/json"
    assert ob.counts(time.time())["delivered"] == 3
    assert sum(r["attempts"] for r in ob.rows()) == 5


def test_a_slow_receiver_is_timed_out_and_a_huge_body_is_not_read(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    release = asyncio.Event()

    async def slow(headers: dict[str, str], body: bytes, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")  # headers, then the body never comes
        await w.drain()
        await release.wait()

    async def main_slow() -> tuple[float, Courier]:
        async with Receiver(slow).serve() as rx:
            c = courier_for(tmp_path, rx.port, monkeypatch, timeout_s=0.5, horizon_s=1.0)
            t0 = time.monotonic()
            await deliver(c, 1, lambda c: c.counters["gave_up"] >= 1)
            release.set()
            return time.monotonic() - t0, c

    took, c = asyncio.run(main_slow())
    assert c.counters["delivered"] == 0 and c.failures.get("timeout", 0) >= 1 and c.counters["gave_up"] == 1
    assert took < 5.0

    sent = {"n": 0}

    async def huge(headers: dict[str, str], body: bytes, w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
        chunk = b"x" * 65536
        with contextlib.suppress(ConnectionError):
            for _ in range(1500):  # up to ~100 MB, unless the courier stops reading
                w.write(chunk)
                await w.drain()
                sent["n"] += len(chunk)

    async def main_huge() -> Courier:
        async with Receiver(huge).serve() as rx:
            c = courier_for(tmp_path / "h", rx.port, monkeypatch, timeout_s=5.0)
            await deliver(c, 1, lambda c: c.counters["delivered"] >= 1)
            return c

    (tmp_path / "h").mkdir()
    c = asyncio.run(main_huge())
    assert c.counters["delivered"] == 1  # the 200 counts; the body was cut at MAX_RESPONSE
    assert sent["n"] < 16 * 1024 * 1024, sent  # of ~98 MB offered: what the socket buffers took, no more


def test_the_courier_refuses_a_private_address_at_delivery_and_gives_up_a_removed_endpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> tuple[Receiver, Courier, Outbox]:
        async with Receiver(status(200)).serve() as rx:
            c = courier_for(tmp_path, rx.port, monkeypatch, allow_private=False, horizon_s=1.0)
            ob = Outbox(c.path)
            ob.enqueue([(make_event("call.ended", {}), Target("daemon", "https://gone.example.com/"))], now=time.time())
            await deliver(c, 1, lambda c: c.counters["gave_up"] >= 2)
            return rx, c, ob

    rx, c, ob = asyncio.run(main())
    assert rx.requests == []  # 127.0.0.1 without allow_private: never reached
    assert c.failures.get("address", 0) >= 1 and c.counters["unknown_endpoint"] == 1
    errors = {r["url"]: r["last_error"] for r in ob.rows()}
    assert errors["https://gone.example.com/"] == "endpoint no longer configured"
    assert "not public" in errors[f"http://127.0.0.1:{rx.port}/in"]


def test_agent_endpoints_are_read_from_the_agent_file_with_their_secret(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SALES_HOOK", "agent-secret")
    (tmp_path / "sales.toml").write_text('system_prompt = "x"\n[[webhooks]]\nurl = "https://s.example.com/h"\n'
                                         'secret_env = "SALES_HOOK"\nhorizon_s = 120\n')
    c = Courier(parse_config({"agents": {"agents_dir": str(tmp_path)}}), tmp_path / "o.sqlite3")
    ep = c.endpoints.get("agent:sales", "https://s.example.com/h")
    assert ep is not None and ep.secret == "agent-secret" and ep.settings.horizon_s == 120
    assert c.endpoints.get("agent:sales", "https://other.example.com/") is None
    assert c.endpoints.get("agent:../etc", "https://s.example.com/h") is None
    assert c.endpoints.get("agent:missing", "https://s.example.com/h") is None and "agent:missing" in c.endpoints.errors
    monkeypatch.delenv("SALES_HOOK")
    os.utime(tmp_path / "sales.toml", (1, 1))  # changed: read again, the secret is gone
    assert c.endpoints.get("agent:sales", "https://s.example.com/h") is None
    assert "SALES_HOOK is not set" in c.endpoints.errors["agent:sales"]


def test_campaign_row_done_goes_to_the_endpoints_that_want_it_once_committed(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from brisvox.outbound.webhooks.campaign_events import CampaignEvents

    monkeypatch.setenv("HOOK_SECRET", SECRET)
    monkeypatch.setenv("SALES_HOOK", "x")
    (tmp_path / "sales.toml").write_text('system_prompt = "x"\n[[webhooks]]\nurl = "https://s.example.com/h"\n'
                                         'secret_env = "SALES_HOOK"\nevents = ["campaign.row.done"]\n')
    cfg = parse_config({"agents": {"agents_dir": str(tmp_path)}, "webhooks": [
        {"url": "https://d.example.com/rows", "secret_env": "HOOK_SECRET", "events": ["campaign.row.done"]},
        {"url": "https://d.example.com/calls", "secret_env": "HOOK_SECRET", "events": ["call.ended"]}]})
    ce = CampaignEvents(cfg, state_dir=tmp_path / "state")

    async def main() -> bool:
        return await ce.row_done_committed("spring", 7, "answered", call_id="c9", agent="sales", attempts=2)

    assert asyncio.run(main())
    assert ce.close()
    rows = Outbox(tmp_path / "state" / "webhooks.sqlite3").rows()
    assert sorted((r["scope"], r["url"]) for r in rows) == [("agent:sales", "https://s.example.com/h"),
                                                            ("daemon", "https://d.example.com/rows")]
    assert rows[0]["event_id"] == rows[1]["event_id"] and rows[0]["type"] == "campaign.row.done"
    ce2 = CampaignEvents(cfg, state_dir=tmp_path / "state")
    assert ce2.targets("nobody") == ce2.targets(None) == [Target("daemon", "https://d.example.com/rows")]
    ce2.close()


def test_a_rows_event_sent_twice_is_one_outbox_row_under_the_rows_id(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from brisvox.outbound.campaign.service import RowEvents
    from brisvox.outbound.campaign.store import DoneRow
    from brisvox.outbound.webhooks.campaign_events import CampaignEvents, row_event_id

    monkeypatch.setenv("HOOK_SECRET", SECRET)
    cfg = parse_config({"agents": {"agents_dir": str(tmp_path)}, "webhooks": [
        {"url": "https://d.example.com/rows", "secret_env": "HOOK_SECRET", "events": ["campaign.row.done"]}]})
    ev = RowEvents(CampaignEvents(cfg, state_dir=tmp_path / "state"))
    row = DoneRow(5, 2, "spring", 1767139200.25, "sales", "+493010001", "unknown", 1, "")

    async def main() -> list[bool]:
        return [await ev.row_done(row), await ev.row_done(row)]  # a runner killed before marking it: sent again

    assert asyncio.run(main()) == [True, True]
    assert ev.close()
    rows = Outbox(tmp_path / "state" / "webhooks.sqlite3").rows()
    assert [(r["event_id"], r["type"]) for r in rows] == [(row_event_id(1767139200.25, 2, 5), "campaign.row.done")]
    nobody = RowEvents(CampaignEvents(parse_config({"agents": {"agents_dir": str(tmp_path)}, "webhooks": [
        {"url": "https://d.example.com/calls", "secret_env": "HOOK_SECRET", "events": ["call.ended"]}]}),
        state_dir=tmp_path / "s2"))
    assert asyncio.run(nobody.row_done(row))  # no endpoint wants it: nothing to send, done
    nobody.close()


def test_the_metrics_have_the_webhook_families() -> None:
    from brisvox.daemon.metrics import render

    snap = {"daemon": {"uptime_s": 1, "state": "running", "ready": True, "calls": 0}, "children": [
        {"role": "outbound", "index": 0, "name": "outbound-0", "state": "ready", "stats": {"webhooks": {
            "attempts": 3, "delivered": 2, "failed": 1, "gave_up": 0, "in_flight": 0, "failures": {"status": 1},
            "outbox": {"pending": 1, "delivered": 2, "gave_up": 0, "oldest_pending_age_s": 3.5},
            "latency": {"le": [0.1, 1.0], "counts": [1, 2, 2], "sum": 0.3, "count": 2}}}},
        {"role": "agent", "index": 0, "name": "agent-0", "state": "ready",
         "stats": {"webhooks": {"committed": 3, "dropped": 1, "failed": 0, "queued": 0}}}]}
    text = render(snap)
    for line in ['brisvox_webhook_deliveries_total{result="delivered"} 2', 'brisvox_webhook_events_total{result="dropped"} 1',
                 'brisvox_webhook_outbox_rows{state="pending"} 1', "brisvox_webhook_oldest_pending_seconds 3.5",
                 'brisvox_webhook_attempt_failures_total{kind="status"} 1',
                 'brisvox_webhook_delivery_seconds_bucket{le="+Inf"} 2', 'brisvox_children{role="outbound",state="ready"} 1']:
        assert line in text.splitlines(), line


def test_the_supervisor_table_has_an_outbound_slot_only_with_webhooks_and_a_reload_adds_or_drops_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from brisvox.daemon.child_table import ChildTable
    from brisvox.daemon.roles import ROLE_MAINS
    from brisvox.daemon.shutdown import STOP_PHASES
    from brisvox.daemon.slots import State

    monkeypatch.setenv("HOOK_SECRET", SECRET)
    base = {"agents": {"agents_dir": str(tmp_path)}}
    with_hooks = parse_config({**base, "webhooks": [{"url": "https://h.example.com/", "secret_env": "HOOK_SECRET"}]})
    without = parse_config(base)
    cfg = {"now": without}
    table = ChildTable(lambda: cfg["now"], tmp_path, os.getpid())
    assert [s.name for s in table.slots if s.role == "outbound"] == []
    retried, to_stop = table.rescale(with_hooks, 0.0)
    assert [s.name for s in table.slots][-1] == "outbound-0" and to_stop == []
    assert ROLE_MAINS["outbound"] == "brisvox.outbound.process:main"
    assert "outbound" in STOP_PHASES[-1]  # stops with the workers, after the calls
    slot = table.slots[-1]
    slot.state = State.READY
    _, to_stop = table.rescale(without, 1.0)
    assert to_stop == [slot] and slot.remove and slot.retired  # drained, then removed when it exits


def test_with_answering_machine_detection_call_answered_waits_for_the_verdict() -> None:
    t = HookRoutes([WebhookSettings(url="https://d.example.com/all")]).targets("a", [])
    w = _Writer()
    hooks = CallHooks(w, t, "c1", "a", expect_amd=True)  # type: ignore[arg-type]
    hooks.on_media("answered")
    assert w.got == []  # the verdict is not known yet
    hooks.amd({"verdict": "machine", "confidence": 0.93})
    hooks.amd({"verdict": "human"})  # once
    (ev, _), = w.got
    data = orjson.loads(ev.body)["data"]
    assert data["amd"] == {"verdict": "machine", "confidence": 0.93} and data["answered_at"] <= time.time() + 0.001  # rounded to the ms
    w2 = _Writer()
    h2 = CallHooks(w2, t, "c2", "a", expect_amd=True)  # type: ignore[arg-type]
    h2.on_media("answered")
    h2.ended({"end_reason": "caller_hangup"}, None)  # ended before the verdict: answered (amd null), then ended
    assert [(orjson.loads(e.body)["type"], orjson.loads(e.body)["data"].get("amd")) for e, _ in w2.got] == [
        ("call.answered", None), ("call.ended", None)]
    w3 = _Writer()
    CallHooks(w3, t, "c3", "a").ended({"end_reason": "no_answer"}, None)  # never answered: no call.answered
    assert [orjson.loads(e.body)["type"] for e, _ in w3.got] == ["call.ended"]


class _Rt:
    """The ChildRuntime members the outbound main uses, recorded."""

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.callbacks: list[Any] = []
        self.readied = 0
        self.reports: list[dict[str, Any]] = []

    def add_shutdown_callback(self, cb: Any) -> None:
        self.callbacks.append(cb)

    def ready(self, endpoints: Any = None, measured: Any = None) -> None:
        self.readied += 1

    def heartbeat(self) -> None:
        pass

    def report(self, calls: int, stats: dict[str, Any] | None = None) -> None:
        self.reports.append(dict(stats or {}))

    def stop(self) -> None:
        self.stopping.set()
        for cb in self.callbacks:
            cb()


class _Service:
    def __init__(self, name: str, fail: bool = False, forever: bool = True) -> None:
        self.name, self.fail, self.forever, self.stopped = name, fail, forever, False

    async def run(self, stop: asyncio.Event) -> None:
        if self.fail:
            raise RuntimeError("boom")
        if self.forever:
            await stop.wait()
            self.stopped = True

    def stats(self) -> dict[str, Any]:
        return {"ok": 1}


def test_the_outbound_main_runs_its_services_survives_a_failing_one_and_stops_them() -> None:
    from brisvox.outbound.process import run_services

    rt = _Rt()
    good, bad = _Service("good"), _Service("bad", fail=True)

    async def main() -> int:
        loop = asyncio.get_running_loop()
        loop.call_later(0.8, rt.stop)
        return await run_services(rt, [good, bad])

    assert asyncio.run(main()) == 0
    assert rt.readied == 1 and good.stopped
    assert rt.reports and rt.reports[-1] == {"good": {"ok": 1}, "bad": {"ok": 1}}
    # every service ended without a stop: the role exits 1 (the supervisor restarts it)
    rt2 = _Rt()
    assert asyncio.run(run_services(rt2, [_Service("done", forever=False)])) == 1


def test_the_courier_connects_to_the_address_it_checked_never_to_a_second_resolution(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: the name answers a public address to the check, a private one after it.

    The test's transport stands for the network: a request addressed to a name is resolved
    there (as httpx would: the second answer, the private address, an internal server on
    loopback); one addressed to the public-looking IP reaches the "public" loopback server."""
    import httpx

    public, private = "93.184.216.34", "10.0.0.7"
    answers = [[public], [private], [private], [private]]
    asked: list[str] = []

    def resolve(host: str) -> list[str]:
        asked.append(host)
        return answers[min(len(asked) - 1, len(answers) - 1)]

    seen: list[tuple[str, str, Any]] = []

    async def main() -> tuple[Receiver, Receiver, Courier]:
        async with Receiver(status(200)).serve() as pub, Receiver(status(200)).serve() as internal:
            inner = httpx.AsyncHTTPTransport()

            class Network(httpx.AsyncBaseTransport):
                async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
                    host = request.url.host
                    seen.append((host, request.headers.get("host", ""), request.extensions.get("sni_hostname")))
                    ip = host if host[0].isdigit() else resolve(host)[0]  # a name: resolved again
                    port = pub.port if ip == public else internal.port
                    fwd = httpx.Request(request.method, f"http://127.0.0.1:{port}{request.url.raw_path.decode()}",
                                        headers=request.headers, content=await request.aread())
                    return await inner.handle_async_request(fwd)

            monkeypatch.setenv("HOOK_SECRET", SECRET)
            cfg = parse_config({"agents": {"agents_dir": str(tmp_path)}, "webhooks": [
                {"url": "https://hooks.example.test:8443/in", "secret_env": "HOOK_SECRET", "retry_base_s": 0.05,
                 "retry_cap_s": 0.2}]})
            c = Courier(cfg, tmp_path / "o.sqlite3", resolve=resolve, transport=Network())
            await deliver(c, 1, lambda c: c.counters["delivered"] >= 1)
            await inner.aclose()
            return pub, internal, c

    pub, internal, c = asyncio.run(main())
    assert c.counters["delivered"] == 1
    assert internal.requests == []  # the private address was never connected
    assert asked == ["hooks.example.test"]  # resolved once: by the check
    assert seen == [(public, "hooks.example.test:8443", "hooks.example.test")]  # to the IP, Host and SNI the name
    headers, body = pub.requests[0]
    assert headers["host"] == "hooks.example.test:8443"
    assert verify_webhook(SECRET, headers["brisvox-signature"], body)["type"] == "call.started"


def test_pinned_keeps_literal_hosts_and_brackets_ipv6() -> None:
    from brisvox.outbound.webhooks.courier import pinned

    h: dict[str, str] = {}
    assert pinned("https://h.example.com/a?b=1", "2606:2800:220:1::1", h) == (
        "https://[2606:2800:220:1::1]/a?b=1", {"sni_hostname": "h.example.com"})
    assert h == {"Host": "h.example.com"}
    h = {}
    assert pinned("http://127.0.0.1:9/x", "127.0.0.1", h) == ("http://127.0.0.1:9/x", {}) and h == {}
