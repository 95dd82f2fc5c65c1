"""The brisvoxd supervisor and what its children share with it.

Modules, in the order a reader meets them: ``arbiter`` (the master loop) and
its parts ``child_table`` (spawn, reap, the child channel), ``health`` (the
timers: pings, hung children, restarts, memory), ``shutdown`` (the phased
stop) and ``command_plane`` (commands, reload, status and HTTP views),
``slots`` (process table and restart policy, pure), ``child`` (fork, child
setup, :class:`~brisvox.daemon.child.ChildRuntime`), ``roles`` (role -> main),
``minimal`` (the placeholder role main), ``logs`` (JSON lines, forwarding),
``sdnotify``, ``httpd`` and ``metrics`` (``/metrics``, ``/healthz``),
``procutil`` (prctl, fds, PSS). The exit codes and the runtime paths (runtime
dir, pid lock) that the children use too live in :mod:`brisvox.runtime`: no
role process imports this package (``tests/unit/test_import_layers.py``).
"""
