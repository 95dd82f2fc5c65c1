"""Run the gateway on its own: one process, its own loop and ZeroMQ context.

Owns the command line used by system tests, benches and operators who want
a gateway without the supervisor (e.g. an echo line-test box)::

    python -m brisvox.gateway --config gw.toml [--instance TAG] [--inbox ipc://...]
                              [--peer agent-0=ipc://...] [--uvloop]

It prints one JSON line ``{"ready": true, "endpoints": {...}, "instance": ...}``
on stdout once every socket is bound (ports may be 0 in the config: the line
tells which were chosen), then serves until SIGTERM/SIGINT, drains on
SIGUSR1 and exits 0. Rings are created under ``--instance`` (default: this
process's own instance tag), so an orphan sweep finds them after a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
import tomllib
from pathlib import Path

import orjson

from brisvox.config.errors import ConfigError
from brisvox.gateway.config import GatewaySettings
from brisvox.gateway.transports import assemble
from ipc.ring import instance_id


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m brisvox.gateway")
    ap.add_argument("--config", type=Path, help="TOML with [gateway], [sip], [websocket] sections")
    ap.add_argument("--instance", default="", help="ring instance tag (default: this process)")
    ap.add_argument("--inbox", default="", help="ZeroMQ endpoint to bind the gateway's inbox on")
    ap.add_argument("--identity", default="gateway-0")
    ap.add_argument("--peer", action="append", default=[], help="NAME=ENDPOINT of an agent or worker inbox")
    ap.add_argument("--uvloop", action="store_true", help="run on uvloop if it is installed")
    ap.add_argument("--log-level", default="WARNING")
    return ap.parse_args(argv)


async def serve(args: argparse.Namespace, settings: GatewaySettings) -> int:
    peers = dict(p.split("=", 1) for p in args.peer)
    core = assemble(settings, instance=args.instance or instance_id(), identity=args.identity,
                       inbox_endpoint=args.inbox or None, static_peers=peers)
    endpoints = await core.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, core.drain)
    sys.stdout.write(orjson.dumps({"ready": True, "endpoints": endpoints, "instance": core.instance,
                                   "pid": os.getpid()}).decode() + "\n")
    sys.stdout.flush()
    await stop.wait()
    await core.stop(grace_s=1.0)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    tables = tomllib.loads(args.config.read_text()) if args.config else {}
    try:
        settings = GatewaySettings.from_tables(tables)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    if args.uvloop:
        try:
            import uvloop

            return uvloop.run(serve(args, settings))
        except ImportError:
            print("uvloop is not installed; using asyncio", file=sys.stderr)
    return asyncio.run(serve(args, settings))


if __name__ == "__main__":
    sys.exit(main())
