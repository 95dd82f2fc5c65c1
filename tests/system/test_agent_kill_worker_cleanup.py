"""SIGKILL of an agent process leaves nothing behind in the worker.

The whole daemon (gateway, one worker, one agent process with the scripted
providers) serves a few WebSocket calls that stay open; the test SIGKILLs the
agent process (by the pid the status names, a process this test's daemon
started). The gateway ends its calls and unlinks their rings; the supervisor
restarts the agent under the same identity (``agent-0``), whose new
incarnation says hello to the worker. Checked from outside:

* within 5 s of the restarted agent being ready, the worker serves no call
  (it retired exactly the dead incarnation's calls: ``retired_calls``), well
  before its orphan timeout (10 s) could have done it;
* no process of the daemon maps a deleted ``/dev/shm`` segment of the
  instance (``/proc/<pid>/maps``), i.e. the worker unmapped what the gateway
  unlinked;
* after a clean stop, ``/dev/shm`` holds no segment of the instance.

Teardown kills the daemon's process group and removes the instance's
segments even when an assertion fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import orjson
import pytest

from bench.harness.call_daemon import config
from bench.harness.daemon import Daemon, wait_dead, ws_port
from ipc.ring import SHM_DIR

pytestmark = pytest.mark.system

N_CALLS = 4
FRAME = b"\0\0" * 160  # 20 ms of silence at 8 kHz


def deleted_shm(pids: list[int], instance: str) -> dict[int, list[str]]:
    """The deleted /dev/shm segments of ``instance`` each process still maps."""
    out: dict[int, list[str]] = {}
    tag = f"/dev/shm/brisvox.{instance}."
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue  # gone
        bad = sorted({ln.split(None, 5)[-1] for ln in lines if tag in ln and "(deleted)" in ln})
        if bad:
            out[pid] = bad
    return out


class Callers:
    """``n`` native WebSocket calls that send silence until the gateway ends them
    (or :meth:`stop`), on their own thread and event loop."""

    def __init__(self, port: int, n: int) -> None:
        self.port = port
        self.n = n
        self.started: list[str] = []
        self.ended = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._all()), daemon=True)

    def start(self) -> Callers:
        self._thread.start()
        return self

    async def _all(self) -> None:
        await asyncio.gather(*(self._one() for _ in range(self.n)), return_exceptions=True)

    async def _one(self) -> None:
        from websockets.asyncio.client import connect
        from websockets.exceptions import ConnectionClosed

        from brisvox.wire.native import NativeStream, server_message

        try:
            async with connect(f"ws://127.0.0.1:{self.port}/ws/default", max_size=2**20,
                               open_timeout=5, close_timeout=1) as ws:
                await ws.send(NativeStream(8000).start())
                async with asyncio.timeout(10):
                    started = server_message(orjson.loads(await ws.recv()))
                assert started.event == "started", started
                self.started.append(started.call_id)

                async def drain() -> None:
                    async for _ in ws:
                        pass

                rx = asyncio.create_task(drain())
                deadline = time.monotonic() + 40  # bounded even if nobody ends the call
                with contextlib.suppress(ConnectionClosed):
                    while not self._stop.is_set() and not rx.done() and time.monotonic() < deadline:
                        await ws.send(FRAME)
                        await asyncio.sleep(0.02)
                    if not rx.done():
                        await ws.send(NativeStream.stop())
                rx.cancel()
        finally:
            self.ended += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.serial  # the worker drops the calls within 5 s
def test_sigkill_of_an_agent_process_leaves_no_call_and_no_mapping_in_the_worker(short_tmp):
    script = short_tmp / "script.json"
    script.write_bytes(orjson.dumps({"user": ["hello"], "bot": ["Hello there."]}))
    d = Daemon(short_tmp, config=config(short_tmp, script), real_roles=True)
    callers: Callers | None = None
    try:
        d.start()
        snap = d.wait_ready(45)
        inst = d.instance
        gw = d.child(snap, "gateway-0")
        port = ws_port(gw)
        callers = Callers(port, N_CALLS).start()
        snap = d.wait_for(lambda s: d.child(s, "worker-0")["calls"] == N_CALLS
                          and d.child(s, "agent-0")["calls"] == N_CALLS, 15, "every call attached")
        assert d.child(snap, "worker-0")["stats"]["calls_by_subscriber"] == {"agent-0": N_CALLS}
        agent = d.child(snap, "agent-0")
        victim, restarts = agent["pid"], agent["restarts"]
        assert Path(f"/proc/{victim}/cmdline").read_bytes().startswith(b"brisvoxd:")  # ours, alive
        os.kill(victim, signal.SIGKILL)
        assert wait_dead([victim], 5) == []
        snap = d.wait_for(lambda s: d.child(s, "agent-0")["restarts"] > restarts
                          and d.child(s, "agent-0")["state"] == "ready"
                          and d.child(s, "agent-0")["pid"] != victim, 20, "agent-0 restarted and ready")
        back = time.monotonic()
        snap = d.wait_for(lambda s: d.child(s, "worker-0")["calls"] == 0
                          and d.child(s, "worker-0")["stats"]["retired_calls"] == N_CALLS, 5,
                          "the worker retired the dead incarnation's calls")
        took = time.monotonic() - back
        w = d.child(snap, "worker-0")["stats"]
        assert w["orphan_detaches"] == 0 and w["retirements"] == 1 and w["calls_by_subscriber"] == {}, w
        # the gateway ended the calls and unlinked their rings; nobody maps one any more
        pids = [c["pid"] for c in snap["children"] if c["pid"]] + [d.proc.pid]
        deadline = time.monotonic() + 5
        while (left := deleted_shm(pids, inst)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not left, f"deleted segments still mapped: {left}"
        deadline = time.monotonic() + 5
        while callers.ended < N_CALLS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert callers.ended == N_CALLS  # the gateway ended every call of the dead agent
        assert took < 5.0
        d.command("stop")
        assert d.wait_exit(15) == 0
        left_segments = sorted(p.name for p in SHM_DIR.glob(f"brisvox.{inst}.*"))
        assert not left_segments, left_segments
    finally:
        if callers is not None:
            callers.stop()
        d.close()
