"""What became of the calls this gateway created through Twilio: its status callbacks, kept per CallSid.

Owns :class:`CallStatuses` (one per TwiML webhook, :class:`brisvox.gateway.control.twiml.Webhook`)
and :func:`verdict`, the pure mapping of a ``CallStatus`` to a dial's answer. A calls create
(:mod:`brisvox.gateway.control.twilio_dial`) asks Twilio for status callbacks
(``StatusCallback`` = the webhook's origin plus :func:`status_path`, events
:data:`EVENTS`); Twilio POSTs them there, signed as its call webhook is, and the webhook
records each verified one here (:meth:`CallStatuses.record`). The TwiML fetch of an outbound
call (Twilio fetches ``Url`` once the callee answered) is recorded as ``in-progress`` too.
A dial asked with ``await_answer`` waits here (:meth:`CallStatuses.wait`) for its call's first
decisive status, and answers as a SIP dial does.

Invariants:

* :func:`verdict` maps every ``CallStatus`` to exactly one of: not decisive (None: ``queued``,
  ``initiated``, ``ringing``, anything unknown), answered (``in-progress``; ``completed``, a call
  that was answered and has ended), or a failure named as the SIP dial names it (``busy``,
  ``no answer``, ``failed``, ``canceled``).
* The table holds at most ``max_calls`` CallSids (the oldest entry dropped first, counted
  ``twilio_status_evicted``); an entry expires ``ttl_s`` after its last change. A status of a
  CallSid not in the table (a callback that beat the calls create's answer) makes an entry
  all the same: only a callback whose signature verified (or, without ``twilio_auth_token``,
  one the webhook admits) reaches :meth:`record`.
* A decisive status is kept: a later one (``completed`` after ``in-progress``) updates the
  entry's ``final`` but never changes what a waiter was told.
* A dial's parameters (:meth:`carry`) live in its CallSid's entry, so they are bounded and
  expire with it; the webhook's TwiML fetch of that CallSid passes them to the stream.
* :meth:`wait` always ends: at the first decisive status (at once when one is already
  there), or at its timeout (None). At most ``max_calls`` waiters wait at once (more: None
  at once, counted ``twilio_status_waiters_full``).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

STATUS_SUFFIX = "/status"
# the events asked for: ringing (for the dial's times), answered (in-progress), completed (the
# final status: completed, busy, no-answer, failed or canceled)
EVENTS = ("initiated", "ringing", "answered", "completed")
ANSWERED = frozenset({"in-progress", "completed"})
FAILURES = {"busy": "busy", "no-answer": "no answer", "failed": "failed", "canceled": "canceled"}
KNOWN = frozenset({"queued", "initiated", "ringing", *ANSWERED, *FAILURES})


def status_path(twiml_path: str) -> str:
    """Where Twilio POSTs the status callbacks: the TwiML webhook's path plus ``/status``."""
    return twiml_path.rstrip("/") + STATUS_SUFFIX


def verdict(status: str) -> tuple[bool, str] | None:
    """``(answered, error)`` of a decisive ``CallStatus``; None while the call is not decided."""
    if status in ANSWERED:
        return True, ""
    if status in FAILURES:
        return False, FAILURES[status]
    return None


@dataclass(slots=True)
class CallStatus:
    """One CallSid's statuses: the first decisive one (``decided``), the last (``final``)."""

    final: str
    decided: str = ""
    changed: float = 0.0
    ringing_at: float | None = None
    params: dict[str, str] = field(default_factory=dict)  # the dial's, for the call's stream (carry)
    waiters: list[asyncio.Future[str]] = field(default_factory=list)


class CallStatuses:
    """The statuses of the calls this gateway created (module invariants)."""

    def __init__(self, max_calls: int = 1024, ttl_s: float = 3600.0,
                 count: Callable[[str], None] = lambda _name: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_calls = max_calls
        self.ttl_s = ttl_s
        self.count = count
        self.clock = clock
        self._calls: OrderedDict[str, CallStatus] = OrderedDict()
        self._waiting = 0

    def __len__(self) -> int:
        return len(self._calls)

    def get(self, sid: str) -> CallStatus | None:
        self._expire()
        return self._calls.get(sid)

    def record(self, sid: str, status: str) -> bool:
        """Twilio says ``sid`` is ``status`` now; False (ignored, counted) for a status Twilio does not define."""
        if status not in KNOWN:
            self.count("twilio_status_unknown")
            return False
        self._expire()
        now = self.clock()
        entry = self._calls.get(sid)
        if entry is None:
            entry = self._calls[sid] = CallStatus(status)
            while len(self._calls) > self.max_calls:
                _, old = self._calls.popitem(last=False)
                self._release(old, "")
                self.count("twilio_status_evicted")
        self._calls.move_to_end(sid)
        entry.final, entry.changed = status, now
        if status == "ringing" and entry.ringing_at is None:
            entry.ringing_at = now
        if not entry.decided and verdict(status) is not None:
            entry.decided = status
            self._release(entry, status)
        return True

    def carry(self, sid: str, params: Mapping[str, str]) -> None:
        """The dial's ``params`` for ``sid``: the webhook gives them to the call's stream (:meth:`params`)."""
        if self.get(sid) is None:
            self.record(sid, "queued")
        self._calls[sid].params = dict(params)

    def params(self, sid: str) -> dict[str, str]:
        """The parameters a dial gave the call ``sid`` ({} for any other)."""
        entry = self.get(sid)
        return dict(entry.params) if entry is not None else {}

    async def wait(self, sid: str, timeout_s: float) -> str | None:
        """The first decisive status of ``sid`` (module invariants); None at ``timeout_s``."""
        entry = self.get(sid)
        if entry is not None and entry.decided:
            return entry.decided
        if self._waiting >= self.max_calls:
            self.count("twilio_status_waiters_full")
            return None
        if entry is None:
            self.record(sid, "queued")
            entry = self._calls[sid]
        fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        entry.waiters.append(fut)
        self._waiting += 1
        try:
            async with asyncio.timeout(timeout_s):
                got = await fut
            return got or None
        except TimeoutError:
            return None
        finally:
            self._waiting -= 1
            if fut in entry.waiters:
                entry.waiters.remove(fut)

    def _release(self, entry: CallStatus, status: str) -> None:
        for fut in entry.waiters:
            if not fut.done():
                fut.set_result(status)
        entry.waiters.clear()

    def _expire(self) -> None:
        cutoff = self.clock() - self.ttl_s
        while self._calls:
            sid, entry = next(iter(self._calls.items()))
            if entry.changed > cutoff or entry.waiters:
                break
            del self._calls[sid]
