"""The supervisor's command plane and views: control.sock, reload, status, HTTP (a part of the arbiter).

Owns what operators ask of the daemon (:class:`CommandPlane`, mixed into
:class:`~brisvox.daemon.arbiter.Arbiter`): the ROUTER ``control.sock``
(``brisvoxd status|stop|drain|reload``), the reload of the config file, and
the views of the daemon: the status line (sd_notify, logs), the snapshot
(``status``, ``/metrics``) and the ``/metrics`` and ``/healthz`` answers.

Invariants:

* Every frame that decodes gets exactly one reply (a ``CommandReply``; ``ok``
  False with an error for an unknown command, a bad argument or a frame that
  is not a command, which is also counted as ``unexpected_type`` and logged
  once per type); one that does not decode is counted and dropped. Frames
  are dispatched by one table (:meth:`CommandPlane.control_frame_handlers`).
* A reload that fails (a configuration error) keeps the running
  configuration; what cannot change live (``runtime_dir``, ``state_dir``,
  ``metrics``, ``log.format``) is kept and reported as changing at the next
  start. A reload retries failed children and scales workers and agents to
  the new counts (a scaled-down slot is drained, then removed).
* No reload while draining or stopping.
* ``/healthz`` is 200 only while running with every child ready.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from brisvox.config.daemon import DaemonConfig, load_config
from brisvox.config.errors import ConfigError
from brisvox.daemon.child_table import ROLE_ORDER
from brisvox.daemon.slots import Slot, State

if TYPE_CHECKING:
    from collections.abc import Callable

    from ipc.codec import DecodeGuard

def resolve_log_format(cfg: DaemonConfig, stream: Any = None) -> DaemonConfig:
    """Turn ``format = "auto"`` into json or text (text only on a terminal)."""
    lg = cfg.daemon.log
    if lg.format != "auto":
        return cfg
    stream = sys.stderr if stream is None else stream
    fmt: Literal["json", "text"] = "text" if hasattr(stream, "isatty") and stream.isatty() else "json"
    return dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, log=dataclasses.replace(lg, format=fmt)))


class CommandPlane:
    """Commands, reload and the views of the daemon."""

    config: DaemonConfig
    cli_counts: tuple[int | None, int | None]
    rdir: Path
    sdir: Path
    pid: int
    instance: str
    state: str
    ready_sent: bool
    started_at: float
    started_wall: float
    stop_reason: str
    drain_timeout_s: float
    slots: list[Slot]
    control: Any
    control_guard: DecodeGuard
    chan_guard: DecodeGuard
    http: Any
    log_lines: collections.Counter[str]
    send_failed: int
    pss: int | None
    topology_dirty: bool
    control_handlers: dict[type, Callable[[Any], Any]]

    if TYPE_CHECKING:  # from the other parts of the arbiter
        def begin_stop(self, drain: bool, reason: str) -> None: ...
        def stop_child(self, slot: Slot, reason: str, drain: bool, grace_s: float, now: float) -> None: ...

    def control_frame_handlers(self) -> dict[type, Callable[[Any], Any]]:
        """The command plane's dispatch table: frame class -> ``handler(frame) -> CommandReply``."""
        from ipc.frames import Command

        return {Command: self._on_command}

    def _on_command(self, f: Any) -> Any:
        return self.run_command(f.name, f.args or {})

    def recv_control(self, now: float) -> None:
        import zmq

        from ipc.codec import encode
        from ipc.frames import CommandReply

        for _ in range(100):
            try:
                parts = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.control_guard.errors["malformed"] = self.control_guard.errors.get("malformed", 0) + 1
                continue
            got = self.control_guard.decode_env(parts[1])
            if got is None:
                continue
            frame, cid = got
            handler = self.control_handlers.get(type(frame))
            if handler is not None:
                reply = handler(frame)
            else:
                self.control_guard.unexpected(frame)
                reply = CommandReply(ok=False, error=f"expected a command frame, got {frame.TYPE}")
            try:
                self.control.send_multipart([parts[0], encode(reply, cid=cid)], zmq.NOBLOCK)
            except zmq.ZMQError:
                self.send_failed += 1

    def run_command(self, name: str, args: dict[str, Any]) -> Any:
        from ipc.frames import CommandReply

        if name == "status":
            return CommandReply(ok=True, data=self.snapshot())
        if name == "stop":
            self.begin_stop(drain=False, reason="brisvoxd stop")
            return CommandReply(ok=True, data={"pid": self.pid, "state": self.state})
        if name == "drain":
            t = args.get("timeout_s")
            if t is not None:
                if not isinstance(t, (int, float)) or isinstance(t, bool) or t < 0:
                    return CommandReply(ok=False, error="timeout_s must be a number >= 0")
                self.drain_timeout_s = float(t)
            self.begin_stop(drain=True, reason="brisvoxd drain")
            return CommandReply(ok=True, data={"pid": self.pid, "state": self.state,
                                               "drain_timeout_s": self.drain_timeout_s})
        if name == "reload":
            ok, msg = self.reload()
            return CommandReply(ok=ok, data={"message": msg}, error="" if ok else msg)
        return CommandReply(ok=False, error=f"unknown command {name[:40]!r} (status, stop, drain, reload)")

    def reload(self) -> tuple[bool, str]:
        """Re-read the config file; apply what can change live; retry failed children."""
        if self.state != "running" and self.state != "starting":
            return False, f"cannot reload while {self.state}"
        now = time.monotonic()
        try:
            new = load_config(self.config.path) if self.config.path else DaemonConfig()
            new = resolve_log_format(new.with_counts(*self.cli_counts))
        except ConfigError as e:
            return False, f"configuration error, keeping the running configuration: {e}"
        old = self.config.daemon
        keep = {}
        notes = []
        for key in ("runtime_dir", "state_dir", "metrics"):
            if getattr(new.daemon, key) != getattr(old, key):
                keep[key] = getattr(old, key)
                notes.append(f"daemon.{key} changes at the next start")
        if new.daemon.log.format != old.log.format:
            keep["log"] = dataclasses.replace(new.daemon.log, format=old.log.format)
            notes.append("daemon.log.format changes at the next start")
        if keep:
            new = dataclasses.replace(new, daemon=dataclasses.replace(new.daemon, **keep))
        self.config = new
        logging.getLogger().setLevel(new.daemon.log.level.upper())
        retried = 0
        for s in self.slots:
            if s.state is State.FAILED:
                s.state = State.EXITED
                s.boot_failures = 0
                s.backoff_s = 0.0
                s.next_start_at = now
                retried += 1
        for role in ("worker", "agent"):
            want = new.count(role)
            have = [s for s in self.slots if s.role == role and not s.remove]
            for i in range(len(have), want):
                slot = Slot(role, i)
                slot.next_start_at = now
                self.slots.append(slot)
            for s in have[want:]:
                s.remove = True
                s.retired = True
                if s.state in (State.STARTING, State.READY):
                    self.stop_child(s, "scaled down", True, self.drain_timeout_s, now)
                elif not s.live:
                    self.slots.remove(s)
        self.slots.sort(key=lambda s: (ROLE_ORDER.index(s.role), s.index))
        self.topology_dirty = True
        msg = f"reloaded {new.path or '(defaults)'}; retried {retried} failed children"
        return True, msg + ("; " + "; ".join(notes) if notes else "")

    def status_line(self) -> str:
        parts = []
        for role, label in (("gateway", "gateway"), ("worker", "workers"), ("agent", "agents")):
            members = [s for s in self.slots if s.role == role]
            parts.append(f"{label} {sum(s.state is State.READY for s in members)}/{len(members)}")
        calls = sum(s.calls for s in self.slots if s.live)
        line = f"{', '.join(parts)} ready; {calls} calls"
        failed = [s.name for s in self.slots if s.state is State.FAILED]
        if failed:
            line += f"; failed: {', '.join(failed)}"
        return line

    def snapshot(self) -> dict[str, Any]:
        from ipc.bus import endpoint

        now = time.monotonic()
        children = []
        for s in self.slots:
            children.append({
                "role": s.role, "index": s.index, "name": s.name, "pid": s.pid, "state": str(s.state),
                "uptime_s": round(now - s.started_at, 3) if s.live else 0.0,
                "ready": s.state is State.READY, "restarts": s.restarts, "boot_failures": s.boot_failures,
                "pss_bytes": s.pss, "calls": s.calls, "beat_ms": s.beat_ms, "last_exit": s.last_exit,
                "error": s.error, "hung": s.hung, "memory_restarts": s.mem_restarts,
                "events": dict(s.events), "stats": s.stats, "endpoints": s.endpoints, "measured": s.measured,
                "stop_reason": s.stop_reason,
            })
        return {
            "daemon": {
                "pid": self.pid, "state": self.state, "ready": self.ready_sent, "instance": self.instance,
                "uptime_s": round(now - self.started_at, 3), "started_at": self.started_wall,
                "runtime_dir": str(self.rdir), "state_dir": str(self.sdir),
                "control": endpoint(self.rdir, "control"),
                "metrics_url": f"{self.http.url}/metrics" if self.http else None,
                "config": self.config.path, "workers": self.config.daemon.workers,
                "agents": self.config.daemon.agents,
                "calls": sum(c["calls"] for c in children if c["state"] in ("ready", "stopping")),
                "status": self.status_line(), "stop_reason": self.stop_reason,
                "decode_errors": {"supervisor": dict(self.chan_guard.errors),
                                  "control": dict(self.control_guard.errors)},
                "log_lines": dict(self.log_lines), "send_failed": self.send_failed,
                "http_requests": self.http.requests if self.http else 0, "pss_bytes": self.pss,
            },
            "children": children,
        }

    def serve_http(self, method: str, path: str) -> tuple[int, str, bytes]:
        import orjson

        from brisvox.daemon.metrics import CONTENT_TYPE, render

        if path == "/metrics":
            return 200, CONTENT_TYPE, render(self.snapshot()).encode()
        if path == "/healthz":
            live = [s for s in self.slots if s.state is not State.FAILED]
            healthy = self.state == "running" and all(s.state is State.READY for s in self.slots)
            body = {"status": "ok" if healthy else "degraded" if self.state == "running" else self.state,
                    "state": self.state, "ready": sum(s.state is State.READY for s in self.slots),
                    "children": len(self.slots), "failed": [s.name for s in self.slots if s.state is State.FAILED],
                    "not_ready": [s.name for s in live if s.state is not State.READY]}
            return (200 if healthy else 503), "application/json", orjson.dumps(body) + b"\n"
        return 404, "text/plain", b"not found: try /metrics or /healthz\n"
