"""The actor's link in the agent process: its frames to the call's gateway and worker.

Owns :class:`ProcessLink`, the :class:`~brisvox.agent.pipeline.stage.call_io.CallLink` of one call
in :mod:`brisvox.agent.host.process`: pushes to the gateway that sent the call's CallStart
(non-blocking, counted when dropped), the TTS frames through the worker client, the Smart
Turn job, and :meth:`ProcessLink.request`, a request to that gateway answered with the same
correlation id (an agent service's ``dial``).

Invariants: a push never blocks (a full or unroutable peer drops it, counted in ``dropped``);
every await is bounded (the request by its ``wait_s``, Smart Turn by its ``timeout``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ipc.frames import AmdStart, Frame, SmartTurnCancel, SmartTurnResult, TtsCut, TtsUtterance

if TYPE_CHECKING:
    from brisvox.agent.host.process import AgentProcess


class ProcessLink:
    """The actor's :class:`~brisvox.agent.pipeline.stage.call_io.CallLink` in the agent process."""

    def __init__(self, proc: AgentProcess, call_id: str, gateway: str) -> None:
        self.proc = proc
        self.call_id = call_id
        self.gateway = gateway
        self.sent = 0
        self.dropped = 0

    def to_gateway(self, frame: Frame) -> None:
        if self.proc.links.send(self.gateway, frame):
            self.sent += 1
        else:
            self.dropped += 1

    async def request(self, frame: Frame, wait_s: float) -> Frame:
        """``frame`` to the call's gateway, and its reply within ``wait_s`` (TimeoutError, or
        ConnectionError when the gateway is not reachable)."""
        return await self.proc.links.request(self.gateway, frame, wait_s)

    def to_worker(self, frame: Frame) -> None:
        wc = self.proc.workers
        if wc is None:
            self.dropped += 1
            return
        if isinstance(frame, TtsUtterance):
            coro = wc.tts_utterance(self.call_id, frame.utterance, frame.epoch, frame.tts_pos)
        elif isinstance(frame, TtsCut):
            coro = wc.tts_cut(self.call_id, frame.epoch, frame.tts_pos)
        elif isinstance(frame, AmdStart):
            coro = wc.amd_start(self.call_id, frame.in16_pos, frame.max_wait_ms, frame.leave_message)
        elif isinstance(frame, SmartTurnCancel):
            coro = wc.smart_turn_cancel(self.call_id, frame.end_pos)
        else:
            self.dropped += 1
            return
        self.proc.spawn(coro)

    async def smart_turn(self, end_pos: int, timeout: float) -> float | None:  # noqa: ASYNC109
        wc = self.proc.workers
        if wc is None:
            return None
        reply = await wc.smart_turn(self.call_id, end_pos, timeout)
        if isinstance(reply, SmartTurnResult):
            return reply.probability
        return None
