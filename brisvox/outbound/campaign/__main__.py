"""``python -m brisvox.outbound.campaign run --db PATH``: the campaign runner alone, in the foreground.

Dials through the gateway of the daemon at ``--runtime-dir`` (default: the
config's, as ``brisvoxd dial`` finds it) until SIGTERM or SIGINT (then the
dials in flight get ``--drain`` seconds). With ``--config`` naming a config whose
``[[webhooks]]`` want it, each done row's ``campaign.row.done`` goes to that daemon's
outbox (its courier delivers it), as the outbound role's runner sends it. Exit codes: 0 stopped; 1 another
runner holds the file, or the store cannot be opened; 2 a configuration error.
Until the daemon's ``outbound`` role hosts :class:`~.runner.CampaignRunner`,
this is how campaigns run (and how the kill -9 tests run it).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from brisvox.runtime import exitcodes


def _runtime_dir(args: argparse.Namespace) -> Path:
    if args.runtime_dir:
        return Path(args.runtime_dir)
    from brisvox.config.daemon import find_config, load_config
    from brisvox.config.secrets import deferred
    from brisvox.runtime.paths import runtime_dir

    path = find_config(args.config)
    with deferred():
        return runtime_dir(load_config(path.resolve() if path else None))


def _events(args: argparse.Namespace) -> Any:
    """The config's row events (its secrets read: the endpoints are the courier's), or None."""
    if not args.config:
        return None
    from brisvox.config.daemon import find_config, load_config
    from brisvox.outbound.campaign.service import row_events

    path = find_config(args.config)
    return row_events(load_config(path.resolve() if path else None))


async def _run(args: argparse.Namespace) -> int:
    from brisvox.outbound.campaign.dialer import GatewayDialer
    from brisvox.outbound.campaign.runner import CampaignRunner

    events = _events(args)
    dialer = GatewayDialer(_runtime_dir(args), trunk=args.trunk or "")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await CampaignRunner(args.db, dialer, poll_s=args.poll, drain_s=args.drain,
                             on_row_done=events.row_done if events is not None else None).run(stop)
    finally:
        dialer.close()
        if events is not None:  # the last rows' events: committed before the exit
            await asyncio.to_thread(events.close, 5.0)
    return exitcodes.OK


def main(argv: list[str] | None = None) -> int:
    from brisvox.config.errors import ConfigError
    from brisvox.outbound.campaign.store import StoreError

    p = argparse.ArgumentParser(prog="python -m brisvox.outbound.campaign")
    sub = p.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("run", help="run the campaigns of a store until SIGTERM")
    sp.add_argument("--db", required=True, help="the campaign store (brisvoxd campaign start --db)")
    sp.add_argument("--config", help="daemon config (its runtime dir; its [[webhooks]] get campaign.row.done)")
    sp.add_argument("--runtime-dir", help="runtime dir of the daemon whose gateway dials")
    sp.add_argument("--trunk", help="a [[sip.trunks]] name numbers are dialled through (default: [sip] trunk)")
    sp.add_argument("--poll", type=float, default=0.25, help="seconds between looks at the store")
    sp.add_argument("--drain", type=float, default=30.0, help="seconds the dials in flight get at the stop")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        code = asyncio.run(_run(args))
    except ConfigError as e:
        print(f"campaign runner: configuration error: {e}", file=sys.stderr)
        return exitcodes.CONFIG
    except StoreError as e:
        print(f"campaign runner: {e}", file=sys.stderr)
        return exitcodes.FAILURE
    # the store is closed; a dial thread still waiting past --drain has nothing left to record (its
    # attempt is unknown at the next start): exit without joining it (up to its ring + 40 s)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
