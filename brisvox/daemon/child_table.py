"""The supervisor's child table: the slots, spawn, reap, the child channel.

:class:`ChildTable` is held by :class:`~brisvox.daemon.arbiter.Arbiter`. It
owns the process table (the :class:`~brisvox.daemon.slots.Slot` list, in
role order), what the master loop does to and hears from its children
(forking a slot's next incarnation with its log pipe, forwarding the log
lines, reaping exits with ``waitpid(WNOHANG)`` and applying the restart
decision of :func:`brisvox.daemon.slots.on_exit`, signals to a child), and
the child channel (ROUTER ``supervisor.sock``, attached as :attr:`chan` once
the first children are forked): frames out (:meth:`send_to`, Topology) and in
(Hello, Pong, ShutdownAck, ChildEvent: one dispatch table,
:meth:`child_frame_handlers`; any other frame is counted as
``unexpected_type`` and logged once per type).

Its interface: the configuration through a getter (it changes on reload),
the runtime dir and the daemon's pid at construction, :attr:`instance` set
before the first spawn. It never stops the daemon itself: :meth:`reap`
yields the error of each exit with the configuration-error code, and the
owner stops the daemon before the next exit is reaped.

Invariants:

* Only the master loop's thread calls these; nothing blocks (every socket
  operation is NOBLOCK; a failed send is counted in ``send_failed``).
* A child's peer identity is ``<slot name>:<pid>``; a frame from a peer that is
  not a live incarnation is dropped and counted (``unknown_peer``), so a late
  frame of a dead incarnation never touches its successor.
* A signal goes only to a live incarnation's pid (never to a reaped pid).
* A slot marked ``remove`` (scaled down) leaves the table when it exits, or at
  once when it is not live.
* The slots stay sorted by role (:data:`ROLE_ORDER`), then index.
* A crash-looping child's restart lines and its boot failures go through the
  supervisor's one :class:`~brisvox.runtime.log_limit.LogLimiter`
  (:attr:`log_limit`): per child, the first with its detail, then a count.
* At a child's handshake its ``RLIMIT_NOFILE`` is read (:mod:`brisvox.daemon.nofile`).
* A spawn, an exit, a handshake or a rescale marks the topology dirty
  (:attr:`topology_dirty`); the owner then pushes one Topology frame
  (numbered) to every ready or stopping child (:meth:`push_topology`).
"""

from __future__ import annotations

import collections
import logging
import os
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from brisvox.config.daemon import DaemonConfig
from brisvox.daemon.child import ChildSpec, resolve_main, spawn
from brisvox.daemon.logs import LineForwarder
from brisvox.daemon.nofile import nofile_of
from brisvox.daemon.slots import Slot, State, StormTracker, on_exit
from brisvox.runtime.log_limit import LogLimiter
from ipc.codec import DecodeGuard

log = logging.getLogger("brisvox.supervisor")

ROLE_ORDER = ("gateway", "worker", "agent", "outbound")

ChildFrameHandler = Callable[[Slot, Any, float], None]


