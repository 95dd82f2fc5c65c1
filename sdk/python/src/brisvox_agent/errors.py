"""The SDK's exceptions."""

from __future__ import annotations


class AgentError(Exception):
    """Base of every exception this package raises."""


class Refuse(AgentError):
    """Raised by an ``on_session`` hook: the offer is answered ``session.refuse``."""

    def __init__(self, reason: str = "refused") -> None:
        super().__init__(reason)
        self.reason = reason


class ToolError(AgentError):
    """Raised by a tool: its message is what the model reads (``ok: false``)."""


class CommandError(AgentError):
    """A command was not carried out: refused by brisvox, not answered in time, or not sent."""

    def __init__(self, command: str, error: str) -> None:
        super().__init__(f"{command}: {error}")
        self.command = command
        self.error = error


class CommandRefused(CommandError):
    """brisvox answered ``command.ack`` with ``ok: false`` (or an ``error`` frame naming the id)."""


class CommandTimeout(CommandError):
    """No ``command.ack`` within the bound."""


class NotLive(CommandError):
    """The session is not live: before its accept, or after the connection closed."""
