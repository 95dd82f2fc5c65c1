"""Speech-to-speech adapters (OpenAI Realtime, Gemini Live, scripted) behind one contract: :mod:`.base`."""
