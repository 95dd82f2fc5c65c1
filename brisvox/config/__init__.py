"""Configuration: ``brisvoxd.toml`` parsed into frozen dataclasses, errors naming the key.

``daemon`` loads the file and owns ``[daemon]``; ``sections`` lists who parses
every other section; ``schema`` holds the strict table -> dataclass rules every
section parser uses; ``errors`` the one :class:`ConfigError`.
"""
