"""The chaos run's fault schedule and the probes of the daemon's processes.

:class:`FaultScheduler` runs a list of :class:`Fault` (an offset in seconds
from the start of the run, a kind, an argument) on its own thread:

* ``kill`` (argument: a child name, ``worker-1`` / ``agent-1``): read the
  calls the child maps (``/proc/<pid>/maps``: the call rings it has open),
  and for an agent process also the calls the gateway placed on it (its
  ``calls`` command: a call whose CallStart is still being handled there maps
  no ring yet), check the pid is a ``brisvoxd:`` process of this daemon,
  SIGKILL it; the event keeps the pid, the time and the call ids;
* ``arm`` (argument: ``fault:count``): arm a vendor fault
  (:meth:`.vendors.VendorProcess.arm`).

The probes (:func:`snapshot`) read, over the daemon's whole process tree:
processes (pid, name), open fds, PSS and RSS, the instance's /dev/shm
segments, and the deleted segments each process still maps.

Invariants: only pids read from this daemon's status and found to be
``brisvoxd:`` processes are signalled; every fault runs at most once; a
fault that fails is recorded (``error``), never raised into the run; the
thread ends by itself after the last fault (or at :meth:`stop`).
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.harness.chaos.vendors import VendorProcess
from bench.harness.daemon import Daemon
from ipc.bus import endpoint, request_sync
from ipc.frames import Command
from ipc.ring import SHM_DIR


@dataclass(frozen=True)
class Fault:
    at: float  # seconds after the start of the run
    kind: str  # kill | arm
    arg: str


@dataclass
class FaultEvent:
    fault: Fault
    t: float = 0.0  # monotonic time it ran
    pid: int = 0
    calls: list[str] = field(default_factory=list)
    error: str = ""


KEY_SUFFIX = re.compile(r"-[0-9a-f]{16,64}$")  # a ring name's random key after the call id (ipc.ring.ring_name)


def mapped_calls(pid: int, instance: str) -> set[str]:
    """Call ids of the instance's rings that ``pid`` maps."""
    pat = re.compile(rf"/dev/shm/brisvox\.{re.escape(instance)}\.([A-Za-z0-9_-]+)\.[a-z0-9]+")
    try:
        text = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return set()
    return {KEY_SUFFIX.sub("", m.group(1)) for m in pat.finditer(text)}  # <call>-<ring key>: the call


def deleted_shm(pids: list[int], instance: str) -> dict[int, list[str]]:
    """The deleted /dev/shm segments of ``instance`` each process still maps."""
    out: dict[int, list[str]] = {}
    tag = f"/dev/shm/brisvox.{instance}."
    for pid in pids:
        try:
            lines = Path(f"/proc/{pid}/maps").read_text().splitlines()
        except OSError:
            continue
        bad = sorted({ln.split(None, 5)[-1] for ln in lines if tag in ln and "(deleted)" in ln})
        if bad:
            out[pid] = bad
    return out


def tree(root: int) -> list[psutil.Process]:
    try:
        p = psutil.Process(root)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


@dataclass
class Snapshot:
    procs: dict[int, str]  # pid -> name (cmdline)
    fds: dict[int, int]
    pss: int
    rss: int
    segments: list[str]
    deleted_maps: dict[int, list[str]]
    zombies: int
    pss_by: dict[int, int]

    def by_name(self, per_pid: dict[int, int]) -> dict[str, int]:
        """Per child name (restarted children keep their name, not their pid)."""
        out: dict[str, int] = {}
        for pid, v in per_pid.items():
            name = " ".join(self.procs.get(pid, str(pid)).split()[:3])
            out[name] = out.get(name, 0) + v
        return out

    @property
    def fd_total(self) -> int:
        return sum(self.fds.values())

    def names(self) -> list[str]:
        return sorted(self.procs.values())


def snapshot(d: Daemon) -> Snapshot:
    assert d.proc is not None
    procs: dict[int, str] = {}
    fds: dict[int, int] = {}
    pss = rss = zombies = 0
    pss_by: dict[int, int] = {}
    for p in tree(d.proc.pid):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                zombies += 1
                continue
            procs[p.pid] = " ".join(p.cmdline()) or p.name()
            fds[p.pid] = len(os.listdir(f"/proc/{p.pid}/fd"))
            mi = p.memory_full_info()
            pss_by[p.pid] = getattr(mi, "pss", mi.rss)
            pss += pss_by[p.pid]
            rss += mi.rss
        except (psutil.Error, OSError):
            continue
    segs = sorted(x.name for x in SHM_DIR.glob(f"brisvox.{d.instance}.*")) if d.instance else []
    return Snapshot(procs, fds, pss, rss, segs, deleted_shm(list(procs), d.instance), zombies, pss_by)


class FaultScheduler:
    def __init__(self, d: Daemon, vendors: VendorProcess, faults: list[Fault]) -> None:
        self.d = d
        self.vendors = vendors
        self.faults = sorted(faults, key=lambda f: f.at)
        self.events: list[FaultEvent] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.t0 = 0.0

    def start(self, t0: float) -> FaultScheduler:
        self.t0 = t0
        self._thread = threading.Thread(target=self._run, name="chaos-faults", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        for f in self.faults:
            if self._stop.wait(max(0.0, self.t0 + f.at - time.monotonic())):
                return
            ev = FaultEvent(f)
            try:
                if f.kind == "kill":
                    self._kill(f.arg, ev)
                elif f.kind == "arm":
                    name, _, count = f.arg.partition(":")
                    ev.t = time.monotonic()
                    self.vendors.arm(name, int(count or 1))
                else:
                    ev.error = f"unknown fault kind {f.kind!r}"
            except Exception as e:  # noqa: BLE001 - recorded, judged
                ev.error = f"{type(e).__name__}: {e}"
            self.events.append(ev)

    def _kill(self, name: str, ev: FaultEvent) -> None:
        snap = self.d.status()
        child = self.d.child(snap, name)
        pid = int(child["pid"] or 0)
        if not pid or not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"brisvoxd:"):
            raise RuntimeError(f"{name} (pid {pid}) is not a live brisvoxd child")
        calls = mapped_calls(pid, self.d.instance)
        if name.startswith("agent"):
            calls |= self._placed_on(name)
        ev.calls = sorted(calls)
        ev.pid = pid
        ev.t = time.monotonic()
        os.kill(pid, signal.SIGKILL)

    def _placed_on(self, name: str) -> set[str]:
        """The live calls the gateway placed on agent process ``name`` (its ``calls`` command)."""
        reply = request_sync(endpoint(self.d.run_dir, "gateway-0"), Command(name="calls"), 2.0)
        table = getattr(reply, "data", None) or {}
        return {cid for cid, c in table.items() if c.get("agent_proc") == name and not c.get("transport_done")}

    def join(self, timeout: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self) -> None:
        self._stop.set()
        self.join(5.0)

    def event(self, kind: str, arg: str) -> FaultEvent | None:
        return next((e for e in self.events if e.fault.kind == kind and e.fault.arg.startswith(arg)), None)

    def as_json(self) -> list[dict[str, Any]]:
        return [{"at": e.fault.at, "kind": e.fault.kind, "arg": e.fault.arg, "t": e.t - self.t0 if e.t else None,
                 "pid": e.pid, "calls": len(e.calls), "error": e.error} for e in self.events]
