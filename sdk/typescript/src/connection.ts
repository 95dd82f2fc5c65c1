/** One brisvox connection = one call's session: framing, limits, dispatch (internal). */
import type { WebSocket, RawData } from "ws";
import { Refuse, ToolError, boundUtf8 } from "./errors.js";
import {
  PROTOCOL_VERSION,
  type CallEventName,
  type ErrorCode,
  type Frame,
  type Limits,
  type WireToolDeclaration,
} from "./protocol.js";
import {
  Session,
  ToolContext,
  type CallEvent,
  type CallInfo,
  type CloseInfo,
  type HangupEvent,
  type ProtocolErrorInfo,
  type ReadyInfo,
  type ToolOutcomeEvent,
  type TurnEvent,
} from "./session.js";

export interface Logger {
  debug?(msg: string, ...rest: unknown[]): void;
  info(msg: string, ...rest: unknown[]): void;
  warn(msg: string, ...rest: unknown[]): void;
  error(msg: string, ...rest: unknown[]): void;
}

export type ToolHandler<A = Record<string, any>, R = unknown> = (args: A, ctx: ToolContext) => R | Promise<R>;

export interface RegisteredTool {
  declaration: WireToolDeclaration;
  handler: ToolHandler;
  /** false: declared only in the sessions whose onSession hook names it */
  offer: boolean;
}

/**
 * What an `onSession` hook may return: nothing (accept), a refusal (`Refuse`, `{ refuse }`),
 * or the names of extra tools (declared with `offer: false`) to declare in this session.
 */
export type SessionDecision = void | undefined | Refuse | string | readonly string[] | { refuse?: string; tools?: readonly string[] };
export type SessionHook = (session: Session) => SessionDecision | Promise<SessionDecision>;

export interface LocalEventMap {
  /** The user's final text of a turn. */
  user_turn: (event: TurnEvent, session: Session) => unknown;
  /** The bot's turn as heard (cut at a barge-in). */
  bot_turn: (event: TurnEvent, session: Session) => unknown;
  tool_outcome: (event: ToolOutcomeEvent, session: Session) => unknown;
  /** The call hung up; brisvox closes the socket next. */
  hangup: (event: HangupEvent, session: Session) => unknown;
  /** `session.ready` arrived (not a subscription: always delivered). */
  ready: (info: ReadyInfo, session: Session) => unknown;
  /** The session's socket closed. */
  close: (info: CloseInfo, session: Session) => unknown;
  /** brisvox sent an `error` frame (something the service sent was refused). */
  error: (info: ProtocolErrorInfo, session: Session) => unknown;
}
export type LocalEventName = keyof LocalEventMap;

/** What a connection needs from its Agent. */
export interface Core {
  readonly limits: Limits;
  readonly logger: Logger;
  readonly tools: ReadonlyMap<string, RegisteredTool>;
  readonly hooks: readonly SessionHook[];
  subscribed(): CallEventName[];
  /** Runs the handlers in order (each awaited); never rejects. */
  emit(event: LocalEventName, payload: unknown, session: Session): Promise<void>;
  /** The session for an offer: a fresh one, or the one being re-dialled (resume) within the grace. */
  sessionFor(id: string, call: CallInfo, resume: boolean, localTools: string[], link: Connection): Session;
  /** The connection of `session` ended. */
  released(session: Session): void;
}

interface Running {
  controller: AbortController;
  /** true while brisvox waits for its result (not answered, not cancelled). */
  owed: boolean;
}

const ID_MAX = 128;
/** ids answered, remembered (bounded) so that a result goes once per id */
const ANSWERED_KEPT = 4096;
/** call events waiting for their handlers, per session */
const EVENT_QUEUE = 256;

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

function str(v: unknown, fallback: string | null = null): string | null {
  return typeof v === "string" ? v : fallback;
}

/** A peek at the first bytes of an oversized frame, for the error's `ref`. */
function peekRef(buf: Buffer): string | null {
  const head = buf.subarray(0, 4096).toString("utf8");
  const id = /"id"\s*:\s*"([^"\\]{1,128})"/.exec(head);
  if (id) return id[1] as string;
  const type = /"type"\s*:\s*"([^"\\]{1,64})"/.exec(head);
  return type ? (type[1] as string) : null;
}

