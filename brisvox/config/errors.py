"""The one configuration error type: it always names the offending key.

``key`` is the dotted path in the TOML file (``daemon.restart.backoff_max_s``,
``websocket.routes[0].path``); a whole section or file uses its name. ``str(err)``
reads ``<file>:<line>: <key>: <message>`` (``<file>: ...`` when the line is not
known) so an operator can go straight to the line.

It is a ``ValueError``: raised inside a section's ``__post_init__`` or a field
validator, pydantic carries it (with its position in the document) to
:func:`brisvox.config.schema.from_table`, which prefixes the enclosing keys.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid or unknown configuration key. ``key`` is the dotted path, ``line`` 1-based (0: unknown)."""

    def __init__(self, key: str, message: str, path: str | None = None, line: int = 0) -> None:
        super().__init__(key, message, path)
        self.key = key
        self.message = message
        self.path = path
        self.line = line

    def with_path(self, path: str, line: int = 0) -> ConfigError:
        return type(self)(self.key, self.message, path, line or self.line)

    def __str__(self) -> str:
        if self.path and self.line:
            where = f"{self.path}:{self.line}: "
        else:
            where = f"{self.path}: " if self.path else ""
        return f"{where}{self.key}: {self.message}"
