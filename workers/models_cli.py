"""``brisvox models install|list|verify``: the user-facing side of :mod:`workers.models`.

Owns argument parsing and the exit codes: 0 when every model is present and
verified, 1 otherwise (verify) or when installation (or a derivation) failed
(install). Derived files are listed and verified too, but a missing one does
not fail ``verify``: the worker falls back to the source model.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workers import models


def add_parser(sub: Any) -> None:
    p = sub.add_parser("models", help="install, list and verify the local model files")
    p.add_argument("--dir", default=None, help="models directory (default: [models] dir of the daemon "
                   "config, else $BRISVOX_MODELS_DIR, <checkout>/models, or ~/.local/share/brisvox/models)")
    p.add_argument("--config", default=None, help="daemon config whose [models] dir to use "
                   "(default: $BRISVOX_CONFIG, else /etc/brisvox/brisvoxd.toml if present)")
    msub = p.add_subparsers(dest="models_command", required=True)
    pi = msub.add_parser("install", help="install missing or corrupt models (idempotent)")
    pi.add_argument("--force", action="store_true", help="reinstall even if present")
    pi.add_argument("names", nargs="*", help=f"models to install (default all: {', '.join(models.CATALOGUE)})")
    msub.add_parser("list", help="list the models and their state")
    msub.add_parser("verify", help="check every model's sha256; exit 1 if any is missing or corrupt")
    p.set_defaults(run=run)


def _configured_dir(args: argparse.Namespace) -> str | None:
    """``--dir``, else the ``[models] dir`` of the daemon config (if one is found and sets it)."""
    if args.dir:
        return str(args.dir)
    from brisvox.config.daemon import find_config, load_config

    path = find_config(args.config)
    if path is None:
        return None
    return load_config(path).section("models").dir or None


def run(args: argparse.Namespace) -> int:
    from brisvox.config.errors import ConfigError

    try:
        directory = models.models_dir(_configured_dir(args))
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    cmd = args.models_command
    if cmd == "install":
        unknown = [n for n in args.names if n not in models.CATALOGUE]
        if unknown:
            print(f"unknown model(s): {', '.join(unknown)}", file=sys.stderr)
            return 2
        try:
            sts = models.install(directory, names=args.names or None, force=args.force, report=print)
        except models.ModelError as e:
            print(f"models install failed: {e}", file=sys.stderr)
            return 1
        return 0 if all(s.state == "ok" for s in sts) else 1
    sts = models.verify(directory)
    derived = models.verify_derived(directory)
    if cmd == "list":
        print(f"models directory: {directory}")
        for s in sts:
            sp = s.spec
            src = f"{sp.package}=={sp.version}" + (f" + {len(sp.chunks) - 1} more chunks" if sp.chunks else "")
            print(f"  {sp.name:<12} {s.state:<8} {sp.filename:<28} {sp.size:>10} B  "
                  f"{src} ({sp.license})  {s.detail}")
        for d in derived:
            print(f"  {d.spec.name:<12} {d.state:<8} {d.spec.filename:<28} derived from "
                  f"{d.spec.source} by {d.spec.recipe} (optional)  {d.detail}")
        return 0
    bad = [s for s in sts if s.state != "ok"]
    for s in sts:
        print(f"{s.spec.name}: {s.state} {s.detail}".rstrip())
    for d in derived:  # optional: the worker falls back to the source without it
        print(f"{d.spec.name} (derived, optional): {d.state} {d.detail}".rstrip())
    if bad:
        print(f"{len(bad)} model(s) not usable in {directory}: {models.INSTALL_HINT}", file=sys.stderr)
        return 1
    return 0



if __name__ == "__main__":  # pragma: no cover
    ap = argparse.ArgumentParser(prog="brisvox")
    add_parser(ap.add_subparsers(dest="command", required=True))
    a = ap.parse_args()
    sys.exit(a.run(a))
