"""The brisvoxd supervisor and what its children share with it.

Modules, in the order a reader meets them: ``arbiter`` (the master loop, the
daemon's state, commands, reload) and the collaborators it holds:
``child_table`` (the slots, spawn, reap, the child channel), ``health``
(pings, hung children, handshake timeouts, memory), ``shutdown`` (the phased
stop) and ``command_plane`` (control.sock, the config reload); ``views``
(status line, status rows, ``/healthz``, pure), ``slots`` (process table and
restart policy, pure), ``child`` (fork, child setup,
:class:`~brisvox.daemon.child.ForkedChildRuntime`, the implementation of
:class:`~brisvox.runtime.child_runtime.ChildRuntime`), ``roles`` (role -> main),
``minimal`` (the placeholder role main), ``logs`` (JSON lines, forwarding),
``sdnotify``, ``httpd`` and ``metrics`` (``/metrics``, ``/healthz``),
``procutil`` (prctl, fds, PSS). The exit codes and the runtime paths (runtime
dir, pid lock) that the children use too live in :mod:`brisvox.runtime`: no
role process imports this package (``tests/unit/test_import_layers.py``).
"""
