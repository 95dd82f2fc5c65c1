"""Call recording: one stereo WAV per call, the caller on the left, the bot on the right.

Owns :class:`Recorder` (one per gateway: a bounded queue and ONE writer
thread for every recorded call) and :class:`Recording` (one call's handle,
used on the event loop). The gateway records because it sees both sides as
they are: the caller's decoded audio at the call's rate (``audio_in``) and
exactly what the pacer released to the transport (after a Clear nothing past
the cut is ever read from the ``out`` ring, so nothing past it is recorded).
What to record comes from the agent process, per call, in ``CallAccepted``'s
``recording`` (``{"dir": <absolute directory>, "keep_days": <n>}``): a plain
"record this call into that directory" instruction; the gateway knows
nothing of agent files (``[recording]``, docs/CONFIGURATION.md).

Invariants:

* The event loop never touches the disk: :meth:`Recording.caller` and
  :meth:`Recording.bot` copy the samples and append them to the queue under a
  lock the writer holds only to swap the queue. At most ``max_items`` audio
  items wait; beyond that an item is dropped and counted
  (``recording_frames_dropped``); open and close instructions are never
  dropped (one each per call).
* One timeline per call, in samples at the call's rate from the moment the
  recording opened (CallAccepted): an item is stamped with
  ``time.monotonic()`` when it is queued; a caller chunk ends at its stamp,
  a released bot frame starts at its stamp. A side's chunk goes right after
  that side's previous one unless it starts more than the side's slack later
  (caller: ``SLACK_IN_S`` of network jitter, bot: ``SLACK_OUT_S``), then the
  gap is silence. Frames are written once both sides cover them; a side more
  than ``HOLD_S`` behind the newest stamp of the call (or ``MAX_SKEW_S``
  behind the other side) is padded with silence first. At close both sides
  are padded to the longer one.
* Files: ``<dir>/<UTC start>-<call id>.wav``
  (:func:`~brisvox.runtime.private_files.recording_file_name`; the instruction's ``file``
  when the agent named it, which its ``call.ended`` webhook reports), 16-bit PCM, 2 channels, the
  call's rate; mode 0600 and the directory 0700
  (:mod:`brisvox.runtime.private_files`). The header is patched after every
  write (stdlib ``wave``), so a crash leaves a readable file up to the last
  write. Retention is the call records' (``[calls] keep_days``, the same
  :func:`~brisvox.runtime.private_files.prune_older`): the writer prunes a
  directory's ``*.wav`` when it first opens a recording there and then at
  most once per ``PRUNE_EVERY_S``.
* A write error (disk full, a directory made unwritable) ends that call's
  recording only: counted (``recording_write_errors``), logged once per
  gateway process, never raised into the call. The writer thread never dies
  of an item.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import wave
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from brisvox.runtime.private_files import (
    open_private,
    private_dir,
    prune_older,
    recording_file_name,
)

log = logging.getLogger("brisvox.gateway.core.recorder")

CALLER, BOT = 0, 1
MAX_ITEMS = 8192  # ~0.8 s of 100 calls' frames (both sides) waiting for the writer
FLUSH_S = 0.1  # the writer's batch period
HOLD_S = 0.4  # how far a silent side may lag the call's newest stamp before it is padded
MAX_SKEW_S = 2.0  # how far one side may run ahead of the other before the other is padded
SLACK_IN_S = 0.08  # caller: jitter absorbed before a gap becomes silence
SLACK_OUT_S = 0.03  # bot: release jitter on the pacer's grid
PRUNE_EVERY_S = 3600.0


def file_name(call_id: str, wall: float, named: Any = None) -> str:
    """The instruction's ``file`` when it is a plain ``*.wav`` name, else the rule's own."""
    if isinstance(named, str) and named.endswith(".wav") and 4 < len(named) <= 200 and os.path.basename(named) == named \
            and not named.startswith("."):
        return named
    return recording_file_name(call_id, wall)


class Recording:
    """One call's recording as the event loop sees it (see the module invariants)."""

    __slots__ = ("_rec", "call_id", "closed")

    def __init__(self, rec: Recorder, call_id: str) -> None:
        self._rec = rec
        self.call_id = call_id
        self.closed = False

    def caller(self, pcm16: np.ndarray, gap: int = 0) -> None:
        """Caller audio just received (``gap`` samples of silence the transport filled first)."""
        if not self.closed:
            self._rec.put((CALLER, self.call_id, self._rec.clock(), gap, np.ascontiguousarray(pcm16, dtype="<i2").tobytes()))

    def bot(self, samples: np.ndarray) -> None:
        """A bot frame just released to the transport."""
        if not self.closed:
            self._rec.put((BOT, self.call_id, self._rec.clock(), 0, np.ascontiguousarray(samples, dtype="<i2").tobytes()))

    def close(self) -> None:
        """The call's audio is over (idempotent): the writer finishes the file."""
        if not self.closed:
            self.closed = True
            self._rec.control(("close", self.call_id, self._rec.clock()))


