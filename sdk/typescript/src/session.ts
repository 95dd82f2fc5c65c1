import { CommandError, CommandRefused, CommandTimeout, NotLive } from "./errors.js";
import type { Limits } from "./protocol.js";

/** The call's metadata from `session.offer`. */
export interface CallInfo {
  /** brisvox's call id. */
  callId: string;
  /** The agent file's name. */
  agent: string;
  /** `sip`, `twilio`, `native`, ... */
  transport: string;
  /** The caller's number (SIP From, Twilio `from`, native `caller`), when known. */
  caller: string | null;
  /** The number called (SIP To, Twilio `to`, native `called`), when known. */
  called: string | null;
  /** Custom parameters (Twilio `customParameters`, native `start` parameters). */
  params: Record<string, unknown>;
}

/** `session.ready`: what brisvox registered of the declarations. */
export interface ReadyInfo {
  tools: string[];
  refused: { name: string; error: string }[];
}

export interface TurnEvent {
  name: "user_turn" | "bot_turn";
  epoch: number;
  /** user_turn: the final text; bot_turn: the text as heard (cut at a barge-in). */
  text: string;
  raw: Record<string, unknown>;
}

export interface ToolOutcomeEvent {
  name: "tool_outcome";
  callId: string;
  tool: string;
  /** `ok`, `error`, `timeout`, `unknown`, ... as brisvox records it. */
  outcome: string;
  raw: Record<string, unknown>;
}

export interface HangupEvent {
  name: "hangup";
  reason: string;
  raw: Record<string, unknown>;
}

export type CallEvent = TurnEvent | ToolOutcomeEvent | HangupEvent;

/** An `error` frame brisvox sent us (something we sent was refused). */
export interface ProtocolErrorInfo {
  code: string;
  message: string;
  ref: string | null;
}

export interface CloseInfo {
  code: number;
  reason: string;
}

/** What a Session needs from its connection (internal). */
export interface SessionLink {
  send(frame: Record<string, unknown>): boolean;
  readonly open: boolean;
  close(code: number, reason: string): void;
}

/** A call brisvox placed for the service (`dial`): over SIP the new call's `callId` (answered)
 * and its signalling times in ms after the INVITE (`ringingAtMs`: the first 18x, `progressAtMs`:
 * the first 18x with early media, `answeredAtMs`: the 200; null when the callee never sent it),
 * through Twilio its `callSid` and Twilio's `status` (queued). */
export interface Dialed {
  via: "sip" | "twilio";
  callId: string;
  callSid: string;
  status: string;
  ringingAtMs: number | null;
  progressAtMs: number | null;
  answeredAtMs: number | null;
}

export interface DialOptions {
  /** The agent that runs the new call (default: brisvox's). */
  agent?: string;
  /** `sip` (default) or `twilio`. */
  via?: "sip" | "twilio";
  /** Over SIP: the `[[sip.trunks]]` entry to dial through (default: brisvox's `[sip] trunk`). */
  trunk?: string;
  /** How long to wait for the ack (default 110 s: a SIP dial is acked once answered). */
  timeoutMs?: number;
}

/** A SIP dial is acked once the callee answered: brisvox waits up to 100 s. */
export const DIAL_TIMEOUT_MS = 110_000;

interface Pending {
  command: string;
  resolve: (ack: Record<string, unknown>) => void;
  reject: (err: CommandError) => void;
  timer: NodeJS.Timeout;
}

/**
 * One call's session: its metadata and the commands the service may send into the call.
 * A re-dial of the same session (`resume: true`) within the agent's resume grace gets
 * the same Session object back (its `state` survives; `resumed` turns true).
 */
export class Session {
  /** The session id (X-Brisvox-Session, `session.offer`'s `session`). */
  readonly id: string;
  readonly call: CallInfo;
  /** True once the session was re-dialled after its connection dropped. */
  resumed: boolean;
  /** The names of the agent file's own tools (a remote tool must not collide with them). */
  readonly localTools: readonly string[];
  /** Free storage for the service's own per-session state (kept across a re-dial). */
  readonly state = new Map<string, unknown>();
  /** The tool names declared in the last `session.accept`. */
  declared: readonly string[] = [];
  /** `session.ready`: what brisvox registered and refused (null until it arrives). */
  ready: ReadyInfo | null = null;
  /** The names last sent with `tools.set` (null: all declared tools are offered). */
  offered: readonly string[] | null = null;
  /** The call hung up (a `hangup` event came): no re-dial will follow. */
  hungUp = false;
  hangupReason: string | null = null;

  private link: SessionLink;
  private readonly limits: Limits;
  private readonly pending = new Map<string, Pending>();
  private readyWaiters = new Set<(ok: boolean) => void>();
  private seq = 0;
  private ended = false;

  /** @internal */
  constructor(id: string, call: CallInfo, resumed: boolean, localTools: string[], link: SessionLink, limits: Limits) {
    this.id = id;
    this.call = call;
    this.resumed = resumed;
    this.localTools = Object.freeze([...localTools]);
    this.link = link;
    this.limits = limits;
  }

