"""sd_notify datagrams written directly to $NOTIFY_SOCKET."""

from __future__ import annotations

import os
import socket

from brisvox.daemon.sdnotify import Notifier


def test_messages_reach_a_path_socket(short_tmp):
    path = str(short_tmp / "n")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(1)
    try:
        n = Notifier({"NOTIFY_SOCKET": path})
        n.ready("all ready")
        assert s.recv(4096).decode().split("\n")[:2] == ["READY=1", "STATUS=all ready"]
        n.status("all ready")  # unchanged: not sent again
        n.status("1 call")
        assert s.recv(4096) == b"STATUS=1 call"
        n.stopping("bye")
        assert s.recv(4096) == b"STOPPING=1\nSTATUS=bye"
        n.close()
    finally:
        s.close()


def test_abstract_socket_and_watchdog():
    name = f"brisvox-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(1)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "2000000"})
        assert n.watchdog_s == 2.0 and n.watchdog_due(0.0) == 0.0
        n.watchdog(10.0)
        assert s.recv(4096) == b"WATCHDOG=1"
        assert n.watchdog_due(10.0) == 1.0
        n.watchdog(10.5)  # not due yet
        n.watchdog(11.0)
        assert s.recv(4096) == b"WATCHDOG=1"
    finally:
        s.close()


def test_disabled_without_socket_and_watchdog_for_another_pid():
    n = Notifier({})
    assert not n.enabled and not n.notify("READY=1")
    n = Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert n.watchdog_due(0.0) is None
