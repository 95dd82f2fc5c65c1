"""The worker's sections of ``brisvoxd.toml``: ``[workers]``, ``[vad]``, ``[smart_turn]``, ``[models]``.

Owns their keys, defaults and bounds (docs/CONFIGURATION.md describes them).
Imported by the supervisor when it loads the config (before it forks), so it
imports nothing heavy: numpy and the model code load lazily.

Each class is a frozen dataclass parsed strictly by
:func:`brisvox.config.schema.from_table`: unknown keys and out-of-range values
raise :class:`brisvox.config.errors.ConfigError` naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from brisvox.config.errors import ConfigError
from brisvox.config.schema import from_table, opt

if TYPE_CHECKING:
    from workers.vad import VadParams

RATE = 16_000  # in16 samples per second (positions in the VAD policy are in16 samples)


@dataclass(frozen=True, slots=True)
class WorkersConfig:
    """``[workers]``: the realtime lane and the job lane of every inference worker."""

    tick_ms: int = opt(20, min=5, max=100)
    # a call's input is converted when its next VAD window is complete, or after fresh_ms at the
    # latest (in16 freshness); 0 = every tick
    fresh_ms: int = opt(40, min=0, max=1000)
    max_calls: int = opt(256, min=1, max=4096)
    max_vad_rounds: int = opt(16, min=1, max=128)  # VAD runs per tick when calls catch up
    max_read_ms: int = opt(1000, min=20, max=10_000)  # audio converted per call per tick, at most
    vad_threads: int = opt(1, min=1, max=16)  # onnxruntime intra-op threads of the Silero session
    job_threads: int = opt(1, min=1, max=16)
    job_queue: int = opt(32, min=1, max=4096)  # per job thread
    job_timeout_ms: int = opt(1000, min=10, max=600_000)
    orphan_timeout_s: float = opt(10.0, min=0.5, max=3600.0)  # detach calls of an unreachable subscriber

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> WorkersConfig:
        return from_table(cls, table, where)


@dataclass(frozen=True, slots=True)
class VadConfig:
    """``[vad]``: default VAD parameters (an AttachCall may override the first four)
    and the fail-open policy."""

    threshold: float = opt(0.5, min=0.01, max=0.99)
    neg_threshold: float = opt(-1.0, min=-1.0, max=0.99)  # < 0: threshold - 0.15
    min_speech_ms: int = opt(96, min=0, max=5000)
    min_silence_ms: int = opt(200, min=32, max=10_000)
    fall_delay_ms: int = opt(0, min=0, max=10_000)  # > 0: "falling" events for early Smart Turn
    max_consecutive_failures: int = opt(5, min=1, max=10_000)
    failure_window_ms: int = opt(1000, min=0, max=600_000)
    recovery_interval_ms: int = opt(5000, min=0, max=3_600_000)  # 0 disables recovery probes
    refine_boundaries: bool = True  # sharpen start/stop positions with the signal's energy
    # 8 kHz calls (telephony): Silero's native 8 kHz mode on the `in` samples (about 40 % less CPU per
    # window; the audio is band-limited to 4 kHz anyway) instead of the 16 kHz model on in16
    native_8k: bool = True

    def __post_init__(self) -> None:
        try:
            self.params()
        except ValueError as e:  # the cross-key checks; bounds were checked per key
            raise ConfigError(str(e).split(" ", 1)[0], str(e)) from None

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> VadConfig:
        return from_table(cls, table, where)

    def params(self) -> VadParams:
        from workers.vad import VadParams

        return VadParams(self.threshold, self.neg_threshold, self.min_speech_ms, self.min_silence_ms,
                         self.fall_delay_ms)

    @property
    def failure_window(self) -> int:
        return self.failure_window_ms * RATE // 1000

    @property
    def recovery_interval(self) -> int:
        return self.recovery_interval_ms * RATE // 1000


@dataclass(frozen=True, slots=True)
class SmartTurnConfig:
    """``[smart_turn]``: the end-of-turn model on the job lane."""

    enabled: bool = True
    threads: int = opt(1, min=1, max=16)  # onnxruntime intra-op threads per analysis
    # time the candidate files at boot (cached per host in the models dir) and load the cheapest;
    # false: the float32-softmax file when verified, else the original
    select: bool = True

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> SmartTurnConfig:
        return from_table(cls, table, where)


@dataclass(frozen=True, slots=True)
class ModelsConfig:
    """``[models]``: where model files live ("" = the default models directory)."""

    dir: str = ""

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> ModelsConfig:
        return from_table(cls, table, where)
