"""Conversation flows: nodes, transitions, actions (docs/FLOWS.md)."""
