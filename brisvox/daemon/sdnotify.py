"""systemd notification, written directly to ``$NOTIFY_SOCKET`` (no libsystemd).

Owns the sd_notify wire format: one datagram of ``KEY=value`` lines to the
unix datagram socket named by ``$NOTIFY_SOCKET`` (a leading ``@`` means the
abstract namespace). Without ``$NOTIFY_SOCKET`` every call is a no-op, so
the daemon runs the same outside systemd.

The watchdog period comes from ``$WATCHDOG_USEC`` (honoured only when
``$WATCHDOG_PID`` is unset or names this process); :meth:`Notifier.watchdog_due`
says when to send ``WATCHDOG=1`` (every half period).
"""

from __future__ import annotations

import os
import socket


class Notifier:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.address: str | None = None
        self.sock: socket.socket | None = None
        self.sent = 0
        self.errors = 0
        self.last_status = ""
        path = env.get("NOTIFY_SOCKET", "")
        if path and (path.startswith("/") or path.startswith("@")):
            self.address = "\0" + path[1:] if path.startswith("@") else path
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_s: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        wpid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not wpid or wpid == str(os.getpid())):
            self.watchdog_s = int(usec) / 1e6
        self.next_watchdog = 0.0

    @property
    def enabled(self) -> bool:
        return self.sock is not None

    def notify(self, *lines: str) -> bool:
        if self.sock is None or self.address is None:
            return False
        try:
            self.sock.sendto("\n".join(lines).encode(), self.address)
            self.sent += 1
            return True
        except OSError:
            self.errors += 1
            return False

    def ready(self, status: str) -> None:
        self.notify("READY=1", f"STATUS={status}", f"MAINPID={os.getpid()}")
        self.last_status = status

    def stopping(self, status: str) -> None:
        self.notify("STOPPING=1", f"STATUS={status}")
        self.last_status = status

    def status(self, status: str) -> None:
        if status != self.last_status:
            self.notify(f"STATUS={status}")
            self.last_status = status

    def watchdog_due(self, now: float) -> float | None:
        """Seconds until the next WATCHDOG=1 is due (None: no watchdog)."""
        if self.watchdog_s is None:
            return None
        return max(0.0, self.next_watchdog - now)

    def watchdog(self, now: float) -> None:
        if self.watchdog_s is not None and now >= self.next_watchdog:
            self.notify("WATCHDOG=1")
            self.next_watchdog = now + self.watchdog_s / 2

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
