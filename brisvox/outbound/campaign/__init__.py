"""Outbound campaigns (docs/OUTBOUND.md): a CSV of numbers dialled at a rate, within calling hours,
with retries, crash-safe in one SQLite file.

The parts, each in its module: :mod:`.csvload` (the file, validated: pure),
:mod:`.store` (the SQLite state: each attempt committed before its INVITE, its
outcome after), :mod:`.scheduler` (which rows to dial now: pure, returns
actions), :mod:`.runner` (:class:`~.runner.CampaignRunner`, the service that
polls the store and dials through a :class:`~.runner.Dialer`), :mod:`.meter` (its
``/metrics`` counters, read from the store in a thread of its own), :mod:`.dialer`
(the real dialer: the running daemon's gateway, as ``brisvoxd dial``), and
``python -m brisvox.outbound.campaign run`` (the runner alone). The CLI
(``brisvoxd campaign``) is :mod:`brisvox.cli.campaign`.
"""
