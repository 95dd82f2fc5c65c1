"""The brisvoxd supervisor: one synchronous master loop that owns every child.

Owns the process table (:mod:`brisvox.daemon.slots`), the child channel
(ROUTER ``supervisor.sock``), the command plane (ROUTER ``control.sock``),
``/metrics`` and ``/healthz`` (:mod:`brisvox.daemon.httpd`), systemd
notification (:mod:`brisvox.daemon.sdnotify`), and the forwarding of
children's log lines (:mod:`brisvox.daemon.logs`).

This module holds the master loop itself (start, the loop, signals, cleanup);
:class:`Arbiter` mixes in its parts, each one concern, each stating its
invariants: :mod:`brisvox.daemon.child_table` (spawn, reap, the child
channel), :mod:`brisvox.daemon.health` (the timers: pings, hung detection,
restarts, memory, sd_notify), :mod:`brisvox.daemon.shutdown` (the phased
stop and the stop of one child) and :mod:`brisvox.daemon.command_plane`
(commands, reload, status and HTTP views).

The loop, in the style of gunicorn's arbiter: signal handlers only queue the
signal (``signal.set_wakeup_fd`` wakes the poll); each turn polls every
socket and pipe with a timeout no later than the nearest deadline, then
handles queued signals through ``handle_<name>`` methods, reaps children
with ``waitpid(WNOHANG)``, serves frames, commands and HTTP, and runs the
timers (pings, hung detection, handshake timeouts, stop escalation,
restarts after backoff, memory checks, sd_notify). There are no threads, so
nothing fights the loop for state.

Order at start (fork safety, see :mod:`brisvox.daemon.child`): umask 077
(every file of the daemon and its children owner-only), take the pid lock,
sweep orphan rings (only segments our own user owns; other users' are left
and logged), bind the metrics listener and open the notify socket, fork
every child, and only then create the ZeroMQ context and bind the two
ROUTERs (children's DEALERs reconnect until the bind exists).

Stop: in phases, gateway and agents first, then workers
(:mod:`brisvox.daemon.shutdown`). At the end the instance's
``/dev/shm/brisvox.*`` segments and the runtime dir's sockets are removed and
the pid lock is released.

Signals: TERM = drain then stop (what systemd sends); INT = stop (a second
INT, or ``stop`` while stopping, SIGTERMs every child at once); QUIT = kill
every child now; HUP = reload; CHLD = reap.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

from brisvox.config.daemon import DaemonConfig
from brisvox.daemon.child_table import ROLE_ORDER, ChildTable
from brisvox.daemon.command_plane import CommandPlane, resolve_log_format
from brisvox.daemon.health import HealthPolicy
from brisvox.daemon.logs import LineForwarder, setup_logging
from brisvox.daemon.sdnotify import Notifier
from brisvox.daemon.shutdown import StopPlan
from brisvox.daemon.slots import Slot, State, StormTracker
from brisvox.runtime import exitcodes
from brisvox.runtime.paths import PidLock, restrict_umask

log = logging.getLogger("brisvox.supervisor")

MAX_LOOP_WAIT_S = 0.5


class StartError(Exception):
    """The daemon cannot start for a reason outside the config file (port in use, ...)."""


class Arbiter(ChildTable, HealthPolicy, StopPlan, CommandPlane):
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
        self.child_handlers = self.child_frame_handlers()
        self.control_handlers = self.control_frame_handlers()

    # -- lifecycle ---------------------------------------------------------------

    def run(self) -> int:
        restrict_umask()  # before any child is forked (``brisvoxd start`` set it already)
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
        from ipc.ring import instance_id, sweep_segments

        self.lock.write_pid(self.pid)
        self.instance = instance_id(self.pid)
        sweep = sweep_segments(keep=self.instance)
        if sweep.removed:
            log.warning("removed %d shared-memory segments of dead instances", len(sweep.removed))
        if sweep.foreign:
            log.info("left %d shared-memory segments of other users (uid %s) in place",
                     len(sweep.foreign), ", ".join(map(str, sweep.uids)))
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
