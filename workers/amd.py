"""Answering-machine detection (AMD): the per-call detector of an answered outbound call.

Owns :class:`AmdDetector`, a pure, sans-IO state machine that classifies the
first seconds of an answered call as ``human``, ``machine`` (a voicemail
greeting), ``ivr``, ``fax`` or ``uncertain``, and, for ``leave_message``, goes
on listening after a ``machine`` verdict for the voicemail BEEP (or, when no
beep comes, the end of the greeting). It needs no network and no model of its
own: it is fed the windows the worker's VAD scores (32 ms: 256 samples at
8 kHz in Silero's native 8 kHz mode, 512 at 16 kHz on in16) together with
that window's Silero speech probability, so the cadence comes from the VAD
the worker already runs (no second VAD); a ``None`` probability falls back to
an energy test against a tracked noise floor.

Signals, per window:

* **Cadence** (from the speech probabilities): speech joined across pauses
  shorter than ``human_silence_ms`` is one *turn*. A person answers with a
  short turn ("hello?", "yes, speaking") and then waits: a turn of at most
  ``human_max_speech_ms`` followed by ``human_silence_ms`` of silence is
  ``human``, and so is a longer one followed by ``reply_silence_ms`` (a slow
  "hello, who is calling?"). A greeting talks on: a turn reaching
  ``machine_speech_ms``, or a new turn after one longer than a person's, is
  ``machine``.
* **Tones** (one Hann-windowed real FFT per window, 31.25 Hz bins): a window
  above ``FLOOR_DBFS`` is tonal when one peak (+-2 bins) holds at least
  ``tone_share`` of its energy; consecutive tonal windows within ``TONE_DRIFT_HZ``
  of each other make a tone. Fax CNG (1100 Hz) or answer tone (2100 Hz)
  lasting ``fax_tone_ms`` with no speech before it is ``fax``; a steady tone
  of 350-2150 Hz lasting ``beep_min_ms`` after speech is the voicemail beep
  (``machine`` if no verdict yet). The tone tests read the window's ``tones``
  samples when they are given: the same span before noise suppression (with
  ``[audio] denoise`` the VAD's windows are denoised, and a suppressor removes
  or smears steady tones; the cadence keeps the VAD's probabilities).
* **Transcript** (optional, :meth:`AmdDetector.hear`): the local STT's text
  against greeting cues ("leave a message", "after the tone"...) gives
  ``machine``, menu cues ("press 1", "for sales"...) give ``ivr``. With
  ``transcripts`` set, a machine decided by cadence is held until the
  deadline so a menu cue can still make it ``ivr``.

Time is audio time: every window advances the clock by its 32 ms (positions
are in16 samples, ``start_pos`` + 512 per window, the VAD's positions), so
the detector is deterministic and runs on any clock; :meth:`expire` forces
the deadline verdict when the caller's own clock ran out (audio stalled).

Invariants:

* Exactly one :class:`AmdVerdict` per detector, at the latest in the window
  that reaches ``max_wait_ms`` (``uncertain`` when nothing decided), and
  never before the first window. After it, with ``leave_message`` and a
  ``machine`` verdict, exactly one :class:`AmdBeep` or :class:`AmdGreetingEnd`
  follows (at the latest at ``listen_max_ms``); then the detector is
  ``done`` and ignores further windows at no cost.
* :meth:`feed` never raises on audio content or probability (NaN, out of
  range, clipping, DC: all handled); only a window (or ``tones``) of the wrong
  shape is a ``ValueError`` (a caller bug).
* Per window: one rfft of 256/512 points and O(1) bookkeeping, nothing
  allocated beyond numpy's temporaries; nothing at all once ``done``.
* Confidences are the measured precision of the rule that decided, on the
  tuning set of ``python -m bench amd`` (docs/BENCHMARKS.md), not a model's
  probability.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

VERDICTS = ("human", "machine", "ivr", "fax", "uncertain")
WINDOW_MS = 32
IN16_PER_WINDOW = 512  # in16 samples per 32 ms window
TONE_DRIFT_HZ = 25.0  # a tone's frequency may wander this much between windows
CNG_HZ = 1100.0
CED_HZ = 2100.0
FAX_TOL_HZ = 45.0
BEEP_BAND = (350.0, 2150.0)
ENERGY_RATIO = 8.0  # energy fallback: speech is 9 dB above the tracked floor
ENERGY_HANG = 4  # ... and the 4 windows (128 ms) after it
FLOOR_DBFS = -50.0  # windows quieter than this are never tonal (and never energy-speech)

_MACHINE_CUES = (
    "leave a message", "leave your message", "leave me a message", "after the tone", "after the beep",
    "at the tone", "record your message", "not available", "unavailable", "can't take your call",
    "cannot take your call", "can't come to the phone", "voicemail", "voice mail", "mailbox",
    "you have reached", "you've reached", "get back to you", "return your call", "call you back",
)
_IVR_CUES = (
    "press one", "press two", "press 1", "press 2", "press zero", "press 0", "press the pound",
    "for sales", "for support", "for billing", "main menu", "menu options", "listen carefully",
    "para espanol", "para español", "dial the extension", "say or press", "thank you for calling",
    "you for calling",  # ... as the local Whisper often hears it ("and you for calling"); not "thanks for calling"
    "your call is important",
)


@dataclass(frozen=True, slots=True)
class AmdParams:
    """One detection's tuning. Durations are milliseconds of audio; defaults were tuned on the
    tuning seed of ``python -m bench amd`` (never on the seed it reports)."""

    max_wait_ms: int = 3000  # a verdict by then, possibly "uncertain"
    leave_message: bool = False  # after "machine": listen on for the beep / the greeting's end
    transcripts: bool = False  # hear() will be fed: a cadence "machine" waits for menu cues
    speech_threshold: float = 0.5  # a window at or above this probability is speech
    human_max_speech_ms: int = 1700  # a person's first words last at most this long (VAD-measured)
    human_silence_ms: int = 420  # ... and are followed by this much silence (shorter pauses: one turn)
    reply_silence_ms: int = 560  # a longer first turn followed by this much silence is a person too
    machine_speech_ms: int = 2000  # one turn this long is a greeting
    tone_share: float = 0.85  # share of a window's energy in its peak (+-2 bins) for "tonal"
    beep_min_ms: int = 128  # a tone after speech this long is the beep
    fax_tone_ms: int = 320  # a CNG / answer tone this long (no speech before) is a fax
    beep_wait_ms: int = 3000  # leave_message: no beep this long after the last speech = greeting end
    listen_max_ms: int = 30_000  # leave_message: an answer (beep or greeting end) by then

    def __post_init__(self) -> None:
        checks = (
            ("max_wait_ms", 500 <= self.max_wait_ms <= 30_000),
            ("speech_threshold", 0.0 < self.speech_threshold < 1.0),
            ("human_max_speech_ms", 100 <= self.human_max_speech_ms <= 5000),
            ("human_silence_ms", 100 <= self.human_silence_ms <= 5000),
            ("reply_silence_ms", self.human_silence_ms <= self.reply_silence_ms <= 10_000),
            ("machine_speech_ms", self.human_max_speech_ms < self.machine_speech_ms <= 20_000),
            ("tone_share", 0.1 <= self.tone_share < 1.0),
            ("beep_min_ms", 32 <= self.beep_min_ms <= 2000),
            ("fax_tone_ms", 64 <= self.fax_tone_ms <= 3000),
            ("beep_wait_ms", 100 <= self.beep_wait_ms <= 30_000),
            ("listen_max_ms", self.max_wait_ms <= self.listen_max_ms <= 120_000),
        )
        for name, ok in checks:
            if not ok:
                raise ValueError(f"amd parameter {name} out of range: {getattr(self, name)!r}")


@dataclass(frozen=True, slots=True)
class AmdVerdict:
    """The classification. ``at_ms``: audio time since the detector started when it was made
    (the time it took); ``pos``: the in16 position of the end of the deciding window;
    ``reason``: the rule that decided (``short_reply``, ``long_greeting``, ``beep``, ``cue``,
    ``fax_tone``, ``deadline``...)."""

    kind: str
    confidence: float
    at_ms: int
    pos: int
    reason: str


@dataclass(frozen=True, slots=True)
class AmdBeep:
    """The voicemail beep: ``onset_ms`` / ``onset_pos`` its first tonal window (audio time since
    the start / in16 position), ``freq_hz`` its frequency, ``at_ms`` when it was confirmed."""

    onset_ms: int
    onset_pos: int
    freq_hz: float
    at_ms: int


@dataclass(frozen=True, slots=True)
class AmdGreetingEnd:
    """No beep came: the greeting ended at ``end_ms`` / ``end_pos`` (its last speech);
    ``reason`` ``no_beep`` (``beep_wait_ms`` of silence followed it) or ``limit``
    (``listen_max_ms`` passed)."""

    end_ms: int
    end_pos: int
    at_ms: int
    reason: str


AmdEvent = AmdVerdict | AmdBeep | AmdGreetingEnd

# The precision of each deciding rule on the tuning set (seed 1 of ``python -m bench amd``,
# 300 openings), Laplace-smoothed ((right + 1) / (decided + 2)): a rule that never decided
# there carries 0.5. ``beep``: the beep evidence's precision (every beep found was on a
# machine). With transcripts a cadence "machine" is made only when no menu cue came (held).
CONFIDENCE = {
    "fax_tone": 0.96, "beep": 0.99, "cue": 0.99, "short_reply": 0.94, "long_reply": 0.67,
    "long_greeting": 0.85, "greeting_resumed": 0.5, "deadline_speech": 0.5, "deadline_reply": 0.75,
}
CONFIDENCE_HEARD = {"long_greeting": 0.94, "short_reply": 0.98}

_CUE_RE = re.compile(r"[^a-z0-9ñ' ]+")


def _norm(text: str) -> str:
    return " ".join(_CUE_RE.sub(" ", text.lower().replace("’", "'")).split())


def cue_of(text: str) -> str | None:
    """``"ivr"`` / ``"machine"`` when ``text`` holds a menu / greeting cue (menu first), else None."""
    t = _norm(text)
    if any(c in t for c in _IVR_CUES):
        return "ivr"
    if any(c in t for c in _MACHINE_CUES):
        return "machine"
    return None


class AmdDetector:
    """One call's detector (see the module docs for the rules and invariants).

    ``rate`` is the rate of the windows fed (8000 or 16000: 256 or 512 samples per window);
    ``start_pos`` the in16 position of the first window's first sample.
    """

    __slots__ = ("p", "rate", "window", "pos", "t_ms", "verdict", "done", "_hann", "_freqs", "_band",
                 "_floor_e", "_noise_e", "_hang", "_turn_start", "_last_speech", "_turns", "_prev_turn",
                 "_speech_ms", "_tone_hz", "_tone_start", "_tone_n", "_held", "_beep_sent", "_pending")

    def __init__(self, params: AmdParams | None = None, rate: int = 8000, start_pos: int = 0) -> None:
        if rate not in (8000, 16000):
            raise ValueError(f"AMD windows are at 8000 or 16000 Hz, got {rate}")
        self.p = params or AmdParams()
        self.rate = rate
        self.window = rate * WINDOW_MS // 1000
        self.pos = start_pos
        self.t_ms = 0
        self.verdict: AmdVerdict | None = None
        self.done = False
        self._hann = np.hanning(self.window).astype(np.float32)
        self._freqs = np.fft.rfftfreq(self.window, 1.0 / rate)
        lo, hi = np.searchsorted(self._freqs, BEEP_BAND)
        self._band = (int(lo), int(hi))
        full = 32768.0 * 32768.0 * self.window
        self._floor_e = full * 10 ** (FLOOR_DBFS / 10)  # window energy (sum of squares) at the floor
        self._noise_e = -1.0  # tracked noise floor (energy fallback)
        self._hang = 0  # energy fallback: windows of hangover left
        self._turn_start = -1  # ms: start of the turn in progress (or the last one)
        self._last_speech = -1  # ms: end of the last speech window
        self._turns = 0
        self._prev_turn = 0  # ms: length of the turn before the current one
        self._speech_ms = 0
        self._tone_hz = 0.0
        self._tone_start = -1  # ms
        self._tone_n = 0  # windows in the tone run
        self._held = False  # a cadence "machine" waits for menu cues (transcripts)
        self._beep_sent = False
        self._pending: list[AmdEvent] = []

    # -- inputs ----------------------------------------------------------------------------

    def hear(self, text: str) -> list[AmdEvent]:
        """A transcript of the call's audio so far (the local STT's interim or final). A cue
        decides at once when no verdict was made; the verdict is dated to the last window."""
        if self.done or self.verdict is not None:
            return []
        cue = cue_of(text)
        if cue is None:
            return []
        self._decide(cue, "cue")
        return self._flush()

    def expire(self) -> list[AmdEvent]:
        """The caller's own deadline passed (audio stalled): the verdict now, from what was heard."""
        if self.done:
            return []
        if self.verdict is None:
            self._deadline()
        elif not self.done:
            self._end_listen("limit")
        return self._flush()

    def feed(self, window: np.ndarray, prob: float | None = None, tones: np.ndarray | None = None) -> list[AmdEvent]:
        """One VAD window (int16, ``self.window`` samples) and its speech probability;
        ``tones``: the same span before noise suppression (same shape), which the tone tests
        read instead of the window (None: the window is what the line carried).
        Returns the events it produced (usually none)."""
        if self.done:
            return []
        if window.shape != (self.window,) or (tones is not None and tones.shape != (self.window,)):
            shape = window.shape if window.shape != (self.window,) else tones.shape if tones is not None else ()
            raise ValueError(f"AMD windows are {self.window} samples at {self.rate} Hz, got {shape}")
        start_ms = self.t_ms
        self.t_ms += WINDOW_MS
        self.pos += IN16_PER_WINDOW
        x = window.astype(np.float32)
        energy = float(np.dot(x, x))
        if tones is None:
            tx, tone_e = x, energy
        else:
            tx = tones.astype(np.float32)
            tone_e = float(np.dot(tx, tx))
        tonal_hz = self._tonal(tx, tone_e) if tone_e > self._floor_e else 0.0
        speech = self._is_speech(prob, energy) and tonal_hz == 0.0
        self._cadence(speech, start_ms)
        self._tone(tonal_hz, start_ms)
        if self.verdict is None:
            self._rules()
        elif self.p.leave_message and not self.done:
            self._listen()
        return self._flush()

    # -- signals ---------------------------------------------------------------------------

    def _is_speech(self, prob: float | None, energy: float) -> bool:
        if prob is not None and prob == prob and 0.0 <= prob <= 1.0:
            return prob >= self.p.speech_threshold
        # no (usable) probability: energy ENERGY_RATIO (9 dB) above a floor that follows the quietest windows
        e = max(energy, 1.0)
        if self._noise_e < 0:
            self._noise_e = e
        elif e < self._noise_e:
            self._noise_e = e
        else:
            self._noise_e *= 1.02  # drifts up about 2.7 dB per second of louder audio
        if e > max(ENERGY_RATIO * self._noise_e, self._floor_e * 10):
            self._hang = ENERGY_HANG
        elif self._hang:
            self._hang -= 1  # Silero's probability lingers after speech too: bridge the weak tails
        else:
            return False
        return True

    def _tonal(self, x: np.ndarray, energy: float) -> float:
        """The frequency of the window's tone, or 0.0 when it is not tonal."""
        spec = np.fft.rfft(x * self._hann)
        pw = spec.real * spec.real + spec.imag * spec.imag
        total = float(pw[1:].sum())
        if not total > 0.0 or not math.isfinite(total):
            return 0.0
        lo, hi = self._band
        k = lo + int(np.argmax(pw[lo:hi]))
        peak = float(pw[k - 2 : k + 3].sum())
        if peak < self.p.tone_share * total:
            return 0.0
        a, b, c = float(pw[k - 1]), float(pw[k]), float(pw[k + 1])
        den = a - 2 * b + c
        shift = 0.5 * (a - c) / den if den != 0.0 else 0.0
        return float(self._freqs[k]) + max(-0.5, min(0.5, shift)) * (self.rate / self.window)

    def _cadence(self, speech: bool, start_ms: int) -> None:
        if not speech:
            return
        if self._turn_start < 0 or start_ms - self._last_speech >= self.p.human_silence_ms:
            if self._turn_start >= 0:
                self._prev_turn = self._last_speech - self._turn_start
            self._turn_start = start_ms
            self._turns += 1
        self._speech_ms += WINDOW_MS
        self._last_speech = start_ms + WINDOW_MS

    @property
    def _in_turn(self) -> bool:
        """Speech was heard within the last ``human_silence_ms``."""
        return self._last_speech >= 0 and self.t_ms - self._last_speech < self.p.human_silence_ms

    @property
    def _turn(self) -> int:
        """ms: length of the turn in progress (or the last one)."""
        return self._last_speech - self._turn_start if self._turn_start >= 0 else 0

    def _tone(self, hz: float, start_ms: int) -> None:
        if hz > 0.0 and self._tone_n and abs(hz - self._tone_hz) <= TONE_DRIFT_HZ:
            self._tone_n += 1
            self._tone_hz += (hz - self._tone_hz) / self._tone_n
        elif hz > 0.0:
            self._tone_hz, self._tone_start, self._tone_n = hz, start_ms, 1
        else:
            self._tone_n = 0

    # -- decisions -------------------------------------------------------------------------

    def _tone_kind(self) -> str | None:
        """"fax" / "beep" when the tone in progress decides, else None."""
        n_ms = self._tone_n * WINDOW_MS
        if not self._tone_n:
            return None
        hz = self._tone_hz
        if self._speech_ms < 200:
            fax = abs(hz - CNG_HZ) <= FAX_TOL_HZ or abs(hz - CED_HZ) <= FAX_TOL_HZ
            return "fax" if fax and n_ms >= self.p.fax_tone_ms else None
        if n_ms >= self.p.beep_min_ms and BEEP_BAND[0] <= hz <= BEEP_BAND[1]:
            return "beep"
        return None

    def _rules(self) -> None:
        p, t = self.p, self.t_ms
        tone = self._tone_kind()
        if tone == "fax":
            return self._decide("fax", "fax_tone")
        if tone == "beep":
            self._decide("machine", "beep")
            return self._beep()
        if self._held:
            if t >= p.max_wait_ms:
                self._decide("machine", "long_greeting")
            return None
        turn = self._turn
        if self._in_turn:
            if turn >= p.machine_speech_ms:
                return self._machine("long_greeting")
            if self._turns > 1 and self._prev_turn > p.human_max_speech_ms:
                return self._machine("greeting_resumed")
        elif self._turn_start >= 0:
            quiet = t - self._last_speech
            if turn <= p.human_max_speech_ms:
                return self._decide("human", "short_reply")
            if quiet >= p.reply_silence_ms:
                return self._decide("human", "long_reply")
        if t >= p.max_wait_ms:
            self._deadline()
        return None

    def _machine(self, reason: str) -> None:
        if self.p.transcripts and self.t_ms < self.p.max_wait_ms:
            self._held = True  # a menu cue may still come: decide at the deadline
            return
        self._decide("machine", reason)

    def _deadline(self) -> None:
        """The deadline: the best guess from what was heard."""
        if self._held:
            return self._decide("machine", "long_greeting")
        if self._speech_ms == 0:
            return self._decide("uncertain", "deadline")
        if self._in_turn and self._turn > self.p.human_max_speech_ms:
            return self._decide("machine", "deadline_speech")
        if self._turn <= self.p.human_max_speech_ms:
            return self._decide("human", "deadline_reply")
        return self._decide("uncertain", "deadline")

    def _decide(self, kind: str, reason: str) -> None:
        table = CONFIDENCE_HEARD if self.p.transcripts and reason in CONFIDENCE_HEARD else CONFIDENCE
        conf = 0.0 if kind == "uncertain" else table.get(reason, 0.5)
        self.verdict = AmdVerdict(kind=kind, confidence=conf, at_ms=self.t_ms, pos=self.pos, reason=reason)
        self._pending.append(self.verdict)
        if not (self.p.leave_message and kind == "machine") or self._beep_sent:
            self.done = True

    def _beep(self) -> None:
        onset = self._tone_start
        self._pending.append(AmdBeep(onset_ms=onset, onset_pos=self.pos - (self.t_ms - onset) * 16,
                                     freq_hz=round(self._tone_hz, 1), at_ms=self.t_ms))
        self._beep_sent = True
        if self.verdict is not None:
            self.done = True

    def _listen(self) -> None:
        """After a machine verdict (leave_message): the beep, or the greeting's end."""
        if self._tone_kind() == "beep":
            return self._beep()
        if self._last_speech >= 0 and self.t_ms - self._last_speech >= self.p.beep_wait_ms:
            return self._end_listen("no_beep")
        if self.t_ms >= self.p.listen_max_ms:
            self._end_listen("limit")
        return None

    def _end_listen(self, reason: str) -> None:
        end = max(0, self._last_speech)
        self._pending.append(AmdGreetingEnd(end_ms=end, end_pos=self.pos - (self.t_ms - end) * 16,
                                            at_ms=self.t_ms, reason=reason))
        self.done = True

    def _flush(self) -> list[AmdEvent]:
        if not self._pending:
            return []
        out, self._pending = self._pending, []
        return out