export class Connection {
  session: Session | null = null;
  private readonly ws: WebSocket;
  private readonly core: Core;
  private readonly headerSession: string;
  private readonly running = new Map<string, Running>();
  private owedCount = 0;
  private readonly answered = new Set<string>();
  private events: Promise<void> = Promise.resolve();
  private eventsQueued = 0;
  private offered = false;
  private deciding = false;
  private lastSeen = Date.now();
  private readonly heartbeat: NodeJS.Timeout;
  private offerTimer: NodeJS.Timeout | null;
  private closedResolve!: () => void;
  readonly closed: Promise<void>;
  /** counters, for tests and logs */
  readonly counters = { errorsSent: 0, errorsReceived: 0, droppedResults: 0, busy: 0 };

  constructor(ws: WebSocket, core: Core, headerSession: string) {
    this.ws = ws;
    this.core = core;
    this.headerSession = headerSession;
    this.closed = new Promise((r) => (this.closedResolve = r));
    const limits = core.limits;
    this.heartbeat = setInterval(() => {
      if (Date.now() - this.lastSeen > limits.deadAfterMs) {
        core.logger.warn(`brisvox-agent: session ${headerSession}: peer silent for ${limits.deadAfterMs} ms, dropping it`);
        ws.terminate();
        return;
      }
      try {
        ws.ping();
      } catch {
        /* closing */
      }
    }, limits.pingIntervalMs);
    this.heartbeat.unref();
    this.offerTimer = setTimeout(() => {
      if (!this.offered) ws.close(1008, "no session.offer");
    }, limits.offerTimeoutMs);
    this.offerTimer.unref();
    const seen = () => (this.lastSeen = Date.now());
    ws.on("pong", seen);
    ws.on("ping", seen);
    ws.on("message", (data: RawData, isBinary: boolean) => {
      seen();
      this.onMessage(data, isBinary);
    });
    ws.on("error", (err) => core.logger.warn(`brisvox-agent: session ${headerSession}: socket error: ${err.message}`));
    ws.on("close", (code: number, reason: Buffer) => this.onClose(code, reason.toString("utf8")));
  }

  get open(): boolean {
    return this.ws.readyState === this.ws.OPEN;
  }

  send(frame: Record<string, unknown>): boolean {
    if (!this.open) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }

  close(code: number, reason: string): void {
    if (this.ws.readyState === this.ws.CLOSED) return;
    this.ws.close(code, reason);
  }

  terminate(): void {
    this.ws.terminate();
  }

  private sendError(code: ErrorCode, message: string, ref: string | null): void {
    this.counters.errorsSent++;
    this.send({ type: "error", code, message: boundUtf8(message, 512), ref });
  }

  private onMessage(data: RawData, isBinary: boolean): void {
    const buf = Array.isArray(data) ? Buffer.concat(data) : Buffer.isBuffer(data) ? data : Buffer.from(data);
    if (buf.length > this.core.limits.maxFrameBytes) {
      this.sendError("too_large", `frame of ${buf.length} bytes; at most ${this.core.limits.maxFrameBytes}`, peekRef(buf));
      return;
    }
    if (isBinary) {
      this.sendError("bad_message", "binary frames are refused; send JSON text frames", null);
      return;
    }
    let frame: unknown;
    try {
      frame = JSON.parse(buf.toString("utf8"));
    } catch {
      this.sendError("bad_message", "not JSON", null);
      return;
    }
    if (!isObject(frame)) {
      this.sendError("bad_message", "a frame is a JSON object", null);
      return;
    }
    if (typeof frame.type !== "string") {
      this.sendError("bad_message", "missing or mistyped field 'type'", null);
      return;
    }
    try {
      this.dispatch(frame as Frame);
    } catch (err) {
      this.core.logger.error(`brisvox-agent: session ${this.headerSession}: handling ${frame.type} failed`, err);
    }
  }

