"""Where a daemon instance lives on disk, and the lock that makes it unique.

Owns directory resolution, the daemon's umask, and the pid lock:

* :func:`restrict_umask`: ``umask 077`` for the daemon and every child.
* runtime dir (sockets, pid file): ``[daemon] runtime_dir``, else
  ``$RUNTIME_DIRECTORY`` (systemd ``RuntimeDirectory=``), else
  ``/run/brisvox`` as root, else ``/tmp/brisvox-<uid>``. It must be short:
  an ``ipc://`` path is limited to 107 bytes.
* state dir: ``[daemon] state_dir``, else ``$STATE_DIRECTORY``, else
  ``/var/lib/brisvox`` as root, else ``~/.local/state/brisvox``.
* The runtime dir is created mode 0700. Whether just created or already
  there, it must be owned by us and not writable by group or others
  (:func:`private_dir_problem`; a shared /tmp must not let another user
  pre-create it or swap our sockets), else the start is refused with a
  :class:`PathError` naming the key, the path and the fix (``brisvoxd``
  reports it as a configuration error). The state dir (logs, call records)
  is created 0700.
* :func:`loose_mode_problem` is the softer test ``brisvoxd check`` warns with:
  any access at all for group or others.
* :class:`PidLock`: ``<runtime>/brisvoxd.pid`` held with ``flock`` for the
  daemon's whole life. A second daemon on the same runtime dir fails to take
  it and is refused with the first one's pid. The file is unlinked on exit;
  after locking, the holder checks the path still names the locked inode (an
  exiting daemon may have unlinked it) and retries otherwise.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import Protocol

PID_FILE = "brisvoxd.pid"
DAEMON_UMASK = 0o077  # every file the daemon and its children create is owner-only
LONGEST_ENDPOINT = "supervisor"


class DaemonDirs(Protocol):
    """The keys of ``[daemon]`` read here (``brisvox.config.daemon.DaemonSection``)."""

    @property
    def runtime_dir(self) -> str: ...
    @property
    def state_dir(self) -> str: ...
    @property
    def workers(self) -> int: ...
    @property
    def agents(self) -> int: ...


class InstanceSettings(Protocol):
    """What of a daemon configuration is read here (``brisvox.config.daemon.DaemonConfig``)."""

    @property
    def daemon(self) -> DaemonDirs: ...
    @property
    def path(self) -> str | None: ...


class PathError(ValueError):
    """A runtime or state dir that cannot be used; ``key`` names the setting to change.

    Reads like the configuration error it is: ``<file>: <key>: <message>``
    (``<key>: <message>`` without a file); callers report it as one.
    """

    def __init__(self, key: str, message: str, path: str | None = None) -> None:
        super().__init__(key, message, path)
        self.key = key
        self.message = message
        self.path = path

    def __str__(self) -> str:
        return f"{self.path}: {self.key}: {self.message}" if self.path else f"{self.key}: {self.message}"


def restrict_umask() -> int:
    """Set the daemon's umask (:data:`DAEMON_UMASK`); returns the previous one.

    Called before anything is created and before any child is forked, so call
    records, logs, rings, sockets and the pid file are owner-only whatever the
    umask of the shell or unit that started the daemon.
    """
    return os.umask(DAEMON_UMASK)


def runtime_dir(cfg: InstanceSettings) -> Path:
    if cfg.daemon.runtime_dir:
        return Path(cfg.daemon.runtime_dir).expanduser()
    env = os.environ.get("RUNTIME_DIRECTORY", "")
    if env:
        return Path(env.split(":")[0])
    if os.geteuid() == 0:
        return Path("/run/brisvox")
    return Path(f"/tmp/brisvox-{os.getuid()}")


def state_dir(cfg: InstanceSettings) -> Path:
    if cfg.daemon.state_dir:
        return Path(cfg.daemon.state_dir).expanduser()
    env = os.environ.get("STATE_DIRECTORY", "")
    if env:
        return Path(env.split(":")[0])
    if os.geteuid() == 0:
        return Path("/var/lib/brisvox")
    return Path.home() / ".local" / "state" / "brisvox"


def check_endpoint_lengths(rdir: Path, cfg: InstanceSettings) -> None:
    """Every endpoint this daemon will bind fits the ipc path limit, else PathError."""
    from ipc.bus import BusError, endpoint

    names = [LONGEST_ENDPOINT, "control", f"worker-{cfg.daemon.workers}", f"agent-{cfg.daemon.agents}"]
    for name in names:
        try:
            endpoint(rdir, name)
        except BusError as e:
            raise PathError("daemon.runtime_dir", str(e), cfg.path) from None


def _owner(uid: int) -> str:
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def private_dir_problem(path: Path, st: os.stat_result, uid: int | None = None) -> str:
    """Why ``path`` (stat ``st``) cannot hold our sockets and pid file, or "" when it can."""
    uid = os.geteuid() if uid is None else uid
    if st.st_uid != uid:
        return (f"{path} is owned by {_owner(st.st_uid)}, not by {_owner(uid)} that runs the daemon; "
                f"remove it (it is recreated) or chown it, or set daemon.runtime_dir elsewhere")
    if st.st_mode & 0o022:
        return (f"{path} is writable by group or others (mode {st.st_mode & 0o7777:04o}); "
                f"fix: chmod 0700 {path}")
    return ""


def loose_mode_problem(path: Path) -> str:
    """"" when ``path`` is absent or owner-only, else a one-line description of its mode."""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    if st.st_mode & 0o077:
        return f"{path} is accessible by group or others (mode {st.st_mode & 0o7777:04o}); fix: chmod go= {path}"
    return ""


def prepare_dirs(cfg: InstanceSettings) -> tuple[Path, Path]:
    """Create and check the runtime and state dirs; PathError names the key on failure."""
    rdir, sdir = runtime_dir(cfg), state_dir(cfg)
    check_endpoint_lengths(rdir, cfg)
    try:
        rdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise PathError("daemon.runtime_dir", f"cannot create {rdir}: {e.strerror}", cfg.path) from None
    problem = private_dir_problem(rdir, os.stat(rdir))
    if problem:
        raise PathError("daemon.runtime_dir", problem, cfg.path)
    try:
        sdir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise PathError("daemon.state_dir", f"cannot create {sdir}: {e.strerror}", cfg.path) from None
    return rdir, sdir


class AlreadyRunning(Exception):
    def __init__(self, path: Path, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(
            f"brisvoxd is already running ({who}) with runtime dir {path.parent}; "
            f"stop it with `brisvoxd stop` or give this instance another daemon.runtime_dir"
        )
        self.pid = pid


def read_pid(rdir: Path) -> int | None:
    try:
        text = (rdir / PID_FILE).read_text().strip()
        return int(text) if text.isdigit() else None
    except OSError:
        return None


def is_locked(rdir: Path) -> bool:
    """True if a live daemon holds the runtime dir's pid lock."""
    try:
        fd = os.open(rdir / PID_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


class PidLock:
    """``flock`` on ``<runtime>/brisvoxd.pid``; the file holds the daemon's pid."""

    def __init__(self, rdir: Path) -> None:
        self.path = rdir / PID_FILE
        self.fd = -1

    def acquire(self) -> None:
        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise AlreadyRunning(self.path, read_pid(self.path.parent)) from None
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return
            os.close(fd)  # the previous holder unlinked it while we waited: retry
        raise AlreadyRunning(self.path, None)

    def write_pid(self, pid: int) -> None:
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, f"{pid}\n".encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = -1
