"""Unit tests: what every test of this folder starts from.

The gateway keeps one rate-limit storage per process (:mod:`brisvox.gateway.rate_limits`),
so the SIP and WebSocket tests that feed a gateway core from the same fixed source address
would count each other's requests: a test run after enough others from that address would
see 503 ``rate_limit`` for requests it never sent too fast. Each test starts from an empty
storage, as a gateway process does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from brisvox.gateway.rate_limits import process_storage


@pytest.fixture(autouse=True)
def _empty_rate_limits() -> Iterator[None]:
    process_storage().reset()
    yield
