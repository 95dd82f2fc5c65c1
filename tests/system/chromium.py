"""A headless Chromium (Debian's ``/usr/bin/chromium``) driven over the DevTools protocol.

Owns :class:`Chromium`: the browser process, started with a fresh profile and
``--remote-debugging-pipe`` (the protocol on fds 3 and 4: no port is opened),
and a minimal CDP client on that pipe (NUL-terminated JSON messages; every call
waits at most its timeout; events are kept, bounded, for :meth:`Chromium.wait_event`).
``close`` kills the browser's whole process group and removes the profile, so a
failed test leaves nothing running. Only tests import it.
"""

from __future__ import annotations

import base64
import collections
import itertools
import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

BINARY = Path("/usr/bin/chromium")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--remote-debugging-pipe")


class CdpError(RuntimeError):
    pass


class Chromium:
    def __init__(self, *extra: str) -> None:
        self.profile = tempfile.mkdtemp(prefix="bv-chromium-")
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def fds() -> None:  # the browser reads commands on fd 3, writes answers on fd 4
            os.dup2(to_r, 3)
            os.dup2(from_w, 4)

        self.log = open(Path(self.profile) / "chromium.log", "wb")
        self.proc = subprocess.Popen([str(BINARY), *FLAGS, f"--user-data-dir={self.profile}", *extra, "about:blank"],
                                     stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     pass_fds=(3, 4), preexec_fn=fds, start_new_session=True)
        os.close(to_r)
        os.close(from_w)
        self._ids = itertools.count(1)
        self._buf = b""
        self._answers: dict[int, dict[str, Any]] = {}
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=2000)
        self.session = ""

    # -- the protocol ----------------------------------------------------------------------
    def _pump(self, timeout: float) -> None:
        r, _, _ = select.select([self._from_r], [], [], max(0.0, timeout))
        if not r:
            return
        chunk = os.read(self._from_r, 1 << 20)
        if not chunk:
            raise CdpError(f"the browser closed its pipe (exit {self.proc.poll()}): {self.log_text()[-2000:]}")
        self._buf += chunk
        *msgs, self._buf = self._buf.split(b"\0")
        for raw in msgs:
            msg = json.loads(raw)
            if "id" in msg:
                self._answers[msg["id"]] = msg
            else:
                self.events.append(msg)

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 15.0,
             session: str | None = None) -> dict[str, Any]:
        i = next(self._ids)
        msg: dict[str, Any] = {"id": i, "method": method, "params": params or {}}
        sid = self.session if session is None else session
        if sid:
            msg["sessionId"] = sid
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while i not in self._answers:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CdpError(f"{method}: no answer in {timeout} s")
            self._pump(left)
        ans = self._answers.pop(i)
        if "error" in ans:
            raise CdpError(f"{method}: {ans['error']}")
        result: dict[str, Any] = ans.get("result", {})
        return result

    def open(self, url: str) -> None:
        """A new page at ``url``, attached: later calls go to it."""
        target = self.call("Target.createTarget", {"url": "about:blank"}, session="")["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session="")["sessionId"]
        self.call("Runtime.enable")
        self.call("Page.enable")
        self.call("Page.navigate", {"url": url})

    def js(self, expression: str, timeout: float = 15.0) -> Any:
        """The value of ``expression`` in the page (promises awaited)."""
        res = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                             "awaitPromise": True}, timeout)
        if "exceptionDetails" in res:
            raise CdpError(f"{expression[:80]}: {res['exceptionDetails']}")
        return res.get("result", {}).get("value")

    def wait(self, expression: str, timeout: float, what: str) -> Any:
        """Poll ``expression`` until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            last = self.js(expression)
            if last:
                return last
            time.sleep(0.1)
        raise AssertionError(f"timed out ({timeout} s) waiting for {what}; last {last!r}; "
                             f"page: {self.js('JSON.stringify(window.playground || null)')}")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def log_text(self) -> str:
        try:
            return (Path(self.profile) / "chromium.log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        for fd in (self._to_w, self._from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)
