"""Loopback WebSocket servers that speak Deepgram's, Cartesia's and ElevenLabs' streaming protocols.

Each fake records what the client sent (paths, headers, JSON controls, audio
bytes) and answers the way the vendor does, with fault modes the tests
select: ``garbage`` (a non-JSON frame), ``cut`` (the socket is dropped
mid-utterance), ``silent`` (never answers), ``error`` (the vendor's error
message), ``slow_first`` (a delay before the first answer).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed


@dataclass
class WsLog:
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    controls: list[Any] = field(default_factory=list)
    audio_bytes: int = 0
    connections: int = 0


class FakeWs:
    mode = ""

    def __init__(self, mode: str = "") -> None:
        self.mode = mode
        self.log = WsLog()
        self._server: Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeWs:
        self._server = await serve(self._handler, "127.0.0.1", 0, compression=None, max_size=8 << 20,
                                   process_request=self._check)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2.0)

    def _check(self, conn: ServerConnection, request: Any) -> Any:
        if self.mode == "reject":
            return conn.respond(401, "bad key\n")
        if self.mode == "busy":
            return conn.respond(429, "slow down\n")
        return None

    async def _handler(self, ws: ServerConnection) -> None:
        self.log.connections += 1
        assert ws.request is not None
        self.log.paths.append(ws.request.path)
        self.log.headers.append({k.lower(): v for k, v in ws.request.headers.raw_items()})
        with contextlib.suppress(ConnectionClosed):
            await self.serve(ws)

    async def serve(self, ws: ServerConnection) -> None:
        raise NotImplementedError


class FakeDeepgram(FakeWs):
    """Interim per 100 ms of audio; a from_finalize final per Finalize."""

    def __init__(self, mode: str = "", words: tuple[str, ...] = ("book", "a", "table", "for", "two")) -> None:
        super().__init__(mode)
        self.words = words

    async def serve(self, ws: ServerConnection) -> None:
        got = 0
        said = 0
        async for msg in ws:
            if isinstance(msg, bytes):
                got += len(msg)
                self.log.audio_bytes += len(msg)
                if self.mode == "cut" and got >= 6400:
                    ws.transport.abort()
                    return
                if got // 3200 > said and said < len(self.words):
                    said = min(len(self.words), got // 3200)
                    if self.mode == "garbage":
                        await ws.send("this is not json")
                    await ws.send(orjson.dumps(_dg(" ".join(self.words[:said]), False, False, False)).decode())
                continue
            obj = orjson.loads(msg)
            self.log.controls.append(obj)
            t = obj.get("type")
            if t == "Finalize" and self.mode != "silent":
                if self.mode == "slow_first":
                    await asyncio.sleep(0.3)
                await ws.send(orjson.dumps(_dg(" ".join(self.words[:said]), True, False, True)).decode())
                said = 0
                got = 0
            elif t == "CloseStream":
                await ws.send(orjson.dumps({"type": "Metadata", "duration": 1.0}).decode())
                await ws.close()
                return


def _dg(text: str, is_final: bool, speech_final: bool, from_finalize: bool) -> dict[str, Any]:
    return {"type": "Results", "channel_index": [0, 1], "duration": 0.5, "start": 0.0, "is_final": is_final,
            "speech_final": speech_final, "from_finalize": from_finalize,
            "channel": {"alternatives": [{"transcript": text, "confidence": 0.93, "words": []}]}}


def _pcm(n_samples: int, value: int = 1000) -> bytes:
    return (value.to_bytes(2, "little", signed=True)) * n_samples


class FakeCartesia(FakeWs):
    """Per text chunk: audio (10 ms per character at the requested rate) + word timestamps;
    ``done`` after the flush (continue false)."""

    async def serve(self, ws: ServerConnection) -> None:
        offsets: dict[str, float] = {}
        first = True
        async for msg in ws:
            obj = orjson.loads(msg)
            self.log.controls.append(obj)
            cid = obj.get("context_id")
            if obj.get("cancel"):
                continue
            if self.mode == "slow_first" and first:
                await asyncio.sleep(0.3)
            first = False
            if self.mode == "error":
                await ws.send(orjson.dumps({"type": "error", "context_id": cid, "status_code": 400,
                                            "error": "bad voice", "done": True}).decode())
                continue
            rate = obj["output_format"]["sample_rate"]
            text = obj.get("transcript", "")
            if text:
                if self.mode == "garbage":
                    await ws.send("{{{ not json")
                    continue
                if self.mode == "cut":
                    ws.transport.abort()
                    return
                n = int(rate * 0.01 * len(text))
                half = n // 2
                for part in (_pcm(half), _pcm(n - half)):
                    await ws.send(orjson.dumps({"type": "chunk", "context_id": cid, "status_code": 206, "done": False,
                                                "data": base64.b64encode(part).decode()}).decode())
                t0 = offsets.get(cid, 0.0)
                words = text.split()
                step = 0.01 * len(text) / max(1, len(words))
                await ws.send(orjson.dumps({"type": "timestamps", "context_id": cid, "word_timestamps": {
                    "words": words, "start": [t0 + i * step for i in range(len(words))],
                    "end": [t0 + (i + 1) * step for i in range(len(words))]}}).decode())
                offsets[cid] = t0 + 0.01 * len(text)
            if obj.get("continue") is False:
                await ws.send(orjson.dumps({"type": "done", "context_id": cid, "done": True,
                                            "status_code": 206}).decode())


class FakeElevenLabs(FakeWs):
    """Audio with character alignment per text message (:meth:`audio`: one message, 10 ms of
    a constant per character, by default); isFinal after close_context."""

    def __init__(self, mode: str = "", rate: int = 24000) -> None:
        super().__init__(mode)
        self.rate = rate

    def audio(self, ws: ServerConnection, cid: Any, text: str) -> list[dict[str, Any]]:
        """The audio messages that answer one text of context ``cid`` on ``ws``."""
        n = int(self.rate * 0.01 * len(text))
        chars = list(text)
        return [{"audio": base64.b64encode(_pcm(n)).decode(), "contextId": cid,
                 "alignment": {"chars": chars, "charStartTimesMs": [10 * i for i in range(len(chars))],
                               "charDurationsMs": [10] * len(chars)}}]

    async def serve(self, ws: ServerConnection) -> None:
        async for msg in ws:
            obj = orjson.loads(msg)
            self.log.controls.append(obj)
            cid = obj.get("context_id")
            if obj.get("close_socket"):
                await ws.close()
                return
            text = obj.get("text")
            if isinstance(text, str) and text.strip():
                if self.mode == "garbage":
                    await ws.send("garbage")
                    continue
                if self.mode == "cut":
                    ws.transport.abort()
                    return
                for m in self.audio(ws, cid, text):
                    await ws.send(orjson.dumps(m).decode())
            if obj.get("close_context"):
                await ws.send(orjson.dumps({"isFinal": True, "contextId": cid}).decode())
