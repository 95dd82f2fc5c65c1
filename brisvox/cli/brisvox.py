"""``brisvox``: user tools (models, call records, a test call, native tokens, benchmarks).

Each subcommand lives in its own module exposing ``add_parser(subparsers)``
and ``run(args) -> int``; this file only lists them, so importing the CLI
does not import numpy, ONNX or ZeroMQ until a subcommand needs them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that implements it
SUBCOMMANDS = {
    "models": "workers.models_cli",
    "calls": "brisvox.cli.calls",
    "call": "brisvox.client.call_cli",
    "token": "brisvox.cli.ws_token",
    "dial": "brisvox.cli.dial",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="brisvox", description="brisvox user tools")
    sub = p.add_subparsers(dest="command", required=True)
    for modname in SUBCOMMANDS.values():
        mod = importlib.import_module(modname)
        mod.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
