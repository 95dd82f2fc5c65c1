"""Log lines of every brisvoxd process: one JSON object per line, tagged with role and pid.

Owns the log format and how children's output reaches the supervisor:

* Every process (supervisor and children) logs through stdlib ``logging`` with
  :class:`JsonFormatter` (or :class:`TextFormatter` when ``[daemon.log] format
  = "text"``). A record carries ``ts`` (UNIX seconds), ``level``, ``role``,
  ``name`` (``worker-1``), ``pid``, ``logger``, ``msg`` and ``exc`` when present.
* A child's stdout and stderr are one pipe whose read end the supervisor holds
  (:class:`LineForwarder`). The supervisor forwards each complete line to its
  own stderr: a line that already is a JSON object passes unchanged; anything
  else (a C library's print, a traceback from a dying interpreter) is wrapped
  into a JSON record tagged with the child's role and pid, so the daemon's
  stream stays one JSON object per line. Under systemd that stream is journald.
* Lines longer than :data:`MAX_LINE` are cut (counted); a child can never make
  the supervisor buffer without bound.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import orjson

MAX_LINE = 16 * 1024


class JsonFormatter(logging.Formatter):
    def __init__(self, role: str, name: str) -> None:
        super().__init__()
        self.role = role
        self.proc_name = name

    def format(self, record: logging.LogRecord) -> str:
        d: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "role": self.role,
            "name": self.proc_name,
            "pid": record.process or os.getpid(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        extra = getattr(record, "data", None)
        if isinstance(extra, dict):
            d["data"] = extra
        return orjson.dumps(d, default=str).decode()


class TextFormatter(logging.Formatter):
    def __init__(self, role: str, name: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)-7s {name}[%(process)d] %(name)s: %(message)s")


def setup_logging(role: str, name: str, level: str = "info", fmt: str = "json") -> None:
    """Replace the root handlers with one stderr handler in the daemon's format."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role, name) if fmt == "json" else TextFormatter(role, name))
    root.addHandler(handler)
    root.setLevel(level.upper())


def wrap_line(line: bytes, role: str, name: str, pid: int, fmt: str) -> bytes:
    """A raw output line of a child -> one line in the daemon's format."""
    text = line.decode("utf-8", "replace").rstrip("\r\n")
    if fmt == "json":
        if text.startswith("{") and text.endswith("}"):
            return text.encode() + b"\n"
        d = {"ts": round(time.time(), 6), "level": "info", "role": role, "name": name, "pid": pid,
             "logger": "stderr", "msg": text}
        return orjson.dumps(d) + b"\n"
    if text.startswith("{") and text.endswith("}"):
        try:
            d = orjson.loads(text)
            t = _asctime(float(d.get("ts", time.time())))
            exc = ("\n" + d["exc"]) if d.get("exc") else ""
            return (f"{t} {d.get('level', 'info').upper():<7} {d.get('name', name)}[{d.get('pid', pid)}] "
                    f"{d.get('logger', '')}: {d.get('msg', '')}{exc}\n").encode()
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
            pass
    return f"{_asctime(time.time())} INFO    {name}[{pid}] stderr: {text}\n".encode()


def _asctime(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f",{int(ts * 1000) % 1000:03d}"


class LineForwarder:
    """Supervisor side of one child's output pipe (non-blocking read end)."""

    __slots__ = ("fd", "role", "name", "pid", "fmt", "buf", "lines", "cut", "out_fd")

    def __init__(self, fd: int, role: str, name: str, pid: int, fmt: str, out_fd: int = 2) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        self.role = role
        self.name = name
        self.pid = pid
        self.fmt = fmt
        self.buf = bytearray()
        self.lines = 0
        self.cut = 0
        self.out_fd = out_fd

    def pump(self) -> bool:
        """Read what is there (at most 1 MiB a turn, so one chatty child cannot
        starve the loop) and forward complete lines. False once the pipe is closed."""
        for _ in range(16):
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return True
            except OSError:
                chunk = b""
            if not chunk:
                self.flush()
                return False
            self.buf += chunk
            self._emit_lines()
        return True

    def _emit_lines(self) -> None:
        out = []
        while True:
            nl = self.buf.find(b"\n")
            if nl < 0:
                if len(self.buf) > MAX_LINE:
                    out.append(bytes(self.buf[:MAX_LINE]))
                    del self.buf[:MAX_LINE]
                    self.cut += 1
                    continue
                break
            line = bytes(self.buf[: nl + 1])
            del self.buf[: nl + 1]
            if len(line) > MAX_LINE:
                line = line[:MAX_LINE]
                self.cut += 1
            out.append(line)
        if out:
            self.lines += len(out)
            self._write(b"".join(wrap_line(line, self.role, self.name, self.pid, self.fmt) for line in out))

    def flush(self) -> None:
        if self.buf:
            self.lines += 1
            self._write(wrap_line(bytes(self.buf), self.role, self.name, self.pid, self.fmt))
            self.buf.clear()

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                n = os.write(self.out_fd, view)
            except BlockingIOError:
                time.sleep(0.001)
                continue
            except OSError:
                return  # our own stderr is gone; nothing sensible to do
            view = view[n:]

    def close(self) -> None:
        try:
            self.pump()
        finally:
            try:
                os.close(self.fd)
            except OSError:
                pass
