"""``brisvox call``: place one call to a brisvox daemon (or any compatible server) and report it.

Owns the subcommand's arguments and its flow: prepare the caller's lines
(``--say`` text spoken by the local Piper voice or espeak-ng, ``--play`` WAV
files, ``--press`` DTMF digits, in the order given), place the call over the
native WebSocket protocol, Twilio Media Streams, Telnyx, Plivo, Vonage, Exotel or SIP, run it
(:mod:`brisvox.client.runner`), write the bot's audio as heard
(``--record``), transcribe each answer locally with Whisper tiny.en, print
one block per turn (:mod:`brisvox.client.report`) and optionally the JSON
result (``--json``).

Exit codes: 0 every step ran and every line was answered; 1 the call could
not be placed; 3 the call ran but some line got no answer, or the far end
hung up before every step ran.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DEFAULT_TARGET = "ws://127.0.0.1:8765/ws"
DEFAULT_LINE = "Hello! What can you do for me?"


def _step(kind: str) -> Callable[[str], tuple[str, str]]:
    def conv(v: str) -> tuple[str, str]:
        return kind, v

    return conv


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "call", help="place a test call (WebSocket or SIP) and print what was said and how fast",
        description="Place one call, speak lines as the caller, record and transcribe the bot, print per turn "
                    "the caller's line, the bot's answer and the latency (caller stopped -> first bot audio).")
    p.add_argument("target", nargs="?", default=DEFAULT_TARGET,
                   help=f"ws://host:port/path (native /ws, Twilio /twilio, Plivo /plivo, Telnyx /telnyx, "
                        f"Vonage /vonage, Exotel /exotel) or "
                        f"sip:user@host:port "
                        f"(default {DEFAULT_TARGET})")
    p.add_argument("--protocol", choices=("auto", "native", "twilio", "plivo", "telnyx", "vonage", "exotel", "sip"),
                   default="auto", help="default: sip for sip: targets, twilio (plivo, telnyx, vonage, exotel) "
                                        "when the path has /twilio (/plivo, /telnyx, /vonage, /exotel), else native")
    p.add_argument("--agent", default="", help="agent definition to talk to (WebSocket: appended to the path; "
                                               "SIP: the request-URI user)")
    p.add_argument("--say", dest="steps", action="append", type=_step("say"), metavar="TEXT",
                   help="a line the caller speaks (synthesized locally; repeatable, in order)")
    p.add_argument("--play", dest="steps", action="append", type=_step("play"), metavar="WAV",
                   help="a recorded line the caller plays (repeatable, in order with --say)")
    p.add_argument("--press", dest="steps", action="append", type=_step("press"), metavar="DIGITS",
                   help="press DTMF digits as a caller step (repeatable, in order)")
    p.add_argument("--barge-in", type=float, default=None, metavar="SECONDS",
                   help="talk over the bot: start the next line this long after the first audio of the answer "
                        "(or, if the bot is pausing then, when it talks again)")
    p.add_argument("--barge-turn", type=int, default=1, metavar="N",
                   help="barge in on the answer to step N (default 1)")
    p.add_argument("--record", default="", metavar="WAV", help="write the bot's audio as the caller heard it")
    p.add_argument("--json", default="", metavar="PATH", help="write the result as JSON ('-' = stdout)")
    p.add_argument("--rate", type=int, default=16000,
                   help="native protocol: audio rate; Vonage: 8000 or 16000; Exotel: 8000, 16000 "
                        "or 24000 (default 16000)")
    p.add_argument("--voice", choices=("auto", "piper", "espeak"), default="auto",
                   help="voice for --say (auto: Piper if installed, else espeak-ng)")
    p.add_argument("--no-transcribe", action="store_true", help="do not transcribe the bot's audio")
    p.add_argument("--lead-in", type=float, default=1.0, metavar="S", help="silence before the first line")
    p.add_argument("--wait", type=float, default=20.0, metavar="S", help="longest wait for an answer")
    p.add_argument("--answer-gap", type=float, default=1.5, metavar="S", help="bot silence that ends an answer")
    p.add_argument("--pause", type=float, default=0.5, metavar="S", help="caller pause after an answer")
    p.add_argument("--max-duration", type=float, default=300.0, metavar="S", help="hang up after this long")
    p.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="custom parameter passed to the agent (WebSocket protocols)")
    p.add_argument("--token", default="", help="native, Telnyx, Vonage and Exotel: the gateway's native_secret, "
                   "or a signed token for the agent (brisvox token); sent as Authorization: Bearer (Telnyx: as the "
                   "x-telnyx-streaming-auth-token header; Exotel: as the password of Authorization: Basic)")
    p.add_argument("--events", action="store_true",
                   help="native protocol: ask for the call's events and print them as they come (what the agent "
                   "heard, what it said, each turn's latencies, tool calls); --json keeps them under \"events\"")
    p.add_argument("--models-dir", default=None, help="where the local models are (default: brisvox models)")
    p.set_defaults(run=run)


def resolve(target: str, protocol: str, agent: str) -> tuple[str, str]:
    """(protocol, address) for the transport: the URL with the agent appended, or the SIP target."""
    if protocol == "auto":
        if target.startswith(("sip:", "sips:")):
            protocol = "sip"
        elif "/twilio" in urlsplit(target).path:
            protocol = "twilio"
        elif "/plivo" in urlsplit(target).path:
            protocol = "plivo"
        elif "/telnyx" in urlsplit(target).path:
            protocol = "telnyx"
        elif "/vonage" in urlsplit(target).path:
            protocol = "vonage"
        elif "/exotel" in urlsplit(target).path:
            protocol = "exotel"
        else:
            protocol = "native"
    if protocol == "sip":
        return protocol, target
    u = urlsplit(target if "://" in target else f"ws://{target}")
    path = u.path or ("/ws" if protocol == "native" else f"/{protocol}")
    if agent:
        path = path.rstrip("/") + "/" + agent
    return protocol, urlunsplit((u.scheme or "ws", u.netloc, path, u.query, ""))


def _transport(protocol: str, address: str, args: argparse.Namespace) -> Any:
    params = dict(kv.split("=", 1) for kv in args.param if "=" in kv)
    if protocol == "sip":
        from brisvox.client.sip import SipTransport

        return SipTransport(address, args.agent)
    if protocol == "twilio":
        from brisvox.client.twilio import TwilioTransport

        return TwilioTransport(address, params)
    if protocol == "plivo":  # mu-law 8 kHz, as <Stream contentType="audio/x-mulaw;rate=8000">
        from brisvox.client.plivo import PlivoTransport

        return PlivoTransport(address, params)
    if protocol == "telnyx":  # PCMU 8 kHz; --token as Telnyx sends its stream_auth_token
        from brisvox.client.telnyx import TelnyxTransport

        return TelnyxTransport(address, params, token=args.token)
    if protocol == "vonage":  # L16 at --rate (8000 or 16000); --token as the endpoint's authorization sends it
        from brisvox.client.vonage import VonageTransport

        return VonageTransport(address, params, rate=args.rate, token=args.token)
    if protocol == "exotel":  # L16 at --rate (8000, 16000, 24000); --token as the applet URL's Basic password
        from brisvox.client.exotel import ExotelTransport

        return ExotelTransport(address, params, rate=args.rate, token=args.token)
    from brisvox.client.native import NativeTransport

    return NativeTransport(address, rate=args.rate, params=params, token=args.token, events=args.events,
                           on_event=_print_event if args.events else None)


def event_line(ev: dict[str, Any]) -> str:
    """One call event as ``brisvox call --events`` prints it."""
    name = ev.get("name")
    if name in ("user_turn", "bot_turn"):
        return f"  [{'caller' if name == 'user_turn' else 'bot'}, turn {ev.get('epoch')}] {ev.get('text', '')}"
    if name == "turn_metrics":
        def ms(key: str) -> str:
            v = ev.get(key)
            return "-" if v is None else f"{float(v):.0f} ms"
        return (f"  [turn {ev.get('epoch')}] voice to voice {ms('voice_to_voice_ms')}, end of turn "
                f"{ms('end_of_turn_ms')}, LLM first token {ms('llm_first_token_ms')}, TTS first audio "
                f"{ms('tts_first_audio_ms')}")
    if name == "tool_call":
        return f"  [tool, turn {ev.get('epoch')}] {ev.get('tool')} -> {ev.get('outcome')}"
    return f"  [{name}]"


def _print_event(ev: dict[str, Any]) -> None:
    print(event_line(ev), file=sys.stderr, flush=True)


def _lines(args: argparse.Namespace, rate: int) -> tuple[list[Any], str]:
    from brisvox.client.script import Step
    from brisvox.client.speech import Voice, make_line, read_wav

    steps_in = args.steps or [("say", DEFAULT_LINE)]
    voice = Voice(args.voice, args.models_dir)
    steps = []
    try:
        for kind, v in steps_in:
            if kind == "say":
                steps.append(Step(line=make_line(v, voice.synthesize(v, rate), rate, text=v)))
            elif kind == "play":
                steps.append(Step(line=make_line(Path(v).name, read_wav(v, rate), rate)))
            else:
                digits = "".join(d for d in v.upper() if d in "0123456789*#ABCD")
                if not digits:
                    raise ValueError(f"--press {v!r}: no DTMF digit (0-9 * # A-D)")
                steps.append(Step(digits=digits))
    finally:
        voice.close()
    return steps, voice.used


def run(args: argparse.Namespace) -> int:
    from brisvox.client import report
    from brisvox.client.recorder import PlayoutRecorder
    from brisvox.client.runner import run_call
    from brisvox.client.script import CallerScript, ScriptTiming
    from brisvox.client.speech import SpeechError, write_wav
    from brisvox.client.transport import TransportError

    protocol, address = resolve(args.target, args.protocol, args.agent)
    if args.events and protocol != "native":
        print(f"brisvox call: --events needs the native protocol (not {protocol})", file=sys.stderr)
        return 1
    try:
        transport = _transport(protocol, address, args)
    except ValueError as e:  # an option the protocol cannot take (Vonage, Exotel: --rate)
        print(f"brisvox call: {e}", file=sys.stderr)
        return 1
    rate = transport.rate
    try:
        steps, voice_used = _lines(args, rate)
    except (SpeechError, ValueError) as e:
        print(f"brisvox call: {e}", file=sys.stderr)
        return 1
    timing = ScriptTiming(lead_in=args.lead_in, answer_wait=args.wait, answer_gap=args.answer_gap,
                          pause=args.pause, barge_in=args.barge_in, barge_turn=args.barge_turn)
    try:
        script = CallerScript(steps, rate, timing)
    except ValueError as e:
        print(f"brisvox call: {e}", file=sys.stderr)
        return 1
    recorder = PlayoutRecorder(rate)
    print(f"calling {address} ({protocol})...", file=sys.stderr, flush=True)
    try:
        st = asyncio.run(run_call(transport, script, recorder, max_s=args.max_duration))
    except (TransportError, OSError, TimeoutError) as e:
        print(f"brisvox call: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the runner hung up (stop / BYE) on its way out
        print("brisvox call: interrupted", file=sys.stderr)
        return 130
    t_end = script.t_end or time.monotonic()
    if args.record:
        write_wav(args.record, recorder.track(until=t_end), rate)
    turns = _transcribed(args, script, recorder, steps, rate)
    stats = {"ticks": st.ticks, "late_ticks": st.late_ticks, "audio_frames_in": st.audio_frames_in,
             "audio_s_in": round(st.audio_s_in, 2), "clears": st.clears, "timed_out": st.timed_out,
             "unattributed_s": round(script.unattributed_s, 2), "recording_cut_s": round(recorder.cut_samples / rate, 3),
             "voice": voice_used, **getattr(transport, "counters", {})}
    res = report.result(protocol=protocol, target=address, call_id=transport.call_id, ids=dict(transport.ids),
                        end_reason=script.end_reason, duration_s=t_end - st.t0, recording=args.record,
                        turns=turns, bot_dtmf=[d for _, d in script.bot_digits], stats=stats,
                        t0_monotonic=script.t_start)
    if args.events:
        res["events"] = list(getattr(transport, "call_events", []))
    print(report.render(res), flush=True)
    if args.json:
        import orjson

        data = orjson.dumps(res, option=orjson.OPT_INDENT_2)
        if args.json == "-":
            sys.stdout.write(data.decode() + "\n")
        else:
            Path(args.json).write_bytes(data + b"\n")
    unanswered = any(t["unanswered"] for t in turns if t["kind"] == "line")
    incomplete = sum(1 for t in turns if t["kind"] != "greeting") < len(steps)
    return 3 if unanswered or incomplete else 0


def _transcribed(args: argparse.Namespace, script: Any, recorder: Any, steps: list[Any],
                 rate: int) -> list[dict[str, Any]]:
    from brisvox.client import report
    from brisvox.client.transcribe import TranscribeError, Transcriber

    tr: Transcriber | None = None if args.no_transcribe else Transcriber(args.models_dir)

    def text(samples: Any) -> str:
        nonlocal tr
        if tr is None:
            return ""
        try:
            return tr.text(samples, rate)
        except TranscribeError as e:
            print(f"brisvox call: not transcribed: {e}", file=sys.stderr)
            tr = None
            return ""

    rows = []
    for t in script.turns:
        caller = ""
        bot = ""
        if t.kind == "line":
            line = steps[t.index - 1].line
            caller = line.text or text(line.samples)
        if t.t_first_audio is not None:
            end = t.bot_stopped if t.barged and t.bot_stopped is not None else t.t_last_audio
            if end is not None and end > t.t_first_audio:
                bot = text(recorder.segment(t.t_first_audio - 0.1, end + 0.1))
        rows.append(report.turn_row(t, script.t_start, caller, bot))
    return rows
