"""The courier's pinned connection keeps TLS checked against the URL's name, on loopback.

A TLS receiver on 127.0.0.1 holds a certificate for ``hooks.example.test`` only (made here
with openssl); the courier's resolver answers 127.0.0.1 for that name. The courier connects
to the address it checked (the request addressed to 127.0.0.1) and sends the name as SNI
and checks the certificate against it (httpcore's ``sni_hostname``): the delivery succeeds.
The same receiver with a certificate for another name is refused (the check is real), and
no name is ever looked up by anyone but the courier's resolver (``hooks.example.test`` does
not resolve on this host: a second lookup would fail the delivery).
"""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from brisvox.config.daemon import parse_config
from brisvox.outbound.webhooks.courier import Courier
from brisvox.outbound.webhooks.events import make_event
from brisvox.outbound.webhooks.outbox import Outbox, Target
from tests.system.gateway_harness import have

pytestmark = [pytest.mark.system, pytest.mark.skipif(not have("openssl"), reason="needs openssl")]
NAME = "hooks.example.test"


def cert_for(tmp: Path, name: str) -> tuple[str, str]:
    cert, key = tmp / f"{name}.pem", tmp / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
                    "-addext", f"subjectAltName=DNS:{name}", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return str(cert), str(key)


async def deliver_once(tmp: Path, server_cert: tuple[str, str], trusted: str,
                       monkeypatch: pytest.MonkeyPatch) -> tuple[Courier, list[str], list[bytes]]:
    import httpx

    got: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            got.append(head)
            n = next(int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length"))
            await asyncio.wait_for(reader.readexactly(n), 5)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, ssl.SSLError):
            pass
        finally:
            writer.close()

    sctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    sctx.load_cert_chain(*server_cert)
    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=sctx)
    port = server.sockets[0].getsockname()[1]
    asked: list[str] = []

    def resolve(host: str) -> list[str]:
        asked.append(host)
        return ["127.0.0.1"]

    monkeypatch.setenv("HOOK_SECRET", "whsec_tls")
    cfg = parse_config({"agents": {"agents_dir": str(tmp)}, "webhooks": [
        {"url": f"https://{NAME}:{port}/in", "secret_env": "HOOK_SECRET", "allow_private": True,
         "timeout_s": 3.0, "horizon_s": 1.0, "retry_base_s": 0.05, "retry_cap_s": 0.1}]})
    c = Courier(cfg, tmp / "o.sqlite3", resolve=resolve,
                transport=httpx.AsyncHTTPTransport(verify=ssl.create_default_context(cafile=trusted)))
    Outbox(c.path).enqueue([(make_event("call.started", {}), Target("daemon", f"https://{NAME}:{port}/in"))],
                           now=time.time())
    stop = asyncio.Event()
    task = asyncio.create_task(c.run(stop))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (c.counters["delivered"] or c.counters["gave_up"]):  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 10)
    server.close()
    await server.wait_closed()
    return c, asked, got


def test_a_pinned_delivery_checks_the_certificate_against_the_urls_name(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    good = cert_for(tmp_path, NAME)
    c, asked, got = asyncio.run(deliver_once(tmp_path / "a", good, good[0], monkeypatch))
    assert c.counters["delivered"] == 1, (c.counters, c.failures)
    assert set(asked) == {NAME}
    assert f"host: {NAME}:".encode() in got[0].lower()


def test_a_certificate_for_another_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = cert_for(tmp_path, "other.example.test")
    c, _, got = asyncio.run(deliver_once(tmp_path / "b", other, other[0], monkeypatch))
    assert c.counters["delivered"] == 0 and c.counters["gave_up"] == 1 and got == []
