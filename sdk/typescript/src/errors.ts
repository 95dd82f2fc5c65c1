/** The base of every error this package throws on purpose. */
export class AgentError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "AgentError";
  }
}

/** Throw a ToolError from a tool: `ok:false` with exactly this message (bounded), meant for the model. */
export class ToolError extends AgentError {
  constructor(message: string) {
    super(message);
    this.name = "ToolError";
  }
}

/** Refuse a session from an `onSession` hook: throw it, or return it. */
export class Refuse extends AgentError {
  readonly reason: string;
  constructor(reason: string) {
    super(reason);
    this.name = "Refuse";
    this.reason = reason;
  }
}

/** A command that brisvox refused (`command.ack` with `ok: false`), that timed out, or that could not be sent. */
export class CommandError extends AgentError {
  /** The command's name: say, note, transfer, end_call, tools.set. */
  readonly command: string;
  /** brisvox's `error` text, or `timeout`, `not_live`, `too_long`, `invalid_tool`, `too_many_pending`. */
  readonly error: string;
  /** The command's id (absent when it never left the SDK). */
  readonly id: string | undefined;
  constructor(command: string, error: string, id?: string) {
    super(`${command} refused: ${error}`);
    this.name = "CommandError";
    this.command = command;
    this.error = error;
    this.id = id;
  }
}

/** brisvox answered `command.ack` with `ok: false`. */
export class CommandRefused extends CommandError {
  constructor(command: string, error: string, id?: string) {
    super(command, error, id);
    this.name = "CommandRefused";
  }
}

/** No `command.ack` within the bound (or the session was not ready in time). */
export class CommandTimeout extends CommandError {
  constructor(command: string, error: string, id?: string) {
    super(command, error, id);
    this.name = "CommandTimeout";
  }
}

/** The session is not live: refused, or its connection closed. */
export class NotLive extends CommandError {
  constructor(command: string, error = "not_live", id?: string) {
    super(command, error, id);
    this.name = "NotLive";
  }
}

/** Cuts a string to at most `maxBytes` UTF-8 bytes, on a character boundary, marking the cut with "…". */
export function boundUtf8(text: string, maxBytes: number): string {
  const bytes = Buffer.from(text, "utf8");
  if (bytes.length <= maxBytes) return text;
  let end = Math.max(0, maxBytes - 3);
  while (end > 0 && ((bytes[end] as number) & 0xc0) === 0x80) end--;
  return bytes.subarray(0, end).toString("utf8") + "…";
}
