"""Small Linux process facilities the supervisor and children need.

Owns: the parent-death signal (``prctl(PR_SET_PDEATHSIG)`` through ctypes),
closing inherited file descriptors after a fork, PSS memory of a process
(psutil, ``/proc/<pid>/smaps_rollup``), and process existence checks. No
policy lives here.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal

PR_SET_PDEATHSIG = 1
_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def set_pdeathsig(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` when our parent thread exits. False if unsupported."""
    try:
        rc = _lib().prctl(PR_SET_PDEATHSIG, ctypes.c_ulong(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return False
    return rc == 0


def open_fds() -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir("/proc/self/fd"))
    except OSError:
        return list(range(3, 1024))


def close_inherited_fds(keep: set[int]) -> int:
    """Close every fd >= 3 not in ``keep``. Returns how many were closed."""
    n = 0
    for fd in open_fds():
        if fd < 3 or fd in keep:
            continue
        try:
            os.close(fd)
            n += 1
        except OSError:
            pass
    return n


def pss_bytes(pid: int) -> int | None:
    """Proportional set size of ``pid`` in bytes (None if unreadable or gone)."""
    import psutil

    try:
        return int(psutil.Process(pid).memory_full_info().pss)
    except (psutil.Error, AttributeError, OSError):
        return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
