"""The playout book of one call and the played-text truncation it drives.

Owns what the caller heard and the played-text truncation it drives, keyed EXPLICITLY by ``(epoch, round)``; rounds are
never zipped to utterances by order.

Who writes what:

* LlmRunner: ``register_round`` before LlmResponseStarted, ``set_msg_index``
  when it pushes the round's assistant message (fillers: when they enter the
  context).
* TtsStage: ``register_utterance`` (one utterance per text round, one round
  per utterance; conflicts ignored and counted), ``push_sent`` with the exact
  raw slice just before it goes to the provider, ``add_word``, ``mark_lost``.
* TtsRingWriter: ``utterance_tts_start`` / ``add_audio`` (samples written to
  the tts ring), ``register_end_mark``.
* The actor's inbound path: ``utterance_out_start`` (OutUtterance: where the
  worker put the utterance in the out ring), ``note_release`` (the gateway's
  Playback release position), ``note_cleared`` (the final release position
  the gateway reports with Cleared), ``mark_played``.
* The clear hook: ``note_clear`` at the barge-in decision, before the Clear
  leaves (so a cut utterance is frozen before any later report arrives).
* The pause hook: ``note_pause`` when a barge-in candidate holds the bot's
  audio at the gateway, ``note_resume`` when it is released again.

Positions are out-ring samples at the call rate; an utterance spans
``[out_start, out_start + total_out)``. Released audio of a cut utterance is
frozen at ``note_clear`` and set exactly by the Cleared position (later
reports of the gateway's new floor can never inflate it).

Heard position = min(released, total) - lead, where lead is the reported
client lead when there is one, else ``lead_margin``, first taken off by the
audio of later utterances of the same epoch behind it in the client's
buffer, and (for the fixed margin) faded by the time between the last
release of this or a later utterance and the barge-in. A response that
ended without an interruption loses no lead.

Pause (a barge-in candidate held the audio): only released audio is ever
counted, so a hold changes nothing in the figures themselves; the release
position simply stops. A cut during a hold loses the client's lead that
drained while the audio was held (a reported lead is faded by the hold's
age at the cut, the fixed margin by the age of the last release as
always), so a confirmed barge-in after a hold keeps exactly what was
released. :meth:`unreleased_s` (audio written but not yet released, from
the release reports) bounds the writer's lead while the release is held.

Settle: an interrupted utterance is settled by its end mark echo, the
Cleared final position, or being played whole; ``wait_settled`` waits for
the interrupted, unapplied rounds that have a context message, bounded by
what is left of ``settle_wait`` after the barge-in; on timeout the last
known position is used (counted). Bounded: at most ``max_rounds`` rounds
and their utterances are kept (oldest, applied ones evicted first).
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from brisvox.agent.conversation.context import AssistantMessage, Context
from brisvox.agent.conversation.truncation import (
    Truncation,
    TruncationError,
    TruncationOutcome,
    apply_truncation,
)
from brisvox.clock import Clock

log = logging.getLogger("brisvox.agent.playout")

_WORD_RE = re.compile(r"\S+")
CHARS_PER_SECOND = 14.0  # speaking-rate estimate when a provider sends no word timings


@dataclass(slots=True)
class Utterance:
    id: int
    epoch: int
    round: int
    sent: list[str] = field(default_factory=list)
    words: list[tuple[str, float, float]] = field(default_factory=list)
    tts_start: int | None = None
    tts_samples: int = 0
    out_start: int | None = None
    released: int = 0  # out samples of this utterance released to the caller
    release_stamp: float | None = None
    mark_name: str | None = None
    marked_played: bool = False
    cut: bool = False  # a clear covered it before it was played whole
    cut_at: float | None = None
    final: bool = False  # the released figure is exact (Cleared / echo / whole)
    lost: bool = False
    settled: bool = False
    client_lead: float | None = None

    @property
    def sent_text(self) -> str:
        return "".join(self.sent)


@dataclass(slots=True)
class Round:
    epoch: int
    round: int
    msg_index: int | None = None
    utterance: int | None = None
    applied: bool = False
    interrupted_at: float | None = None
    removed: bool = False


@dataclass(slots=True)
class BookStats:
    rounds: int = 0
    utterances: int = 0
    conflicts: int = 0
    clears_noted: int = 0
    cleared_finals: int = 0
    marks_played: int = 0
    marks_after_clear: int = 0
    settle_waits: int = 0
    settle_timeouts: int = 0
    truncations: int = 0
    kept_whole: int = 0
    removed: int = 0
    estimated: int = 0
    not_a_prefix: int = 0
    evicted: int = 0
    pauses: int = 0


@dataclass(frozen=True, slots=True)
class PlayoutConfig:
    lead_margin: float = 0.1
    settle_wait: float = 0.25
    max_rounds: int = 64


class PlayoutBook:
    def __init__(self, clock: Clock, call_rate: int, tts_rate: int, cfg: PlayoutConfig | None = None) -> None:
        self.clock = clock
        self.call_rate = call_rate
        self.tts_rate = tts_rate
        self.cfg = cfg or PlayoutConfig()
        self.rounds: OrderedDict[tuple[int, int], Round] = OrderedDict()
        self.utts: OrderedDict[int, Utterance] = OrderedDict()
        self._marks: dict[str, int] = {}
        self.release_pos = 0
        self.client_lead: float | None = None
        self._clears: list[tuple[int, float, int | None]] = []  # (epoch, at, final position)
        self.paused_at: float | None = None  # the gateway holds the bot's audio since then
        self._changed = asyncio.Event()
        self.st = BookStats()

    # -- registration -------------------------------------------------------------
    def register_round(self, epoch: int, rnd: int) -> None:
        key = (epoch, rnd)
        if key in self.rounds:
            self.st.conflicts += 1
            return
        self.rounds[key] = Round(epoch, rnd)
        self.st.rounds += 1
        self._evict()

    def set_msg_index(self, epoch: int, rnd: int, index: int) -> None:
        r = self.rounds.get((epoch, rnd))
        if r is not None:
            r.msg_index = index
            self._changed.set()

    def round(self, epoch: int, rnd: int) -> Round | None:
        return self.rounds.get((epoch, rnd))

    def round_over(self, epoch: int, rnd: int) -> bool:
        """Round ``(epoch, rnd)`` played out: its utterance's end mark was played, it was cut
        or lost, or every sample of it written so far was released (a round in the middle of
        a turn has no end mark; a TTS that renders slower than real time may make this true
        before its last audio, which still plays in order). False while it has no audio yet."""
        r = self.rounds.get((epoch, rnd))
        u = self.utts.get(r.utterance) if r is not None and r.utterance is not None else None
        if u is None:
            return False
        return u.marked_played or u.cut or u.lost or (u.out_start is not None and 0 < self.total_out(u) <= u.released)

    def register_utterance(self, epoch: int, rnd: int, utt: int) -> bool:
        r = self.rounds.get((epoch, rnd))
        if r is None:
            r = Round(epoch, rnd)  # a round the runner did not register (tests, fallbacks)
            self.rounds[(epoch, rnd)] = r
            self.st.rounds += 1
        if r.utterance is not None or utt in self.utts:
            self.st.conflicts += 1
            return False
        r.utterance = utt
        self.utts[utt] = Utterance(utt, epoch, rnd)
        self.st.utterances += 1
        if r.interrupted_at is not None:
            self.utts[utt].cut = True
            self.utts[utt].cut_at = r.interrupted_at
        return True

    def push_sent(self, utt: int, text: str) -> None:
        u = self.utts.get(utt)
        if u is not None:
            u.sent.append(text)

    def add_word(self, utt: int, word: str, start: float, end: float) -> None:
        u = self.utts.get(utt)
        if u is not None and len(u.words) < 4096:
            u.words.append((word, start, end))

    def mark_lost(self, utt: int) -> None:
        u = self.utts.get(utt)
        if u is not None:
            u.lost = True
            self._changed.set()

    def utterance_tts_start(self, utt: int, tts_pos: int) -> None:
        u = self.utts.get(utt)
        if u is not None and u.tts_start is None:
            u.tts_start = tts_pos

    def add_audio(self, utt: int, n_tts: int) -> None:
        u = self.utts.get(utt)
        if u is not None:
            u.tts_samples += n_tts
            if not u.cut and u.out_start is not None:
                self._update_release(u, self.release_pos)

    def register_end_mark(self, utt: int, name: str) -> None:
        u = self.utts.get(utt)
        if u is not None:
            u.mark_name = name
            self._marks[name] = utt

    # -- positions -----------------------------------------------------------------
    def total_out(self, u: Utterance) -> int:
        return (u.tts_samples * self.call_rate) // self.tts_rate

    def _update_release(self, u: Utterance, pos: int) -> None:
        if u.out_start is None:
            return
        rel = min(max(0, pos - u.out_start), self.total_out(u))
        if rel > u.released:
            u.released = rel
            u.release_stamp = self.clock.now()

    def utterance_out_start(self, utt: int, out_pos: int) -> None:
        u = self.utts.get(utt)
        if u is None or u.out_start is not None:
            return
        u.out_start = out_pos
        if u.cut:
            final = self._final_for(u.epoch)
            if final is not None:
                u.released = min(max(0, final - out_pos), self.total_out(u))
                u.final = True
                self._settle(u)
        else:
            self._update_release(u, self.release_pos)

    def note_release(self, pos: int, lead: float | None = None) -> None:
        """The gateway's release position (Playback); ``lead`` a client-reported buffer lead."""
        if pos < self.release_pos:
            return
        self.release_pos = pos
        if lead is not None:
            self.client_lead = lead
        for u in reversed(self.utts.values()):
            if u.cut or u.out_start is None:
                continue
            if u.out_start > pos:
                continue
            self._update_release(u, pos)
            if u.out_start + self.total_out(u) <= pos - self.call_rate * 5:
                break  # older utterances were updated long ago

    def note_pause(self, at: float) -> None:
        """A barge-in candidate holds the bot's audio at the gateway from ``at`` on."""
        self.st.pauses += 1
        if self.paused_at is None:
            self.paused_at = at

    def note_resume(self) -> None:
        """The held audio is released again (the candidate was vetoed)."""
        self.paused_at = None

    def unreleased_s(self) -> float:
        """Seconds of bot audio written (not cut) that the last release report had not
        released yet: the writer's real lead over the caller's ear, which a hold stops
        from shrinking. An upper bound (reports are periodic)."""
        n = 0
        for u in reversed(self.utts.values()):
            if u.cut:
                break
            total = self.total_out(u)
            if u.out_start is None:
                n += total  # written, not placed in the out ring yet
                continue
            n += max(0, u.out_start + total - max(self.release_pos, u.out_start))
            break
        return n / self.call_rate

    def note_clear(self, new_epoch: int, at: float) -> None:
        """The barge-in decision (before the Clear leaves): freeze what is cut."""
        self.st.clears_noted += 1
        self._clears.append((new_epoch, at, None))
        if len(self._clears) > 64:
            del self._clears[:-64]
        lead = self.client_lead
        if lead is not None and self.paused_at is not None:
            lead = max(0.0, lead - max(0.0, at - self.paused_at))  # the client played it out during the hold
        self.paused_at = None
        for u in self.utts.values():
            if u.epoch < new_epoch and not u.cut and not u.settled:
                u.cut = True
                u.cut_at = at
                u.client_lead = lead
                if u.out_start is not None and u.released >= self.total_out(u) and u.tts_samples > 0:
                    pass  # released whole already: the final position will confirm it
        for r in self.rounds.values():
            if r.epoch < new_epoch and not r.applied and r.interrupted_at is None:
                r.interrupted_at = at

    def _final_for(self, epoch: int) -> int | None:
        for ce, _at, fin in self._clears:
            if ce > epoch and fin is not None:
                return fin
        return None

    def note_cleared(self, epoch: int, position: int, cut_marks: Iterable[str] = ()) -> None:
        """The clear for ``epoch`` was applied (everything older is dead): ``position`` is
        the last out position released; ``cut_marks`` end marks it discarded (they settle
        their utterances and never count as played)."""
        self.st.cleared_finals += 1
        for name in cut_marks:
            utt = self._marks.pop(name, None)
            if utt is not None and utt in self.utts:
                self.st.marks_after_clear += 1
        for i, (ce, at, fin) in enumerate(self._clears):
            if ce == epoch and fin is None:
                self._clears[i] = (ce, at, position)
                break
        else:
            self._clears.append((epoch, self.clock.now(), position))
        for u in self.utts.values():
            if u.epoch < epoch and u.cut and not u.final:
                if u.out_start is not None:
                    u.released = min(max(0, position - u.out_start), self.total_out(u))
                else:
                    u.released = 0
                u.final = True
                self._settle(u)
        self._changed.set()

    def mark_played(self, name: str) -> int | None:
        """An end mark was played. Returns the utterance's epoch when it counts as
        played (None: unknown, or a clear covered the utterance first)."""
        utt = self._marks.pop(name, None)
        if utt is None:
            return None
        u = self.utts.get(utt)
        if u is None:
            return None
        if u.cut:
            self.st.marks_after_clear += 1
            self._settle(u)
            return None
        u.marked_played = True
        u.final = True
        u.released = self.total_out(u)
        self.st.marks_played += 1
        self._settle(u)
        return u.epoch

    def _settle(self, u: Utterance) -> None:
        if not u.settled:
            u.settled = True
            self._changed.set()

    # -- settle wait -----------------------------------------------------------------
    def _unsettled(self) -> list[Utterance]:
        out = []
        for r in self.rounds.values():
            if r.applied or r.msg_index is None or r.interrupted_at is None or r.utterance is None:
                continue
            u = self.utts.get(r.utterance)
            if u is not None and u.cut and not u.settled and not u.final:
                out.append(u)
        return out

    async def wait_settled(self) -> bool:
        """Wait (bounded by settle_wait after each barge-in) until every interrupted
        round with a context message is settled. False on timeout (counted)."""
        pending = self._unsettled()
        if not pending:
            return True
        self.st.settle_waits += 1
        deadline = max((u.cut_at or 0.0) for u in pending) + self.cfg.settle_wait
        while True:
            pending = self._unsettled()
            if not pending:
                return True
            if self.clock.now() >= deadline:
                self.st.settle_timeouts += 1
                return False
            self._changed.clear()
            try:
                async with asyncio.timeout_at(deadline):
                    await self._changed.wait()
            except TimeoutError:
                pass

    # -- heard text --------------------------------------------------------------------
    def _lead(self, u: Utterance) -> float:
        """Seconds of ``u`` still in the client's buffer at the cut (never negative)."""
        if u.client_lead is not None:
            lead = u.client_lead
            fade = False
        else:
            lead = self.cfg.lead_margin
            fade = True
        if lead <= 0:
            return 0.0
        later = [x for x in self.utts.values() if x.epoch == u.epoch and x.round > u.round]
        later_s = sum(x.released for x in later) / self.call_rate
        lead = max(0.0, lead - later_s)
        if fade and u.cut_at is not None:
            stamps = [x.release_stamp for x in [u, *later] if x.release_stamp is not None]
            if stamps:
                since = u.cut_at - max(stamps)
                lead = max(0.0, lead - max(0.0, since))
        return lead

    def _heard_pos(self, u: Utterance, interrupted: bool) -> int:
        pos = min(u.released, self.total_out(u))
        if interrupted:
            pos -= int(self._lead(u) * self.call_rate)
        return max(0, pos)

    def heard_ms(self, utt: int, interrupted: bool = True) -> int | None:
        """Milliseconds of ``utt``'s audio the caller heard: the position :meth:`heard` cuts at
        (the speech-to-speech stage tells its provider this figure)."""
        u = self.utts.get(utt)
        return None if u is None else self._heard_pos(u, interrupted) * 1000 // self.call_rate

    def heard(self, u: Utterance, interrupted: bool) -> Truncation:
        sent = u.sent_text
        total = self.total_out(u)
        pos = self._heard_pos(u, interrupted)
        if not interrupted and not u.lost and pos >= total and total > 0:
            return Truncation(sent, in_full=True)
        heard_s = pos / self.call_rate
        return heard_prefix(sent, u.words, heard_s, whole=(pos >= total and not u.lost and total > 0))

    # -- truncation pass -----------------------------------------------------------------
    async def apply_to(self, ctx: Context) -> None:
        """Settle wait, then :meth:`apply`."""
        await self.wait_settled()
        self.apply(ctx)

    def apply(self, ctx: Context) -> None:
        """Cut every unapplied round with a context message to what was heard
        (last round first), then mark them applied. Validates the context."""
        todo = [r for r in self.rounds.values() if not r.applied and r.msg_index is not None]
        todo.sort(key=lambda r: r.msg_index or 0, reverse=True)
        played_epochs: dict[int, int] = {}  # epoch -> highest round echoed as played
        for r in self.rounds.values():
            if r.utterance is not None:
                u = self.utts.get(r.utterance)
                if u is not None and u.marked_played and not u.lost:
                    played_epochs[r.epoch] = max(played_epochs.get(r.epoch, -1), r.round)
        for r in todo:
            r.applied = True
            idx = r.msg_index
            assert idx is not None
            if idx >= len(ctx):
                continue
            msg = ctx[idx]
            if not isinstance(msg, AssistantMessage) or not msg.text.strip():
                continue
            u = self.utts.get(r.utterance) if r.utterance is not None else None
            if u is None:
                trunc = Truncation.nothing()
            elif not u.lost and (u.marked_played or played_epochs.get(r.epoch, -1) > r.round):
                self.st.kept_whole += 1
                continue
            else:
                trunc = self.heard(u, interrupted=r.interrupted_at is not None or u.cut)
                if trunc.in_full and not u.cut:
                    self.st.kept_whole += 1
                    continue
            if not msg.text.startswith(trunc.heard):
                # the sent text is not what the message says (should not happen): be safe
                self.st.not_a_prefix += 1
                trunc = Truncation(_common_prefix(msg.text, trunc.heard), estimated=True)
            try:
                outcome = apply_truncation(ctx, idx, trunc)
            except TruncationError:
                self.st.not_a_prefix += 1
                continue
            if outcome is TruncationOutcome.TRUNCATED:
                self.st.truncations += 1
            elif outcome is TruncationOutcome.REMOVED:
                self.st.removed += 1
                r.removed = True
                r.msg_index = None
                self._shift_after(idx)
            if trunc.estimated:
                self.st.estimated += 1
        ctx.validate()

    def _shift_after(self, removed_index: int) -> None:
        for r in self.rounds.values():
            if r.msg_index is not None and r.msg_index > removed_index:
                r.msg_index -= 1

    def forget_unapplied(self) -> None:
        """Mark every round applied (the context was replaced)."""
        for r in self.rounds.values():
            r.applied = True

    def _evict(self) -> None:
        while len(self.rounds) > self.cfg.max_rounds:
            key, r = next(iter(self.rounds.items()))
            if not r.applied and r.msg_index is not None:
                # the oldest is still unapplied: apply can no longer reach it
                pass
            self.rounds.pop(key)
            self.st.evicted += 1
            if r.utterance is not None:
                u = self.utts.pop(r.utterance, None)
                if u is not None and u.mark_name:
                    self._marks.pop(u.mark_name, None)

    def stats(self) -> dict[str, int]:
        return {k: getattr(self.st, k) for k in self.st.__slots__}


