"""The fault budget of a live WebSocket call (brisvox.gateway.fault_budget) and its config keys.

* more than ``max_faults`` malformed messages within ``window_s`` end the call,
  exactly ``max_faults`` do not, and faults spaced beyond the window never do
  (the window slides: only the latest ``max_faults + 1`` count);
* ``hangup_on_error`` ends the call on the first fault (with no budget reason:
  the leg keeps the message's own);
* memory stays bounded at ``max_faults + 1`` timestamps, every fault is counted;
* ``[websocket] fault_max``, ``fault_window_s``, ``hangup_on_error`` are
  validated with an error naming the key, and become the session's budget.
"""

from __future__ import annotations

import math

import pytest

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import WebSocketConfig
from brisvox.gateway.fault_budget import DROP, FaultBudget


def feed(counter, times):
    return [counter.fault(t) for t in times]


def test_exactly_max_faults_within_the_window_drop_one_more_ends():
    c = FaultBudget(max_faults=3, window_s=10.0).counter()
    assert feed(c, [0.0, 1.0, 2.0]) == [DROP] * 3
    d = c.fault(3.0)
    assert d.end and d.reason == "fault budget exceeded: 4 malformed messages in 10 s"
    assert c.total == 4


def test_the_window_slides():
    c = FaultBudget(max_faults=3, window_s=10.0).counter()
    assert feed(c, [0.0, 1.0, 2.0]) == [DROP] * 3
    # the fourth comes when the first is exactly window_s old: it no longer counts
    assert c.fault(10.0) == DROP
    assert c.recent(10.0) == 3
    # 1.0, 2.0, 10.0 and 10.5 are four within 10 s
    assert c.fault(10.5).end


def test_faults_spaced_beyond_the_window_never_end_the_call():
    c = FaultBudget(max_faults=2, window_s=1.0).counter()
    for i in range(1000):
        assert c.fault(i * 0.5) == DROP  # two per second: never three within a second
    assert c.total == 1000


def test_a_burst_after_quiet_time_is_judged_on_its_own():
    c = FaultBudget(max_faults=20, window_s=10.0).counter()
    assert all(not d.end for d in feed(c, [t * 0.6 for t in range(100)]))  # 1.7 a second: fine
    burst = feed(c, [100.0 + t * 0.02 for t in range(21)])  # a stream gone bad, 50 a second
    assert [d.end for d in burst] == [False] * 20 + [True]


def test_hangup_on_error_ends_on_the_first_fault_with_the_message_reason():
    c = FaultBudget(max_faults=20, window_s=10.0, hangup_on_error=True).counter()
    d = c.fault(0.0)
    assert d.end and d.reason == ""
    assert c.total == 1 and c.kept == 0


def test_zero_faults_allowed_ends_on_the_first_one_with_the_budget_reason():
    c = FaultBudget(max_faults=0, window_s=5.0).counter()
    d = c.fault(0.0)
    assert d.end and d.reason == "fault budget exceeded: 1 malformed messages in 5 s"


def test_memory_is_bounded_whatever_the_number_of_faults():
    b = FaultBudget(max_faults=4, window_s=0.001)
    c = b.counter()
    for i in range(10_000):
        c.fault(float(i))
        assert c.kept <= b.max_faults + 1
    assert c.kept == 5 and c.total == 10_000


def test_counters_are_independent():
    b = FaultBudget(max_faults=1, window_s=10.0)
    one, two = b.counter(), b.counter()
    assert one.fault(0.0) == DROP and two.fault(0.0) == DROP
    assert one.fault(1.0).end and two.total == 1


def test_defaults_and_description():
    b = FaultBudget()
    assert (b.max_faults, b.window_s, b.hangup_on_error) == (20, 10.0, False)
    assert b.describe() == "at most 20 malformed messages within 10 s"
    assert "first malformed" in FaultBudget(hangup_on_error=True).describe()


@pytest.mark.parametrize("kwargs", [{"max_faults": -1}, {"max_faults": 10_001}, {"max_faults": 1.5},
                                    {"window_s": 0.0}, {"window_s": -1.0}, {"window_s": math.nan},
                                    {"window_s": 3601.0}])
def test_the_budget_refuses_bad_values(kwargs):
    with pytest.raises(ValueError):
        FaultBudget(**kwargs)


def test_config_keys_make_the_budget():
    assert WebSocketConfig.from_section({}).fault_budget() == FaultBudget()
    cfg = WebSocketConfig.from_section({"fault_max": 0, "fault_window_s": 2, "hangup_on_error": True})
    assert cfg.fault_budget() == FaultBudget(0, 2.0, True)


@pytest.mark.parametrize(("table", "key", "match"), [
    ({"fault_max": -1}, "websocket.fault_max", "must be >= 0"),
    ({"fault_max": 10_001}, "websocket.fault_max", "must be <= 10000"),
    ({"fault_max": "20"}, "websocket.fault_max", "expected an integer"),
    ({"fault_max": 2.5}, "websocket.fault_max", "expected an integer"),
    ({"fault_max": True}, "websocket.fault_max", "expected an integer"),
    ({"fault_window_s": 0}, "websocket.fault_window_s", "must be > 0"),
    ({"fault_window_s": -3.0}, "websocket.fault_window_s", "must be > 0"),
    ({"fault_window_s": math.nan}, "websocket.fault_window_s", "expected a finite number"),
    ({"fault_window_s": 7200}, "websocket.fault_window_s", "must be <= 3600"),
    ({"fault_window_s": "10"}, "websocket.fault_window_s", "expected a number"),
    ({"hangup_on_error": 1}, "websocket.hangup_on_error", "expected true or false"),
    ({"hangup_on_error": "yes"}, "websocket.hangup_on_error", "expected true or false"),
])
def test_config_refuses_bad_values_naming_the_key(table, key, match):
    with pytest.raises(ConfigError, match=match) as ei:
        WebSocketConfig.from_section(table)
    assert ei.value.key == key