  /** Ready (`session.ready` came) and its socket open: commands go out at once. */
  get live(): boolean {
    return this.ready !== null && !this.ended && this.link.open;
  }

  /** Say a line into the call (at most 1,000 characters). Resolves at brisvox's ack. */
  say(text: string): Promise<void> {
    if (typeof text !== "string" || text.length === 0) return Promise.reject(new CommandError("say", "empty text"));
    if ([...text].length > this.limits.maxSayChars) {
      return Promise.reject(new CommandError("say", `too_long: over ${this.limits.maxSayChars} characters`));
    }
    return this.command("say", { text }).then(() => undefined);
  }

  /** Add a system note to the model's context. */
  note(text: string): Promise<void> {
    if (typeof text !== "string" || text.length === 0) return Promise.reject(new CommandError("note", "empty text"));
    return this.command("note", { text }).then(() => undefined);
  }

  /** Transfer the call to one of the agent file's transfer targets. */
  transfer(target: string): Promise<void> {
    if (typeof target !== "string" || target.length === 0) return Promise.reject(new CommandError("transfer", "empty target"));
    if (target.length > 256) return Promise.reject(new CommandError("transfer", "too_long: a target is at most 256 characters"));
    return this.command("transfer", { target }).then(() => undefined);
  }

  /** End the call. */
  endCall(reason = "done"): Promise<void> {
    if (typeof reason !== "string" || reason.length > 200) return Promise.reject(new CommandError("end_call", "too_long: a reason is at most 200 characters"));
    return this.command("end_call", { reason }).then(() => undefined);
  }

  /**
   * Have brisvox place a NEW outbound call (the agent file's `[agent_link] allow_dial` and
   * `dial_targets` must allow the target). Resolves once the callee answered (SIP) or Twilio
   * queued the call; rejects with CommandRefused and brisvox's reason (`busy`, ...).
   */
  async dial(target: string, options: DialOptions = {}): Promise<Dialed> {
    if (typeof target !== "string" || target.length === 0 || target.length > 256) {
      throw new CommandError("dial", "the target must be 1..256 characters");
    }
    const via = options.via ?? "sip";
    if (via !== "sip" && via !== "twilio") throw new CommandError("dial", "via must be sip or twilio");
    const fields: Record<string, unknown> = { target, via };
    if (options.agent) fields.agent = options.agent;
    if (options.trunk) {
      if (via !== "sip" || options.trunk.length > 32) {
        throw new CommandError("dial", "a trunk (at most 32 characters) is dialled via sip");
      }
      fields.trunk = options.trunk;
    }
    const ack = await this.command("dial", fields, options.timeoutMs ?? DIAL_TIMEOUT_MS);
    const text = (k: string): string => (typeof ack[k] === "string" ? (ack[k] as string) : "");
    const ms = (k: string): number | null => {
      const v = ack[k];
      return typeof v === "number" && Number.isInteger(v) && v >= 0 ? v : null;
    };
    return {
      via: text("via") === "twilio" ? "twilio" : via, callId: text("call_id"), callSid: text("call_sid"), status: text("status"),
      ringingAtMs: ms("ringing_at_ms"), progressAtMs: ms("progress_at_ms"), answeredAtMs: ms("answered_at_ms"),
    };
  }

  /**
   * Narrow the tools offered to the model from its next response on (`tools.set`).
   * The names must be declared in this session (and registered, once `session.ready`
   * came); otherwise it rejects with `invalid_tool` and sends nothing. The protocol has
   * no ack for `tools.set`: it resolves once the frame is sent (a refusal by brisvox
   * arrives as an `error` event). A re-dial sends the narrowing again.
   */
  setTools(names: readonly string[]): Promise<void> {
    if (!Array.isArray(names) || names.some((n) => typeof n !== "string")) {
      return Promise.reject(new CommandError("tools.set", "invalid_tool: names must be strings"));
    }
    const known = new Set(this.ready ? this.ready.tools : this.declared);
    const bad = names.filter((n) => !known.has(n));
    if (bad.length > 0) return Promise.reject(new CommandError("tools.set", `invalid_tool: ${bad.join(", ")}`));
    const list = Object.freeze([...new Set(names)]);
    if (this.ended || !this.link.send({ type: "tools.set", names: list })) return Promise.reject(new NotLive("tools.set"));
    this.offered = list;
    return Promise.resolve();
  }

  /** Close this session's WebSocket (brisvox treats it as the service going away). */
  close(code = 1000, reason = "closed by the service"): void {
    this.link.close(code, reason);
  }

