/**
 * @brisvox/agent: the service side of the brisvox agent protocol (docs/AGENT_PROTOCOL.md, v1).
 * brisvox dials the service, one WebSocket per call, with a signed handshake.
 */
export { Agent, type AgentOptions, type ToolSpec } from "./agent.js";
export { DIAL_TIMEOUT_MS, Session, ToolContext } from "./session.js";
export type {
  CallEvent,
  CallInfo,
  CloseInfo,
  DialOptions,
  Dialed,
  HangupEvent,
  ProtocolErrorInfo,
  ReadyInfo,
  ToolOutcomeEvent,
  TurnEvent,
} from "./session.js";
export type { LocalEventMap, LocalEventName, Logger, SessionDecision, SessionHook, ToolHandler } from "./connection.js";
export { AgentError, CommandError, CommandRefused, CommandTimeout, NotLive, Refuse, ToolError } from "./errors.js";
export { NonceCache, REFUSALS, signHandshake, verifyHandshake } from "./auth.js";
export {
  CALL_EVENTS,
  DEFAULT_LIMITS,
  PROTOCOL_VERSION,
  ToolKind,
  type CallEventName,
  type ErrorCode,
  type JsonSchema,
  type Limits,
} from "./protocol.js";
export { WEBHOOK_SIGNATURE_HEADER, WebhookError, verifyWebhook, type WebhookEvent } from "./webhooks.js";
