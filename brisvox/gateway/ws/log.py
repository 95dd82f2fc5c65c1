"""The websockets library's log on the gateway's listener: nothing per connection.

Owns :class:`LibraryLog`, the logger the library's protocol objects get
(:mod:`brisvox.gateway.ws.server`; split out of it for size). Invariant: below
WARNING nothing is written (the library writes a line per connection otherwise,
whatever the peer sends: the server's counters say it instead); WARNING and above
go through the server's :class:`~brisvox.runtime.log_limit.LogLimiter`, one line
per level per minute, with the exception's type and message instead of a traceback.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from brisvox.runtime.log_limit import LogLimiter


class LibraryLog(logging.LoggerAdapter[logging.Logger]):
    """The logger the websockets library's protocol objects get (see the module invariants):
    below WARNING nothing (one line per connection otherwise, whatever the peer sends), above
    it one line per level per minute through ``limiter``, with the exception's type instead of
    a traceback."""

    def __init__(self, limiter: LogLimiter) -> None:
        super().__init__(logging.getLogger("websockets.server"), {})
        self.limiter = limiter

    def isEnabledFor(self, level: int) -> bool:
        return level >= logging.WARNING

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level < logging.WARNING:
            return
        exc = sys.exc_info()[1] if kwargs.get("exc_info") else None
        what = f"{msg}" % args if args else f"{msg}"
        if exc is not None:
            what += f": {type(exc).__name__}: {exc}"
        self.limiter(f"ws_library_{logging.getLevelName(level).lower()}", "websockets: %s", what[:200], level=level)
