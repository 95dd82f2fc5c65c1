"""Network lists of ``brisvoxd.toml`` that may come from the environment: ``K_env = "VAR"``.

Owns the one non-secret environment form (secrets have their own, with
files and credentials: :mod:`brisvox.config.secrets`). A key of
:data:`ENV_NETWORK_KEYS` (today ``[sip] allow``) may be given as well as::

    allow = ["127.0.0.0/8"]         # used when the variable is unset or empty
    allow_env = "BRISVOX_SIP_ALLOW" # "203.0.113.0/24, 198.51.100.7": replaces allow

so a container image can ship one config file and take the deployment's
networks from ``docker run -e BRISVOX_SIP_ALLOW=...``; with the variable
unset the file's own value (or the key's default) stands, so the image is
safe without it (``configs/brisvoxd.container.toml``).

Invariants:

* :func:`resolve_env_networks` returns the table with every ``K_env`` removed;
  when the variable is set and not blank, ``K`` is the list of its entries
  (split on commas and white space), each a valid IP address or CIDR network,
  else a :class:`ConfigError` naming ``<section>.K_env`` and the variable.
* The variable is read at parse time (start and each reload, in the
  supervisor); children inherit the parsed value across ``fork``.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

from brisvox.config.errors import ConfigError

# section -> its keys (lists of IP networks) that may take the K_env form
ENV_NETWORK_KEYS: dict[str, tuple[str, ...]] = {"sip": ("allow",)}
_VAR_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_SPLIT_RE = re.compile(r"[\s,]+")


def resolve_env_networks(table: Mapping[str, Any], where: str,
                         env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``table`` with each ``K_env`` of :data:`ENV_NETWORK_KEYS` [``where``] read into ``K`` (when set)."""
    out = dict(table)
    env = os.environ if env is None else env
    for k in ENV_NETWORK_KEYS.get(where, ()):
        form = f"{k}_env"
        if form not in out:
            continue
        var = out.pop(form)
        key = f"{where}.{form}"
        if type(var) is not str or not _VAR_RE.match(var):
            raise ConfigError(key, f"expected the name of an environment variable, got {var!r}")
        value = env.get(var, "").strip()
        if not value:
            continue  # unset: the file's K (or its default) stands
        entries = [e for e in _SPLIT_RE.split(value) if e]
        for entry in entries:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ConfigError(key, f"environment variable {var}: {entry[:60]!r} is not an IP address or "
                                       "CIDR network (expected e.g. \"203.0.113.0/24, 198.51.100.7\")") from None
        out[k] = entries
    return out
