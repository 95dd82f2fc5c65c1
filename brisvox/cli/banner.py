"""The "where to call" banner ``brisvoxd start`` prints once the daemon is ready.

Owns what an operator is told at start: the WebSocket URLs of every route
(Twilio Media Streams, Plivo Audio Streams, native), the SIP URI of the default agent and of
each configured SIP user, the agent "default" runs, and how to stop. The
addresses are the gateway's BOUND endpoints from the supervisor's status
(so port 0 shows the port actually picked), not the configured ones.

In the foreground (``make run``) the banner comes from a small helper process
forked before the supervisor starts (:func:`fork_reporter`; no thread may
run in the supervisor, which forks): it waits on the supervisor's status pipe
for "ready", asks the command plane for the status, prints the banner to
stdout and exits (the supervisor reaps it like any unknown child). A boot
that fails closes the pipe and the helper exits silently; the supervisor
reports the failure itself.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

STATUS_TIMEOUT_S = 5.0
# what a route's protocol is called in the banner (another: "<name> protocol")
ROUTE_KINDS = {"twilio": "Twilio Media Streams", "plivo": "Plivo Audio Streams",
               "telnyx": "Telnyx Media Streaming", "vonage": "Vonage Voice WebSocket",
               "exotel": "Exotel Voicebot stream", "asterisk_ws": "Asterisk chan_websocket",
               "freeswitch": "FreeSWITCH mod_audio_stream",
               "native": "native protocol"}


def lines(snap: dict[str, Any], cfg: Any, foreground: bool) -> list[str]:
    """The banner for a status snapshot ``snap`` of the daemon running ``cfg``."""
    gw = next((c for c in snap.get("children", []) if c.get("role") == "gateway"), None)
    eps = (gw or {}).get("endpoints") or {}
    out = ["", "brisvoxd is ready. Call it:"]
    agents = cfg.section("agents")
    default = agents.default_agent if agents.providers == "definitions" else "scripted test providers"
    rows: list[tuple[str, str]] = []
    ws = eps.get("websocket")
    first = ""
    if ws:
        for r in cfg.section("websocket").routes:
            first = first or f"ws://{ws}{r.path}"
            name = default if r.agent == "default" else r.agent
            kind = ROUTE_KINDS.get(r.protocol, f"{r.protocol} protocol")
            extra = f" (or {r.path}/<{'|'.join(r.agents)}>)" if r.agents else ""
            rows.append((f"ws://{ws}{r.path}", f"{kind}, agent {name}{extra}"))
    sip = eps.get("sip")
    if sip:
        scfg = cfg.section("sip")
        name = default if scfg.default_agent == "default" else scfg.default_agent
        rows.append((f"sip:agent@{sip}", f"SIP/UDP, agent {name}"))
        for user, agent in sorted(scfg.user_agents.items()):
            rows.append((f"sip:{user}@{sip}", f"SIP/UDP, agent {agent}"))
    width = max((len(a) for a, _ in rows), default=0)
    out += [f"  {a:<{width}}  {d}" for a, d in rows]
    if not ws and not sip:
        out.append("  (no WebSocket or SIP listener is enabled in the config)")
    if first:
        out.append(f'Try it: brisvox call {first} --say "What time do you close tonight?"')
    if foreground:
        out.append("Stop: Ctrl-C here, or `brisvoxd stop` from another shell (add --config if you gave one).")
    else:
        out.append("Stop: `brisvoxd stop` (add --config if you gave one).")
    out.append("")
    return out


def print_banner(rdir: Path, cfg: Any, foreground: bool, out: Any = None) -> bool:
    """Ask the running daemon for its status and print the banner; False if it did not answer."""
    from ipc.bus import endpoint, request_sync
    from ipc.frames import Command

    try:
        reply = request_sync(endpoint(rdir, "control"), Command(name="status"), STATUS_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - a banner is best effort
        return False
    snap = getattr(reply, "data", None)
    if not isinstance(snap, dict):
        return False
    stream = out or sys.stdout
    text = "\n".join(lines(snap, cfg, foreground))
    if not stream.isatty():
        # not a terminal (systemd, a log file): one JSON line like every other log line
        import orjson

        text = orjson.dumps({"level": "info", "role": "supervisor", "name": "banner", "pid": os.getpid(),
                             "logger": "brisvox.banner", "msg": text.strip()}).decode()
    print(text, file=stream, flush=True)
    return True


def fork_reporter(rdir: Path, cfg: Any) -> int:
    """Fork the banner helper; returns the pipe's write end for the supervisor's
    ``status_fd`` (-1 when the fork failed: no banner, the daemon runs anyway)."""
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        return -1
    if pid:
        os.close(r)
        return w
    code = 0
    try:  # the helper: no zmq context exists yet in this process (fork safety)
        os.close(w)
        os.closerange(3, r)  # the pid lock and anything else the supervisor holds
        os.closerange(r + 1, 1024)
        buf = b""
        while b"\n" not in buf:
            chunk = os.read(r, 4096)
            if not chunk:
                break
            buf += chunk
        if buf.startswith(b"ready"):
            print_banner(rdir, cfg, foreground=True)
    except BaseException:  # noqa: BLE001 - never let the helper run the supervisor's code
        code = 1
    finally:
        os._exit(code)
