"""The child side of the supervisor: fork, process setup, and :class:`ForkedChildRuntime`.

Owns everything a child process of brisvoxd does that is not its role's work:
the fork itself (:func:`spawn`), making the forked process clean and safe
(:func:`_child_entry`), the control channel to the supervisor (a DEALER
served by one control thread), and the API a role main sees, the
:class:`~brisvox.runtime.child_runtime.ChildRuntime` protocol, which
:class:`ForkedChildRuntime` implements::

    def main(rt: ChildRuntime) -> int: ...   # registered in brisvox/daemon/roles.py

Fork safety (pyzmq and onnxruntime are not fork-safe). The first children are forked before the
supervisor creates any ZeroMQ context. A *restarted* child is forked from a supervisor that now has
one (I/O threads, sockets, the metrics listener, log pipes). The child therefore, before anything
else: points stdout/stderr at its own log pipe, resets every signal disposition the supervisor
installed, and closes every inherited file descriptor except 0, 1, 2 (``/proc/self/fd`` scan). The
supervisor's Python objects stay referenced on the forked stack until ``os._exit``, so they are
never finalised in the child; pyzmq's own objects are inert in a process whose pid differs from
their creator's (their close/term are no-ops there). The child then makes its own context
(:meth:`ForkedChildRuntime.zmq_context`). It never returns into the supervisor's code: it always
leaves through ``os._exit``.

Control channel. The runtime's DEALER (identity ``<role>-<index>:<pid>``) connects to the
supervisor's ROUTER at ``endpoint(runtime_dir, "supervisor")``. A control thread owns that socket:
it answers Ping with Pong (carrying the age of the main loop's last :meth:`heartbeat`, the last
:meth:`report`), applies Topology, and answers Shutdown with ShutdownAck before it sets
:attr:`stopping` and runs the shutdown callbacks (one table, :meth:`control_frame_handlers`; any
other frame is counted as ``unexpected_type`` and logged once per type). Frames the main thread
sends (Hello, ChildEvent) go through a deque plus a wake pipe: only the control thread touches it.

Liveness. ``prctl(PR_SET_PDEATHSIG, SIGTERM)`` plus a ``getppid()`` check
at start and every 250 ms: when the supervisor is gone the child stops like on
a Shutdown, and exits hard after ``daemon.health.orphan_exit_s`` if its main
has not returned. SIGTERM means "stop now" (no drain); a second SIGTERM exits
at once. SIGINT and SIGHUP are ignored (Ctrl-C in a terminal reaches the
whole process group; the supervisor coordinates the stop). SIGUSR2 dumps every
thread's stack to the log (the supervisor sends it before killing a hung child).
"""

from __future__ import annotations

import asyncio
import collections
import faulthandler
import importlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from brisvox.config.daemon import DaemonConfig
from brisvox.config.errors import ConfigError
from brisvox.runtime import exitcodes
from brisvox.runtime.child_runtime import ChildRuntime
from brisvox.runtime.log_limit import LogLimiter

log = logging.getLogger("brisvox.child")

TEST_ROLE_MAIN_ENV = "BRISVOX_TEST_ROLE_MAIN"
SUPERVISOR_ENDPOINT = "supervisor"
_CONTROL_POLL_MS = 250


def child_name(role: str, index: int) -> str:
    return f"{role}-{index}"


def proc_title(role: str, index: int) -> str:
    return f"brisvoxd: {role} {index}"


def resolve_main(role: str, index: int) -> str:
    """``module:function`` of a role's main.

    Test only: ``BRISVOX_TEST_ROLE_MAIN="worker=mod:fn,agent-0=mod:fn"``
    replaces the main of a role, or of one child (``role-index`` wins). The
    system tests use it to run crashing or hanging children; never set it in
    production (the supervisor logs a warning when it is set).
    """
    override = os.environ.get(TEST_ROLE_MAIN_ENV, "")
    if override:
        table = dict(item.split("=", 1) for item in override.split(",") if "=" in item)
        ref = table.get(child_name(role, index)) or table.get(role)
        if ref:
            return ref.strip()
    from brisvox.daemon.roles import ROLE_MAINS

    return ROLE_MAINS[role]


def load_main(ref: str) -> Callable[[ChildRuntime], int | None]:
    module, _, func = ref.partition(":")
    fn: Callable[[ChildRuntime], int | None] = getattr(importlib.import_module(module), func or "main")
    return fn


