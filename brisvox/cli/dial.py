"""``brisvox dial TARGET``: the same outbound call as ``brisvoxd dial`` (SIP, or ``--via twilio``; docs/OPERATIONS.md).

Owns the subcommand's registration and the arguments both CLIs give ``dial``
(:func:`add_dial_arguments`); the command is
:func:`brisvox.cli.brisvoxd.cmd_dial` (it asks the running daemon's gateway).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_dial_arguments(sp: argparse.ArgumentParser) -> None:
    """``dial``'s arguments (``brisvoxd dial`` and ``brisvox dial`` alike)."""
    sp.add_argument("target", help="sip:user@ip[:port], or a number dialled as sip:NUMBER@<[sip] trunk>; "
                    "with --via twilio an E.164 number or a sip: URI")
    sp.add_argument("--via", choices=("sip", "twilio"), default="sip",
                    help="sip: an INVITE from the gateway (default); twilio: a calls create pointing at "
                    "[websocket] twiml_path")
    sp.add_argument("--trunk", help="dial the number through this [[sip.trunks]] entry (its proxy or registrar, "
                    "its credentials for a 401/407; default: [sip] trunk)")
    sp.add_argument("--agent", help="the agent that runs the call (default: [sip] default_agent, or the "
                    "twilio route's)")
    sp.add_argument("--ring-timeout", type=float, help="seconds to ring (default: [sip] dial_ring_timeout_s; "
                    "Twilio's 60 s)")
    sp.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", type=param_arg,
                    help="a call parameter (repeatable): the agent's CallStart.params, its prompt's {{NAME}} "
                    "(SIP only; at most 29, not from/to/direction)")
    sp.add_argument("--json", action="store_true", help="machine-readable output")


def param_arg(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` of ``--param`` (the gateway checks the bounds)."""
    name, eq, value = text.partition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text[:64]!r}")
    return name, value


def add_parser(sub: Any) -> None:
    p = sub.add_parser("dial", help="place an outbound call (SIP, or --via twilio) through the running daemon's gateway")
    add_dial_arguments(p)
    p.add_argument("--config", help="config file (default: $BRISVOX_CONFIG, /etc/brisvox/brisvoxd.toml)")
    p.add_argument("--runtime-dir", help="runtime dir of the daemon to talk to (default: from the config)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from brisvox.cli.brisvoxd import cmd_dial

    return cmd_dial(args)
