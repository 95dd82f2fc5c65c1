"""Shared-memory audio ring: one writer, any number of readers, int16 samples.

Owns the layout and the read/write protocol of the audio plane (the two planes: control
frames over ZeroMQ, audio in these rings; docs/ARCHITECTURE.md).

Layout (all header fields are little-endian int64, each on its own 64-byte line)::

    line 0   magic, version, capacity, rate, creator pid   (static after create)
    line 1   write_pos    samples published so far (free-running, absolute)
    line 2   reserve_pos  samples the writer has started to copy (>= write_pos)
    line 3   floor        the cut floor: readers skip everything before it
    line 4   closed       1 once the writer has finished the stream
    256..    buffer       ``capacity`` int16 samples, capacity a power of two

Invariants:

* Positions are absolute sample counts since the stream started; sample ``p``
  lives at buffer index ``p & (capacity - 1)``. A position means the same
  thing in every process.
* The writer is the only process that stores samples, ``write_pos`` and
  ``reserve_pos``. It first raises ``reserve_pos`` (telling readers which old
  samples are about to be overwritten), copies the payload, then publishes
  ``write_pos`` (kfifo order: publish after the payload).
* A reader never blocks the writer. It copies what is published, then
  re-reads ``reserve_pos``: anything older than ``reserve_pos - capacity``
  may have been overwritten during the copy, is dropped from the front and
  counted as lost. So a reader that falls more than a ring behind skips
  forward and reports exactly how many samples it lost.
* ``floor`` only rises (``cut`` takes the max). It has a single writer too:
  the process that owns Clear for that stream (for the ``out`` ring, the
  gateway). Samples below the floor are skipped, counted as ``skipped``, not
  ``lost``.
* Aligned 8-byte stores and loads are single instructions on the 64-bit
  hosts we support and stores are not reordered with other stores (x86-TSO);
  the publish order above is what keeps readers consistent. The header is read
  and stored through a native ``q`` memoryview (an aligned 8-byte load/store per
  field, about three times cheaper per access than a numpy scalar), which is
  why the module refuses a big-endian host at import.

Segments live in ``/dev/shm`` and are named ``brisvox.<instance>.<call>-<key>.<kind>``
(see :func:`ring_name`): ``key`` is random per call (:func:`new_ring_key`, 64 bits
from :mod:`secrets`), chosen by the gateway and carried to the agent and the worker
in the frames that tell them about the call (``CallStart.ring_key``,
``AttachCall.ring_key``), so no other local user can guess the next call's names
and create them first. Every segment is created exclusively (``O_CREAT | O_EXCL |
O_NOFOLLOW``) and set to mode 0600 whatever the umask; :meth:`Ring.attach` maps only
a regular file the effective user owns with mode 0600 (else :class:`RingError`),
so a segment another user planted under a ring's name is refused, never read or
written. The orphan sweep
(:func:`sweep_segments`) removes only dead instances' segments that the
sweeping user owns; another user's are left and reported. We map the file directly instead of using
``multiprocessing.shared_memory``: on Python 3.11 its resource tracker
unlinks segments a process merely attached to when that process exits, and it
spawns a tracker process per child.
"""

from __future__ import annotations

import mmap
import os
import re
import secrets
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

MAGIC = 0x4252_5356_5249_4E47  # "BRSVRING"
VERSION = 1
SHM_DIR = Path("/dev/shm")
PREFIX = "brisvox."
HEADER_BYTES = 320
_LINE = 8  # int64 slots per 64-byte cache line
_W = 1 * _LINE
_R = 2 * _LINE
_F = 3 * _LINE
_C = 4 * _LINE
MAX_CAPACITY = 1 << 26  # 64 Mi samples: 70 min at 16 kHz
if sys.byteorder != "little":  # the header is little-endian and read through a native view
    raise ImportError("ipc.ring: the shared-memory layout needs a little-endian host")
_NAME_RE = re.compile(r"^brisvox\.([A-Za-z0-9-]+)\.([A-Za-z0-9_-]+)\.([a-z0-9]+)$")
_KEY_RE = re.compile(r"^[0-9a-f]{16,64}$")
MODE = 0o600  # the only mode a ring segment may have


class RingError(Exception):
    """A ring could not be created or attached (bad name, key, owner, mode, magic, rate, size)."""


def new_ring_key() -> str:
    """A call's ring key: 16 hex digits (64 random bits) that make its ring names unguessable."""
    return secrets.token_hex(8)


