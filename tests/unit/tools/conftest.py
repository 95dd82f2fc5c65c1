"""Every scenario that builds a context through ``helpers.Conv`` ends with
``Context.validate()`` (asserted after every scenario)."""

from __future__ import annotations

import pytest

from . import helpers


@pytest.fixture(autouse=True)
def _validate_every_context():
    helpers.LIVE_CONVS.clear()
    yield
    convs = list(helpers.LIVE_CONVS)
    helpers.LIVE_CONVS.clear()
    for conv in convs:
        conv.ctx.validate()