def _common_prefix(a: str, b: str) -> str:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]


def heard_prefix(sent: str, words: list[tuple[str, float, float]], heard_s: float, whole: bool = False) -> Truncation:
    """The prefix of ``sent`` the caller heard after ``heard_s`` seconds of the utterance.

    With word timings: every word that STARTED before ``heard_s`` is heard; the
    prefix ends after the last heard word as it appears in ``sent`` (aligned in
    order, case-sensitive). A word that cannot be aligned ends the timed part and
    the rest is estimated at :data:`CHARS_PER_SECOND`. Without timings the whole
    position is estimated, cut at a word end. ``whole``: the utterance played to
    its end (the whole sent text is heard).
    """
    if whole:
        return Truncation(sent, in_full=True)
    if not sent.strip() or heard_s <= 0:
        return Truncation("")
    cursor = 0
    est_from = 0.0
    for w, start, end in words:
        if start >= heard_s:
            return Truncation(sent[:cursor])
        token = w.strip()
        if not token:
            continue
        idx = sent.find(token, cursor)
        if idx < 0:
            est_from = start
            break
        cursor = idx + len(token)
        est_from = end
    else:
        if words:
            # every timed word was heard; untimed text after them is not (lost audio)
            return Truncation(sent[:cursor])
    # estimate the rest by speaking rate, from est_from seconds at the cursor
    budget = (heard_s - est_from) * CHARS_PER_SECOND
    start_cursor = cursor
    end = cursor
    for m in _WORD_RE.finditer(sent[start_cursor:]):
        if m.start() >= budget:
            break
        end = start_cursor + m.end()
    return Truncation(sent[:end], estimated=True)
