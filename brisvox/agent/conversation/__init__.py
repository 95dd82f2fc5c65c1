"""What a call remembers, and the seam to the LLM.

The context (``context``: messages, tool-call ids, ordering rules), what the
caller heard (``playout``: the PlayoutBook) and how a barge-in cuts the context
to it (``truncation``), the per-turn latency marks (``timeline``), the LLM
request built from the context (``request``), the streamed response
assembled back into text and tool calls (``assemble``) and the error bodies of
tool results (``tool_errors``). The tool engine is above it: nothing here
imports :mod:`brisvox.agent.tool_engine`.
"""
