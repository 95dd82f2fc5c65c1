"""``brisvoxd``: start, stop, inspect and drain the daemon; dial out; validate a config offline.

Owns the command line only. ``start`` loads and validates the config (exit 2
naming the key when it is wrong), prepares the runtime dir, takes the pid
lock (a second start on the same runtime dir is refused) and runs the
supervisor (:class:`brisvox.daemon.arbiter.Arbiter`), in the foreground or
daemonized (the starting command waits until the daemon is ready or failed
and exits with its verdict). The other commands talk to the running
supervisor over its command plane (``control.sock`` in the runtime dir);
``campaign`` manages outbound campaigns in their SQLite store
(:mod:`brisvox.cli.campaign`). ``dial`` asks the gateway itself (its inbox, ``gateway-0.sock``), which owns SIP,
and waits until the callee answered or the dial failed (``--via twilio``: until
Twilio accepted the calls create).

Exit codes: 0 ok; 1 failure; 2 configuration error; 3 (``status``) not running.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from brisvox.cli.dial_request import dial, dial_times
from brisvox.config.daemon import DaemonConfig, find_config, load_config
from brisvox.config.errors import ConfigError
from brisvox.runtime import exitcodes

CONTROL_TIMEOUT_S = 5.0


def _err(msg: str) -> None:
    print(f"brisvoxd: {msg}", file=sys.stderr, flush=True)


def _load(args: argparse.Namespace) -> DaemonConfig:
    path = find_config(getattr(args, "config", None))
    return load_config(path.resolve() if path else None)


def _runtime_dir(args: argparse.Namespace) -> Path:
    from brisvox.runtime.paths import runtime_dir

    if getattr(args, "runtime_dir", None):
        return Path(args.runtime_dir)
    from brisvox.config.secrets import deferred

    try:
        with deferred():  # a secret of the service's environment is not needed to find the daemon
            cfg = _load(args)
    except ConfigError as e:
        _err(f"warning: {e}; using the default runtime dir")
        cfg = DaemonConfig()
    return runtime_dir(cfg)


def _command(rdir: Path, name: str, args: dict[str, Any] | None = None, timeout: float = CONTROL_TIMEOUT_S) -> Any:
    from ipc.bus import endpoint, request_sync
    from ipc.frames import Command

    return request_sync(endpoint(rdir, "control"), Command(name=name, args=args), timeout)


def _running_or_explain(rdir: Path) -> bool:
    from brisvox.runtime.paths import is_locked

    if is_locked(rdir):
        return True
    _err(f"not running (no daemon holds {rdir}/brisvoxd.pid)")
    return False


def _ask(rdir: Path, name: str, not_running: int, args: dict[str, Any] | None = None) -> Any:
    """The running daemon's reply to command ``name``, or an exit code (explained on
    stderr): ``not_running`` when no daemon holds the pid lock, FAILURE when it does
    not answer in time or refuses the command."""
    from ipc.bus import RequestTimeout

    if not _running_or_explain(rdir):
        return not_running
    try:
        reply = _command(rdir, name, args)
    except RequestTimeout:
        _err(f"the daemon does not answer on {rdir}/control.sock")
        return exitcodes.FAILURE
    if not reply.ok:
        _err(reply.error)
        return exitcodes.FAILURE
    return reply


def _wait_gone(rdir: Path, timeout: float) -> bool:
    from brisvox.runtime.paths import is_locked

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not is_locked(rdir):
            return True
        time.sleep(0.05)
    return False


# -- start ---------------------------------------------------------------------------


def cmd_start(args: argparse.Namespace) -> int:
    from brisvox.config.exposure import check_open_sip
    from brisvox.daemon.arbiter import Arbiter
    from brisvox.outbound.webhooks.config import check_webhooks
    from brisvox.runtime.paths import (
        AlreadyRunning,
        PathError,
        PidLock,
        prepare_dirs,
        restrict_umask,
    )

    restrict_umask()  # first: the runtime dir, pid file, log file and every child's files are owner-only
    try:
        cfg = _load(args).with_counts(args.workers, args.agents)
        for line in check_open_sip(cfg):  # an open SIP port is refused (exit 2) unless overridden
            _err(f"warning: {line}")
        hook_errors, hook_warnings = check_webhooks(cfg)  # the refusals of brisvoxd check
        for line in hook_warnings:
            _err(f"warning: {line}")
        if hook_errors:
            raise ConfigError("webhooks", "; ".join(hook_errors))
        rdir, sdir = prepare_dirs(cfg)
    except (ConfigError, PathError) as e:
        _err(f"configuration error: {e}")
        return exitcodes.CONFIG
    lock = PidLock(rdir)
    try:
        lock.acquire()
    except AlreadyRunning as e:
        _err(str(e))
        return exitcodes.FAILURE
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    counts = (args.workers, args.agents)
    if args.foreground:
        from brisvox.cli.banner import fork_reporter

        status_fd = fork_reporter(rdir, cfg)  # prints where to call once ready, then exits
        return Arbiter(cfg, rdir, sdir, lock, cli_counts=counts, status_fd=status_fd).run()
    return _daemonize(cfg, rdir, sdir, lock, counts)


def _daemonize(cfg: DaemonConfig, rdir: Path, sdir: Path, lock: Any, counts: tuple[int | None, int | None]) -> int:
    from brisvox.daemon.arbiter import Arbiter

    log_path = sdir / "brisvoxd.log"
    r, w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = exitcodes.FAILURE
        try:
            os.close(r)
            os.setsid()
            if os.fork():
                os._exit(0)
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            out = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.fchmod(out, 0o600)  # a log file left by an older version may be group-readable
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.close(null)
            os.close(out)
            code = Arbiter(cfg, rdir, sdir, lock, cli_counts=counts, status_fd=w).run()
        finally:
            os._exit(code)
    os.close(w)
    os.waitpid(pid, 0)
    os.close(lock.fd)  # the daemon holds the lock now (same open file description)
    lock.fd = -1
    deadline = time.monotonic() + cfg.daemon.health.init_timeout_s + 30
    buf = b""
    while b"\n" not in buf and time.monotonic() < deadline:
        import select

        rl, _, _ = select.select([r], [], [], 0.5)
        if rl:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            buf += chunk
    os.close(r)
    line = buf.decode(errors="replace").strip()
    if line == "ready":
        try:
            snap = _command(rdir, "status").data
            d = snap["daemon"]
            print(f"brisvoxd started: pid {d['pid']}, {d['status']}")
            print(f"  runtime dir {d['runtime_dir']}, control {d['control']}")
            print(f"  metrics {d['metrics_url'] or 'disabled'}, logs {log_path}")
            from brisvox.cli.banner import lines

            print("\n".join(lines(snap, cfg, foreground=False)))
        except Exception:
            print(f"brisvoxd started; logs {log_path}")
        return exitcodes.OK
    if line.startswith("error "):
        _, code_s, msg = (line.split(" ", 2) + [""])[:3]
        code = int(code_s) if code_s.isdigit() else exitcodes.FAILURE
        _err(("configuration error: " if code == exitcodes.CONFIG else "") + f"{msg} (logs: {log_path})")
        return code
    _err(f"the daemon did not report ready in time; see {log_path}")
    return exitcodes.FAILURE


# -- talking to a running daemon ----------------------------------------------------------


def cmd_stop(args: argparse.Namespace) -> int:
    rdir = _runtime_dir(args)
    reply = _ask(rdir, "stop", exitcodes.OK)
    if isinstance(reply, int):
        return reply
    if _wait_gone(rdir, args.timeout):
        print("brisvoxd stopped")
        return exitcodes.OK
    _err(f"still stopping after {args.timeout:g}s")
    return exitcodes.FAILURE


def cmd_drain(args: argparse.Namespace) -> int:
    rdir = _runtime_dir(args)
    cargs = {"timeout_s": args.timeout} if args.timeout is not None else None
    reply = _ask(rdir, "drain", exitcodes.OK, cargs)
    if isinstance(reply, int):
        return reply
    timeout = float(reply.data.get("drain_timeout_s", 0)) if reply.data else 0.0
    print(f"draining (up to {timeout:g}s for live calls)")
    if args.no_wait:
        return exitcodes.OK
    if _wait_gone(rdir, timeout + 120):
        print("brisvoxd stopped")
        return exitcodes.OK
    _err("still draining")
    return exitcodes.FAILURE


def _fmt_uptime(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _fmt_mem(b: int | None) -> str:
    return "-" if b is None else f"{b / (1 << 20):.1f} MiB"


def _fmt_nofile(lim: dict[str, Any] | None) -> str:
    """``65536/65536`` (soft/hard RLIMIT_NOFILE), ``-`` when unknown."""
    return f"{lim['soft']}/{lim['hard']}" if lim else "-"


def render_status(snap: dict[str, Any]) -> str:
    d = snap["daemon"]
    lines = [
        f"brisvoxd pid {d['pid']}  {d['state']}  up {_fmt_uptime(d['uptime_s'])}  instance {d['instance']}"
        f"  calls {d['calls']}",
        f"runtime dir {d['runtime_dir']}  metrics {d['metrics_url'] or 'disabled'}  config {d['config'] or '(defaults)'}",
        f"file descriptors (soft/hard): supervisor {_fmt_nofile(d.get('nofile'))}; each child's: NOFILE",
        "",
    ]
    head = ("ROLE", "INDEX", "PID", "STATE", "UPTIME", "RESTARTS", "PSS", "CALLS", "NOFILE", "NOTE")
    rows = [head]
    for c in snap["children"]:
        note = c["error"] or (c["last_exit"] if c["state"] in ("exited", "failed") else "") or c.get("stop_reason", "")
        rows.append((c["role"], str(c["index"]), str(c["pid"] or "-"), c["state"],
                     _fmt_uptime(c["uptime_s"]) if c["state"] in ("starting", "ready", "stopping") else "-",
                     str(c["restarts"]), _fmt_mem(c["pss_bytes"]), str(c["calls"]), _fmt_nofile(c.get("nofile")),
                     note[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for r in rows:
        lines.append("  ".join(v.ljust(widths[i]) for i, v in enumerate(r)).rstrip())
    for c in snap["children"]:  # the gateway's [[sip.trunks]] registrations
        trunks = (c.get("stats") or {}).get("sip_trunks")
        if isinstance(trunks, dict):
            for name, t in sorted(trunks.items()):
                if isinstance(t, dict):
                    err = f"  last error: {str(t.get('error'))[:80]}" if t.get("error") else ""
                    lines.append(f"trunk {name}: {t.get('state')} with {t.get('registrar')}  expires in "
                                 f"{t.get('expires_in_s')}s  next REGISTER in {t.get('next_s')}s{err}")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    import json

    rdir = _runtime_dir(args)
    reply = _ask(rdir, "status", exitcodes.NOT_RUNNING)
    if isinstance(reply, int):
        return reply
    if args.json:
        print(json.dumps(reply.data, indent=2, sort_keys=True))
    else:
        print(render_status(reply.data))
    return exitcodes.OK


def cmd_reload(args: argparse.Namespace) -> int:
    rdir = _runtime_dir(args)
    reply = _ask(rdir, "reload", exitcodes.NOT_RUNNING)
    if isinstance(reply, int):
        return reply
    print((reply.data or {}).get("message", "reloaded"))
    return exitcodes.OK


def cmd_dial(args: argparse.Namespace) -> int:
    """An outbound call (SIP, or ``--via twilio``) through the running daemon's gateway (its inbox, gateway-0)."""
    from ipc.bus import endpoint

    rdir = _runtime_dir(args)
    if not _running_or_explain(rdir):
        return exitcodes.NOT_RUNNING
    via = getattr(args, "via", None) or "sip"
    ok, data, error = dial(endpoint(rdir, "gateway-0"), args.target, args.agent or "", args.ring_timeout or 0.0, via,
                           getattr(args, "trunk", None) or "", dict(getattr(args, "param", None) or ()))
    if args.json:
        import orjson

        print(orjson.dumps({"ok": ok, "error": error, **data}).decode())
    elif ok and via == "twilio":
        agent = f"agent {data['agent']}" if data.get("agent") else "the twilio route's agent"
        print(f"{data.get('status') or 'queued'}: Twilio call {data.get('call_sid')} to {data.get('target')} "
              f"({agent} runs it once answered)")
    elif ok:
        print(f"answered: call {data.get('call_id')} (agent {data.get('agent')}, {data.get('codec')})")
        print(f"  {dial_times(data)}")
    if not ok:
        _err(f"dial failed: {error}")
        return exitcodes.FAILURE
    return exitcodes.OK


