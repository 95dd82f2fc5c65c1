"""The one configuration error type: it always names the offending key.

``key`` is the dotted path in the TOML file (``daemon.restart.backoff_max_s``,
``gateway.sip.port``); a whole section or file uses its name. ``str(err)``
reads ``<file>: <key>: <message>`` so an operator can go straight to the line.
"""

from __future__ import annotations


class ConfigError(Exception):
    """An invalid or unknown configuration key. ``key`` is the dotted path."""

    def __init__(self, key: str, message: str, path: str | None = None) -> None:
        super().__init__(key, message, path)
        self.key = key
        self.message = message
        self.path = path

    def with_path(self, path: str) -> ConfigError:
        return ConfigError(self.key, self.message, path)

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        return f"{where}{self.key}: {self.message}"
