"""The agent link: remote tools, events and commands of an agent service (docs/AGENT_PROTOCOL.md).

* :mod:`.config`: the agent file's ``[agent_link]`` and its offline check.
* :mod:`.messages`: the protocol's frames (parsed, bounded, built), the declarations'
  checks, the handshake signature.
* :mod:`.state`: the pure state (phases, waiting calls, narrowing, the command rate).
* :mod:`.client`: :class:`~brisvox.agent.link.client.AgentLink`, one call's WebSocket.
* :mod:`.build`: the link opened for a call before its actor starts.
"""
