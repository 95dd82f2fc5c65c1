"""Operations surface of brisvoxd: sd_notify, /metrics and /healthz, garbage on every endpoint."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import zmq

from bench.harness.daemon import Daemon, cli, write_config
from ipc.bus import endpoint, make_socket, request_sync
from ipc.codec import encode
from ipc.frames import Command, Pong
from tests.system.daemon_promparse import parse, value

pytestmark = pytest.mark.system


@pytest.fixture
def daemon(short_tmp):
    made: list[Daemon] = []

    def make(**kw) -> Daemon:
        d = Daemon(short_tmp, **kw)
        made.append(d)
        return d.start()

    yield make
    for d in made:
        d.close()


def test_notify_socket_ready_after_every_child_then_watchdog_status_stopping(short_tmp, daemon):
    path = str(short_tmp / "notify")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(0.2)
    got: list[tuple[float, str]] = []
    at_ready: dict = {}
    stop = threading.Event()
    run_dir = short_tmp / "run"

    def reader() -> None:
        while not stop.is_set():
            try:
                msg = sock.recv(4096).decode()
            except TimeoutError:
                continue
            got.append((time.monotonic(), msg))
            if "READY=1" in msg.split("\n") and not at_ready:
                # what the daemon looks like the moment READY=1 arrives
                at_ready.update(request_sync(endpoint(run_dir, "control"), Command(name="status"), 3.0).data)

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        t0 = time.monotonic()
        d = daemon(env={"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "400000",
                        "BRISVOX_TEST_ROLE_MAIN": "agent-0=tests.system.daemon_roles:slow_boot"})
        deadline = time.monotonic() + 10
        while not at_ready and time.monotonic() < deadline:
            time.sleep(0.02)
        assert at_ready, f"no READY=1; got {got}\n{d.logs()}"
        ready_at = next(ts for ts, m in got if "READY=1" in m.split("\n"))
        assert ready_at - t0 >= 0.7  # the slow agent's handshake came first
        assert [c["state"] for c in at_ready["children"]] == ["ready"] * 4
        assert not any("READY=1" in m for ts, m in got if ts < ready_at)
        time.sleep(1.0)
        msgs = [m for _, m in got]
        assert sum("WATCHDOG=1" in m.split("\n") for m in msgs) >= 3
        assert any("STATUS=gateway 1/1, workers 2/2, agents 1/1 ready; 0 calls" in m for m in msgs)

        n_before = len(got)
        r = cli("drain", "--timeout", "3", "--config", str(d.config))
        assert r.returncode == 0, r.stderr
        assert d.wait_exit() == 0
        after = [m for _, m in got[n_before:]]
        assert any("STOPPING=1" in m.split("\n") for m in after)
        assert sum("READY=1" in m.split("\n") for _, m in got) == 1
    finally:
        stop.set()
        t.join(2)
        sock.close()


def test_metrics_parse_as_prometheus_text_and_healthz(short_tmp, daemon):
    d = daemon()
    d.wait_ready()
    d.wait_for(lambda s: all(c["pss_bytes"] for c in s["children"]) and all(c["stats"] for c in s["children"]),
               5.0, "memory and stats sampled")
    code, text = d.metrics_text()
    assert code == 200
    fams = parse(text)
    for name, fam in fams.items():
        assert fam["help"], name
        if fam["type"] == "counter":
            assert name.endswith("_total"), name
    assert value(fams, "brisvox_up") == 1
    assert value(fams, "brisvox_daemon_ready") == 1
    assert value(fams, "brisvox_daemon_state", state="running") == 1
    assert value(fams, "brisvox_children", role="worker", state="ready") == 2
    assert value(fams, "brisvox_children", role="gateway", state="ready") == 1
    assert value(fams, "brisvox_children", role="agent", state="failed") == 0
    snap = d.status()
    for c in snap["children"]:
        labels = {"role": c["role"], "index": str(c["index"])}
        assert value(fams, "brisvox_child_up", **labels) == 1
        assert value(fams, "brisvox_child_restarts_total", **labels) == 0
        assert value(fams, "brisvox_child_memory_pss_bytes", **labels) > 1 << 20
        assert value(fams, "brisvox_child_stat", stat="requests", **labels) == 0
    code, body = d.metrics_text("/healthz")
    assert code == 200 and json.loads(body)["status"] == "ok"
    code, _ = d.metrics_text("/nope")
    assert code == 404
    d.command("stop")
    assert d.wait_exit() == 0


def _http_raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
        s.sendall(data)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (ConnectionResetError, TimeoutError):
            pass
        return out


def test_garbage_on_every_endpoint_is_counted_and_dropped(short_tmp, daemon):
    d = daemon(config=write_config(short_tmp, workers=2, agents=1))
    snap = d.wait_ready()
    before = {c["name"]: c["pid"] for c in snap["children"]}
    ctx = zmq.Context()
    socks = []
    try:
        def dealer(ep: str, identity: bytes | None = None):
            s = make_socket(ctx, zmq.DEALER, identity=identity)
            s.connect(ep)
            socks.append(s)
            return s

        sup = dealer(endpoint(d.run_dir, "supervisor"))
        sup.send(b"\x00\xffgarbage")
        sup.send(b'{"type":"hello","role":1}')
        sup.send_multipart([b"two", b"parts"])
        forged = dealer(endpoint(d.run_dir, "supervisor"), identity=b"worker-0:1")
        forged.send(encode(Pong(seq=1, sent_ns=0)))

        ctl = dealer(endpoint(d.run_dir, "control"))
        ctl.send(b"not json")
        ctl.send(b"[1,2,3]")
        ctl.send(b"x" * 300_000)

        for c in snap["children"]:
            s = dealer(c["endpoints"]["inbox"], identity=b"fuzz-0")
            s.send(b"\x00garbage")
            s.send(b'{"type":"no_such_frame"}')
            s.send(b"{" * 300_000)

        port = int(snap["daemon"]["metrics_url"].rsplit(":", 1)[1].split("/")[0])
        assert _http_raw(port, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.0 400")
        assert _http_raw(port, b"A" * 9000).startswith(b"HTTP/1.0 431")

        def counted(s: dict) -> bool:
            de = s["daemon"]["decode_errors"]
            if de["supervisor"].get("malformed", 0) < 2 or de["supervisor"].get("bad_field", 0) < 1:
                return False
            if de["supervisor"].get("unknown_peer", 0) < 1:
                return False
            if de["control"].get("malformed", 0) < 2 or de["control"].get("oversized", 0) < 1:
                return False
            for c in s["children"]:
                e = (c["stats"] or {}).get("decode_errors", {})
                if e.get("malformed", 0) < 1 or e.get("unknown_type", 0) < 1 or e.get("oversized", 0) < 1:
                    return False
            return True

        snap = d.wait_for(counted, 5.0, "every endpoint counted its garbage")
        assert {c["name"]: c["pid"] for c in snap["children"]} == before
        assert all(c["state"] == "ready" for c in snap["children"])
        code, text = d.metrics_text()
        fams = parse(text)
        assert value(fams, "brisvox_decode_errors_total", process="control", kind="oversized") == 1
        assert value(fams, "brisvox_decode_errors_total", process="worker-1", kind="unknown_type") == 1
        # still serving: a real command and a real request to a child
        assert d.command("status").ok
        w = dealer(snap["children"][1]["endpoints"]["inbox"], identity=b"test-1")
        w.send(encode(Command(name="x"), cid=5))
        assert w.poll(3000)
    finally:
        for s in socks:
            s.close(0)
        ctx.term()
    d.command("stop")
    assert d.wait_exit() == 0


def test_registered_role_mains_boot_survive_garbage_and_stop(short_tmp, daemon):
    """The real ROLE_MAINS (whatever the role owners registered) under the real supervisor."""
    from ipc.ring import SHM_DIR

    d = daemon(config=write_config(short_tmp, workers=2, agents=1), real_roles=True)
    snap = d.wait_ready(timeout=60)
    before = {c["name"]: c["pid"] for c in snap["children"]}
    ctx = zmq.Context()
    try:
        for c in snap["children"]:
            inbox = (c["endpoints"] or {}).get("inbox") or endpoint(d.run_dir, c["name"])
            s = make_socket(ctx, zmq.DEALER, identity=b"fuzz-1")
            s.connect(inbox)
            for junk in (b"\x00garbage", b'{"type":"no_such_frame"}', b"[]", b"{" * 300_000):
                s.send(junk)
            s.close(linger=500)
    finally:
        ctx.term()
    time.sleep(1.0)
    snap = d.status()
    assert {c["name"]: c["pid"] for c in snap["children"]} == before
    assert all(c["state"] == "ready" for c in snap["children"]), snap["children"]
    inst = snap["daemon"]["instance"]
    r = cli("stop", "--config", str(d.config))
    assert r.returncode == 0, r.stderr
    assert d.wait_exit(60) == 0
    assert not list(SHM_DIR.glob(f"brisvox.{inst}.*"))
