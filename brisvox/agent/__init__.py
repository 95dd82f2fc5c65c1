"""The agent: the per-call voice pipeline and the process that hosts it.

In data-flow order: :mod:`.pipeline` (the stages a call's audio and text pass
through), :mod:`.conversation` (what the call remembers: the context, what
the caller heard, the LLM request and response), :mod:`.tool_engine` (tool
calling) and :mod:`.host` (the agent process, which builds, runs and records
the calls). :mod:`.definition` is the agent file a call is built from.
"""