class _Track:
    """One call's file and its two pending channels (writer thread only)."""

    def __init__(self, call_id: str, rate: int, t0: float, path: Path) -> None:
        self.call_id = call_id
        self.rate = rate
        self.t0 = t0
        self.path = path
        self.file: BinaryIO | None = None
        self.wav: wave.Wave_write | None = None
        self.failed = False
        self.base = 0  # samples written per channel
        self.bufs = (bytearray(), bytearray())  # pending int16 LE samples of each side, from base
        self.slack = (int(SLACK_IN_S * rate), int(SLACK_OUT_S * rate))
        self.newest = t0

    def end(self, side: int) -> int:
        return self.base + len(self.bufs[side]) // 2

    def pad(self, side: int, upto: int) -> None:
        n = upto - self.end(side)
        if n > 0:
            self.bufs[side].extend(bytes(2 * n))

    def place(self, side: int, t: float, gap: int, data: bytes) -> None:
        n = len(data) // 2 + gap
        at = round((t - self.t0) * self.rate) - (n if side == CALLER else 0)
        if at > self.end(side) + self.slack[side]:
            self.pad(side, at)
        if gap:
            self.pad(side, self.end(side) + gap)
        self.bufs[side].extend(data)
        self.newest = max(self.newest, t)

    def ready(self, final: bool) -> int:
        """Pad what lags, then how many stereo frames both sides cover."""
        hi = max(self.end(CALLER), self.end(BOT))
        floor = hi if final else max(round((self.newest - self.t0 - HOLD_S) * self.rate),
                                     hi - int(MAX_SKEW_S * self.rate))
        for side in (CALLER, BOT):
            self.pad(side, floor)
        return min(self.end(CALLER), self.end(BOT)) - self.base

    def frames(self, m: int) -> bytes:
        left = np.frombuffer(self.bufs[CALLER], dtype="<i2", count=m)
        right = np.frombuffer(self.bufs[BOT], dtype="<i2", count=m)
        out = np.empty(2 * m, dtype="<i2")
        out[0::2] = left
        out[1::2] = right
        data = out.tobytes()
        del left, right
        for b in self.bufs:
            del b[:2 * m]
        self.base += m
        return data


