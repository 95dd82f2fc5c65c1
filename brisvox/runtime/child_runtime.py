"""What a role main sees of its process: the :class:`ChildRuntime` protocol.

A role main is ``main(rt: ChildRuntime) -> int`` (registered in
``brisvox/daemon/roles.py``). The protocol lives here, below every role, so
the gateway, the workers and the agent processes type their ``rt`` without
importing the supervisor; the supervisor's forked child implements it
(:class:`brisvox.daemon.child.ForkedChildRuntime`, which documents each
member).

It covers what the role mains use: who the child is (``role``, ``index``,
``name``, ``instance``, ``runtime_dir``, ``config``), ZeroMQ (its context and
the children's inbox endpoints), the handshake (``ready``, ``fail``),
liveness and load (``heartbeat``, ``report``, ``event``), the stop
(``stopping``, ``drain``, ``grace_s``, ``stop_reason``, shutdown callbacks)
and the topology (topology callbacks, ``peers``).

Invariants (of every implementation):

* ``ready`` completes the handshake once; ``fail`` never returns (it raises
  out of the main, with the exit code).
* ``stopping`` is set once, when a stop is requested; ``drain``, ``grace_s``
  and ``stop_reason`` are meaningful from then on. A shutdown callback runs
  once (at once when registered after the stop), a topology callback at
  every push (the topology already received is replayed at registration).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Protocol

from brisvox.runtime.paths import InstanceSettings


class RoleConfig(InstanceSettings, Protocol):
    """The daemon configuration as a role reads it (``brisvox.config.daemon.DaemonConfig``)."""

    def section(self, name: str) -> Any:
        """The parsed dataclass of section ``name`` (defaults when absent)."""
        ...


class ChildRuntime(Protocol):
    """The API a role main gets."""

    @property
    def role(self) -> str: ...
    @property
    def index(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def instance(self) -> str: ...
    @property
    def runtime_dir(self) -> Path: ...
    @property
    def config(self) -> RoleConfig: ...
    @property
    def stopping(self) -> threading.Event: ...
    @property
    def drain(self) -> bool: ...
    @property
    def grace_s(self) -> float: ...
    @property
    def stop_reason(self) -> str: ...

    def zmq_context(self) -> Any: ...
    def inbox_endpoint(self, role: str, index: int) -> str: ...
    def ready(self, endpoints: dict[str, str] | None = None, measured: dict[str, float] | None = None) -> None: ...
    def fail(self, error: str, code: int = ...) -> NoReturn: ...
    def heartbeat(self) -> None: ...
    def report(self, calls: int, stats: dict[str, Any] | None = None) -> None: ...
    def event(self, kind: str, detail: str = "", data: dict[str, Any] | None = None) -> None: ...
    def add_shutdown_callback(self, cb: Callable[[], Any]) -> None: ...
    def add_topology_callback(self, cb: Callable[[list[dict[str, Any]]], Any],
                              loop: asyncio.AbstractEventLoop | None = None) -> None: ...
    def add_reload_callback(self, cb: Callable[[str], Any], loop: asyncio.AbstractEventLoop | None = None) -> None: ...
    def peers(self, role: str, state: str = "ready") -> list[dict[str, Any]]: ...
