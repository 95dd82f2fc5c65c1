"""The cascaded chain's stages: STT, the turn driver and its machines, the segmenter, TTS and the keypad."""