class Recorder:
    """The gateway's recordings: the queue and the writer thread (see the module invariants)."""

    def __init__(self, max_items: int = MAX_ITEMS, clock: Callable[[], float] = time.monotonic,
                 flush_s: float = FLUSH_S) -> None:
        self.max_items = max_items
        self.clock = clock
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._items: deque[tuple[Any, ...]] = deque()
        self._audio = 0  # audio items in _items
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._tracks: dict[str, _Track] = {}  # writer thread only
        self._pruned_at: dict[Path, float] = {}  # writer thread only
        self._logged = False
        # the loop's counters
        self.dropped = 0
        self.refused = 0
        # the writer's counters
        self.started = 0
        self.written = 0
        self.errors = 0
        self.pruned = 0

    # -- the loop's side ----------------------------------------------------------------

    def open(self, call_id: str, rate: int, instruction: Mapping[str, Any]) -> Recording | None:
        """Start recording ``call_id`` as ``instruction`` says (None: refused, counted, logged)."""
        d = instruction.get("dir")
        keep = instruction.get("keep_days", 0)
        if not isinstance(d, str) or not os.path.isabs(d) or not isinstance(keep, int) or keep < 0:
            self.refused += 1
            log.warning("call %s: recording refused: bad instruction %r", call_id, dict(instruction))
            return None
        if self._thread is None:
            self.start()
        self.control(("open", call_id, self.clock(), rate, d, keep, time.time(), instruction.get("file")))
        return Recording(self, call_id)

    def put(self, item: tuple[Any, ...]) -> None:
        with self._lock:
            if self._audio >= self.max_items:
                self.dropped += 1
                return
            self._items.append(item)
            self._audio += 1

    def control(self, item: tuple[Any, ...]) -> None:
        with self._lock:
            self._items.append(item)

    def stats(self) -> dict[str, int]:
        return {"recordings_started": self.started, "recordings_written": self.written,
                "recordings_refused": self.refused, "recordings_pruned": self.pruned,
                "recording_frames_dropped": self.dropped, "recording_write_errors": self.errors}

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="brisvox-recorder", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Finish every open recording and end the writer (blocking: run it off the loop)."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- the writer thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            stopping = self._stopping
            self.drain()
            if stopping:
                for tr in list(self._tracks.values()):
                    self._finish(tr)
                return
            self._wake.wait(self.flush_s)

    def drain(self) -> None:
        """Write what is queued (the writer thread's batch; tests call it directly)."""
        with self._lock:
            batch, self._items = self._items, deque()
            self._audio = 0
        touched: dict[str, _Track] = {}
        for item in batch:
            try:
                tr = self._apply(item)
            except Exception as e:  # noqa: BLE001 - one item must never end the writer
                bad = self._tracks.get(item[1])
                if bad is not None:
                    self._fail(bad, e)
                continue
            if tr is not None:
                touched[tr.call_id] = tr
        for tr in touched.values():
            self._write(tr, final=False)

    def _apply(self, item: tuple[Any, ...]) -> _Track | None:
        kind, call_id = item[0], item[1]
        if kind == "open":
            _, _, t0, rate, d, keep, wall, named = item
            new = _Track(call_id, rate, t0, Path(d) / file_name(call_id, wall, named))
            self._tracks[call_id] = new
            try:
                self._open(new, Path(d), keep)
            except OSError as e:
                self._fail(new, e)
            return None
        tr = self._tracks.get(call_id)
        if tr is None:
            return None
        if kind == "close":
            self._finish(tr)
            return None
        if not tr.failed:
            tr.place(kind, item[2], item[3], item[4])
            return tr
        return None

    def _open(self, tr: _Track, d: Path, keep_days: int) -> None:
        private_dir(d)
        now = time.monotonic()
        last = self._pruned_at.get(d)
        if last is None or now - last >= PRUNE_EVERY_S:
            self._pruned_at[d] = now
            self.pruned += prune_older(d, keep_days, "*.wav")
        fd = open_private(tr.path, os.O_TRUNC)
        tr.file = os.fdopen(fd, "wb")
        w = wave.open(tr.file, "wb")
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(tr.rate)
        tr.wav = w
        self.started += 1

    def _write(self, tr: _Track, final: bool) -> None:
        if tr.failed or tr.wav is None:
            return
        try:
            m = tr.ready(final)
            if m > 0:
                tr.wav.writeframes(tr.frames(m))
        except Exception as e:  # noqa: BLE001 - OSError mostly (ENOSPC, EIO): this recording only
            self._fail(tr, e)

    def _finish(self, tr: _Track) -> None:
        self._tracks.pop(tr.call_id, None)
        self._write(tr, final=True)
        if tr.failed:
            return
        try:
            self._close(tr)
            self.written += 1
        except Exception as e:  # noqa: BLE001
            self._fail(tr, e)

    def _close(self, tr: _Track) -> None:
        w, f = tr.wav, tr.file
        tr.wav = tr.file = None
        try:
            if w is not None:
                w.close()  # patches the header
        finally:
            if f is not None:
                f.close()

    def _fail(self, tr: _Track, e: BaseException) -> None:
        if tr.failed:
            return
        tr.failed = True
        tr.bufs[CALLER].clear()
        tr.bufs[BOT].clear()
        self.errors += 1
        if not self._logged:
            self._logged = True
            why = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            log.error("call %s: recording to %s stopped: %s (the call goes on; later failures are "
                      "only counted: recording_write_errors)", tr.call_id, tr.path, why)
        try:
            self._close(tr)
        except Exception:  # noqa: BLE001, S110 - the file is abandoned either way
            pass
