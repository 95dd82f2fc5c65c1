"""The brisvoxd supervisor: one synchronous master loop that owns every child.

:class:`Arbiter` owns the daemon's state (``starting``, ``running``,
``draining``, ``stopping``; the exit code; the configuration, which a reload
replaces), the master loop (start, the loop, signals, the timers, cleanup),
the commands and the views, and holds one collaborator per concern, each a
class in its own module stating its invariants:

* :class:`~brisvox.daemon.child_table.ChildTable` (``self.table``): the
  slots (:mod:`brisvox.daemon.slots`), spawn, reap, log forwarding
  (:mod:`brisvox.daemon.logs`), signals to a child, the child channel (ROUTER
  ``supervisor.sock``);
* :class:`~brisvox.daemon.health.HealthPolicy` (``self.health``): pings, hung
  detection, handshake timeouts, memory checks (it returns the children to
  restart for memory);
* :class:`~brisvox.daemon.shutdown.StopPlan` (``self.stop_plan``): the phased
  stop and the stop of one child (it says when the stop is complete);
* :class:`~brisvox.daemon.command_plane.CommandPlane` (``self.commands``):
  the ROUTER ``control.sock``, which hands each command to
  :meth:`Arbiter.run_command`;

and, besides, ``/metrics`` and ``/healthz`` (:mod:`brisvox.daemon.httpd`,
answers from :mod:`brisvox.daemon.views`) and systemd notification
(:mod:`brisvox.daemon.sdnotify`). The collaborators see the configuration
through a getter (``lambda: self.config``) and act on children only through
the table; none of them holds the arbiter.

The loop, in the style of gunicorn's arbiter: signal handlers only queue the
signal (``signal.set_wakeup_fd`` wakes the poll); each turn polls every
socket and pipe with a timeout no later than the nearest deadline, then
handles queued signals through ``handle_<name>`` methods, reaps children
with ``waitpid(WNOHANG)``, serves frames, commands and HTTP, and runs the
timers (:meth:`Arbiter.tick`: pings, hung detection, handshake timeouts,
stop escalation, restarts after backoff, memory checks, the ready
transition, sd_notify). There are no threads that touch its state, so nothing
fights the loop for it (the loop-stall probe's watchdog, :mod:`brisvox.runtime.loop_probe`,
only reads the loop thread's frame while a turn runs over 250 ms; each turn's length
is the probe's lateness).

Order at start (fork safety, see :mod:`brisvox.daemon.child`): umask 077
(every file of the daemon and its children owner-only), take the pid lock,
raise the soft ``RLIMIT_NOFILE`` to the hard limit (:mod:`brisvox.daemon.nofile`;
one line says what it got, a warning when the hard limit is low; every child
inherits it), sweep orphan rings (only segments our own user owns; other users' are left
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

Invariants:

* The state only moves forward: starting -> running (READY=1 sent once, when
  every child is ready or failed; the status pipe of ``brisvoxd start`` is
  answered then) -> draining -> stopping; a stop may begin in any state.
* The first fatal error sets the exit code; later ones do not overwrite it.
* No reload while draining or stopping.
* The daemon is done only when the stop plan's every phase is gone.
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from brisvox.config.daemon import DaemonConfig
from brisvox.config.errors import ConfigError
from brisvox.daemon import views
from brisvox.daemon.child_table import ChildTable
from brisvox.daemon.command_plane import CommandPlane, reload_config, resolve_log_format
from brisvox.daemon.health import HealthPolicy
from brisvox.daemon.logs import setup_logging
from brisvox.daemon.nofile import NofileLimit, describe, raise_nofile
from brisvox.daemon.sdnotify import Notifier
from brisvox.daemon.shutdown import StopPlan
from brisvox.daemon.slots import Slot, State
from brisvox.runtime import exitcodes
from brisvox.runtime.log_limit import LogLimiter
from brisvox.runtime.loop_probe import LoopProbe
from brisvox.runtime.paths import PidLock, restrict_umask

log = logging.getLogger("brisvox.supervisor")

MAX_LOOP_WAIT_S = 0.5


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
        self.ready_sent = False
        self.started_at = time.monotonic()
        self.started_wall = time.time()
        self.sig_queue: collections.deque[int] = collections.deque(maxlen=32)
        self.ctx: Any = None
        self.http: Any = None
        self.notifier = Notifier()
        self.next_status_notify = 0.0
        self.wake_r = self.wake_w = -1
        self.nofile: NofileLimit | None = None  # the supervisor's file limit, once raised at start

        def current() -> DaemonConfig:
            return self.config

        # the supervisor's one rate-limited logger: every repeated line of its loops goes through it
        self.log_limit = LogLimiter(log)
        self.table = ChildTable(current, self.rdir, self.pid, self.log_limit)
        self.health = HealthPolicy(self.table, current, self.pid, self.log_limit)
        self.stop_plan = StopPlan(self.table, current)
        self.commands = CommandPlane(self.run_command)
        self.probe = LoopProbe("supervisor")  # the master loop's turns (``loop`` in the snapshot)

    @property
    def slots(self) -> list[Slot]:
        """The process table (owned by :attr:`table`)."""
        return self.table.slots

    # -- lifecycle ---------------------------------------------------------------

    def run(self) -> int:
        restrict_umask()  # before any child is forked (``brisvoxd start`` set it already)
        lg = self.config.daemon.log
        setup_logging("supervisor", "supervisor", lg.level, lg.format)
        self.init_signals()  # first: a signal that arrives during start is queued, then handled
        try:
            self.start()
            self.probe.start()
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
        self.nofile = raise_nofile()  # before the first fork: every child inherits it
        warn, line = describe(self.nofile)
        (log.warning if warn else log.info)("%s", line)
        self.instance = self.table.instance = instance_id(self.pid)
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
                self.http = MiniHttp(addr[0], addr[1], self.serve_http, log_limit=self.log_limit)
            except OSError as e:
                raise StartError(f"daemon.metrics.listen {self.config.daemon.metrics.listen}: {e.strerror}") from None
        now = time.monotonic()
        for slot in self.slots:
            self.table.spawn(slot, now)
        # only now: the ZeroMQ context (every first child was forked without one)
        import zmq

        from ipc.bus import bind, endpoint, make_socket

        self.ctx = zmq.Context()
        self.table.chan = make_socket(self.ctx, zmq.ROUTER)
        bind(self.table.chan, endpoint(self.rdir, "supervisor"))
        self.commands.control = make_socket(self.ctx, zmq.ROUTER, hwm=100)
        bind(self.commands.control, endpoint(self.rdir, "control"))
        d = self.config.daemon
        self.health.restart_clock(time.monotonic())
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

        self.probe.close()
        self.table.close_logs()
        if self.instance:
            for name in list_segments(self.instance):
                (SHM_DIR / name).unlink(missing_ok=True)
        for sock in (self.table.chan, self.commands.control):
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
            self.table.kill(s, signal.SIGTERM)
        deadline = time.monotonic() + self.config.daemon.shutdown.term_timeout_s
        while time.monotonic() < deadline and any(s.live for s in live):
            self.reap(time.monotonic())
            time.sleep(0.02)
        for s in live:
            if s.live:
                self.table.kill(s, signal.SIGKILL)
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
        poller.register(self.table.chan, zmq.POLLIN)
        poller.register(self.commands.control, zmq.POLLIN)
        for fd in self.table.forwarders:
            poller.register(fd, zmq.POLLIN)
        if self.http is not None:
            for fd, ev in self.http.poll_items(now):
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
        self.probe.owe(now)  # what the poll woke for is due now: the turn's length is its lateness
        self.handle_signals()
        self.table.pump_logs(ready)
        # frames before exits: a child that fails its boot sends its error, then exits, and
        # both can land in one turn; the exit applied first would lose the error
        self.table.recv_children(now)
        self.reap(now)
        if ready.get(self.commands.control):
            self.commands.recv_control(now)
        if self.http is not None:
            self.http.handle({k: v for k, v in ready.items() if isinstance(k, int)}, now)
        self.tick(now)
        self.probe.paid()

    def next_wait(self, now: float) -> float:
        h = self.config.daemon.health
        times = [now + MAX_LOOP_WAIT_S, self.health.next_memory_check]
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

    def reap(self, now: float) -> None:
        for error in self.table.reap(now):  # a configuration error stops the daemon before the next exit
            self.fatal(exitcodes.CONFIG, error)

    def tick(self, now: float) -> None:
        """The timers of one turn, each slot by its state; then the daemon's own."""
        self.health.note_turn(now)
        for slot in list(self.slots):
            if slot.state is State.READY:
                self.health.probe(slot, now)
            elif slot.state is State.STARTING:
                self.health.check_handshake(slot, now)
            elif slot.state is State.STOPPING:
                self.stop_plan.escalate(slot, now)
            elif slot.state is State.EXITED and slot.next_start_at is not None and now >= slot.next_start_at:
                if not slot.retired and self.stop_plan.may_restart(slot.role):
                    self.table.spawn(slot, now)
        for slot in self.health.check_memory(now, running=self.state == "running"):
            self.stop_plan.stop_child(slot, "memory limit", True, self.config.daemon.shutdown.drain_timeout_s, now)
        if self.state in ("draining", "stopping"):
            self.advance_stop(now)
        if self.table.topology_dirty:
            self.table.push_topology()
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

    # -- signals -------------------------------------------------------------------

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
                self.table.kill(s, signal.SIGKILL)

    def handle_hup(self) -> None:
        ok, msg = self.reload()
        (log.info if ok else log.error)("SIGHUP: %s", msg)

    # -- stop ----------------------------------------------------------------------

    def begin_stop(self, drain: bool, reason: str) -> None:
        now = time.monotonic()
        if self.state in ("draining", "stopping"):
            if self.state == "draining" and not drain:
                log.info("stop requested while draining: ending calls now")
                self.state = "stopping"
                self.stop_plan.end_calls_now(reason, now)
            elif not drain:
                log.warning("second stop request: sending SIGTERM to every child now")
                self.stop_plan.term_all(now)
            return
        self.state = "draining" if drain else "stopping"
        self.stop_plan.begin(drain, reason)
        self.notifier.stopping(f"{self.state} ({reason}); {self.status_line()}")
        self.advance_stop(now)

    def advance_stop(self, now: float) -> None:
        if self.stop_plan.advance(now):
            self.done = True

    def fatal(self, code: int, message: str) -> None:
        if self.exit_code == exitcodes.OK:
            self.exit_code = code
            self.error_message = message
            if code == exitcodes.CONFIG:
                print(f"brisvoxd: configuration error: {message}", file=sys.stderr, flush=True)
        self.begin_stop(drain=False, reason="configuration error" if code == exitcodes.CONFIG else "fatal error")

    # -- commands and reload -----------------------------------------------------------

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
                self.stop_plan.drain_timeout_s = float(t)
            self.begin_stop(drain=True, reason="brisvoxd drain")
            return CommandReply(ok=True, data={"pid": self.pid, "state": self.state,
                                               "drain_timeout_s": self.stop_plan.drain_timeout_s})
        if name == "reload":
            ok, msg = self.reload()
            return CommandReply(ok=ok, data={"message": msg}, error="" if ok else msg)
        return CommandReply(ok=False, error=f"unknown command {name[:40]!r} (status, stop, drain, reload)")

    def reload(self) -> tuple[bool, str]:
        """Re-read the config file; apply what can change live; retry failed children.

        Scales workers and agents to the new counts (a scaled-down slot is
        drained, then removed)."""
        if self.state != "running" and self.state != "starting":
            return False, f"cannot reload while {self.state}"
        now = time.monotonic()
        try:
            new, notes = reload_config(self.config, self.cli_counts)
        except ConfigError as e:
            return False, f"configuration error, keeping the running configuration: {e}"
        self.config = new
        logging.getLogger().setLevel(new.daemon.log.level.upper())
        retried, scaled_down = self.table.rescale(new, now)
        for s in scaled_down:
            self.stop_plan.stop_child(s, "scaled down", True, self.stop_plan.drain_timeout_s, now)
        told = self.table.push_reload(new.path) if new.path else 0  # the gateway registers its trunks again
        msg = f"reloaded {new.path or '(defaults)'}; retried {retried} failed children; told {told} children"
        return True, msg + ("; " + "; ".join(notes) if notes else "")

    # -- views -------------------------------------------------------------------------

    def status_line(self) -> str:
        return views.status_line(self.slots)

    def snapshot(self) -> dict[str, Any]:
        from ipc.bus import endpoint

        now = time.monotonic()
        children = views.child_rows(self.slots, now)
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
                "status": self.status_line(), "stop_reason": self.stop_plan.reason,
                "decode_errors": {"supervisor": dict(self.table.chan_guard.errors),
                                  "control": dict(self.commands.control_guard.errors)},
                "log_lines": dict(self.table.log_lines),
                "send_failed": self.table.send_failed + self.commands.send_failed,
                "http_requests": self.http.requests if self.http else 0, "pss_bytes": self.health.pss,
                "nofile": self.nofile.as_dict() if self.nofile else None,
                "http_refused": self.http.refused() if self.http else {},
                "log_suppressed": dict(self.log_limit.suppressed),
                "loop": self.probe.snapshot(),
            },
            "children": children,
        }

    def serve_http(self, method: str, path: str) -> tuple[int, str, bytes]:
        import orjson

        from brisvox.daemon.metrics import CONTENT_TYPE, render

        if path == "/metrics":
            return 200, CONTENT_TYPE, render(self.snapshot()).encode()
        if path == "/healthz":
            code, body = views.healthz(self.state, self.slots)
            return code, "application/json", orjson.dumps(body) + b"\n"
        return 404, "text/plain", b"not found: try /metrics or /healthz\n"
