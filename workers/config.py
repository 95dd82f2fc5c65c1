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
from typing import TYPE_CHECKING, Any

from pydantic import Field

from brisvox.config.errors import ConfigError
from brisvox.config.schema import from_table, section

if TYPE_CHECKING:
    from workers.vad import VadParams

RATE = 16_000  # in16 samples per second (positions in the VAD policy are in16 samples)


@section
class WorkersConfig:
    """``[workers]``: the realtime lane and the job lane of every inference worker."""

    tick_ms: int = Field(default=20, ge=5, le=100)
    # a call's input is converted when its next VAD window is complete, or after fresh_ms at the
    # latest (in16 freshness); 0 = every tick
    fresh_ms: int = Field(default=40, ge=0, le=1000)
    max_calls: int = Field(default=256, ge=1, le=4096)
    max_vad_rounds: int = Field(default=16, ge=1, le=128)  # VAD runs per tick when calls catch up
    max_read_ms: int = Field(default=1000, ge=20, le=10_000)  # audio converted per call per tick, at most
    vad_threads: int = Field(default=1, ge=1, le=16)  # onnxruntime intra-op threads of the Silero session
    job_threads: int = Field(default=1, ge=1, le=16)
    job_queue: int = Field(default=32, ge=1, le=4096)  # per job thread
    job_timeout_ms: int = Field(default=1000, ge=10, le=600_000)
    # the job threads (Smart Turn, local models) run this much nicer than the tick thread and the
    # other roles (0: the same priority): a model run never holds a core the media paths want
    job_nice: int = Field(default=10, ge=0, le=19)
    # the local LLM's threads for a generation when the host left that many cores idle since the
    # previous one (workers/local_llm.py, SpareCores); else one. 1: always one
    llm_threads: int = Field(default=2, ge=1, le=16)
    orphan_timeout_s: float = Field(default=10.0, ge=0.5, le=3600.0)  # detach calls of an unreachable subscriber

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> WorkersConfig:
        return from_table(cls, table, where)


@section
class VadConfig:
    """``[vad]``: default VAD parameters (an AttachCall may override the first four)
    and the fail-open policy."""

    threshold: float = Field(default=0.5, ge=0.01, le=0.99)
    neg_threshold: float = Field(default=-1.0, ge=-1.0, le=0.99)  # < 0: threshold - 0.15
    min_speech_ms: int = Field(default=96, ge=0, le=5000)
    min_silence_ms: int = Field(default=200, ge=32, le=10_000)
    fall_delay_ms: int = Field(default=0, ge=0, le=10_000)  # > 0: "falling" events for early Smart Turn
    max_consecutive_failures: int = Field(default=5, ge=1, le=10_000)
    failure_window_ms: int = Field(default=1000, ge=0, le=600_000)
    recovery_interval_ms: int = Field(default=5000, ge=0, le=3_600_000)  # 0 disables recovery probes
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


@section
class SmartTurnConfig:
    """``[smart_turn]``: the end-of-turn model on the job lane."""

    enabled: bool = True
    threads: int = Field(default=1, ge=1, le=16)  # onnxruntime intra-op threads per analysis
    # time the candidate files at boot (cached per host in the models dir) and load the cheapest;
    # false: the float32-softmax file when verified, else the original
    select: bool = True

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> SmartTurnConfig:
        return from_table(cls, table, where)


@section
class ModelsConfig:
    """``[models]``: where model files live ("" = the default models directory)."""

    dir: str = ""

    @classmethod
    def from_section(cls, table: Mapping[str, Any], where: str) -> ModelsConfig:
        return from_table(cls, table, where)
