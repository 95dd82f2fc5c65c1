"""``brisvox token --agent NAME [--ttl S] [--param K=V]``: issue a signed native-protocol token.

Owns argument parsing and output. The key is ``[websocket] native_secret`` of
the daemon config (``--config``, else the one ``brisvoxd`` would find); the
token (:func:`brisvox.gateway.ws.auth.mint_token`) admits one connection
handshake to the native route serving ``NAME`` until it expires, with the
given call parameters fixed. Prints the token (with ``--url``: the URL with
``?token=`` appended). Exit codes: 0; 2 when no config or no secret is found,
or the TTL is out of range.

Invariants: the secret is never printed; nothing but the token (or URL) goes
to stdout.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import quote


def add_parser(sub: Any) -> None:
    p = sub.add_parser("token", help="issue a short-lived signed token for the native WebSocket protocol")
    p.add_argument("--agent", required=True, help="the agent the token admits: the route's agent for its "
                   "bare path, or NAME of <path>/NAME")
    p.add_argument("--ttl", type=float, default=300.0, help="lifetime in seconds (default 300)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="call parameter fixed by the token (repeatable)")
    p.add_argument("--config", default=None, help="daemon config holding [websocket] native_secret")
    p.add_argument("--url", default="", help="print this URL with ?token=<token> appended instead")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from brisvox.config.daemon import find_config, load_config
    from brisvox.config.errors import ConfigError
    from brisvox.gateway.config import AGENT_RE
    from brisvox.gateway.ws.auth import mint_token

    if not AGENT_RE.match(args.agent):
        print(f"brisvox token: invalid agent name {args.agent!r}", file=sys.stderr)
        return 2
    path = find_config(args.config)
    if path is None:
        print("brisvox token: no daemon config found (pass --config)", file=sys.stderr)
        return 2
    try:
        secret = load_config(path).section("websocket").native_secret
    except ConfigError as e:
        print(f"brisvox token: {path}: {e}", file=sys.stderr)
        return 2
    params = dict(kv.split("=", 1) for kv in args.param if "=" in kv) or None
    try:
        token = mint_token(secret, args.agent, args.ttl, params)
    except ValueError as e:
        print(f"brisvox token: {e}", file=sys.stderr)
        return 2
    if args.url:
        sep = "&" if "?" in args.url else "?"
        print(f"{args.url}{sep}token={quote(token)}")
    else:
        print(token)
    return 0
