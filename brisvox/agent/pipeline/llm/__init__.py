"""The LLM runner: its model round, tool phase, flow hook, policy, turn state, observer and summarizer."""