def cmd_check(args: argparse.Namespace) -> int:
    """A daemon config (and every agent file it names), or one agent file.

    Besides the errors (exit 2), a daemon config gets the file-mode audit
    (:mod:`brisvox.config.audit`): one ``warning:`` line each, exit unchanged
    unless ``--strict`` (then 1 when there is any).
    """
    from brisvox.agent.definition import check_main, is_agent_file
    from brisvox.agent.host.config import check_referenced_agents
    from brisvox.config.audit import audit
    from brisvox.config.exposure import check_open_sip
    from brisvox.config.secrets import deferred
    from brisvox.daemon.nofile import check_line, would_get
    from brisvox.outbound.webhooks.config import check_webhooks
    from brisvox.runtime.paths import PathError, check_endpoint_lengths, runtime_dir

    if is_agent_file(args.file):
        return check_main(args.file)
    try:
        with deferred() as unresolved:  # offline: the service's env and credentials are not here
            cfg = load_config(args.file)
        check_endpoint_lengths(runtime_dir(cfg), cfg)
        open_sip = check_open_sip(cfg)  # the same refusal as brisvoxd start's
    except (ConfigError, PathError) as e:
        _err(f"configuration error: {e}")
        return exitcodes.CONFIG
    errors, warnings = check_referenced_agents(cfg)
    hook_errors, hook_warnings = check_webhooks(cfg)  # [[webhooks]]: https, public addresses (or allow_private)
    errors += hook_errors
    for line in [*warnings, *(f"warning: {w}" for w in hook_warnings)]:
        print(line)
    sip = cfg.section("sip")
    if sip.enabled:
        print(f"sip: {sip.host}:{sip.port} answers {', '.join(sip.allow) or 'no one'} (sip.allow)")
    audiosocket = cfg.section("audiosocket")
    if audiosocket.enabled:  # no authentication: the allow list is who can place calls
        print(f"audiosocket: {audiosocket.host}:{audiosocket.port} answers {', '.join(audiosocket.allow)} "
              "(audiosocket.allow)")
    low, nofile = check_line(would_get())
    print(f"{'warning: ' if low else ''}{nofile}")
    security = [*open_sip, *audit(cfg, args.file, unresolved)]
    for line in security:
        print(f"warning: {line}")
    if errors:
        for line in errors:
            _err(f"configuration error: {line}")
        return exitcodes.CONFIG
    names = ", ".join(["daemon", *sorted(cfg.sections)])
    if security and args.strict:
        _err(f"{args.file}: {len(security)} file-mode/secret warning(s) (--strict)")
        return exitcodes.FAILURE
    print(f"{args.file}: ok (workers {cfg.daemon.workers}, agents {cfg.daemon.agents}; sections: {names})")
    return exitcodes.OK


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="brisvoxd", description="brisvox daemon: supervisor of the gateway, "
                                "inference workers and agent processes")
    sub = p.add_subparsers(dest="command", required=True)

    def locate(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--config", help="config file (default: $BRISVOX_CONFIG, /etc/brisvox/brisvoxd.toml)")
        sp.add_argument("--runtime-dir", help="runtime dir of the daemon to talk to (default: from the config)")

    sp = sub.add_parser("start", help="start the daemon")
    sp.add_argument("--workers", type=int, help="inference workers (overrides daemon.workers)")
    sp.add_argument("--agents", type=int, help="agent processes (overrides daemon.agents)")
    sp.add_argument("--config", help="config file (default: $BRISVOX_CONFIG, /etc/brisvox/brisvoxd.toml)")
    sp.add_argument("--foreground", action="store_true", help="stay in the foreground (systemd, make run)")
    sp.set_defaults(func=cmd_start)

    sp = sub.add_parser("stop", help="stop the daemon (live calls are ended)")
    locate(sp)
    sp.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for the exit")
    sp.set_defaults(func=cmd_stop)

    sp = sub.add_parser("drain", help="stop admitting calls, let live ones finish, then stop")
    locate(sp)
    sp.add_argument("--timeout", type=float, help="seconds to wait for live calls (default: daemon.shutdown.drain_timeout_s)")
    sp.add_argument("--no-wait", action="store_true", help="return once the drain started")
    sp.set_defaults(func=cmd_drain)

    sp = sub.add_parser("status", help="show the daemon and its children")
    locate(sp)
    sp.add_argument("--json", action="store_true", help="machine-readable output")
    sp.set_defaults(func=cmd_status)

    sp = sub.add_parser("reload", help="re-read the config, retry failed children, rescale")
    locate(sp)
    sp.set_defaults(func=cmd_reload)

    sp = sub.add_parser("dial", help="place an outbound call: SIP (a sip: URI, or a number through [sip] trunk) "
                        "or --via twilio (Twilio's REST API)")
    locate(sp)
    from brisvox.cli.dial import add_dial_arguments

    add_dial_arguments(sp)
    sp.set_defaults(func=cmd_dial)

    from brisvox.cli.campaign import add_parser as add_campaign

    add_campaign(sub)

    sp = sub.add_parser("check", help="validate a daemon config (with the agent files it names) or an agent file, offline")
    sp.add_argument("file")
    sp.add_argument("--strict", action="store_true",
                    help="exit 1 on a secret others can read or a runtime/state/records dir with loose modes")
    sp.set_defaults(func=cmd_check)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:  # Ctrl-C before the supervisor's own handlers were installed
        return exitcodes.SIGNAL_BASE + 2


if __name__ == "__main__":
    sys.exit(main())
