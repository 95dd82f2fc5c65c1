"""The spoken fallback line of an S2S call whose session cannot be restored.

Owns :func:`speak_line`: the line is synthesized by the agent's local TTS
(``[tts]`` of the agent file, e.g. ``espeak`` or ``local_piper``), converted
to the tts ring rate and written as a NEW epoch above every epoch of the call
(the fast path first: watch, book, Clear), then the epoch is ended
(``TtsEnded``: the writer's end mark) and the caller is given until the mark
comes back. The caller (:meth:`S2sStage._give_up`) bounds the whole of it
and hangs up afterwards, whatever happened.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from brisvox.agent.pipeline.s2s.audio import OutputConverter
from brisvox.agent.pipeline.stage.pipeline_frames import AudioOut, Interrupt, TtsEnded
from brisvox.providers.base import TtsAudio, TtsClosed, TtsConfig, TtsFlushed, TtsProvider

if TYPE_CHECKING:
    from brisvox.agent.pipeline.s2s.stage import S2sStage

CONTEXT = 1


async def speak_line(stage: S2sStage, tts: TtsProvider, text: str) -> bool:
    """Speak ``text`` as its own epoch; True when its end mark came back (it was played)."""
    call = stage.call
    m = stage.machine
    old = m.epoch
    epoch = max(m.epoch, m.floor, stage.watch.latest, call.ledger.epoch) + 1
    m.floor = m.epoch = epoch  # every model epoch is dead from here on
    stage.fallback_epoch = epoch
    now = stage.clock.now()
    stage.watch.bump(epoch)
    call.clear(epoch, now)
    if stage.next is not None:
        stage.next.inbox.put_nowait(Interrupt(epoch, old, now))
    session = await tts.connect(TtsConfig(sample_rate=call.tts_rate), stage.cfg.connect_timeout)
    try:
        conv = OutputConverter(session.sample_rate, call.tts_rate)
        stage._utt_seq += 1
        utt = stage._utt_seq
        stage.book.register_round(epoch, 0)
        stage.book.register_utterance(epoch, 0, utt)
        stage.book.push_sent(utt, text)
        await session.send_text(CONTEXT, text, continue_=False, timeout=stage.cfg.send_timeout)
        await session.flush(CONTEXT, stage.cfg.send_timeout)
        async for ev in session.events():
            if isinstance(ev, TtsAudio) and ev.context == CONTEXT:
                samples = conv.convert(ev.pcm)
                if len(samples):
                    await stage.guarded_send(AudioOut(epoch, utt, samples))
            elif isinstance(ev, TtsFlushed | TtsClosed):
                break
    finally:
        with contextlib.suppress(Exception):
            await session.close(1.0)
    await stage.guarded_send(TtsEnded(epoch))
    await stage.fallback_played.wait()
    return True
