"""``brisvox dial TARGET``: the same outbound SIP call as ``brisvoxd dial`` (see docs/OPERATIONS.md).

Owns nothing but the subcommand's registration; the command is
:func:`brisvox.cli.brisvoxd.cmd_dial` (it asks the running daemon's gateway).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dial", help="place an outbound SIP call through the running daemon's gateway")
    p.add_argument("target", help="sip:user@ip[:port], or a number dialled as sip:NUMBER@<[sip] trunk>")
    p.add_argument("--agent", help="the agent that runs the call (default: [sip] default_agent)")
    p.add_argument("--ring-timeout", type=float, help="seconds to ring before CANCEL (default: [sip] dial_ring_timeout_s)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--config", help="config file (default: $BRISVOX_CONFIG, /etc/brisvox/brisvoxd.toml)")
    p.add_argument("--runtime-dir", help="runtime dir of the daemon to talk to (default: from the config)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from brisvox.cli.brisvoxd import cmd_dial

    return cmd_dial(args)
