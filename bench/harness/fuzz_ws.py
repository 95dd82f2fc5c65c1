"""The WebSocket half of the fuzz campaign: raw connections with mutated handshakes and frames.

:func:`plans` builds one :class:`Plan` per connection from a seeded
``random.Random``: a handshake (:data:`HANDSHAKES`: good ones for Twilio --
signed -- and native -- the static secret or a signed token --, at the bare
route or ``/<route>/echo``; a bad path, an agent the route does not list, a
foreign Origin, a missing / wrong / expired / other-agent token, a missing
or bad Twilio signature, and requests the library refuses: not HTTP, no
Upgrade, a bad key or version) and, for the good ones, ``per_conn``
messages: the protocol's valid messages (Twilio ``connected``, ``start``,
``media``, ``mark``, ``dtmf``, ``stop``; native ``start``, PCM16 frames,
``mark``, ``dtmf``, ``stop``), the same with values replaced or removed
(:func:`bench.harness.mutations.mutate_json`) or bytes edited, bad base64
and over-long media, unknown events, binary frames on Twilio and odd-length
ones on native, invalid UTF-8, fragmented messages, pings and pongs, and
frames that end the connection (:data:`TERMINAL`: a control frame over 125
bytes or fragmented, a bad close code, reserved bits, an unknown opcode, an
unmasked frame, a continuation without a start, a frame over
``max_message_bytes``). The connection ends with a close, an abort or a
half-close.

:func:`run` opens the connections (``concurrency`` at a time, each from one
of :data:`SOURCES`), writes every frame the server lets it (it stops at the
server's close), reads what comes back (HTTP status, native ``error`` codes,
the close code) and returns a :class:`WsResult`.

Invariants: every connection is closed (or aborted) when its task ends;
each await is bounded (:data:`IO_TIMEOUT_S`); a connection's failure is
recorded in the result, never raised into the others; the whole run stops
starting connections at ``deadline``.
"""

from __future__ import annotations

import asyncio
import base64
import random
import struct
import time
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.frames import apply_mask

from bench.harness.mutations import RandomPicker, mutate_bytes, mutate_json
from brisvox.gateway.ws.auth import mint_token
from brisvox.wire import native, twilio

SOURCES = [f"127.0.0.{i}" for i in range(2, 251)]
SECRET = "fuzz-native-secret"
TOKEN = "fuzz-twilio-token"
PUBLIC_URL = "wss://fuzz.example"
ORIGIN = "https://app.example.com"
IO_TIMEOUT_S = 3.0
MAX_MESSAGE = 65536  # the campaign's [websocket] max_message_bytes
# handshake kind -> weight; "ok_*" are let in, the rest refused with the status in REFUSED
HANDSHAKES = {"ok_twilio": 30, "ok_twilio_echo": 8, "ok_native": 22, "ok_native_token": 8, "ok_native_echo": 8,
              "bad_path": 3, "bad_agent": 3, "bad_origin": 3, "no_token": 2, "bad_token": 2, "expired_token": 2,
              "other_agent_token": 2, "no_signature": 2, "bad_signature": 2, "not_http": 1, "no_upgrade": 1,
              "bad_key": 1}
REFUSED = {"bad_path": 404, "bad_agent": 404, "bad_origin": 403, "no_token": 401, "bad_token": 401,
           "expired_token": 401, "other_agent_token": 401, "no_signature": 403, "bad_signature": 403,
           "not_http": 400, "no_upgrade": 426, "bad_key": 400}
TERMINAL = ("ping_long", "ping_fragmented", "close_bad_code", "close_bad_utf8", "rsv1", "opcode_3", "opcode_b",
            "unmasked", "cont_first", "interleaved", "oversized")


def frame(payload: bytes, opcode: int, rng: random.Random, fin: bool = True, rsv: int = 0,
          masked: bool = True, length: int | None = None) -> bytes:
    """One client frame (masked unless told otherwise); ``length`` overrides the declared length."""
    n = len(payload) if length is None else length
    b0 = (0x80 if fin else 0) | (rsv << 4) | opcode
    m = 0x80 if masked else 0
    if n < 126:
        head = struct.pack("!BB", b0, m | n)
    elif n < 65536:
        head = struct.pack("!BBH", b0, m | 126, n)
    else:
        head = struct.pack("!BBQ", b0, m | 127, n)
    if not masked:
        return head + payload
    key = rng.randbytes(4)
    return head + key + apply_mask(payload, key)


