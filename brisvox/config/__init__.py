"""Configuration: ``brisvoxd.toml`` parsed into frozen dataclasses, errors naming the key.

``daemon`` loads the file and owns ``[daemon]``; ``sections`` lists who parses
every other section; ``schema`` is the one validator (strict pydantic dataclasses)
every section and agent file uses; ``lines`` finds a key's line in the file;
``errors`` the one :class:`ConfigError`.
"""
