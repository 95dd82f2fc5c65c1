"""The Piper voice host: a small subprocess that owns piper-tts (GPL-3.0) and nothing else.

Owns the synthesis loop of the local TTS. It runs as
``python -m workers.piper_host MODEL.onnx CONFIG.json`` under the inference
worker (:mod:`workers.local_tts`), so the GPL library (and the espeak-ng it
embeds for phonemes) never loads into a brisvox process; the worker talks to
it over pipes. Protocol (binary, on stdin/stdout):

* request: one JSON line ``{"text": str, "speed": float}``, optionally with
  ``"noise_scale"`` and ``"noise_w_scale"`` (the voice's sampling noise; 0 makes
  the synthesis deterministic, as the AMD benchmark's set generator needs;
  absent: the voice's own);
* answer: for every sentence a little-endian int32 ``n > 0`` followed by
  ``n`` int16 samples (22,050 Hz mono); then ``0`` (end of the request); or a
  negative ``-k`` followed by ``k`` bytes of a UTF-8 error message (the
  request failed, the host lives on).

The host exits when stdin closes (its worker is gone). onnxruntime runs with
one intra-op and one inter-op thread.
"""

from __future__ import annotations

import json
import os
import struct
import sys


def main() -> int:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    model, config = sys.argv[1], sys.argv[2]
    import onnxruntime as ort
    from piper.config import PiperConfig, SynthesisConfig
    from piper.voice import PiperVoice

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    with open(config, encoding="utf-8") as f:
        cfg = PiperConfig.from_dict(json.load(f))
    voice = PiperVoice(session=ort.InferenceSession(model, sess_options=so, providers=["CPUExecutionProvider"]),
                       config=cfg)
    out = sys.stdout.buffer
    out.write(struct.pack("<i", 0))  # ready
    out.flush()
    for line in sys.stdin.buffer:
        try:
            req = json.loads(line)
            speed = float(req.get("speed") or 1.0)
            syn = SynthesisConfig(length_scale=1.0 / max(0.5, min(2.0, speed)))
            if req.get("noise_scale") is not None:
                syn.noise_scale = max(0.0, min(2.0, float(req["noise_scale"])))
            if req.get("noise_w_scale") is not None:
                syn.noise_w_scale = max(0.0, min(2.0, float(req["noise_w_scale"])))
            for chunk in voice.synthesize(str(req.get("text", "")), syn_config=syn):
                pcm = chunk.audio_int16_bytes
                out.write(struct.pack("<i", len(pcm) // 2))
                out.write(pcm)
                out.flush()
            out.write(struct.pack("<i", 0))
        except Exception as e:  # noqa: BLE001 - one bad request must not end the host
            msg = f"{type(e).__name__}: {e}".encode()[:500]
            out.write(struct.pack("<i", -len(msg)))
            out.write(msg)
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