def text(s: str | bytes, rng: random.Random) -> bytes:
    return frame(s.encode() if isinstance(s, str) else s, 1, rng)


@dataclass
class Plan:
    idx: int
    protocol: str  # twilio | native
    handshake: str
    src: str
    request: bytes
    frames: list[tuple[str, bytes]] = field(default_factory=list)  # (kind, wire bytes)
    ending: str = "close"  # close | abort | half


class _Gen:
    def __init__(self, rng: random.Random, host: str) -> None:
        self.r = rng
        self.p = RandomPicker(rng)
        self.host = host

    def request(self, kind: str, protocol: str, idx: int) -> bytes:
        r = self.r
        route = "/twilio" if protocol == "twilio" else "/ws"
        path, headers = route, []
        key = base64.b64encode(r.randbytes(16)).decode()
        if kind.endswith("_echo"):
            path = route + "/echo"
        if kind == "bad_path":
            path = r.choice(["/", "/nope", "/twilio2", "/ws/../twilio", "/ws/a b", "/%00", "/ws/" + "x" * 300])
        elif kind == "bad_agent":
            path = route + "/" + r.choice(["sales", "default2", "root", "agent"])
        elif kind == "bad_origin":
            headers.append(("Origin", r.choice(["https://evil.example", "null", "http://app.example.com",
                                                "https://app.example.com.evil"])))
        if protocol == "native" and kind not in ("no_token",):
            cred = {"bad_token": "not-the-secret", "expired_token": mint_token(SECRET, "default", 60,
                                                                              now=time.time() - 120),
                    "other_agent_token": mint_token(SECRET, "echo" if not path.endswith("/echo") else "default"),
                    "ok_native_token": mint_token(SECRET, "echo" if path.endswith("/echo") else "default", 300,
                                                  {"fuzz": str(idx)})}.get(kind, SECRET)
            if r.random() < 0.5:
                path += f"?token={cred}"
            else:
                headers.append(("Authorization", f"Bearer {cred}"))
        if protocol == "twilio" and kind != "no_signature":
            sig = "bm90IGEgc2lnbmF0dXJl" if kind == "bad_signature" else twilio.signature(TOKEN, PUBLIC_URL + path)
            headers.append(("X-Twilio-Signature", sig))
        if kind == "not_http":
            return r.choice([b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + r.randbytes(40) + b"\r\n\r\n",
                             b"HELLO\r\n\r\n", b"GET\r\n\r\n", r.randbytes(64) + b"\r\n\r\n"])
        lines = [f"GET {path} HTTP/1.1", f"Host: {self.host}"]
        if kind != "no_upgrade":
            lines += ["Upgrade: websocket", "Connection: Upgrade"]
        lines.append(f"Sec-WebSocket-Key: {'short==' if kind == 'bad_key' else key}")
        lines.append("Sec-WebSocket-Version: 13")
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def valid_twilio(self, st: twilio.TwilioStream, slot: int) -> str:
        r = self.r
        if slot == 0:
            return st.connected()
        if slot == 1:
            return st.start({"fuzz": str(r.randint(0, 99)), "lang": r.choice(["fr", "en", "日本"])})
        k = r.random()
        if k < 0.75:
            return st.media(base64.b64encode(r.randbytes(160)).decode())
        if k < 0.85:
            return st.mark(f"m{r.randint(0, 9)}")
        if k < 0.99:
            return st.dtmf(r.choice("0123456789*#"))
        return st.stop()

    def valid_native(self, slot: int) -> str | bytes:
        r = self.r
        if slot == 0:
            return native.NativeStream(r.choice((8000, 16000, 16000, 24000)), {"fuzz": "1"},
                                       marks=r.choice((None, "echo", "release"))).start()
        k = r.random()
        if k < 0.75:
            return r.randbytes(2 * r.choice((80, 160, 320)))
        if k < 0.85:
            return native.NativeStream.mark(f"m{r.randint(0, 9)}")
        if k < 0.99:
            return native.NativeStream.dtmf(r.choice("0123456789*#"), r.choice((None, 80, 120)))
        return native.NativeStream.stop()

    def odd(self, protocol: str, valid: str | bytes) -> tuple[str, bytes]:
        r = self.r
        k = r.choice(["binary", "bad_utf8", "fragmented", "ping", "pong", "unknown_event", "bad_base64",
                      "long_media", "empty", "not_object", "odd_binary"])
        raw = valid.encode() if isinstance(valid, str) else valid
        if k == "binary" or (k == "odd_binary" and protocol == "twilio"):
            return k, frame(r.randbytes(r.randint(0, 400)), 2, r)
        if k == "odd_binary":
            return k, frame(r.randbytes(2 * r.randint(0, 100) + 1), 2, r)
        if k == "bad_utf8":
            return k, text(b'{"event":"' + r.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88"])
                           + b'"}', r)
        if k == "fragmented":
            cut = sorted(r.sample(range(1, max(2, len(raw))), min(len(raw) - 1, r.randint(1, 3)))) \
                if len(raw) > 2 else []
            parts = [raw[a:b] for a, b in zip([0, *cut], [*cut, len(raw)], strict=True)]
            op = 1 if isinstance(valid, str) else 2
            return k, b"".join(frame(part, op if i == 0 else 0, r, fin=i == len(parts) - 1)
                               for i, part in enumerate(parts))
        if k == "ping":
            return k, frame(r.randbytes(r.randint(0, 125)), 9, r)
        if k == "pong":
            return k, frame(r.randbytes(r.randint(0, 20)), 10, r)
        if k == "unknown_event":
            return k, text(orjson.dumps({"event": r.choice(["hello", "Media", "", "x" * 200]), "n": 1}), r)
        if k == "bad_base64":
            pay = r.choice(["!!!!", "abc", "////w=", "=" * 8, "\u00e9t\u00e9", "AAAA" * 3 + "A"])
            msg = {"event": "media", "streamSid": "MZfuzz", "media": {"payload": pay}} if protocol == "twilio" \
                else {"event": "dtmf", "digit": pay}
            return k, text(orjson.dumps(msg), r)
        if k == "long_media":
            b64 = base64.b64encode(r.randbytes(8001 + r.randint(0, 4000))).decode()
            return k, text(orjson.dumps({"event": "media", "streamSid": "MZfuzz", "media": {"payload": b64}}), r)
        if k == "empty":
            return k, text(b"", r)
        if k == "not_object":
            return k, text(r.choice([b"[1,2]", b'"start"', b"null", b"42", b"true"]), r)
        return k, text(raw, r)

    def terminal(self) -> tuple[str, bytes]:
        r = self.r
        k = r.choice(TERMINAL)
        data = {
            "ping_long": lambda: frame(r.randbytes(126 + r.randint(0, 200)), 9, r),
            "ping_fragmented": lambda: frame(b"x", 9, r, fin=False),
            "close_bad_code": lambda: frame(struct.pack("!H", r.choice((0, 999, 1005, 1006, 1015, 5000))), 8, r),
            "close_bad_utf8": lambda: frame(struct.pack("!H", 1000) + b"\xff\xfe", 8, r),
            "rsv1": lambda: frame(b'{"event":"stop"}', 1, r, rsv=r.choice((1, 2, 4))),
            "opcode_3": lambda: frame(b"abc", 3, r),
            "opcode_b": lambda: frame(b"abc", 0xB, r),
            "unmasked": lambda: frame(b'{"event":"mark"}', 1, r, masked=False),
            "cont_first": lambda: frame(b"tail", 0, r),
            "interleaved": lambda: frame(b'{"ev', 1, r, fin=False) + frame(b"\x00\x00", 2, r),
            "oversized": lambda: frame(r.randbytes(1024), 1, r, length=MAX_MESSAGE + 1 + r.randint(0, 10**6)),
        }[k]()
        return k, data

    def plan(self, idx: int, per_conn: int) -> Plan:
        r, p = self.r, self.p
        hk = r.choices(list(HANDSHAKES), list(HANDSHAKES.values()))[0]
        if "twilio" in hk or hk in ("no_signature", "bad_signature"):
            protocol = "twilio"
        elif "native" in hk or hk.endswith("token"):
            protocol = "native"
        else:
            protocol = r.choice(("twilio", "native"))
        plan = Plan(idx, protocol, hk, SOURCES[idx % len(SOURCES)], self.request(hk, protocol, idx))
        plan.ending = r.choices(["close", "abort", "half"], [7, 2, 1])[0]
        if hk in REFUSED:
            return plan
        st = twilio.TwilioStream(idx, tag="fuzz")
        for slot in range(per_conn):
            valid = self.valid_twilio(st, slot) if protocol == "twilio" else self.valid_native(slot)
            k = r.random()
            if k < 0.01 and slot > 1:
                plan.frames.append(self.terminal())
                break
            if k < 0.5 or (slot < 2 and k < 0.9):
                plan.frames.append(("valid", text(valid, r) if isinstance(valid, str) else frame(valid, 2, r)))
            elif k < 0.7 and isinstance(valid, str):
                msg = mutate_json(orjson.loads(valid), p)
                plan.frames.append(("json_mutated", text(orjson.dumps(msg), r)))
            elif k < 0.8:
                raw = valid.encode() if isinstance(valid, str) else valid
                op = 1 if isinstance(valid, str) else 2
                plan.frames.append(("byte_mutated", frame(mutate_bytes(raw, p), op, r)))
            else:
                plan.frames.append(self.odd(protocol, valid))
        return plan


