"""The asyncio side of ``brisvox call``: one 20 ms timer, one transport, one caller script.

Owns the call's lifetime: open the transport, then on a fixed 20 ms grid ask
the script for the caller's frame (and digits) and send it, while the
transport's receive side feeds the script and the recorder with arrival
times; hang up when the script is done, the far end ended the call, or the
call's time limit passed; always close the transport.

Invariants: every await is bounded (the transport's own timeouts, and
``max_s`` for the whole call); a timer that falls more than ``MAX_BEHIND_S``
behind resynchronizes instead of bursting (counted in ``late_ticks``);
callbacks run on the loop thread, so the script and recorder need no lock.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from brisvox.client.recorder import PlayoutRecorder
from brisvox.client.script import CallerScript
from brisvox.client.transport import BotEvents, CallTransport

PERIOD_S = 0.020
MAX_BEHIND_S = 0.2


@dataclass
class CallStats:
    t0: float = 0.0
    ticks: int = 0
    late_ticks: int = 0
    audio_frames_in: int = 0
    audio_s_in: float = 0.0
    clears: int = 0
    timed_out: bool = False


async def run_call(transport: CallTransport, script: CallerScript, recorder: PlayoutRecorder,
                   max_s: float = 300.0) -> CallStats:
    """Place the call and run it to its end (see the module docstring)."""
    st = CallStats()
    rate = transport.rate

    def on_audio(pcm: np.ndarray, now: float) -> None:
        st.audio_frames_in += 1
        st.audio_s_in += len(pcm) / rate
        script.on_bot_audio(pcm, now)
        recorder.on_audio(pcm, now)

    def on_clear(now: float) -> None:
        st.clears += 1
        script.on_clear(now)
        recorder.on_clear(now)

    events = BotEvents(on_audio=on_audio, on_clear=on_clear, on_dtmf=script.on_bot_dtmf, on_end=script.on_end)
    t0 = time.monotonic()
    st.t0 = t0
    recorder.t0 = t0
    script.start(t0)
    await asyncio.wait_for(transport.open(events), 60.0)
    try:
        next_t = time.monotonic()
        while True:
            now = time.monotonic()
            if now - t0 > max_s:
                st.timed_out = True
                script.on_end(f"time limit ({max_s:g}s)", now)
            out = script.tick(now)
            if out.hangup:
                break
            st.ticks += 1
            if out.digits:
                await transport.send_dtmf(out.digits)
            if out.frame is not None:
                await transport.send_audio(out.frame)
            next_t += PERIOD_S
            if next_t < time.monotonic() - MAX_BEHIND_S:
                st.late_ticks += 1
                next_t = time.monotonic()
            await asyncio.sleep(max(0.0, next_t - time.monotonic()))
    finally:
        await transport.close()
    return st
