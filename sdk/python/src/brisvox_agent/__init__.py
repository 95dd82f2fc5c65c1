"""brisvox-agent: the service side of the brisvox agent protocol (docs/AGENT_PROTOCOL.md).

```python
from brisvox_agent import Agent

agent = Agent(secret_env="BRISVOX_AGENT_SECRET", port=9100)

@agent.tool(kind="read_only")
async def check_availability(ctx, date: str, time: str, people: int) -> dict:
    "Whether a table is free."
    return {"free_tables": 3}

asyncio.run(agent.serve())
```
"""

from ._auth import SESSION_HEADER, SIGNATURE_HEADER, NonceCache, sign, verify
from .agent import Agent
from .errors import (
    AgentError,
    CommandError,
    CommandRefused,
    CommandTimeout,
    NotLive,
    Refuse,
    ToolError,
)
from .session import EVENTS, MAX_FRAME_BYTES, PROTOCOL_VERSION, Dialed, Event, Session
from .tools import CallInfo, Kind, Tool, ToolContext
from .webhooks import WEBHOOK_SIGNATURE_HEADER, WebhookError, verify_webhook

__version__ = "0.1.0"

__all__ = [
    "EVENTS",
    "MAX_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "SESSION_HEADER",
    "SIGNATURE_HEADER",
    "WEBHOOK_SIGNATURE_HEADER",
    "Agent",
    "AgentError",
    "CallInfo",
    "CommandError",
    "CommandRefused",
    "CommandTimeout",
    "Dialed",
    "Event",
    "Kind",
    "NonceCache",
    "NotLive",
    "Refuse",
    "Session",
    "Tool",
    "ToolContext",
    "ToolError",
    "WebhookError",
    "__version__",
    "sign",
    "verify",
    "verify_webhook",
]
