"""Private files every role writes (call records, call recordings): their modes and their retention.

Owns the one rule for both: :func:`open_private` creates (or reuses) a file
with mode 0600 whatever the umask (a file found looser is tightened),
:func:`private_dir` makes a directory 0700, and :func:`prune_older` deletes
the files of a directory older than ``keep_days`` (the ``[calls] keep_days``
retention: the agent process prunes its records with it, the gateway its
recordings).

Invariants: nothing here follows a name outside ``target`` (``glob`` of one
directory, no recursion); a file that cannot be stat'ed or unlinked is left
(another process may prune the same directory at the same time); ``keep_days``
0 keeps everything; a ``target`` that is not a directory prunes nothing.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FILE_MODE = 0o600  # what the caller said, their voice: the daemon's user only
DIR_MODE = 0o700


def open_private(path: str | os.PathLike[str], flags: int) -> int:
    """An fd of ``path`` opened ``O_WRONLY | O_CREAT | O_CLOEXEC | flags`` with mode :data:`FILE_MODE`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | flags, FILE_MODE)
    try:
        if os.fstat(fd).st_mode & 0o777 != FILE_MODE:
            os.fchmod(fd, FILE_MODE)  # a file made before (another umask, an older version)
    except OSError:
        os.close(fd)
        raise
    return fd


def recording_file_name(call_id: str, wall: float) -> str:
    """A call recording's file name: ``<UTC start, YYYYmmddTHHMMSS>-<call id, made safe>.wav``.

    The agent process names it (from its call's start) in the recording instruction, so the
    call's ``call.ended`` webhook can say which file it is; the gateway writes that file."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall))
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in call_id)[:80] or "call"
    return f"{stamp}-{safe}.wav"


def private_dir(path: str | os.PathLike[str]) -> Path:
    """``path`` as a directory (made, with its parents, mode :data:`DIR_MODE` if missing)."""
    p = Path(path)
    p.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    return p


def prune_older(target: Path, keep_days: int, pattern: str) -> int:
    """Delete the files of ``target`` matching ``pattern`` older than ``keep_days``; how many."""
    if keep_days <= 0 or not target.is_dir():
        return 0
    cutoff = time.time() - keep_days * 86400
    n = 0
    for p in target.glob(pattern):
        try:
            if p.stat().st_mtime < cutoff:
                p.unlink()
                n += 1
        except OSError:
            pass
    return n
