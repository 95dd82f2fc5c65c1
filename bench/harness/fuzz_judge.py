"""Every judgment of the fuzz campaign (:mod:`bench.harness.fuzz`), as bench rows with a verdict.

:func:`judge` turns a finished :class:`bench.harness.fuzz.Fuzz` into a
:class:`bench.harness.chaos.judge.Report` (figure, value, unit, target, ok;
``ok`` None for the informational figures), in the order of the invariants
(i)-(vi) of :mod:`bench.harness.fuzz`, then the counters themselves.

Definitions:

* a *bad input* is a datagram or a WebSocket message or handshake the
  campaign sent that is not one of the protocol's valid messages (the
  generators' ``valid`` messages are not counted; every other kind is);
* a *kind* is a counter name (``sip_malformed_*``, ``sip_refused_*``,
  ``ws_refused_*``, ``ws_malformed_*``) that the campaign moved; the log
  budget is one line per kind plus one per 100 bad inputs;
* a *bad-input log line* is a line of the gateway written during the
  campaign at INFO or above; the call lifecycle lines of the agent process
  and the supervisor's are not (calls the campaign opened are calls);
* SIP intake: every datagram the gateway's socket received is counted once,
  as ``sip_requests_*``, ``sip_malformed_*`` (including
  ``sip_malformed_response``), ``sip_stray_responses`` or
  ``sip_refused_allowlist``; keep-alives (blank datagrams) are not counted;
  received = sent - the socket's kernel drops.

Invariants: judging reads only the campaign's data (no I/O); a missing datum
is a failed check, never an exception.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from bench.harness.chaos.judge import Report
from bench.harness.fuzz_ws import REFUSED

if TYPE_CHECKING:
    from bench.harness.fuzz import Fuzz

REFUSAL_OF = {400: "sip_refused_malformed", 513: "sip_refused_too_large",
              488: ("sip_refused_sdp", "sip_refused_media_address"),
              415: "sip_refused_media_type", 420: "sip_refused_extension", 482: "sip_refused_loop",
              -503: "sip_refused_rate_limit"}
WS_CLASS = {"400": ("ws_refused_handshake",), "401": ("ws_refused_auth", "ws_refused_token_expired",
                                                      "ws_refused_token_agent", "ws_refused_token_replay",
                                                      "ws_refused_token_ttl", "ws_refused_token_route"),
            "403": ("ws_refused_origin", "ws_refused_signature", "ws_refused_unconfigured"), "404": ("ws_refused_path", "ws_refused_agent"),
            "429": ("ws_refused_rate",), "503": ("ws_refused_connections", "ws_refused_token_table")}
KIND_PREFIXES = ("sip_malformed_", "sip_refused_", "ws_refused_", "ws_malformed_")
LOG_PER_BAD = 100


def delta(after: dict[str, Any], before: dict[str, Any], key: str) -> int:
    return int(after.get(key, 0) or 0) - int(before.get(key, 0) or 0)


def moved(after: dict[str, Any], before: dict[str, Any], prefix: str) -> dict[str, int]:
    return {k: delta(after, before, k) for k in sorted(after) if k.startswith(prefix) and delta(after, before, k)}


def _children(s: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {c["name"]: (c.get("pid"), c.get("restarts")) for c in s.get("children", [])}


def judge(fz: Fuzz, daemon_alive: bool) -> Report:
    rep = Report()
    b, a, m = fz.stats_before, fz.stats_after, fz.stats_main
    # (i) crashes and restarts
    before, after = _children(fz.status_before), _children(fz.status_after)
    changed = sorted(n for n in before if before[n] != after.get(n))
    rep.add("restarts", "processes crashed or restarted (pid or restart count changed)", len(changed), "",
            "0", daemon_alive and not changed and bool(before), ", ".join(changed))
    # (ii) the call table empties
    rep.add("drain", "gateway call count back to 0 after", round(fz.drain_s, 1) if fz.drain_s is not None else None,
            "s", "<= 35", fz.drain_s is not None and fz.drain_s <= 35.0)
    rep.add("calls_admitted", "calls the campaign's inputs opened (valid-looking starts, INVITEs)",
            delta(m, b, "calls_admitted"), "", "", None)
    # (iii) shared memory
    rep.add("segments", "/dev/shm segments of the instance left once idle", len(fz.segments), "", "0",
            not fz.segments, ", ".join(fz.segments[:5]))
    n_del = sum(len(v) for v in fz.deleted.values())
    rep.add("deleted_maps", "mappings of deleted segments", n_del, "", "0", n_del == 0, str(fz.deleted)[:200])
    # (iv) valid calls right after
    for name in ("sip", "twilio"):
        v = fz.valid.get(name) or {}
        ok = bool(v.get("answered")) and int(v.get("loud", 0)) >= 10
        rep.add(f"valid_{name}", f"valid {name.upper() if name == 'sip' else 'Twilio'} call after: answered, "
                f"echo frames", f"{'yes' if v.get('answered') else 'no'}, {v.get('loud', 0)}/{v.get('frames', 0)}",
                "", "yes, >= 10", ok, v.get("error", ""))
    # (v) bounded logs
    bad_sip = fz.sip.sent - fz.sip.by_kind.get("keepalive", 0)
    bad_ws = sum(1 for c in fz.ws.conns if c.plan.handshake.startswith("bad") or c.status not in (101,)) + \
        sum(sum(1 for k, _ in c.plan.frames[:c.sent] if k != "valid") for c in fz.ws.conns)
    bad = bad_sip + bad_ws
    kinds = {k for p in KIND_PREFIXES for k in moved(a, b, p)}
    gw_lines = [ln for ln in fz.log_lines if ln.get("role") == "gateway"
                and ln.get("level") in ("info", "warning", "error", "critical")]
    budget = len(kinds) + bad // LOG_PER_BAD
    rep.add("log_lines", "gateway log lines during the campaign (budget: kinds + bad/100)", len(gw_lines),
            "lines", f"<= {budget} ({len(kinds)} kinds, {bad} bad inputs)", len(gw_lines) <= budget,
            _top_lines(gw_lines))
    rep.add("log_lines_all", "all daemon log lines during the campaign", len(fz.log_lines), "lines", "", None,
            _top_lines(fz.log_lines))
    # (vi) counted: SIP
    s0, s1 = fz.stats_sip0, fz.stats_sip1
    intake = sum(moved(s1, s0, "sip_requests_").values()) + sum(moved(s1, s0, "sip_malformed_").values()) + \
        delta(s1, s0, "sip_stray_responses") + delta(s1, s0, "sip_refused_allowlist")
    want = fz.sip.sent - fz.sip.keepalives - fz.sip_drops
    rep.add("sip_intake", "SIP datagrams counted at intake / received by the gateway", f"{intake}/{want}", "",
            "equal", bool(s1) and intake == want, f"sent {fz.sip.sent}, keep-alives {fz.sip.keepalives}, "
            f"kernel drops {fz.sip_drops}")
    codes = fuzz_codes(fz)
    def counted(code: int) -> int:
        keys = REFUSAL_OF[code]
        return sum(delta(m, b, k) for k in ((keys,) if isinstance(keys, str) else keys))

    over = {c: (n, counted(c)) for c, n in codes.items() if c in REFUSAL_OF and n > counted(c)}
    rep.add("sip_refusals", "SIP refusal answers received beyond their counter", len(over), "kinds", "0",
            not over, f"answers {dict(sorted(codes.items()))}; {over}")
    rate_main = delta(m, b, "sip_refused_rate_limit")
    rep.add("sip_rate_main", "campaign datagrams refused by the rate limit (default limits, 249 sources)",
            rate_main, "", f"< {max(1, fz.sip.sent // 100)} (1%)", rate_main < max(1, fz.sip.sent // 100))
    rep.add("sip_outside", "datagrams from outside [sip] allow, counted", delta(m, b, "sip_refused_allowlist"), "",
            str(fz.sip.outside), delta(m, b, "sip_refused_allowlist") == fz.sip.outside)
    # (vi) counted: WebSocket
    seen = {"400": 0, "401": 0, "403": 0, "404": 0, "429": 0, "503": 0}
    for c in fz.ws.conns:  # the library answers no upgrade 426, and closes on what is not HTTP at all
        lib = c.status == 426 or (c.status <= 0 and c.plan.handshake in REFUSED)
        k = "400" if lib else str(c.status)
        if k in seen:
            seen[k] += 1
    diff = {k: (n, sum(delta(m, b, c) for c in WS_CLASS[k])) for k, n in seen.items()
            if n != sum(delta(m, b, c) for c in WS_CLASS[k])}
    rep.add("ws_refusals", "HTTP refusal classes whose count differs from their ws_refused_* counters", len(diff),
            "classes", "0", not diff, f"seen {seen}; {diff}; unanswered: "
            + "; ".join(f"{c.plan.handshake} {c.plan.request[:40]!r}: {c.error[:40]}"
                        for c in fz.ws.conns if c.status <= 0)[:1200])
    malformed = sum(moved(m, b, "ws_malformed_").values())
    lo = fz.ws.native_errors()
    hi = fz.ws.messages + sum(1 for c in fz.ws.conns if c.status == 101)
    rep.add("ws_malformed", "ws_malformed_* sum within [native error answers, messages delivered]",
            f"{lo} <= {malformed} <= {hi}", "", "holds", lo <= malformed <= hi)
    rep.add("sip_tx_full", "campaign requests refused because the transaction table was full",
            delta(m, b, "sip_refused_tx_table_full"), "", "0", delta(m, b, "sip_refused_tx_table_full") == 0)
    internal = delta(a, b, "sip_internal_errors") + delta(a, b, "ws_session_errors")
    rep.add("internal", "internal errors (sip_internal_errors + ws_session_errors)", internal, "", "0",
            internal == 0)
    # the default limits engage (limits phase)
    lim = fz.limits
    lc = lim.get("sip_codes", {})
    sip_lim = delta(a, m, "sip_refused_rate_limit")
    rep.add("limits_sip", "limits phase: SIP 503 Rate Limited received / counted", f"{lc.get(-503, 0)}/{sip_lim}",
            "", "> 0, equal", lc.get(-503, 0) > 0 and lc.get(-503, 0) == sip_lim, f"answers {lc}")
    ws_st = lim.get("ws_statuses", {})
    ws_lim = delta(a, m, "ws_refused_rate")
    rep.add("limits_ws", "limits phase: WebSocket 429 received / counted", f"{ws_st.get(429, 0)}/{ws_lim}", "",
            "> 0, equal", ws_st.get(429, 0) > 0 and ws_st.get(429, 0) == ws_lim, f"statuses {ws_st}")
    # informational
    rep.add("sip_sent", "SIP datagrams sent", fz.sip.sent, "", str(fz.n_sip), None,
            str(dict(sorted(fz.sip.by_kind.items()))))
    rep.add("ws_messages", "WebSocket messages sent / connections", f"{fz.ws.messages}/{len(fz.ws.conns)}", "",
            f"{fz.n_ws}/{fz.n_conns} planned", None, f"statuses {fz.ws.statuses()}")
    v = fz.victim
    rep.add("victim", "the live call during the SIP phase: answered, echo frames, its end",
            f"{'yes' if v.get('answered') else 'no'}, {v.get('loud', 0)}, {v.get('ended') or '-'}", "", "", None)
    for prefix in KIND_PREFIXES:
        rep.add(f"counters_{prefix}", f"counters {prefix}*", sum(moved(a, b, prefix).values()), "", "", None,
                str(moved(a, b, prefix)))
    rep.add("timings", "timings", round(fz.timings.get("total_s", 0.0), 1), "s", "", None,
            str({k: round(x, 1) for k, x in fz.timings.items()}))
    return rep


def fuzz_codes(fz: Fuzz) -> dict[int, int]:
    from bench.harness.fuzz_sip import replies

    return replies(fz.sip.replies)


def _top_lines(lines: list[dict[str, Any]], n: int = 6) -> str:
    by: dict[str, int] = {}
    for ln in lines:
        key = f"{ln.get('role')}/{ln.get('logger')}: {str(ln.get('msg'))[:50]}"
        by[key] = by.get(key, 0) + 1
    top = sorted(by.items(), key=lambda kv: -kv[1])[:n]
    return "; ".join(f"{v}x {k}" for k, v in top)
