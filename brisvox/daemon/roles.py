"""Which function runs each child role: ``role -> "module:function"``.

A role main is ``main(rt: ChildRuntime) -> int`` (the exit code). Imported
lazily in the forked child, so the supervisor never imports numpy, ONNX or
ZeroMQ-using role code before it forks.
"""

ROLE_MAINS: dict[str, str] = {
    "gateway": "brisvox.gateway.process:main",
    "worker": "workers.process:main",
    "agent": "brisvox.agent.host.process:main",
    "outbound": "brisvox.outbound.process:main",  # 0 or 1 child: when webhooks (or campaigns) are configured
}
