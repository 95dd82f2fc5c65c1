"""What every brisvox process shares about running, whatever its role.

``exitcodes`` (the exit-code table of ``brisvoxd`` and of its children, used
on both sides of a fork) and ``paths`` (where a daemon instance lives on disk:
the runtime and state dirs, the pid lock), ``histogram`` (the fixed-bucket
histograms the agent processes report and the supervisor sums), ``private_files``
(0600 files, 0700 directories and the ``keep_days`` retention of the call records and
the gateway's call recordings). The supervisor (``brisvox.daemon``),
the CLI and the role processes (gateway, workers, agent processes) import them
from here, so no role needs to import the supervisor.
"""
