"""Speculative LLM starts: the hit rule and counters, the runner's speculator, the turn driver's offers."""