def ring_name(instance: str, call_id: str, kind: str, key: str = "") -> str:
    """Name of a call's ring: ``brisvox.<instance>.<call_id>-<key>.<kind>``.

    The gateway's calls always have a ``key`` (:func:`new_ring_key`); the keyless form
    ``brisvox.<instance>.<call_id>.<kind>`` is for tests and benches on their own rings.
    The sweep's grammar (``prefix.instance.call.kind``) reads both."""
    if key and not _KEY_RE.match(key):
        raise RingError(f"invalid ring key {key!r}")
    name = f"{PREFIX}{instance}.{call_id}-{key}.{kind}" if key else f"{PREFIX}{instance}.{call_id}.{kind}"
    if not _NAME_RE.match(name):
        raise RingError(f"invalid ring name {name!r}")
    return name


def sibling_name(name: str, kind: str) -> str:
    """The name of the same call's ring of another ``kind`` (same instance, call and key)."""
    m = _NAME_RE.match(name)
    if not m or not re.fullmatch(r"[a-z0-9]+", kind):
        raise RingError(f"invalid ring name {name!r} or kind {kind!r}")
    return f"{PREFIX}{m.group(1)}.{m.group(2)}.{kind}"


def instance_id(pid: int | None = None) -> str:
    """Daemon instance tag: the supervisor pid plus its start time.

    The start time guards the orphan sweep against pid reuse.
    """
    pid = os.getpid() if pid is None else pid
    ctime = int(psutil.Process(pid).create_time() * 100)
    return f"{pid}-{ctime % 100_000_000:08d}"


def instance_alive(instance: str) -> bool:
    """True if the process that owns ``instance`` is still the one that made it."""
    try:
        pid_s, _, _ = instance.partition("-")
        return instance_id(int(pid_s)) == instance
    except (ValueError, psutil.Error):
        return False


@dataclass(frozen=True, slots=True)
class Sweep:
    """What a sweep did: ``removed`` dead instances' segments, left ``foreign`` ones (``uids``)."""

    removed: list[str]
    foreign: list[str]
    uids: list[int]


def sweep_decision(instance: str, keep: str | None, owner_uid: int, uid: int,
                   alive: Callable[[str], bool]) -> str:
    """``"remove"``, ``"keep"`` (ours, or alive) or ``"foreign"`` for one segment.

    A segment another user owns is never removed, whether its instance looks
    dead or not (its processes may just be invisible to us); ``alive`` is only
    asked about our own.
    """
    if owner_uid != uid:
        return "foreign"
    if instance == keep or alive(instance):
        return "keep"
    return "remove"


def sweep_segments(keep: str | None = None, uid: int | None = None,
                   alive: Callable[[str], bool] | None = None) -> Sweep:
    """Unlink every ``brisvox.*`` segment of a dead instance that ``uid`` (default: us) owns.

    ``keep`` names an instance to spare even if its owner looks dead (the
    caller's own). Segments of other users are left and reported.
    """
    uid = os.geteuid() if uid is None else uid
    is_alive = instance_alive if alive is None else alive
    seen: dict[str, bool] = {}

    def cached(inst: str) -> bool:
        if inst not in seen:
            seen[inst] = is_alive(inst)
        return seen[inst]

    removed: list[str] = []
    foreign: list[str] = []
    uids: set[int] = set()
    try:
        entries = list(SHM_DIR.iterdir())
    except OSError:
        return Sweep(removed, foreign, [])
    for entry in entries:
        m = _NAME_RE.match(entry.name)
        if not m:
            continue
        try:
            owner = entry.lstat().st_uid
        except FileNotFoundError:
            continue
        verdict = sweep_decision(m.group(1), keep, owner, uid, cached)
        if verdict == "foreign":
            foreign.append(entry.name)
            uids.add(owner)
        elif verdict == "remove":
            try:
                entry.unlink()
                removed.append(entry.name)
            except FileNotFoundError:
                pass
    return Sweep(removed, foreign, sorted(uids))


def sweep_orphans(keep: str | None = None) -> list[str]:
    """Names removed by :func:`sweep_segments` of our own dead instances."""
    return sweep_segments(keep).removed


def list_segments(instance: str | None = None) -> list[str]:
    """Names of brisvox segments in /dev/shm, optionally of one instance."""
    out = []
    for entry in SHM_DIR.iterdir():
        m = _NAME_RE.match(entry.name)
        if m and (instance is None or m.group(1) == instance):
            out.append(entry.name)
    return sorted(out)


@dataclass(frozen=True, slots=True)
class ReadResult:
    """What one read returned: ``samples`` start at absolute ``start``.

    ``lost`` counts samples overwritten before the reader got to them;
    ``skipped`` counts samples passed over because they were below the cut
    floor. Both happened before ``start``.
    """

    samples: np.ndarray
    start: int
    lost: int
    skipped: int

    @property
    def end(self) -> int:
        return self.start + len(self.samples)