  private dispatch(f: Frame): void {
    if (f.type === "session.offer") return void this.onOffer(f);
    const known = ["session.ready", "tool.call", "tool.cancel", "event", "command.ack", "error"];
    if (!known.includes(f.type)) {
      this.sendError("unknown_type", `unknown frame type '${boundUtf8(f.type, 64)}'`, boundUtf8(f.type, 64));
      return;
    }
    if (f.type === "error") return this.onError(f);
    const session = this.session;
    if (!session || this.deciding) {
      this.sendError("not_live", `'${f.type}' before the session was accepted`, typeof f.id === "string" ? f.id : f.type);
      return;
    }
    switch (f.type) {
      case "session.ready":
        return this.onReady(f, session);
      case "tool.call":
        return this.onToolCall(f, session);
      case "tool.cancel":
        return this.onCancel(f);
      case "event":
        return this.onEvent(f, session);
      case "command.ack": {
        if (typeof f.id !== "string" || typeof f.ok !== "boolean") {
          this.sendError("bad_message", "command.ack needs a string 'id' and a boolean 'ok'", str(f.id));
          return;
        }
        const { type: _type, id: _id, ok: _ok, ...ack } = f;
        session._ack(f.id, f.ok, f.error, ack);
        return;
      }
    }
  }

  // ---- the session handshake -------------------------------------------------------------

  private async onOffer(f: Frame): Promise<void> {
    if (this.offered) {
      this.sendError("bad_message", "session.offer already received on this connection", "session.offer");
      return;
    }
    this.offered = true;
    if (this.offerTimer) clearTimeout(this.offerTimer);
    this.offerTimer = null;
    const sessionId = this.headerSession;
    const refuse = (reason: string): void => {
      this.send({ type: "session.refuse", session: sessionId, reason: [...reason].slice(0, 200).join("") });
      this.close(1000, "session refused");
    };
    if (f.v !== PROTOCOL_VERSION) return refuse(`unsupported protocol version ${JSON.stringify(f.v)} (this SDK speaks ${PROTOCOL_VERSION})`);
    if (f.session !== sessionId) return refuse("session.offer's session differs from X-Brisvox-Session");
    if (!isObject(f.call) || typeof f.call.call_id !== "string") {
      this.sendError("bad_message", "session.offer needs a 'call' object with a string 'call_id'", "session.offer");
      return refuse("malformed session.offer");
    }
    const c = f.call;
    const call: CallInfo = Object.freeze({
      callId: c.call_id as string,
      agent: str(c.agent, "") as string,
      transport: str(c.transport, "") as string,
      caller: str(c.caller),
      called: str(c.called),
      params: Object.freeze(isObject(c.params) ? { ...c.params } : {}),
    });
    const localTools = Array.isArray(f.local_tools) ? f.local_tools.filter((n): n is string => typeof n === "string") : [];
    const session = this.core.sessionFor(sessionId, call, f.resume === true, localTools, this);
    this.session = session;
    this.deciding = true;

    let extra: readonly string[] = [];
    try {
      const decided = await this.runHooks(session);
      if (decided.refuse !== undefined) return refuse(decided.refuse);
      extra = decided.tools;
    } catch (err) {
      const reason = err instanceof Refuse ? err.reason : "the service could not decide";
      if (!(err instanceof Refuse)) this.core.logger.error(`brisvox-agent: session ${sessionId}: onSession hook failed`, err);
      return refuse(reason);
    } finally {
      this.deciding = false;
    }
    if (!this.open) return;
    for (const n of extra) {
      if (!this.core.tools.has(n)) this.core.logger.error(`brisvox-agent: session ${sessionId}: onSession named '${n}', which is not a declared tool`);
    }
    const tools = [...this.core.tools.values()].filter((t) => t.offer || extra.includes(t.declaration.name)).map((t) => t.declaration);
    session._accepted(tools.map((t) => t.name));
    this.send({ type: "session.accept", session: sessionId, tools, subscribe: this.core.subscribed() });
  }