class ChildTable:
    """The slots and the children that fill them: spawn, reap, signal, talk."""

    def __init__(self, config: Callable[[], DaemonConfig], runtime_dir: Path, parent_pid: int,
                 log_limit: LogLimiter | None = None) -> None:
        self.config = config
        self.rdir = Path(runtime_dir)
        self.parent_pid = parent_pid
        # the supervisor's one limiter: a crash-looping child or a chatty one logs a line, then a count
        self.log_limit = log_limit or LogLimiter(log)
        self.instance = ""  # the ring instance tag, set by the owner before the first spawn
        cfg = config()
        self.slots: list[Slot] = [Slot(role, i) for role in ROLE_ORDER for i in range(cfg.count(role))]
        self.storm = StormTracker()
        self.forwarders: dict[int, LineForwarder] = {}
        self.log_lines: collections.Counter[str] = collections.Counter()
        self.chan: Any = None
        self.chan_guard = DecodeGuard("supervisor")
        self.send_failed = 0
        self.topology_seq = 0
        self.reload_seq = 0
        self.topology_dirty = False
        self.child_handlers = self.child_frame_handlers()

    # -- spawn, logs, reap, signals ----------------------------------------------

    def spawn(self, slot: Slot, now: float) -> None:
        cfg = self.config()
        r, w = os.pipe2(os.O_CLOEXEC)
        spec = ChildSpec(
            role=slot.role, index=slot.index, config=cfg, runtime_dir=self.rdir,
            instance=self.instance, parent_pid=self.parent_pid, main_ref=resolve_main(slot.role, slot.index),
            log_fd=w,
        )
        try:
            pid = spawn(spec)
        finally:
            os.close(w)
        slot.on_spawn(pid, now)
        self.forwarders[r] = LineForwarder(r, slot.role, slot.name, pid, cfg.daemon.log.format)
        self.topology_dirty = True
        log.debug("%s spawned (pid %d)", slot.name, pid)

    def pump_logs(self, ready: dict[Any, int]) -> None:
        """Forward the lines of every log pipe that ``ready`` (a poll result) marks readable."""
        for fd in [fd for fd in self.forwarders if ready.get(fd)]:
            fwd = self.forwarders[fd]
            before = fwd.lines
            if not fwd.pump():
                self.close_forwarder(fd)
            self.log_lines[fwd.role] += fwd.lines - before

    def close_forwarder(self, fd: int) -> None:
        fwd = self.forwarders.pop(fd, None)
        if fwd is not None:
            before = fwd.lines
            fwd.close()
            self.log_lines[fwd.role] += fwd.lines - before

    def close_logs(self) -> None:
        for fwd in list(self.forwarders.values()):
            fwd.close()
        self.forwarders.clear()

    def reap(self, now: float) -> Iterator[str]:
        """Reap every exited child; yields the error of each configuration-error exit.

        Lazy: each exit is applied when the caller asks for the next one, so a
        caller that stops the daemon on a yielded error does so before the
        next exit is applied. Consume it whole.
        """
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            code = os.waitstatus_to_exitcode(status)
            slot = next((s for s in self.slots if s.pid == pid and s.live), None)
            if slot is not None:
                error = self.on_child_exit(slot, code, now)
                if error is not None:
                    yield error

    def on_child_exit(self, slot: Slot, code: int, now: float) -> str | None:
        """Apply one exit; returns the error when it is a configuration error (the daemon stops)."""
        for fd, fwd in list(self.forwarders.items()):
            if fwd.pid == slot.pid:
                self.close_forwarder(fd)
        was = slot.state
        stopping = was is State.STOPPING
        reason = slot.stop_reason
        decision = on_exit(slot, code, now, self.config().daemon.restart, self.storm)
        self.topology_dirty = True
        error = None
        if decision.action == "config_error":
            error = slot.error or f"{slot.name} exited with the configuration-error code"
            log.critical("%s: %s; stopping the daemon", slot.name, error)
        elif decision.action == "retired":
            (log.info if code in (0, -signal.SIGTERM) or stopping else log.warning)(
                "%s (pid %d) exited: %s", slot.name, slot.pid, slot.last_exit)
        elif decision.action == "failed":
            log.error("%s failed to boot %d times in a row (%s%s); marked failed, not restarted "
                      "(`brisvoxd reload` retries it)", slot.name, slot.boot_failures, slot.last_exit,
                      f": {slot.error}" if slot.error else "")
        else:  # the restart loop: a child that keeps crashing logs its first exit, then a count a minute
            what = "boot failure" if decision.boot_failure else ("restart: " + reason if stopping else "crashed")
            self.log_limit(f"restart:{slot.name}", "%s (pid %d) exited: %s (%s%s); restarting in %.2fs",
                           slot.name, slot.pid, slot.last_exit, what, f": {slot.error}" if slot.error else "",
                           decision.delay_s)
        if slot.remove:
            self.slots.remove(slot)
        return error

    def kill(self, slot: Slot, sig: int) -> None:
        if slot.pid and slot.live:
            try:
                os.kill(slot.pid, sig)
            except ProcessLookupError:
                pass

    def rescale(self, cfg: DaemonConfig, now: float) -> tuple[int, list[Slot]]:
        """After a reload: retry failed slots, add and drop slots to ``cfg``'s counts.

        Returns (slots retried, live slots to drain and remove): the caller
        stops those; a dropped slot that is not live leaves at once.
        """
        retried = 0
        for s in self.slots:
            if s.state is State.FAILED:
                s.state = State.EXITED
                s.boot_failures = 0
                s.backoff_s = 0.0
                s.next_start_at = now
                retried += 1
        to_stop: list[Slot] = []
        for role in ("worker", "agent", "outbound"):  # outbound: 0 or 1, as the new config wants
            want = cfg.count(role)
            have = [s for s in self.slots if s.role == role and not s.remove]
            for i in range(len(have), want):
                slot = Slot(role, i)
                slot.next_start_at = now
                self.slots.append(slot)
            for s in have[want:]:
                s.remove = True
                s.retired = True
                if s.state in (State.STARTING, State.READY):
                    to_stop.append(s)
                elif not s.live:
                    self.slots.remove(s)
        self.slots.sort(key=lambda s: (ROLE_ORDER.index(s.role), s.index))
        self.topology_dirty = True
        return retried, to_stop

    # -- the child channel -------------------------------------------------------------

    def send_to(self, slot: Slot, frame: Any) -> bool:
        import zmq

        from ipc.codec import encode

        try:
            self.chan.send_multipart([f"{slot.name}:{slot.pid}".encode(), encode(frame)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            self.send_failed += 1
            return False

    def child_frame_handlers(self) -> dict[type, ChildFrameHandler]:
        """The child channel's dispatch table: frame class -> ``handler(slot, frame, now)``."""
        from ipc.frames import ChildEvent, Hello, Pong, ShutdownAck

        return {Hello: self.on_hello, Pong: self._on_pong, ShutdownAck: self._on_shutdown_ack,
                ChildEvent: self._on_child_event}

    def recv_children(self, now: float) -> None:
        import zmq

        from ipc.frames import Hello

        for _ in range(1000):
            try:
                parts = self.chan.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.chan_guard.errors["malformed"] = self.chan_guard.errors.get("malformed", 0) + 1
                continue
            f = self.chan_guard.decode(parts[1])
            if f is None:
                continue
            slot = self.slot_for(parts[0])
            if slot is None and isinstance(f, Hello) and not f.ok:
                self.late_boot_error(parts[0], f.error)
                continue
            if slot is None:
                self.chan_guard.errors["unknown_peer"] = self.chan_guard.errors.get("unknown_peer", 0) + 1
                continue
            handler = self.child_handlers.get(type(f))
            if handler is None:
                self.chan_guard.unexpected(f)
            else:
                handler(slot, f, now)

    def _on_pong(self, slot: Slot, f: Any, now: float) -> None:
        slot.last_pong_at = now
        slot.beat_ms = f.beat_ms
        slot.calls = f.calls
        slot.stats = f.stats

    def _on_shutdown_ack(self, slot: Slot, f: Any, now: float) -> None:
        slot.acked = True

    def _on_child_event(self, slot: Slot, f: Any, now: float) -> None:
        slot.events[f.kind[:64]] += 1
        log.info("%s event %s: %s", slot.name, f.kind, f.detail[:500])

    def late_boot_error(self, ident: bytes, error: str) -> None:
        """A boot failure's error that arrived after its exit was applied: the slot keeps it.

        Only the slot of that very process (same name and pid, no longer live) and only when
        it recorded no error of its own; its state and counters are not touched again.
        """
        name, _, pid_s = ident.decode("ascii", "replace").partition(":")
        slot = next((s for s in self.slots if str(s.pid) == pid_s and s.name == name and not s.live), None)
        if slot is None:
            self.chan_guard.errors["unknown_peer"] = self.chan_guard.errors.get("unknown_peer", 0) + 1
        elif not slot.error:
            slot.error = error[:2000] or "boot failed"
            log.error("%s (pid %d) failed to boot: %s", slot.name, slot.pid, slot.error[:500])

    def slot_for(self, ident: bytes) -> Slot | None:
        name, _, pid_s = ident.decode("ascii", "replace").partition(":")
        if not pid_s.isdigit():
            return None
        pid = int(pid_s)
        return next((s for s in self.slots if s.pid == pid and s.name == name and s.live), None)

    def on_hello(self, slot: Slot, f: Any, now: float) -> None:
        if not f.ok:
            slot.error = f.error or "boot failed"
            self.log_limit(f"boot_failed:{slot.name}", "%s (pid %d) failed to boot: %s", slot.name, slot.pid,
                           slot.error[:500], level=logging.ERROR)
            return
        slot.nofile = nofile_of(slot.pid)  # the file limit the child runs with (inherited, or its own)
        if slot.state is State.STARTING:
            slot.on_ready(now, f.endpoints, f.measured)
            self.topology_dirty = True
            log.info("%s ready (pid %d, boot %.2fs)", slot.name, slot.pid, now - slot.started_at)
        elif slot.state is State.STOPPING:
            slot.ready_at = now  # handshake completed; a stop is already under way

    def push_reload(self, path: str) -> int:
        """Tell every ready child that ``path`` was applied (a :class:`~ipc.frames.Reload`);
        returns how many were told."""
        from ipc.frames import Reload

        self.reload_seq += 1
        frame = Reload(path=path, seq=self.reload_seq)
        return sum(1 for s in self.slots if s.state == State.READY and self.send_to(s, frame))

    def push_topology(self) -> None:
        from ipc.frames import Topology

        self.topology_dirty = False
        self.topology_seq += 1
        rows = [s.row() for s in self.slots]
        frame = Topology(children=rows, seq=self.topology_seq)
        for s in self.slots:
            if s.state in (State.READY, State.STOPPING):
                self.send_to(s, frame)