def plans(seed: int, n_conns: int, per_conn: int, host: str) -> list[Plan]:
    gen = _Gen(random.Random(seed), host)
    return [gen.plan(i, per_conn) for i in range(n_conns)]


@dataclass
class ConnResult:
    plan: Plan
    status: int = 0
    sent: int = 0  # frames written before the server closed
    errors: dict[str, int] = field(default_factory=dict)  # native error codes received
    close_code: int | None = None
    error: str = ""


@dataclass
class WsResult:
    conns: list[ConnResult] = field(default_factory=list)
    seconds: float = 0.0

    def statuses(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for c in self.conns:
            out[c.status] = out.get(c.status, 0) + 1
        return out

    @property
    def messages(self) -> int:
        return sum(c.sent for c in self.conns)

    def native_errors(self) -> int:
        return sum(sum(c.errors.values()) for c in self.conns)


async def _read_frames(reader: asyncio.StreamReader, res: ConnResult, closed: asyncio.Event) -> None:
    """Server frames (unmasked) until EOF: native ``error`` codes and the close code."""
    try:
        while True:
            b0, b1 = await reader.readexactly(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack("!H", await reader.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", await reader.readexactly(8))[0]
            payload = await reader.readexactly(n)
            op = b0 & 0x0F
            if op == 8:
                res.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else 1005
                closed.set()
            elif op == 1 and res.plan.protocol == "native" and payload.startswith(b'{"event":"error"'):
                code = str(orjson.loads(payload).get("code"))
                res.errors[code] = res.errors.get(code, 0) + 1
    except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError):
        pass
    finally:
        closed.set()


async def _one(plan: Plan, port: int, pace_s: float) -> ConnResult:
    res = ConnResult(plan)
    writer: asyncio.StreamWriter | None = None
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection("127.0.0.1", port, local_addr=(plan.src, 0)), IO_TIMEOUT_S)
        writer.write(plan.request)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), IO_TIMEOUT_S)
        parts = head.split(b" ", 2)
        res.status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else -1
        if res.status != 101:
            return res
        closed = asyncio.Event()
        rx = asyncio.create_task(_read_frames(reader, res, closed))
        for _, data in plan.frames:
            if closed.is_set() or writer.is_closing():
                break
            writer.write(data)
            res.sent += 1
            await writer.drain()
            await asyncio.sleep(pace_s)
        if plan.ending == "abort":
            writer.transport.abort()
        else:
            if plan.ending == "close" and not closed.is_set():
                writer.write(frame(struct.pack("!H", 1000), 8, random.Random(plan.idx)))
            elif writer.can_write_eof():
                writer.write_eof()
            try:
                await asyncio.wait_for(closed.wait(), IO_TIMEOUT_S)
            except TimeoutError:
                res.error = "no close from the server"
        rx.cancel()
        try:
            await rx
        except asyncio.CancelledError:
            pass
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as e:
        res.error = res.error or f"{type(e).__name__}: {e}"[:120]
    finally:
        if writer is not None:
            writer.transport.abort()
    return res


async def run(all_plans: list[Plan], port: int, concurrency: int, deadline: float, pace_s: float = 0.004) -> WsResult:
    out = WsResult()
    sem = asyncio.Semaphore(concurrency)
    t0 = time.monotonic()

    async def guarded(p: Plan) -> ConnResult | None:
        async with sem:
            if time.monotonic() > deadline:
                return None
            return await _one(p, port, pace_s)

    got = await asyncio.gather(*(guarded(p) for p in all_plans))
    out.conns = [g for g in got if g is not None]
    out.seconds = time.monotonic() - t0
    return out


def expected_refusals(result: WsResult) -> dict[str, Any]:
    """HTTP refusals seen, by status class (the counters they must match: docs/PROTOCOL.md)."""
    st = result.statuses()
    return {"400": st.get(400, 0) + st.get(426, 0), "401": st.get(401, 0), "403": st.get(403, 0),
            "404": st.get(404, 0), "429": st.get(429, 0), "503": st.get(503, 0)}
