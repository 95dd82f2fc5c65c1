/**
 * The wire contract of docs/AGENT_PROTOCOL.md (version 1): constants, limits and the
 * shapes of the frames the service side reads and writes.
 */

export const PROTOCOL_VERSION = 1;

/** The protocol's limits, and the SDK's own timers. Tests may shrink them. */
export interface Limits {
  /** A frame is at most 1 MiB; a bigger one is answered `error` `too_large`. */
  maxFrameBytes: number;
  /** Frames above this close the socket (1009) before they are buffered: a memory guard. */
  hardMaxFrameBytes: number;
  /** At most 64 tools declared per session. */
  maxTools: number;
  /** At most 32 tool calls owed a result per session; the 33rd is answered ok:false at once. */
  maxConcurrentCalls: number;
  /** Handlers still running (owed or cancelled but not yet returned); beyond it a call is answered busy. */
  maxRunningHandlers: number;
  /** A `say` text is at most 1,000 characters. */
  maxSayChars: number;
  /** A declaration's timeout_ms is 1..30000. */
  maxTimeoutMs: number;
  /** A failed tool's message is cut to this many UTF-8 bytes (the engine's `detail` bound). */
  maxErrorBytes: number;
  /** The signed handshake's `t` may be at most this far from our clock (its nonce is remembered this long). */
  signatureWindowS: number;
  /** At most this many nonces of accepted handshakes are remembered; beyond, a handshake gets 503. */
  maxNonces: number;
  /** WebSocket ping interval. */
  pingIntervalMs: number;
  /** A peer silent (no frame, no pong) this long is down: the socket is terminated. */
  deadAfterMs: number;
  /** The first frame (`session.offer`) must arrive within this. */
  offerTimeoutMs: number;
  /** Every `onSession` hook together must decide within this (brisvox waits 5 s for the answer). */
  sessionHookTimeoutMs: number;
  /** A command waits this long for its `command.ack`. */
  commandTimeoutMs: number;
  /** At most this many commands waiting for their ack per session. */
  maxPendingCommands: number;
  /** A dropped (not hung up) session is kept this long for a re-dial (`resume: true`). */
  resumeGraceMs: number;
}

export const DEFAULT_LIMITS: Readonly<Limits> = Object.freeze({
  maxFrameBytes: 1024 * 1024,
  hardMaxFrameBytes: 8 * 1024 * 1024,
  maxTools: 64,
  maxConcurrentCalls: 32,
  maxRunningHandlers: 64,
  maxSayChars: 1000,
  maxTimeoutMs: 30_000,
  maxErrorBytes: 512,
  signatureWindowS: 30,
  maxNonces: 65_536,
  pingIntervalMs: 10_000,
  deadAfterMs: 30_000,
  offerTimeoutMs: 10_000,
  sessionHookTimeoutMs: 4_000,
  commandTimeoutMs: 5_000,
  maxPendingCommands: 64,
  resumeGraceMs: 60_000,
});

/** ReadOnly changes nothing (may run speculatively, is cancelled at a barge-in); SideEffect changes the world. */
export type ToolKind = "read_only" | "side_effect";
export const ToolKind = Object.freeze({ ReadOnly: "read_only", SideEffect: "side_effect" } as const);

/** The call events a service may subscribe to. */
export type CallEventName = "user_turn" | "bot_turn" | "tool_outcome" | "hangup";
export const CALL_EVENTS: readonly CallEventName[] = Object.freeze(["user_turn", "bot_turn", "tool_outcome", "hangup"]);

/** The `code` of an `error` frame. */
export type ErrorCode =
  | "bad_message"
  | "too_large"
  | "unknown_type"
  | "unknown_id"
  | "late"
  | "invalid_tool"
  | "rate_limited"
  | "not_live";

/** The header names of the signed handshake. */
export const SIGNATURE_HEADER = "x-brisvox-signature";
export const SESSION_HEADER = "x-brisvox-session";

/** A tool name: 1 to 64 ASCII letters, digits, `_` or `-` (docs/TOOLS.md). */
export const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;
export const RESERVED_TOOL_NAMES: ReadonlySet<string> = new Set(["confirm_pending"]);

/** A JSON Schema (draft 2020-12) with `"type": "object"`; brisvox validates arguments against it. */
export type JsonSchema = { type: "object" } & Record<string, unknown>;

/** One tool declaration as it goes on the wire in `session.accept`. */
export interface WireToolDeclaration {
  name: string;
  description: string;
  parameters: JsonSchema;
  kind: ToolKind;
  timeout_ms: number;
  filler_after_ms: number | null;
  repeatable: boolean;
  confirm: boolean;
}

/** Any frame: a JSON object with a string `type`. */
export type Frame = { type: string } & Record<string, unknown>;