class Ring:
    """One mapped ring segment. Create it once (the owner), attach elsewhere."""

    __slots__ = ("name", "capacity", "rate", "_mm", "_hdr", "_buf", "_mask", "_owner", "_closed")

    def __init__(self, name: str, mm: mmap.mmap, owner: bool) -> None:
        self.name = name
        self._mm = mm
        self._hdr = memoryview(mm)[:HEADER_BYTES].cast("q")  # native = little-endian (checked at import)
        if self._hdr[0] != MAGIC:
            self._release()
            raise RingError(f"ring {name}: bad magic")
        if self._hdr[1] != VERSION:
            self._release()
            raise RingError(f"ring {name}: version {self._hdr[1]}, expected {VERSION}")
        self.capacity = self._hdr[2]
        self.rate = self._hdr[3]
        if self.capacity <= 0 or self.capacity & (self.capacity - 1) or self.capacity > MAX_CAPACITY:
            self._release()
            raise RingError(f"ring {name}: bad capacity {self.capacity}")
        if len(mm) < HEADER_BYTES + 2 * self.capacity:
            self._release()
            raise RingError(f"ring {name}: segment shorter than its capacity")
        self._buf = np.frombuffer(mm, dtype="<i2", count=self.capacity, offset=HEADER_BYTES)
        self._mask = self.capacity - 1
        self._owner = owner
        self._closed = False

    # -- lifecycle ---------------------------------------------------------

    @classmethod
    def create(cls, name: str, capacity: int, rate: int) -> Ring:
        """Create a new segment, exclusively (``FileExistsError`` if the name exists, even as
        another user's file or a symlink), mode 0600 whatever the umask."""
        if not _NAME_RE.match(name):
            raise RingError(f"invalid ring name {name!r}")
        if capacity <= 0 or capacity & (capacity - 1) or capacity > MAX_CAPACITY:
            raise RingError(f"capacity must be a power of two <= {MAX_CAPACITY}, got {capacity}")
        if not 1000 <= rate <= 192_000:
            raise RingError(f"rate {rate} out of range")
        size = HEADER_BYTES + 2 * capacity
        path = SHM_DIR / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, MODE)
        try:
            os.fchmod(fd, MODE)  # the umask may have taken bits away; attach insists on exactly 0600
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        hdr = np.frombuffer(mm, dtype="<i8", count=HEADER_BYTES // 8)
        hdr[:] = 0
        hdr[1] = VERSION
        hdr[2] = capacity
        hdr[3] = rate
        hdr[4] = os.getpid()
        hdr[0] = MAGIC  # magic last: attach sees a whole header
        del hdr
        return cls(name, mm, owner=True)

    @classmethod
    def attach(cls, name: str, rate: int | None = None) -> Ring:
        """Map an existing segment; check its owner and mode (a regular file of the effective
        user, mode 0600), its magic, version and (if given) rate."""
        if not _NAME_RE.match(name):
            raise RingError(f"invalid ring name {name!r}")
        try:
            fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise RingError(f"ring {name} does not exist") from None
        except OSError as e:  # ELOOP: a symlink; EACCES: not ours to open
            raise RingError(f"ring {name}: cannot open: {e.strerror or e}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise RingError(f"ring {name}: not a regular file")
            if st.st_uid != os.geteuid():
                raise RingError(f"ring {name}: owned by uid {st.st_uid}, not by us (uid {os.geteuid()})")
            if stat.S_IMODE(st.st_mode) != MODE:
                raise RingError(f"ring {name}: mode {stat.S_IMODE(st.st_mode):04o}, expected {MODE:04o}")
            size = st.st_size
            if size < HEADER_BYTES:
                raise RingError(f"ring {name}: segment too small ({size} bytes)")
            mm = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        ring = cls(name, mm, owner=False)
        if rate is not None and ring.rate != rate:
            ring.close()
            raise RingError(f"ring {name}: rate {ring.rate}, expected {rate}")
        return ring

    def _release(self) -> None:
        if self._hdr is not None:
            self._hdr.release()  # the mapping cannot close while a view exports it
        self._hdr = None  # type: ignore[assignment]
        self._buf = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with the process

    def close(self) -> None:
        """Unmap. Views handed out by reads stay valid (they are copies)."""
        if not self._closed:
            self._closed = True
            self._release()

    def unlink(self) -> None:
        """Remove the segment name; mappings stay valid until closed."""
        (SHM_DIR / self.name).unlink(missing_ok=True)

    def __enter__(self) -> Ring:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- positions ---------------------------------------------------------

    @property
    def write_pos(self) -> int:
        return self._hdr[_W]

    @property
    def floor(self) -> int:
        return self._hdr[_F]

    @property
    def closed(self) -> bool:
        """The writer marked the stream finished."""
        return bool(self._hdr[_C])

    # -- writer side -------------------------------------------------------

    def write(self, samples: np.ndarray) -> int:
        """Append samples (int16); returns the new write position.

        A chunk larger than the ring keeps only its last ``capacity`` samples
        (the rest would be overwritten at once anyway) but still advances the
        position by the whole chunk.
        """
        n = len(samples)
        if n == 0:
            return self._hdr[_W]
        w = self._hdr[_W]
        end = w + n
        if n > self.capacity:
            samples = samples[n - self.capacity :]
            w = end - self.capacity
            n = self.capacity
        self._hdr[_R] = end
        i = w & self._mask
        first = min(n, self.capacity - i)
        buf = self._buf
        buf[i : i + first] = samples[:first]
        if first < n:
            buf[: n - first] = samples[first:]
        self._hdr[_W] = end
        return end

    def write_silence(self, n: int) -> int:
        return self.write(np.zeros(n, dtype=np.int16))

    def cut(self, position: int) -> int:
        """Raise the floor to ``position`` (never lowers it); returns the floor."""
        f = self._hdr[_F]
        if position > f:
            self._hdr[_F] = position
            return position
        return f

    def cut_at_write(self) -> int:
        """Clear: discard everything written so far. Returns the cut position."""
        return self.cut(self._hdr[_W])

    def mark_closed(self) -> None:
        self._hdr[_C] = 1

    # -- reader side -------------------------------------------------------

    def reader(self, start: int | None = None) -> RingReader:
        """A cursor at ``start`` (default: the current write position)."""
        return RingReader(self, self.write_pos if start is None else start)

    def read_range(self, start: int, end: int) -> ReadResult:
        """Copy absolute positions ``[start, end)`` if they are still in the ring.

        ``end`` is clamped to the write position. Samples that were already
        overwritten (or are being overwritten) are dropped from the front and
        counted in ``lost``; the floor is ignored (Smart Turn reads history).
        """
        if end < start:
            raise ValueError(f"bad range [{start}, {end})")
        w = self._hdr[_W]
        end = min(end, w)
        start = min(start, end)
        lo = min(max(start, w - self.capacity), end)  # a range wholly overwritten reads empty
        out = self._copy(lo, end)
        valid_from = self._hdr[_R] - self.capacity
        if valid_from > lo:
            drop = min(valid_from - lo, len(out))
            out = out[drop:]
            lo += drop
        return ReadResult(out, lo, lo - start, 0)

    def copy_range(self, start: int, end: int) -> np.ndarray | None:
        """Copy ``[start, end)`` if all of it is published and intact, else None.

        The allocation-light fast path of a reader that keeps up (a worker
        tick reads every call's ring 50 times a second); on None, fall back
        to :meth:`read_range` to learn what was lost.
        """
        if start < 0 or end > self._hdr[_W]:
            return None
        out = self._copy(start, end)
        if self._hdr[_R] - self.capacity > start:
            return None
        return out

    def _copy(self, lo: int, hi: int) -> np.ndarray:
        n = hi - lo
        if n <= 0:
            return np.empty(0, dtype=np.int16)
        i = lo & self._mask
        if i + n <= self.capacity:  # no wrap (nearly always): one slice copy, no second array
            return self._buf[i : i + n].copy()
        first = self.capacity - i
        out = np.empty(n, dtype=np.int16)
        out[:first] = self._buf[i:]
        out[first:] = self._buf[: n - first]
        return out


class RingReader:
    """A reader's own cursor over a ring. Readers never affect each other."""

    __slots__ = ("ring", "position", "lost", "skipped")

    def __init__(self, ring: Ring, position: int) -> None:
        self.ring = ring
        self.position = position
        self.lost = 0
        self.skipped = 0

    def available(self) -> int:
        return max(0, self.ring.write_pos - max(self.position, self.ring.floor))

    def read(self, max_samples: int | None = None) -> ReadResult:
        """Read up to ``max_samples`` published samples from the cursor on."""
        ring = self.ring
        w = ring.write_pos
        pos = self.position
        skipped = 0
        f = ring.floor
        if pos < f:
            skipped = min(f, w) - pos if f <= w else f - pos
            pos = f
        lost = 0
        if w - pos > ring.capacity:
            lost = w - ring.capacity - pos
            pos = w - ring.capacity
        hi = w if max_samples is None else min(w, pos + max_samples)
        hi = max(hi, pos)
        out = ring._copy(pos, hi)
        valid_from = ring._hdr[_R] - ring.capacity
        if valid_from > pos:
            drop = min(valid_from - pos, len(out))
            out = out[drop:]
            lost += valid_from - pos
            pos = valid_from
            hi = max(hi, pos)
        self.position = max(hi, pos)
        self.lost += lost
        self.skipped += skipped
        return ReadResult(out, self.position - len(out), lost, skipped)

    def seek(self, position: int) -> None:
        self.position = position
