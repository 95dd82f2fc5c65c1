"""The brisvoxd supervisor and what its children share with it.

Modules, in the order a reader meets them: ``arbiter`` (the master loop),
``slots`` (process table and restart policy, pure), ``child`` (fork, child
setup, :class:`~brisvox.daemon.child.ChildRuntime`), ``roles`` (role -> main),
``minimal`` (the placeholder role main), ``exitcodes``, ``paths`` (runtime
dir, pid lock), ``logs`` (JSON lines, forwarding), ``sdnotify``, ``httpd`` and
``metrics`` (``/metrics``, ``/healthz``), ``procutil`` (prctl, fds, PSS).
"""