  private async command(name: string, fields: Record<string, unknown>,
                        timeoutMs = this.limits.commandTimeoutMs): Promise<Record<string, unknown>> {
    if (this.ended) throw new NotLive(name);
    if (this.pending.size >= this.limits.maxPendingCommands) {
      throw new CommandError(name, `too_many_pending: ${this.pending.size} commands wait for their ack`);
    }
    const started = Date.now();
    if (this.ready === null) await this.waitReady(name, timeoutMs);
    const left = Math.max(1, timeoutMs - (Date.now() - started));
    const id = `k${++this.seq}`;
    return new Promise<Record<string, unknown>>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(id);
        reject(new CommandTimeout(name, `timeout: no command.ack in ${timeoutMs} ms`, id));
      }, left);
      this.pending.set(id, { command: name, resolve, reject, timer });
      if (this.ended || !this.link.send({ type: "command", id, name, ...fields })) {
        clearTimeout(timer);
        this.pending.delete(id);
        reject(new NotLive(name, "not_live", id));
      }
    });
  }

  private waitReady(name: string, timeoutMs: number): Promise<void> {
    return new Promise((resolve, reject) => {
      const done = (ok: boolean) => {
        clearTimeout(timer);
        this.readyWaiters.delete(done);
        if (ok) resolve();
        else reject(new NotLive(name, "not_live: the session ended"));
      };
      const timer = setTimeout(() => {
        this.readyWaiters.delete(done);
        reject(new CommandTimeout(name, `timeout: the session was not ready in ${timeoutMs} ms`));
      }, timeoutMs);
      this.readyWaiters.add(done);
    });
  }

  /** @internal */
  _accepted(declared: string[]): void {
    this.declared = Object.freeze([...declared]);
  }

  /** @internal */
  _ready(info: ReadyInfo): void {
    this.ready = info;
    for (const w of [...this.readyWaiters]) w(true);
  }

  /** @internal a re-dial: the session moves to its new connection. */
  _attach(link: SessionLink): void {
    this.link = link;
    this.ended = false;
    this.ready = null;
    this.resumed = true;
  }

  /** @internal is this the session's current connection? */
  _isLink(link: SessionLink): boolean {
    return this.link === link;
  }

  /** @internal a `command.ack`; false when no command waits for that id. */
  _ack(id: string, ok: boolean, error: unknown, ack: Record<string, unknown> = {}): boolean {
    const p = this.pending.get(id);
    if (!p) return false;
    this.pending.delete(id);
    clearTimeout(p.timer);
    if (ok) p.resolve(ack);
    else p.reject(new CommandRefused(p.command, typeof error === "string" && error ? error : "refused", id));
    return true;
  }

  /** @internal an `error` frame whose ref names a waiting command refuses it. */
  _errorFor(ref: string, code: string, message: string): boolean {
    const p = this.pending.get(ref);
    if (!p) return false;
    this.pending.delete(ref);
    clearTimeout(p.timer);
    p.reject(new CommandRefused(p.command, `${code}: ${message}`, ref));
    return true;
  }

  /** @internal the socket is gone: every waiting command is rejected. */
  _ended(): void {
    this.ended = true;
    for (const [id, p] of this.pending) {
      clearTimeout(p.timer);
      p.reject(new NotLive(p.command, "not_live: the session ended", id));
    }
    this.pending.clear();
    for (const w of [...this.readyWaiters]) w(false);
  }
}

/** What a tool receives besides its arguments. */
export class ToolContext {
  /** The RPC id of this `tool.call` (unique among the session's waiting calls). */
  readonly id: string;
  /** The tool's name. */
  readonly name: string;
  /** The model's call id (e.g. `t3.0`). */
  readonly callId: string;
  /** The turn epoch the call belongs to. */
  readonly epoch: number;
  /** Hex digest of (session, epoch, call id): stable across a redelivery. Key your store's effect on it. */
  readonly idempotencyKey: string;
  /** How long brisvox waits for the result (the declared timeout). */
  readonly deadlineMs: number;
  /** `Date.now()`-based instant of the deadline. */
  readonly deadline: number;
  /** Aborted at `tool.cancel` (reason: `barge_in`, `timeout`, `hangup`) or when the session ends. */
  readonly signal: AbortSignal;
  readonly session: Session;

  /** @internal */
  constructor(fields: {
    id: string;
    name: string;
    callId: string;
    epoch: number;
    idempotencyKey: string;
    deadlineMs: number;
    signal: AbortSignal;
    session: Session;
  }) {
    this.id = fields.id;
    this.name = fields.name;
    this.callId = fields.callId;
    this.epoch = fields.epoch;
    this.idempotencyKey = fields.idempotencyKey;
    this.deadlineMs = fields.deadlineMs;
    this.deadline = Date.now() + fields.deadlineMs;
    this.signal = fields.signal;
    this.session = fields.session;
  }

  /** The call's metadata (caller, called, custom parameters, ...). */
  get call(): CallInfo {
    return this.session.call;
  }

  /** True once brisvox cancelled this call: its result will never be sent. */
  get cancelled(): boolean {
    return this.signal.aborted;
  }

  say(text: string): Promise<void> {
    return this.session.say(text);
  }
  note(text: string): Promise<void> {
    return this.session.note(text);
  }
  transfer(target: string): Promise<void> {
    return this.session.transfer(target);
  }
  endCall(reason?: string): Promise<void> {
    return this.session.endCall(reason);
  }
  dial(target: string, options?: DialOptions): Promise<Dialed> {
    return this.session.dial(target, options);
  }
  setTools(names: readonly string[]): Promise<void> {
    return this.session.setTools(names);
  }
}
