"""A call's webhook events, handed to the outbox writer (docs/PROTOCOL.md "Webhooks").

Owns :class:`HookRoutes` (which endpoints get which event: the daemon's ``[[webhooks]]``
and the call's agent file's, each filtered by its ``events``) and :class:`CallHooks`,
made by the agent process for each call that has at least one endpoint. The events:

* ``call.started`` ``{call_id, agent, transport, transport_ids, call, started, media}``:
  when the actor starts;
* ``call.answered`` ``{call_id, agent, answered_at, amd}``: once, when the call's media is
  ``answered`` (at the start for an inbound call, at the far end's answer for a dialled
  one); ``amd``: the answering-machine verdict (null when no detection ran). A call whose
  answering-machine detection runs (``expect_amd``) sends it when :meth:`CallHooks.amd`
  gives the verdict, with the time of the answer; a call that ends before the verdict
  sends it (``amd`` null) just before its ``call.ended``;
* ``tool.called`` ``{call_id, agent, epoch, tool_call_id, tool, outcome}``: one tool call's
  outcome, as recorded (never its arguments or result), of a cascaded call (its runner's
  observer) or a speech-to-speech one (its stage's tool phase);
* ``call.ended`` ``{call_id, agent, reason, record, recording}``: at the hang-up, with
  the call record (:mod:`~brisvox.agent.host.call_record`: transcript, tools, latencies)
  and the recording's file name (null when the call was not recorded).

Invariants: nothing here blocks or raises into the call (:meth:`OutboxWriter.submit
<brisvox.outbound.webhooks.writer.OutboxWriter.submit>` never blocks; an event over the
body limit is counted in ``too_large`` and dropped); ``call.answered`` is sent at most
once per call; the tap passes every observer call through to the one the call already had.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from brisvox.outbound.webhooks.config import DAEMON_SCOPE, WebhookSettings, agent_scope
from brisvox.outbound.webhooks.events import make_event
from brisvox.outbound.webhooks.outbox import Target

if TYPE_CHECKING:
    from brisvox.agent.conversation.context import Context, Message
    from brisvox.agent.pipeline.llm.observer import CallObserver
    from brisvox.agent.tool_engine.registry import ToolSpec
    from brisvox.outbound.webhooks.writer import OutboxWriter

log = logging.getLogger("brisvox.agent.call_hooks")


class HookRoutes:
    """The endpoints of the daemon's ``[[webhooks]]``, and per agent file its own."""

    def __init__(self, daemon_hooks: Sequence[WebhookSettings]) -> None:
        self.daemon = tuple(daemon_hooks)

    def targets(self, agent: str, agent_hooks: Sequence[WebhookSettings]) -> dict[str, tuple[Target, ...]]:
        """Event type -> the endpoints that get it, for a call of the agent file ``agent``."""
        out: dict[str, list[Target]] = {}
        for scope, hooks in ((DAEMON_SCOPE, self.daemon), (agent_scope(agent), agent_hooks)):
            for h in hooks:
                for ev in h.events:
                    out.setdefault(ev, []).append(Target(scope, h.url))
        return {k: tuple(v) for k, v in out.items()}


