"""What every brisvox process shares about running, whatever its role.

``exitcodes`` (the exit-code table of ``brisvoxd`` and of its children, used
on both sides of a fork) and ``paths`` (where a daemon instance lives on disk:
the runtime and state dirs, the pid lock), ``child_runtime`` (the
:class:`~brisvox.runtime.child_runtime.ChildRuntime` protocol a role main is
typed with), ``histogram`` (the fixed-bucket
histograms the agent processes report and the supervisor sums), ``private_files``
(0600 files, 0700 directories and the ``keep_days`` retention of the call records and
the gateway's call recordings), ``retry`` (the one retry policy of every
retry and reconnect: backoff, jitter, attempt budgets, ``Retry-After``,
deadlines). The supervisor (``brisvox.daemon``),
the CLI and the role processes (gateway, workers, agent processes) import them
from here, so no role needs to import the supervisor. This package imports no
other brisvox package (the configuration reaches it as a protocol).
"""
