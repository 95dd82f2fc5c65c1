"""Which parser owns each section of ``brisvoxd.toml``: ``section -> "module:Class"``.

Each class is a frozen dataclass with ``from_section(table: dict, where: str)``
that validates its keys and raises ``brisvox.config.errors.ConfigError``
naming the offending key (``where`` is the dotted path, e.g. ``gateway.sip``).
A section missing from the file gets the class defaults.
"""

SECTION_PARSERS: dict[str, str] = {}