class CallHooks:
    """One call's webhook events (see the module docstring)."""

    def __init__(self, writer: OutboxWriter, targets: dict[str, tuple[Target, ...]], call_id: str,
                 agent: str, expect_amd: bool = False) -> None:
        self.writer = writer
        self.targets = targets
        self.call_id = call_id
        self.agent = agent
        self.expect_amd = expect_amd  # answering-machine detection runs: call.answered waits for its verdict
        self.answered_at: float | None = None
        self.answered_sent = False
        self.sent = 0
        self.too_large = 0
        self.tap: _HookTap | None = None

    def emit(self, type_: str, **data: Any) -> None:
        targets = self.targets.get(type_)
        if not targets:
            return
        try:
            event = make_event(type_, {"call_id": self.call_id, "agent": self.agent, **data})
        except (ValueError, TypeError) as e:
            self.too_large += 1
            log.warning("call %s: %s webhook event not sent: %s", self.call_id, type_, str(e)[:200])
            return
        if self.writer.submit(event, targets):
            self.sent += 1

    def install(self, actor: Any) -> None:
        """Tap the actor for tool outcomes: a cascaded call's runner (after the agent link bound
        itself), a speech-to-speech call's stage tools (:class:`~brisvox.agent.pipeline.s2s.tools.S2sTools`)."""
        if "tool.called" not in self.targets:
            return
        runner = getattr(actor, "runner", None)
        if runner is not None and hasattr(runner, "observer"):
            self.tap = runner.observer = _HookTap(runner.observer, self)
        tools = getattr(getattr(actor, "s2s", None), "tools", None)
        if tools is not None and hasattr(tools, "on_outcome"):
            tools.on_outcome = self.tool_called

    def tool_called(self, epoch: int, call_id: str, tool: str, outcome: str) -> None:
        self.emit("tool.called", epoch=epoch, tool_call_id=call_id[:128], tool=tool[:64], outcome=outcome[:64])

    def started(self, actor: Any) -> None:
        info = actor.call_info.record()
        self.emit("call.started", transport=actor.transport, transport_ids=dict(actor.transport_ids), call=info,
                  started=round(actor.started_wall, 3), media=actor.media.state)
        if actor.media.state == "answered":
            self.answered()

    def on_media(self, state: str, amd: Any = None) -> None:
        if state == "answered":
            self.answered(amd)

    def answered(self, amd: Any = None) -> None:
        """The call is answered: ``call.answered`` now, or (``expect_amd``) at the verdict."""
        if self.answered_at is None:
            self.answered_at = time.time()
        if not self.expect_amd or amd is not None:
            self._send_answered(amd)

    def amd(self, verdict: Any) -> None:
        """The answering-machine verdict (JSON-serialisable): sends the waiting ``call.answered``."""
        if self.answered_at is None:
            self.answered_at = time.time()
        self._send_answered(verdict)

    def _send_answered(self, amd: Any) -> None:
        if self.answered_sent:
            return
        self.answered_sent = True
        self.emit("call.answered", answered_at=round(self.answered_at or time.time(), 3), amd=amd)

    def ended(self, record: dict[str, Any], recording_file: str | None) -> None:
        if self.answered_at is not None and not self.answered_sent:  # the verdict never came
            self._send_answered(None)
        self.emit("call.ended", reason=record.get("end_reason", ""), record=record, recording=recording_file)

    def stats(self) -> dict[str, int]:
        return {"sent": self.sent, "too_large": self.too_large}


class _HookTap:
    """A :class:`~brisvox.agent.pipeline.llm.observer.CallObserver` that passes every call to
    ``inner`` (the agent link's, or None: then the runner's defaults) and sends ``tool.called``."""

    def __init__(self, inner: CallObserver | None, hooks: CallHooks) -> None:
        self.inner = inner
        self.hooks = hooks

    def on_user_turn(self, epoch: int, text: str) -> None:
        if self.inner is not None:
            self.inner.on_user_turn(epoch, text)

    def on_settled(self, ctx: Context) -> list[Message]:
        return self.inner.on_settled(ctx) if self.inner is not None else []

    def on_tool_outcome(self, epoch: int, call_id: str, tool: str, outcome: str) -> None:
        if self.inner is not None:
            self.inner.on_tool_outcome(epoch, call_id, tool, outcome)
        self.hooks.tool_called(epoch, call_id, tool, outcome)

    def offered(self, specs: list[ToolSpec]) -> list[ToolSpec]:
        return specs if self.inner is None else self.inner.offered(specs)

    def screened(self, name: str) -> bool:
        return self.inner is not None and self.inner.screened(name)