@dataclass(frozen=True)
class ChildSpec:
    """What the supervisor hands a child across the fork."""

    role: str
    index: int
    config: DaemonConfig
    runtime_dir: Path
    instance: str
    parent_pid: int
    main_ref: str
    log_fd: int = -1  # write end of the output pipe; -1 keeps the inherited stderr

    @property
    def name(self) -> str:
        return child_name(self.role, self.index)


class ChildExit(SystemExit):
    """Raised by :meth:`ForkedChildRuntime.fail`; carries the exit code out of a role main."""


class ForkedChildRuntime:
    """What a role main gets in a forked child of brisvoxd (a
    :class:`~brisvox.runtime.child_runtime.ChildRuntime`). Create through
    :func:`spawn` (or directly in tests).

    Attributes: ``role``, ``index``, ``name`` (``worker-1``), ``pid``,
    ``config`` (:class:`DaemonConfig`), ``runtime_dir`` (Path), ``instance``
    (ring instance tag), ``stopping`` (threading.Event), ``drain`` and
    ``grace_s`` (from the Shutdown frame), ``stop_reason``, ``topology``
    (latest rows ``{"role","index","pid","state"}``).
    """

    def __init__(self, spec: ChildSpec) -> None:
        self.role = spec.role
        self.index = spec.index
        self.name = spec.name
        self.pid = os.getpid()
        self.config = spec.config
        self.runtime_dir = Path(spec.runtime_dir)
        self.instance = spec.instance
        self.parent_pid = spec.parent_pid
        self.main_ref = spec.main_ref
        self.stopping = threading.Event()
        self.drain = False
        self.grace_s = 0.0
        self.stop_reason = ""
        self.topology: list[dict[str, Any]] = []
        self.topology_seq = -1
        self.is_ready = False
        self.orphaned = False
        self._ctx: Any = None
        self._out: collections.deque[bytes] = collections.deque(maxlen=1000)
        self._requests: collections.deque[tuple[str, Any]] = collections.deque()
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._beat: float | None = None
        self._calls = 0
        self._stats: dict[str, Any] | None = None
        self._shutdown_cbs: list[Callable[[], Any]] = []
        self._topology_cbs: list[Callable[[list[dict[str, Any]]], Any]] = []
        self._reload_cbs: list[Callable[[str], Any]] = []
        self.reload_seq = -1
        self._topology_lock = threading.Lock()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._connected = threading.Event()
        self.control_errors: dict[str, int] = {}
        self.sent_dropped = 0
        self.log_limit = LogLimiter(log)  # repeated lines of the control thread

    # -- endpoints and ZeroMQ ------------------------------------------------

    def inbox_endpoint(self, role: str, index: int) -> str:
        """``ipc://<runtime_dir>/<role>-<index>.sock``: where that child's ROUTER inbox binds."""
        from ipc.bus import endpoint

        return endpoint(self.runtime_dir, child_name(role, index))

    def endpoint(self, name: str) -> str:
        from ipc.bus import endpoint

        return endpoint(self.runtime_dir, name)

    def zmq_context(self) -> Any:
        """This process's ZeroMQ context (sync; shadow it for asyncio:
        ``zmq.asyncio.Context.shadow(rt.zmq_context())``). Terminated at exit."""
        if self._ctx is None:
            import zmq

            self._ctx = zmq.Context()
        return self._ctx

    # -- handshake -----------------------------------------------------------

    def ready(self, endpoints: dict[str, str] | None = None, measured: dict[str, float] | None = None) -> None:
        """Complete the init handshake (``measured``: boot figures, shown in the Topology rows)."""
        from ipc.frames import Hello

        if self.is_ready:
            log.warning("rt.ready() called twice; ignored")
            return
        self.is_ready = True
        self._beat = time.monotonic()
        self._send(Hello(role=self.role, index=self.index, pid=self.pid, endpoints=endpoints, measured=measured))

    def fail(self, error: str, code: int = exitcodes.BOOT) -> NoReturn:
        """Boot failed: tell the supervisor (Hello ok=False) and exit with ``code``.

        Use ``exitcodes.CONFIG`` with an error naming the key for a
        configuration error: the daemon then stops instead of restarting.
        The error is also logged: the Hello may not reach a supervisor that
        is not listening yet, but the log pipe always does.
        """
        log.error("boot failed: %s", error)
        self._fail_hello(error)
        raise ChildExit(code)

    def _fail_hello(self, error: str) -> None:
        from ipc.frames import ChildEvent, Hello

        if self.is_ready:
            self._send(ChildEvent(kind="fatal", detail=error[:2000]))
        else:
            self._send(Hello(role=self.role, index=self.index, pid=self.pid, ok=False, error=error[:2000]))

    # -- liveness and reports --------------------------------------------------

    def heartbeat(self) -> None:
        """The main loop is alive. Call at least every second once ready."""
        self._beat = time.monotonic()

    async def heartbeat_task(self, interval: float = 0.5) -> None:
        """For asyncio mains: beat from the loop until stopping (``create_task`` it)."""
        while not self.stopping.is_set():
            self._beat = time.monotonic()
            await asyncio.sleep(interval)

    def report(self, calls: int, stats: dict[str, Any] | None = None) -> None:
        """Load and counters sent with the next pong (shown by status and /metrics).

        ``stats`` values that are numbers become ``brisvox_child_stat`` gauges;
        ``stats["decode_errors"] = {kind: count}`` is exported as
        ``brisvox_decode_errors_total``. Keep it small (it rides every pong).
        """
        self._calls = int(calls)
        self._stats = stats

    def event(self, kind: str, detail: str = "", data: dict[str, Any] | None = None) -> None:
        """Something operators should see: counted and logged by the supervisor."""
        from ipc.frames import ChildEvent

        self._send(ChildEvent(kind=kind, detail=detail, data=data))

    # -- stop and topology -------------------------------------------------------

    def add_shutdown_callback(self, cb: Callable[[], Any]) -> None:
        """``cb()`` runs once, on the control thread, when a stop is requested
        (use ``loop.call_soon_threadsafe``). Runs at once if already stopping."""
        self._shutdown_cbs.append(cb)
        if self.stopping.is_set():
            self._call(cb)

    def add_topology_callback(self, cb: Callable[[list[dict[str, Any]]], Any],
                              loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``cb(rows)`` runs at every Topology push: on the control thread, or with ``loop`` on that
        loop (nothing once it is closed: a push while the role stops reaches no one). The Topology
        already received is replayed at once, under the lock pushes are applied with (none is lost)."""

        def post(rows: list[dict[str, Any]]) -> None:
            if loop is None:
                return cb(rows)
            if loop.is_closed():
                return
            try:
                loop.call_soon_threadsafe(cb, list(rows))
            except RuntimeError:  # closed between the check and the call
                pass

        with self._topology_lock:
            self._topology_cbs.append(post)
            if self.topology_seq >= 0:
                self._call(post, self.topology)

    def add_reload_callback(self, cb: Callable[[str], Any], loop: asyncio.AbstractEventLoop | None = None) -> None:
        """``cb(path)`` runs at every Reload frame (the configuration file the supervisor applied):
        on the control thread, or with ``loop`` on that loop (nothing once it is closed). A reload
        before the callback was added is not replayed: the child started with that file."""

        def post(path: str) -> None:
            if loop is None:
                return cb(path)
            if loop.is_closed():
                return
            try:
                loop.call_soon_threadsafe(cb, path)
            except RuntimeError:  # closed between the check and the call
                pass

        self._reload_cbs.append(post)

    def stop_event(self, loop: asyncio.AbstractEventLoop) -> asyncio.Event:
        """An asyncio.Event on ``loop`` that is set when a stop is requested."""
        ev = asyncio.Event()

        def fire() -> None:
            loop.call_soon_threadsafe(ev.set)

        self.add_shutdown_callback(fire)
        return ev

    def peers(self, role: str, state: str = "ready") -> list[dict[str, Any]]:
        """Topology rows of ``role`` in ``state``."""
        return [r for r in self.topology if r.get("role") == role and r.get("state") == state]

    def request_stop(self, reason: str, drain: bool = False, grace_s: float = 0.0) -> None:
        """Stop this child from inside (thread- and signal-safe)."""
        self._requests.append(("stop", (reason, drain, grace_s)))
        self._wake()

    # -- internals -------------------------------------------------------------

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except (BlockingIOError, OSError):
            pass

    def _send(self, frame: Any) -> None:
        from ipc.codec import encode

        if len(self._out) == self._out.maxlen:
            self.sent_dropped += 1
        self._out.append(encode(frame))
        self._wake()

    def _call(self, cb: Callable[..., Any], *args: Any) -> None:
        try:
            cb(*args)
        except Exception:  # a callback that fails at every Topology push: its first traceback, then a count
            import traceback

            self.log_limit(f"callback:{getattr(cb, '__qualname__', type(cb).__name__)}", "callback %r failed:\n%s",
                           cb, traceback.format_exc(limit=8)[-4000:], level=logging.ERROR)

    def _begin_stop(self, reason: str, drain: bool, grace_s: float) -> None:
        if self.stopping.is_set():
            if self.drain and not drain:
                self.drain = False  # an escalation: stop draining
            return
        self.stop_reason = reason
        self.drain = drain
        self.grace_s = grace_s
        self.stopping.set()
        log.info("stopping: %s (drain=%s, grace %.1fs)", reason, drain, grace_s)
        for cb in list(self._shutdown_cbs):
            self._call(cb)

    def start(self) -> None:
        """Connect to the supervisor and start the control thread."""
        self._thread = threading.Thread(target=self._control_loop, name="brisvox-control", daemon=True)
        self._thread.start()
        self._connected.wait(5.0)

    def _pong_stats(self) -> dict[str, Any] | None:
        stats = dict(self._stats) if self._stats else {}
        if self.control_errors:
            de = dict(stats.get("decode_errors") or {})
            for k, v in self.control_errors.items():
                de[k] = de.get(k, 0) + v
            stats["decode_errors"] = de
        return stats or None

    def control_frame_handlers(self) -> dict[type, Callable[[Any, Any], None]]:
        """The control thread's dispatch table: frame class -> ``handler(sock, frame)``."""
        from ipc.frames import Ping, Reload, Shutdown, Topology

        return {Ping: self._on_ping, Topology: self._on_topology, Shutdown: self._on_shutdown,
                Reload: self._on_reload}

    def _reply_now(self, sock: Any, frame: Any) -> None:
        import zmq

        from ipc.codec import encode

        try:
            sock.send(encode(frame), zmq.NOBLOCK)
        except zmq.Again:
            self.sent_dropped += 1

    def _on_ping(self, sock: Any, f: Any) -> None:
        from ipc.frames import Pong

        beat = -1 if self._beat is None else int((time.monotonic() - self._beat) * 1000)
        self._reply_now(sock, Pong(seq=f.seq, sent_ns=f.sent_ns, calls=self._calls, stats=self._pong_stats(), beat_ms=beat))

    def _on_topology(self, sock: Any, f: Any) -> None:
        with self._topology_lock:
            if f.seq > self.topology_seq:
                self.topology_seq = f.seq
                self.topology = list(f.children)
                for tcb in list(self._topology_cbs):
                    self._call(tcb, self.topology)

    def _on_reload(self, sock: Any, f: Any) -> None:
        if f.seq > self.reload_seq:  # a resent or reordered frame is applied once
            self.reload_seq = f.seq
            for cb in list(self._reload_cbs):
                self._call(cb, f.path)

    def _on_shutdown(self, sock: Any, f: Any) -> None:
        from ipc.frames import ShutdownAck

        self._reply_now(sock, ShutdownAck(pid=self.pid))
        self._begin_stop(f.reason, f.drain, f.grace_s)

    def _control_loop(self) -> None:
        import zmq

        from ipc.bus import connect, endpoint, make_socket
        from ipc.codec import DecodeGuard

        ctx = self.zmq_context()
        sock = make_socket(ctx, zmq.DEALER, hwm=1000, identity=f"{self.name}:{self.pid}".encode())
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 500)
        connect(sock, endpoint(self.runtime_dir, SUPERVISOR_ENDPOINT))
        self._connected.set()
        guard = DecodeGuard(f"{self.name} control")
        guard.errors = self.control_errors
        handlers = self.control_frame_handlers()
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        orphan_deadline = 0.0
        try:
            while True:
                try:
                    events = dict(poller.poll(_CONTROL_POLL_MS))
                except zmq.ZMQError:
                    events = {}
                if self._wake_r in events:
                    try:
                        while os.read(self._wake_r, 4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                while self._requests:
                    kind, arg = self._requests.popleft()
                    if kind == "stop":
                        reason, drain, grace = arg
                        if reason == "SIGTERM" and self.stopping.is_set():
                            log.warning("second SIGTERM: exiting now")
                            _hard_exit(exitcodes.SIGNAL_BASE + signal.SIGTERM)
                        self._begin_stop(reason, drain, grace)
                while self._out:
                    try:
                        sock.send(self._out[0], zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._out.popleft()
                if sock in events:
                    for _ in range(100):
                        try:
                            data = sock.recv(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        f = guard.decode(data)
                        if f is None:
                            continue
                        handler = handlers.get(type(f))
                        if handler is None:
                            guard.unexpected(f)
                        else:
                            handler(sock, f)
                if not self.orphaned and os.getppid() != self.parent_pid:
                    self.orphaned = True
                    orphan_deadline = time.monotonic() + self.config.daemon.health.orphan_exit_s
                    log.warning("supervisor %d is gone; stopping", self.parent_pid)
                    self._begin_stop("supervisor died", False, 0.0)
                if self.orphaned and time.monotonic() > orphan_deadline:
                    log.error("supervisor gone and main did not return in time; exiting")
                    _hard_exit(exitcodes.FAILURE)
                if self._closing and not self._out:
                    break
        finally:
            sock.close(linger=1000)

    def run_main(self) -> int:
        """Load and run the role main; turn every outcome into an exit code."""
        try:
            fn = load_main(self.main_ref)
        except Exception as e:  # import errors are boot failures
            log.exception("cannot load role main %s", self.main_ref)
            self._fail_hello(f"cannot load role main {self.main_ref}: {type(e).__name__}: {e}")
            return exitcodes.BOOT
        try:
            code = fn(self)
        except ChildExit as e:
            code = e.code if isinstance(e.code, int) else exitcodes.FAILURE
        except ConfigError as e:
            log.error("configuration error: %s", e)
            self._fail_hello(f"configuration error: {e}")
            code = exitcodes.CONFIG
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else exitcodes.FAILURE)
        except BaseException as e:
            log.exception("%s main failed", self.role)
            self._fail_hello(f"{type(e).__name__}: {e}")
            code = exitcodes.FAILURE if self.is_ready else exitcodes.BOOT
        return int(code or 0)

    def close(self, timeout: float = 2.0) -> None:
        """Flush queued frames, stop the control thread, destroy the context."""
        self._closing = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._ctx is not None:
            # destroy() closes the sockets this context object made; one made through a shadow
            # context (asyncio) and left open would make term() wait forever, and with it the
            # process's exit: bounded here, the process exits anyway and says why
            ctx = self._ctx

            def destroy() -> None:
                try:
                    ctx.destroy(linger=0)
                except Exception:
                    pass

            t = threading.Thread(target=destroy, name="zmq-term", daemon=True)
            t.start()
            t.join(timeout)
            if t.is_alive():
                from ipc.bus import describe_open

                log.warning("the ZeroMQ context did not terminate in %.1f s; sockets still open: %s; "
                            "exiting anyway", timeout, describe_open(ctx))
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass


# -- process setup -------------------------------------------------------------

_RUNTIME: ForkedChildRuntime | None = None


def _hard_exit(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def _on_sigterm(signum: int, frame: Any) -> None:
    rt = _RUNTIME
    if rt is None:
        _hard_exit(exitcodes.SIGNAL_BASE + signum)
    rt.request_stop("SIGTERM")


def _setup_signals() -> None:
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGQUIT, signal.SIGUSR1, signal.SIGWINCH, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def _child_entry(spec: ChildSpec) -> NoReturn:
    """Runs in the forked child; never returns."""
    global _RUNTIME
    code = exitcodes.FAILURE
    try:
        if spec.log_fd >= 0:
            os.dup2(spec.log_fd, 1)
            os.dup2(spec.log_fd, 2)
        _setup_signals()
        from brisvox.daemon.procutil import close_inherited_fds, set_pdeathsig

        close_inherited_fds(keep=set())
        set_pdeathsig(signal.SIGTERM)
        if os.getppid() != spec.parent_pid:
            _hard_exit(exitcodes.FAILURE)  # the supervisor died before we armed the signal
        for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"):
            os.environ.pop(var, None)
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        os.environ["BRISVOX_ROLE"] = spec.role
        os.environ["BRISVOX_INDEX"] = str(spec.index)
        try:
            import setproctitle

            setproctitle.setproctitle(proc_title(spec.role, spec.index))
        except ImportError:
            pass
        from brisvox.daemon.logs import setup_logging

        lg = spec.config.daemon.log
        # through the supervisor's pipe always JSON: it renders text for a terminal itself
        setup_logging(spec.role, spec.name, lg.level, "json" if spec.log_fd >= 0 else lg.format)
        faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)
        rt = ForkedChildRuntime(spec)
        _RUNTIME = rt
        rt.start()
        log.debug("child started (main %s)", spec.main_ref)
        code = rt.run_main()
        rt.close()
        logging.shutdown()
    except BaseException:
        try:
            log.exception("child setup failed")
        except Exception:
            pass
    _hard_exit(code)


def spawn(spec: ChildSpec) -> int:
    """Fork a child running ``spec``; returns its pid in the parent."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    pid = os.fork()
    if pid == 0:
        _child_entry(spec)
    return pid