  private async runHooks(session: Session): Promise<{ refuse?: string; tools: readonly string[] }> {
    const hooks = this.core.hooks;
    if (hooks.length === 0) return { tools: [] };
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Refuse("the service did not decide in time")), this.core.limits.sessionHookTimeoutMs);
    });
    try {
      const tools: string[] = [];
      const add = (names: unknown) => {
        if (typeof names === "string") tools.push(names);
        else if (Array.isArray(names)) tools.push(...names.filter((n): n is string => typeof n === "string"));
      };
      for (const hook of hooks) {
        const d = await Promise.race([Promise.resolve().then(() => hook(session)), timeout]);
        if (d instanceof Refuse) return { refuse: d.reason, tools };
        if (isObject(d)) {
          if (typeof d.refuse === "string") return { refuse: d.refuse, tools };
          add(d.tools);
        } else {
          add(d);
        }
      }
      return { tools };
    } finally {
      clearTimeout(timer);
    }
  }

  private onReady(f: Frame, session: Session): void {
    const tools = Array.isArray(f.tools) ? f.tools.filter((n): n is string => typeof n === "string") : [];
    const refused = Array.isArray(f.refused)
      ? f.refused.filter(isObject).map((r) => ({ name: String(r.name ?? ""), error: String(r.error ?? "") }))
      : [];
    const info = Object.freeze({ tools, refused });
    for (const r of refused) {
      this.core.logger.warn(`brisvox-agent: session ${session.id}: brisvox refused tool '${r.name}': ${r.error}`);
    }
    session._ready(info);
    if (session.offered !== null) {
      // a re-dial: the narrowing of the dropped connection is sent again
      session.offered = Object.freeze(session.offered.filter((n) => tools.includes(n)));
      this.send({ type: "tools.set", names: session.offered });
    }
    void this.core.emit("ready", info, session);
  }

  private onError(f: Frame): void {
    this.counters.errorsReceived++;
    const info: ProtocolErrorInfo = { code: String(f.code ?? ""), message: String(f.message ?? ""), ref: str(f.ref) };
    this.core.logger.warn(`brisvox-agent: session ${this.headerSession}: brisvox refused a frame: ${info.code}: ${info.message} (${info.ref})`);
    if (this.session) {
      if (info.ref !== null) this.session._errorFor(info.ref, info.code, info.message);
      void this.core.emit("error", info, this.session);
    }
  }

  // ---- tool calls ----------------------------------------------------------------------------

  private onToolCall(f: Frame, session: Session): void {
    const id = f.id;
    if (typeof id !== "string" || id.length === 0 || id.length > ID_MAX) {
      this.sendError("bad_message", `tool.call needs a string 'id' of 1..${ID_MAX} characters`, null);
      return;
    }
    const bad: string[] = [];
    if (typeof f.name !== "string") bad.push("name");
    if (!isObject(f.arguments)) bad.push("arguments");
    if (typeof f.idempotency_key !== "string") bad.push("idempotency_key");
    if (typeof f.epoch !== "number") bad.push("epoch");
    if (typeof f.call_id !== "string") bad.push("call_id");
    if (f.deadline_ms !== undefined && typeof f.deadline_ms !== "number") bad.push("deadline_ms");
    if (bad.length > 0) {
      this.sendError("bad_message", `tool.call: missing or mistyped ${bad.join(", ")}`, id);
      return;
    }
    if (this.running.has(id) || this.answered.has(id)) {
      this.sendError("bad_message", `tool.call id '${id}' was already called`, id);
      return;
    }
    const name = f.name as string;
    const tool = session.declared.includes(name) ? this.core.tools.get(name) : undefined;
    if (!tool) {
      this.result(id, false, { message: `unknown_tool: '${boundUtf8(name, 64)}' is not declared by this service` });
      return;
    }
    const limits = this.core.limits;
    if (this.owedCount >= limits.maxConcurrentCalls || this.running.size >= limits.maxRunningHandlers) {
      this.counters.busy++;
      this.result(id, false, { message: `busy: ${this.owedCount} tool calls already running in this session (at most ${limits.maxConcurrentCalls})` });
      return;
    }
    const controller = new AbortController();
    const entry: Running = { controller, owed: true };
    this.running.set(id, entry);
    this.owedCount++;
    const ctx = new ToolContext({
      id,
      name,
      callId: f.call_id as string,
      epoch: f.epoch as number,
      idempotencyKey: f.idempotency_key as string,
      deadlineMs: typeof f.deadline_ms === "number" ? f.deadline_ms : tool.declaration.timeout_ms,
      signal: controller.signal,
      session,
    });
    const args = f.arguments as Record<string, unknown>;
    Promise.resolve()
      .then(() => tool.handler(args, ctx))
      .then(
        (value) => this.settle(id, entry, true, value === undefined ? null : value),
        (err: unknown) => this.settle(id, entry, false, { message: this.errorMessage(name, err) }),
      )
      .finally(() => {
        if (this.running.get(id) === entry) this.running.delete(id);
      });
  }

  private errorMessage(tool: string, err: unknown): string {
    const max = this.core.limits.maxErrorBytes;
    if (err instanceof Error) {
      if (!(err instanceof ToolError)) this.core.logger.warn(`brisvox-agent: tool ${tool} threw`, err);
      return boundUtf8(err.message || err.name, max);
    }
    return boundUtf8(typeof err === "string" ? err : `tool ${tool} failed`, max);
  }

  private settle(id: string, entry: Running, ok: boolean, payload: unknown): void {
    if (!entry.owed) {
      this.counters.droppedResults++; // cancelled, or the session ended: never a result after that
      return;
    }
    entry.owed = false;
    this.owedCount--;
    if (ok) {
      let text: string;
      try {
        text = JSON.stringify({ type: "tool.result", id, ok: true, result: payload });
      } catch (err) {
        this.result(id, false, { message: `the tool's result is not JSON-serializable (${(err as Error).message})` });
        return;
      }
      const size = Buffer.byteLength(text);
      if (size > this.core.limits.maxFrameBytes) {
        this.result(id, false, { message: `the tool's result is too large (${size} bytes; a frame is at most ${this.core.limits.maxFrameBytes})` });
        return;
      }
      this.remember(id);
      if (this.open) this.ws.send(text);
    } else {
      this.result(id, false, payload);
    }
  }

  private remember(id: string): void {
    this.answered.add(id);
    if (this.answered.size > ANSWERED_KEPT) this.answered.delete(this.answered.values().next().value as string);
  }

  private result(id: string, ok: boolean, payload: unknown): void {
    this.remember(id);
    this.send(ok ? { type: "tool.result", id, ok: true, result: payload } : { type: "tool.result", id, ok: false, error: payload });
  }

  private onCancel(f: Frame): void {
    if (typeof f.id !== "string") {
      this.sendError("bad_message", "tool.cancel needs a string 'id'", null);
      return;
    }
    const entry = this.running.get(f.id);
    if (!entry || !entry.owed) return; // answered already (the result crossed the cancel), or unknown
    entry.owed = false;
    this.owedCount--;
    this.remember(f.id);
    entry.controller.abort(typeof f.reason === "string" ? f.reason : "cancelled");
  }

  // ---- events --------------------------------------------------------------------------------

  private onEvent(f: Frame, session: Session): void {
    if (typeof f.name !== "string") {
      this.sendError("bad_message", "event needs a string 'name'", "event");
      return;
    }
    const name = f.name;
    if (name === "hangup") {
      session.hungUp = true;
      session.hangupReason = str(f.reason);
    }
    if (!(this.core.subscribed() as string[]).includes(name)) {
      if (name === "hangup") this.afterEvents(() => this.close(1000, "hangup"));
      return; // not subscribed: ignored
    }
    let event: CallEvent;
    switch (name) {
      case "user_turn":
      case "bot_turn":
        event = { name, epoch: typeof f.epoch === "number" ? f.epoch : -1, text: str(f.text, "") as string, raw: f };
        break;
      case "tool_outcome":
        event = { name, callId: str(f.call_id, "") as string, tool: str(f.tool, "") as string, outcome: str(f.outcome, "") as string, raw: f };
        break;
      case "hangup":
        event = { name, reason: str(f.reason, "") as string, raw: f };
        break;
      default:
        return;
    }
    if (this.eventsQueued >= EVENT_QUEUE) {
      this.core.logger.warn(`brisvox-agent: session ${session.id}: event ${name} dropped (${EVENT_QUEUE} waiting)`);
      return;
    }
    this.eventsQueued++;
    this.afterEvents(async () => {
      this.eventsQueued--;
      await this.core.emit(name as LocalEventName, event, session);
      if (name === "hangup") this.close(1000, "hangup");
    });
  }

  /** Runs `step` after the events queued before it (the handlers see them in order). */
  private afterEvents(step: () => unknown): void {
    this.events = this.events.then(step).then(undefined, (err: unknown) => {
      this.core.logger.error(`brisvox-agent: session ${this.headerSession}: event handling failed`, err);
    });
  }

  // ---- the end -------------------------------------------------------------------------------

  private onClose(code: number, reason: string): void {
    clearInterval(this.heartbeat);
    if (this.offerTimer) clearTimeout(this.offerTimer);
    for (const entry of this.running.values()) {
      if (entry.owed) {
        entry.owed = false;
        this.owedCount--;
      }
      if (!entry.controller.signal.aborted) entry.controller.abort("session_ended");
    }
    const session = this.session;
    if (session && session._isLink(this)) {
      session._ended();
      this.core.released(session);
      void this.core.emit("close", { code, reason }, session);
    }
    this.closedResolve();
  }
}
