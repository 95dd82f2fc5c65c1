"""Test kit for driving one pipeline stage on virtual time: a sink stage that keeps every
frame it is sent, in order."""

from __future__ import annotations

from brisvox.agent.pipeline.stage.base import Inbox, Stage
from brisvox.agent.pipeline.stage.call_context import CallContext
from brisvox.agent.pipeline.stage.pipeline_frames import PipelineFrame


class Collect(Stage):
    """The last stage of a test chain: ``frames`` holds what reached it."""

    def __init__(self, call: CallContext) -> None:
        super().__init__(call, None, Inbox("collect", 4096, sys_cap=256))
        self.frames: list[PipelineFrame] = []

    async def process(self, frame: PipelineFrame) -> None:
        self.frames.append(frame)
