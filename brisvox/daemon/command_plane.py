"""The supervisor's command plane: control.sock, and the reload of the config file.

:class:`CommandPlane` is held by :class:`~brisvox.daemon.arbiter.Arbiter`: it
owns the ROUTER ``control.sock`` (``brisvoxd status|stop|drain|reload``),
attached as :attr:`CommandPlane.control` once the children are forked. It
decodes each request, hands the command to the ``run_command(name, args)``
callback it was built with (the arbiter carries the command out) and sends
the reply. :func:`reload_config` is the pure half of a reload: the new
configuration, with what cannot change live kept.

Invariants:

* Every frame that decodes gets exactly one reply (a ``CommandReply``; ``ok``
  False with an error for an unknown command, a bad argument or a frame that
  is not a command, which is also counted as ``unexpected_type`` and logged
  once per type); one that does not decode is counted and dropped. Frames
  are dispatched by one table (:meth:`CommandPlane.control_frame_handlers`).
* Nothing blocks: a reply that cannot be sent is counted in ``send_failed``.
* A reload that fails (a configuration error) keeps the running
  configuration; what cannot change live (``runtime_dir``, ``state_dir``,
  ``metrics``, ``log.format``) is kept and reported as changing at the next
  start.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from typing import Any, Literal

from brisvox.config.daemon import DaemonConfig, load_config
from ipc.codec import DecodeGuard

RunCommand = Callable[[str, dict[str, Any]], Any]  # (name, args) -> CommandReply


def resolve_log_format(cfg: DaemonConfig, stream: Any = None) -> DaemonConfig:
    """Turn ``format = "auto"`` into json or text (text only on a terminal)."""
    lg = cfg.daemon.log
    if lg.format != "auto":
        return cfg
    stream = sys.stderr if stream is None else stream
    fmt: Literal["json", "text"] = "text" if hasattr(stream, "isatty") and stream.isatty() else "json"
    return dataclasses.replace(cfg, daemon=dataclasses.replace(cfg.daemon, log=dataclasses.replace(lg, format=fmt)))


def reload_config(running: DaemonConfig, cli_counts: tuple[int | None, int | None]) -> tuple[DaemonConfig, list[str]]:
    """Re-read ``running``'s file (defaults without one) -> (the config to run, notes).

    Raises ConfigError. What cannot change live is kept from ``running``;
    each note says what changes at the next start instead.
    """
    from brisvox.config.exposure import check_open_sip

    new = load_config(running.path) if running.path else DaemonConfig()
    new = resolve_log_format(new.with_counts(*cli_counts))
    notes = check_open_sip(new)  # an open SIP port is refused like at start; with the override: a note
    # [[webhooks]]: each URL's form was checked by the parse; its host is not resolved here (the
    # master loop must not wait on DNS): the courier checks the address before every attempt
    if new.section("webhooks") != running.section("webhooks"):
        notes.append("[[webhooks]] changes reach the agent and outbound processes when they next start")
    old = running.daemon
    keep = {}
    for key in ("runtime_dir", "state_dir", "metrics"):
        if getattr(new.daemon, key) != getattr(old, key):
            keep[key] = getattr(old, key)
            notes.append(f"daemon.{key} changes at the next start")
    if new.daemon.log.format != old.log.format:
        keep["log"] = dataclasses.replace(new.daemon.log, format=old.log.format)
        notes.append("daemon.log.format changes at the next start")
    if keep:
        new = dataclasses.replace(new, daemon=dataclasses.replace(new.daemon, **keep))
    return new, notes


class CommandPlane:
    """control.sock: decode, dispatch to ``run_command``, reply."""

    def __init__(self, run_command: RunCommand) -> None:
        self.run_command = run_command
        self.control: Any = None
        self.control_guard = DecodeGuard("control")
        self.control_handlers = self.control_frame_handlers()
        self.send_failed = 0

    def control_frame_handlers(self) -> dict[type, Callable[[Any], Any]]:
        """The command plane's dispatch table: frame class -> ``handler(frame) -> CommandReply``."""
        from ipc.frames import Command

        return {Command: self._on_command}

    def _on_command(self, f: Any) -> Any:
        return self.run_command(f.name, f.args or {})

    def recv_control(self, now: float) -> None:
        import zmq

        from ipc.codec import encode
        from ipc.frames import CommandReply

        for _ in range(100):
            try:
                parts = self.control.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(parts) != 2:
                self.control_guard.errors["malformed"] = self.control_guard.errors.get("malformed", 0) + 1
                continue
            got = self.control_guard.decode_env(parts[1])
            if got is None:
                continue
            frame, cid = got
            handler = self.control_handlers.get(type(frame))
            if handler is not None:
                reply = handler(frame)
            else:
                self.control_guard.unexpected(frame)
                reply = CommandReply(ok=False, error=f"expected a command frame, got {frame.TYPE}")
            try:
                self.control.send_multipart([parts[0], encode(reply, cid=cid)], zmq.NOBLOCK)
            except zmq.ZMQError:
                self.send_failed += 1
