"""The speech-to-speech chain: its stage, machine, audio, tools and cascaded fallback."""
