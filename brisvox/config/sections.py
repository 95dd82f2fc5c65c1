"""Which parser owns each section of ``brisvoxd.toml``: ``section -> "module:Class"``.

Each class is a frozen dataclass with ``from_section(table: dict, where: str)``
that validates its keys and raises ``brisvox.config.errors.ConfigError``
naming the offending key (``where`` is the dotted path, e.g. ``gateway.sip``).
A section missing from the file gets the class defaults.
"""

SECTION_PARSERS: dict[str, str] = {
    "workers": "workers.config:WorkersConfig",
    "vad": "workers.config:VadConfig",
    "smart_turn": "workers.config:SmartTurnConfig",
    "models": "workers.config:ModelsConfig",
    "gateway": "brisvox.gateway.config:GatewayConfig",
    "sip": "brisvox.gateway.config:SipConfig",
    "websocket": "brisvox.gateway.config:WebSocketConfig",
    "audiosocket": "brisvox.gateway.config:AudioSocketConfig",
    "agents": "brisvox.agent.host.config:AgentsConfig",
    "calls": "brisvox.agent.host.config:CallsConfig",
    "tracing": "brisvox.agent.host.tracing:TracingConfig",
    "webhooks": "brisvox.outbound.webhooks.config:WebhooksConfig",  # [[webhooks]]: an array of tables
    "campaigns": "brisvox.outbound.campaign.config:CampaignsConfig",
}
