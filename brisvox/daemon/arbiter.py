"""The brisvoxd supervisor: one synchronous master loop that owns every child.

Owns the process table (:mod:`brisvox.daemon.slots`), the child channel
(ROUTER ``supervisor.sock``), the command plane (ROUTER ``control.sock``),
``/metrics`` and ``/healthz`` (:mod:`brisvox.daemon.httpd`), systemd
notification (:mod:`brisvox.daemon.sdnotify`), and the forwarding of
children's log lines (:mod:`brisvox.daemon.logs`).

The loop, in the style of gunicorn's arbiter: signal handlers only queue the
signal (``signal.set_wakeup_fd`` wakes the poll); each turn polls every
socket and pipe with a timeout no later than the nearest deadline, then
handles queued signals through ``handle_<name>`` methods, reaps children
with ``waitpid(WNOHANG)``, serves frames, commands and HTTP, and runs the
timers (pings, hung detection, handshake timeouts, stop escalation,
restarts after backoff, memory checks, sd_notify). There are no threads, so
nothing fights the loop for state.

Order at start (fork safety, see :mod:`brisvox.daemon.child`): take the pid
lock, sweep orphan rings, bind the metrics listener and open the notify
socket, fork every child, and only then create the ZeroMQ context and bind
the two ROUTERs (children's DEALERs reconnect until the bind exists).

Stop: phases. Phase 1 stops the gateway and the agent processes (with
``drain`` they stop admitting and finish live calls, up to the drain
timeout); phase 2 stops the workers once phase 1 is gone (live calls need
them until then). Each stop is a Shutdown frame, acknowledged by the child,
escalated to SIGTERM at the grace deadline (or at once if unacknowledged),
then to SIGKILL. At the end the instance's ``/dev/shm/brisvox.*`` segments
and the runtime dir's sockets are removed and the pid lock is released.

Signals: TERM = drain then stop (what systemd sends); INT = stop (a second
INT, or ``stop`` while stopping, SIGTERMs every child at once); QUIT = kill
every child now; HUP = reload; CHLD = reap.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any, Literal

from brisvox.config.daemon import DaemonConfig, load_config
from brisvox.config.errors import ConfigError
from brisvox.daemon import exitcodes
from brisvox.daemon.child import ChildSpec, resolve_main, spawn
from brisvox.daemon.logs import LineForwarder, setup_logging
from brisvox.daemon.paths import PidLock
from brisvox.daemon.procutil import pss_bytes
from brisvox.daemon.sdnotify import Notifier
from brisvox.daemon.slots import (
    Slot,
    State,
    StormTracker,
    hung_reason,
    memory_verdict,
    on_exit,
)

log = logging.getLogger("brisvox.supervisor")

STOP_PHASES = (("gateway", "agent"), ("worker",))
ROLE_ORDER = ("gateway", "worker", "agent")
HUNG_KILL_DELAY_S = 0.5  # between the SIGUSR2 stack dump and SIGKILL
MAX_LOOP_WAIT_S = 0.5


def resolve_log_format(cfg: DaemonConfig, stream: Any = None) -> DaemonConfig:
    """Turn ``format = "auto"`` into json or text (text only on a terminal)."""
    lg = cfg.daemon.log
    if lg.format != "auto":
        return cfg
    stream = sys.stderr if stream is None else stream
    fmt: Literal["json", "text"] = "text" if hasattr(stream, "isatty") and stream.isatty() else "json"
    return dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, log=dataclasses.replace(lg, format=fmt)))


class StartError(Exception):
    """The daemon cannot start for a reason outside the config file (port in use, ...)."""


class Arbiter:
    SIGNALS: dict[int, str] = {
        signal.SIGHUP: "hup",
        signal.SIGQUIT: "quit",
        signal.SIGINT: "int",
        signal.SIGTERM: "term",
        signal.SIGCHLD: "chld",
    }

    def __init__(
        self,
        config: DaemonConfig,
        runtime_dir: Path,
        state_dir: Path,
        lock: PidLock,
        *,
        cli_counts: tuple[int | None, int | None] = (None, None),
        status_fd: int = -1,
    ) -> None:
        self.config = resolve_log_format(config)
        self.cli_counts = cli_counts
        self.rdir = Path(runtime_dir)
        self.sdir = Path(state_dir)
        self.lock = lock
        self.status_fd = status_fd
        self.pid = os.getpid()
        self.instance = ""
        self.state = "starting"
        self.done = False
        self.exit_code = exitcodes.OK
        self.error_message = ""
        self.stop_reason = ""
        self.stop_drain = False
        self.stop_phase = 0
        self.drain_timeout_s = self.config.daemon.shutdown.drain_timeout_s
        self.ready_sent = False
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self.slots: list[Slot] = []
        for role in ROLE_ORDER:
            for i in range(self.config.count(role)):
                self.slots.append(Slot(role, i))
        self.storm = StormTracker()
        self.sig_queue: collections.deque[int] = collections.deque(maxlen=32)
        self.forwarders: dict[int, LineForwarder] = {}
        self.log_lines: collections.Counter[str] = collections.Counter()
        self.ctx: Any = None
        self.chan: Any = None
        self.control: Any = None
        self.http: Any = None
        self.notifier = Notifier()
        self.topology_seq = 0
        self.topology_dirty = False
        self.next_memory_check = 0.0
        self.next_status_notify = 0.0
        self.pss: int | None = None
        self.last_tick_at = time.monotonic()
        self.send_failed = 0
        self.wake_r = self.wake_w = -1
        from ipc.codec import DecodeGuard

        self.chan_guard = DecodeGuard("supervisor")
        self.control_guard = DecodeGuard("control")

    # -- lifecycle ---------------------------------------------------------------

    def run(self) -> int:
        lg = self.config.daemon.log
        setup_logging("supervisor", "supervisor", lg.level, lg.format)
        self.init_signals()  # first: a signal that arrives during start is queued, then handled
        try:
            self.start()
            while not self.done:
                self.loop_once()
        except StartError as e:
            log.error("%s", e)
            self.exit_code = exitcodes.FAILURE
            self.error_message = str(e)
            self.emergency_stop()
        except Exception as e:
            log.exception("supervisor failed")
            self.exit_code = exitcodes.FAILURE
            self.error_message = self.error_message or f"supervisor failed: {type(e).__name__}: {e}"
            self.emergency_stop()
        finally:
            self.cleanup()
        return self.exit_code

    def start(self) -> None:
        from ipc.ring import instance_id, sweep_orphans

        self.lock.write_pid(self.pid)
        self.instance = instance_id(self.pid)
        removed = sweep_orphans(keep=self.instance)
        if removed:
            log.warning("removed %d shared-memory segments of dead instances", len(removed))
        if os.environ.get("BRISVOX_TEST_ROLE_MAIN"):
            log.warning("BRISVOX_TEST_ROLE_MAIN is set: test role mains in use (never in production)")
        addr = self.config.daemon.metrics.address()
        if addr is not None:
            from brisvox.daemon.httpd import MiniHttp

            try:
                self.http = MiniHttp(addr[0], addr[1], self.serve_http)
            except OSError as e:
                raise StartError(f"daemon.metrics.listen {self.config.daemon.metrics.listen}: {e.strerror}") from None
        now = time.monotonic()
        for slot in self.slots:
            self.spawn(slot, now)
        # only now: the ZeroMQ context (every first child was forked without one)
        import zmq

        from ipc.bus import bind, endpoint, make_socket

        self.ctx = zmq.Context()
        self.chan = make_socket(self.ctx, zmq.ROUTER)
        bind(self.chan, endpoint(self.rdir, "supervisor"))
        self.control = make_socket(self.ctx, zmq.ROUTER, hwm=100)
        bind(self.control, endpoint(self.rdir, "control"))
        d = self.config.daemon
        self.last_tick_at = time.monotonic()
        log.info(
            "brisvoxd pid %d instance %s: gateway 1, workers %d, agents %d; runtime dir %s; control %s; "
            "metrics %s; config %s",
            self.pid, self.instance, d.workers, d.agents, self.rdir, endpoint(self.rdir, "control"),
            f"{self.http.url}/metrics" if self.http else "disabled", self.config.path or "(defaults)",
        )

    def init_signals(self) -> None:
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        for sig in self.SIGNALS:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.sig_queue.append(signum)

    def cleanup(self) -> None:
        from ipc.ring import SHM_DIR, list_segments

        for fwd in list(self.forwarders.values()):
            fwd.close()
        self.forwarders.clear()
        if self.instance:
            for name in list_segments(self.instance):
                (SHM_DIR / name).unlink(missing_ok=True)
        for sock in (self.chan, self.control):
            if sock is not None:
                sock.close(0)
        if self.ctx is not None:
            self.ctx.term()
        if self.http is not None:
            self.http.close()
        for p in self.rdir.glob("*.sock"):
            p.unlink(missing_ok=True)
        self.notifier.close()
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:
            pass
        for fd in (self.wake_r, self.wake_w):
            if fd >= 0:
                os.close(fd)
        self.report_status_pipe()
        self.lock.release()
        if self.exit_code == exitcodes.OK:
            log.info("stopped")
        else:
            log.error("stopped with exit code %d: %s", self.exit_code, self.error_message)

    def emergency_stop(self) -> None:
        """After an internal error: SIGTERM every child, then SIGKILL, and reap them."""
        live = [s for s in self.slots if s.live and s.pid]
        for s in live:
            self._kill(s, signal.SIGTERM)
        deadline = time.monotonic() + self.config.daemon.shutdown.term_timeout_s
        while time.monotonic() < deadline and any(s.live for s in live):
            self.reap(time.monotonic())
            time.sleep(0.02)
        for s in live:
            if s.live:
                self._kill(s, signal.SIGKILL)
        while any(s.live for s in live):
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            for s in live:
                if s.pid == pid:
                    s.state = State.EXITED

    def report_status_pipe(self, ready: bool = False) -> None:
        """Tell the `brisvoxd start` that daemonized us how the boot went."""
        if self.status_fd < 0:
            return
        msg = "ready\n" if ready else f"error {self.exit_code} {self.error_message or 'stopped before ready'}\n"
        try:
            os.write(self.status_fd, msg.encode())
            os.close(self.status_fd)
        except OSError:
            pass
        self.status_fd = -1

    # -- the loop ------------------------------------------------------------------

    def loop_once(self) -> None:
        import zmq

        now = time.monotonic()
        poller = zmq.Poller()
        poller.register(self.wake_r, zmq.POLLIN)
        poller.register(self.chan, zmq.POLLIN)
        poller.register(self.control, zmq.POLLIN)
        for fd in self.forwarders:
            poller.register(fd, zmq.POLLIN)
        if self.http is not None:
            for fd, ev in self.http.poll_items():
                poller.register(fd, ev)
        wait = self.next_wait(now)
        try:
            ready = dict(poller.poll(int(wait * 1000)))
        except zmq.ZMQError:
            ready = {}
        if self.wake_r in ready:
            try:
                while os.read(self.wake_r, 4096):
                    pass
            except (BlockingIOError, OSError):
                pass
        now = time.monotonic()
        self.handle_signals()
        for fd in [fd for fd in self.forwarders if ready.get(fd)]:
            fwd = self.forwarders[fd]
            before = fwd.lines
            if not fwd.pump():
                self.close_forwarder(fd)
            self.log_lines[fwd.role] += fwd.lines - before
        self.reap(now)
        if ready.get(self.chan):
            self.recv_children(now)
        if ready.get(self.control):
            self.recv_control(now)
        if self.http is not None:
            self.http.handle({k: v for k, v in ready.items() if isinstance(k, int)}, now)
        self.tick(now)

    def next_wait(self, now: float) -> float:
        h = self.config.daemon.health
        times = [now + MAX_LOOP_WAIT_S, self.next_memory_check]
        for s in self.slots:
            if s.state is State.READY:
                times.append(s.last_ping_at + h.ping_interval_s)
            elif s.state is State.STARTING:
                times.append(s.started_at + h.init_timeout_s)
            elif s.state is State.STOPPING:
                times += [t for t in (s.ack_deadline, s.term_at, s.kill_at) if t is not None]
            elif s.state is State.EXITED and s.next_start_at is not None:
                times.append(s.next_start_at)
        wd = self.notifier.watchdog_due(now)
        if wd is not None:
            times.append(now + wd)
        if self.http is not None and (dl := self.http.next_deadline()) is not None:
            times.append(dl)
        return max(0.0, min(times) - now)

    def handle_signals(self) -> None:
        while self.sig_queue:
            signum = self.sig_queue.popleft()
            name = self.SIGNALS.get(signum)
            handler = getattr(self, f"handle_{name}", None) if name else None
            if handler is not None:
                handler()

    def handle_chld(self) -> None:
        self.reap(time.monotonic())

    def handle_term(self) -> None:
        log.info("SIGTERM: draining, then stopping")
        self.begin_stop(drain=True, reason="SIGTERM")

    def handle_int(self) -> None:
        log.info("SIGINT: stopping")
        self.begin_stop(drain=False, reason="SIGINT")

    def handle_quit(self) -> None:
        log.warning("SIGQUIT: killing every child now")
        self.begin_stop(drain=False, reason="SIGQUIT")
        for s in self.slots:
            if s.live:
                self._kill(s, signal.SIGKILL)

    def handle_hup(self) -> None:
        ok, msg = self.reload()
        (log.info if ok else log.error)("SIGHUP: %s", msg)

    # -- children --------------------------------------------------------------------

    def spawn(self, slot: Slot, now: float) -> None:
        r, w = os.pipe2(os.O_CLOEXEC)
        spec = ChildSpec(
            role=slot.role, index=slot.index, config=self.config, runtime_dir=self.rdir,
            instance=self.instance, parent_pid=self.pid, main_ref=resolve_main(slot.role, slot.index), log_fd=w,
        )
        try:
            pid = spawn(spec)
        finally:
            os.close(w)
        slot.on_spawn(pid, now)
        self.forwarders[r] = LineForwarder(r, slot.role, slot.name, pid, self.config.daemon.log.format)
        self.topology_dirty = True
        log.debug("%s spawned (pid %d)", slot.name, pid)

    def close_forwarder(self, fd: int) -> None:
        fwd = self.forwarders.pop(fd, None)
        if fwd is not None:
            before = fwd.lines
            fwd.close()
            self.log_lines[fwd.role] += fwd.lines - before

    def reap(self, now: float) -> None:
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
                self.on_child_exit(slot, code, now)

    def on_child_exit(self, slot: Slot, code: int, now: float) -> None:
        for fd, fwd in list(self.forwarders.items()):
            if fwd.pid == slot.pid:
                self.close_forwarder(fd)
        was = slot.state
        stopping = was is State.STOPPING
        reason = slot.stop_reason
        decision = on_exit(slot, code, now, self.config.daemon.restart, self.storm)
        self.topology_dirty = True
        if decision.action == "config_error":
            msg = slot.error or f"{slot.name} exited with the configuration-error code"
            log.critical("%s: %s; stopping the daemon", slot.name, msg)
            self.fatal(exitcodes.CONFIG, msg)
        elif decision.action == "retired":
            (log.info if code in (0, -signal.SIGTERM) or stopping else log.warning)(
                "%s (pid %d) exited: %s", slot.name, slot.pid, slot.last_exit)
        elif decision.action == "failed":
            log.error("%s failed to boot %d times in a row (%s%s); marked failed, not restarted "
                      "(`brisvoxd reload` retries it)", slot.name, slot.boot_failures, slot.last_exit,
                      f": {slot.error}" if slot.error else "")
        else:
            what = "boot failure" if decision.boot_failure else ("restart: " + reason if stopping else "crashed")
            log.warning("%s (pid %d) exited: %s (%s%s); restarting in %.2fs", slot.name, slot.pid, slot.last_exit,
                        what, f": {slot.error}" if slot.error else "", decision.delay_s)
        if slot.remove:
            self.slots.remove(slot)

    def fatal(self, code: int, message: str) -> None:
        if self.exit_code == exitcodes.OK:
            self.exit_code = code
            self.error_message = message
            if code == exitcodes.CONFIG:
                print(f"brisvoxd: configuration error: {message}", file=sys.stderr, flush=True)
        self.begin_stop(drain=False, reason="configuration error" if code == exitcodes.CONFIG else "fatal error")

    def _kill(self, slot: Slot, sig: int) -> None:
        if slot.pid and slot.live:
            try:
                os.kill(slot.pid, sig)
            except ProcessLookupError:
                pass

    def send_to(self, slot: Slot, frame: Any) -> bool:
        import zmq

        from ipc.codec import encode

        try:
            self.chan.send_multipart([f"{slot.name}:{slot.pid}".encode(), encode(frame)], zmq.NOBLOCK)
            return True
        except zmq.ZMQError:
            self.send_failed += 1
            return False

    def recv_children(self, now: float) -> None:
        import zmq

        from ipc.frames import ChildEvent, Hello, Pong, ShutdownAck

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
            if slot is None:
                self.chan_guard.errors["unknown_peer"] = self.chan_guard.errors.get("unknown_peer", 0) + 1
                continue
            if isinstance(f, Pong):
                slot.last_pong_at = now
                slot.beat_ms = f.beat_ms
                slot.calls = f.calls
                slot.stats = f.stats
            elif isinstance(f, Hello):
                self.on_hello(slot, f, now)
            elif isinstance(f, ShutdownAck):
                slot.acked = True
            elif isinstance(f, ChildEvent):
                slot.events[f.kind[:64]] += 1
                log.info("%s event %s: %s", slot.name, f.kind, f.detail[:500])
            else:
                self.chan_guard.errors["unexpected_type"] = self.chan_guard.errors.get("unexpected_type", 0) + 1

    def slot_for(self, ident: bytes) -> Slot | None:
        name, _, pid_s = ident.decode("ascii", "replace").partition(":")
        if not pid_s.isdigit():
            return None
        pid = int(pid_s)
        return next((s for s in self.slots if s.pid == pid and s.name == name and s.live), None)

    def on_hello(self, slot: Slot, f: Any, now: float) -> None:
        if not f.ok:
            slot.error = f.error or "boot failed"
            log.error("%s (pid %d) failed to boot: %s", slot.name, slot.pid, slot.error)
            return
        if slot.state is State.STARTING:
            slot.on_ready(now, f.endpoints)
            self.topology_dirty = True
            log.info("%s ready (pid %d, boot %.2fs)", slot.name, slot.pid, now - slot.started_at)
        elif slot.state is State.STOPPING:
            slot.ready_at = now  # handshake completed; a stop is already under way

    # -- timers --------------------------------------------------------------------

    def tick(self, now: float) -> None:
        from ipc.frames import Ping

        d = self.config.daemon
        h = d.health
        stalled = now - self.last_tick_at
        self.last_tick_at = now
        if stalled > h.pong_timeout_s / 2:
            # the supervisor itself was not running (SIGSTOP, host suspend, swap storm):
            # missing pongs say nothing about the children this turn
            log.warning("master loop stalled for %.1fs; not judging children's pongs this turn", stalled)
            for slot in self.slots:
                slot.last_pong_at = max(slot.last_pong_at, now)
        for slot in list(self.slots):
            if slot.state is State.READY:
                if now - slot.last_ping_at >= h.ping_interval_s:
                    slot.ping_seq += 1
                    slot.last_ping_at = now
                    self.send_to(slot, Ping(seq=slot.ping_seq, sent_ns=time.monotonic_ns()))
                reason = hung_reason(slot, now, h.pong_timeout_s, h.heartbeat_timeout_s)
                if reason:
                    self.kill_hung(slot, reason, now)
            elif slot.state is State.STARTING:
                if now - slot.started_at > h.init_timeout_s:
                    slot.error = f"no handshake within {h.init_timeout_s:g}s (daemon.health.init_timeout_s)"
                    log.error("%s (pid %d): %s; killing it", slot.name, slot.pid, slot.error)
                    self._kill(slot, signal.SIGKILL)
                    slot.started_at = now  # do not repeat the kill every turn
            elif slot.state is State.STOPPING:
                self.escalate(slot, now)
            elif slot.state is State.EXITED and slot.next_start_at is not None and now >= slot.next_start_at:
                if not slot.retired and self.may_restart(slot.role):
                    self.spawn(slot, now)
        if now >= self.next_memory_check:
            self.next_memory_check = now + d.memory.check_interval_s
            self.check_memory(now)
        if self.state in ("draining", "stopping"):
            self.advance_stop(now)
        if self.topology_dirty:
            self.push_topology()
        if not self.ready_sent and self.state == "starting" and all(
            s.state in (State.READY, State.FAILED) for s in self.slots
        ):
            self.ready_sent = True
            self.state = "running"
            status = self.status_line()
            self.notifier.ready(status)
            log.info("ready: %s", status)
            self.report_status_pipe(ready=True)
        if now >= self.next_status_notify and self.state != "starting":
            self.next_status_notify = now + 1.0
            self.notifier.status(self.status_line())
        self.notifier.watchdog(now)

    def may_restart(self, role: str) -> bool:
        if self.state not in ("draining", "stopping"):
            return True
        for i, roles in enumerate(STOP_PHASES):
            if role in roles:
                return i > self.stop_phase
        return False

    def kill_hung(self, slot: Slot, reason: str, now: float) -> None:
        slot.hung += 1
        log.error("%s (pid %d) is hung: %s; dumping its stacks and killing it", slot.name, slot.pid, reason)
        self._kill(slot, signal.SIGUSR2)
        slot.state = State.STOPPING
        slot.stop_reason = f"hung: {reason}"
        slot.termed = True
        slot.kill_at = now + HUNG_KILL_DELAY_S
        self.topology_dirty = True

    def stop_child(self, slot: Slot, reason: str, drain: bool, grace_s: float, now: float) -> None:
        from ipc.frames import Shutdown

        sd = self.config.daemon.shutdown
        connected = slot.state is State.READY
        slot.state = State.STOPPING
        slot.stop_reason = reason
        slot.stop_sent_at = now
        self.topology_dirty = True
        if connected and self.send_to(slot, Shutdown(reason=reason, grace_s=grace_s, drain=drain)):
            slot.ack_deadline = now + sd.ack_timeout_s
            slot.term_at = now + grace_s
        else:
            self._kill(slot, signal.SIGTERM)
            slot.termed = True
            slot.kill_at = now + sd.term_timeout_s

    def escalate(self, slot: Slot, now: float) -> None:
        sd = self.config.daemon.shutdown
        if not slot.termed:
            late_ack = not slot.acked and slot.ack_deadline is not None and now >= slot.ack_deadline
            if late_ack or (slot.term_at is not None and now >= slot.term_at):
                log.warning("%s (pid %d): %s; sending SIGTERM", slot.name, slot.pid,
                            "no shutdown acknowledgement" if late_ack else "grace period over")
                self._kill(slot, signal.SIGTERM)
                slot.termed = True
                slot.kill_at = now + sd.term_timeout_s
        elif slot.kill_at is not None and now >= slot.kill_at:
            if not slot.stop_reason.startswith("hung"):
                log.warning("%s (pid %d) ignored SIGTERM; sending SIGKILL", slot.name, slot.pid)
            self._kill(slot, signal.SIGKILL)
            slot.kill_at = None

    def check_memory(self, now: float) -> None:
        mem = self.config.daemon.memory
        self.pss = pss_bytes(self.pid)
        restarting = {s.role for s in self.slots if s.state is State.STOPPING and s.stop_reason == "memory limit"}
        for slot in self.slots:
            if slot.state not in (State.READY, State.STARTING):
                continue
            slot.pss = pss_bytes(slot.pid)
            lim = mem.for_role(slot.role)
            verdict = memory_verdict(slot.pss, lim.warn_mb, lim.limit_mb)
            mb = (slot.pss or 0) / (1 << 20)
            if verdict == "ok":
                slot.mem_warned = False
            elif verdict == "warn" and not slot.mem_warned:
                slot.mem_warned = True
                log.warning("%s (pid %d) uses %.0f MiB PSS (warn at %d MiB, restart at %d MiB)",
                            slot.name, slot.pid, mb, lim.warn_mb, lim.limit_mb)
            elif verdict == "limit" and slot.state is State.READY and self.state == "running" \
                    and slot.role not in restarting:
                slot.mem_restarts += 1
                restarting.add(slot.role)
                log.error("%s (pid %d) uses %.0f MiB PSS, over its %d MiB limit; restarting it",
                          slot.name, slot.pid, mb, lim.limit_mb)
                self.stop_child(slot, "memory limit", True, self.config.daemon.shutdown.drain_timeout_s, now)

    def push_topology(self) -> None:
        from ipc.frames import Topology

        self.topology_dirty = False
        self.topology_seq += 1
        rows = [s.row() for s in self.slots]
        frame = Topology(children=rows, seq=self.topology_seq)
        for s in self.slots:
            if s.state in (State.READY, State.STOPPING):
                self.send_to(s, frame)

    # -- stop ------------------------------------------------------------------------

    def begin_stop(self, drain: bool, reason: str) -> None:
        now = time.monotonic()
        sd = self.config.daemon.shutdown
        if self.state in ("draining", "stopping"):
            if self.state == "draining" and not drain:
                log.info("stop requested while draining: ending calls now")
                self.state = "stopping"
                self.stop_drain = False
                for s in self.slots:
                    if s.state is State.STOPPING and not s.termed:
                        s.term_at = min(s.term_at or now, now + sd.grace_s)
                        from ipc.frames import Shutdown

                        self.send_to(s, Shutdown(reason=reason, grace_s=sd.grace_s, drain=False))
            elif not drain:
                log.warning("second stop request: sending SIGTERM to every child now")
                for s in self.slots:
                    if s.live and not s.termed:
                        self._kill(s, signal.SIGTERM)
                        s.state = State.STOPPING
                        s.termed = True
                        s.kill_at = now + sd.term_timeout_s
            return
        self.state = "draining" if drain else "stopping"
        self.stop_reason = reason
        self.stop_drain = drain
        self.stop_phase = 0
        self.notifier.stopping(f"{self.state} ({reason}); {self.status_line()}")
        self.advance_stop(now)

    def advance_stop(self, now: float) -> None:
        sd = self.config.daemon.shutdown
        while self.stop_phase < len(STOP_PHASES):
            roles = STOP_PHASES[self.stop_phase]
            # in a drain, only the first phase waits for calls; workers go once callers are gone
            drain = self.stop_drain and self.stop_phase == 0
            grace = self.drain_timeout_s if drain else sd.grace_s
            members = [s for s in self.slots if s.role in roles]
            for s in members:
                s.retired = True
                if s.state in (State.STARTING, State.READY):
                    self.stop_child(s, self.stop_reason, drain, grace, now)
                elif s.state is State.EXITED:
                    s.next_start_at = None
            if any(s.live for s in members):
                return
            self.stop_phase += 1
        self.done = True

    # -- command plane -----------------------------------------------------------------

    def recv_control(self, now: float) -> None:
        import zmq

        from ipc.codec import encode
        from ipc.frames import Command, CommandReply

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
            if isinstance(frame, Command):
                reply = self.run_command(frame.name, frame.args or {})
            else:
                self.control_guard.errors["unexpected_type"] = self.control_guard.errors.get("unexpected_type", 0) + 1
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

    # -- views -------------------------------------------------------------------------

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
                "events": dict(s.events), "stats": s.stats, "endpoints": s.endpoints,
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
