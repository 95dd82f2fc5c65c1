import { createServer, type IncomingMessage, type RequestListener, type Server } from "node:http";
import { createServer as createTlsServer, type ServerOptions as TlsOptions } from "node:https";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";
import { WebSocketServer } from "ws";
import { NonceCache, REFUSALS, verifyHandshake } from "./auth.js";
import {
  Connection,
  type Core,
  type LocalEventMap,
  type LocalEventName,
  type Logger,
  type RegisteredTool,
  type SessionHook,
  type ToolHandler,
} from "./connection.js";
import {
  CALL_EVENTS,
  DEFAULT_LIMITS,
  RESERVED_TOOL_NAMES,
  SESSION_HEADER,
  SIGNATURE_HEADER,
  TOOL_NAME,
  type JsonSchema,
  type Limits,
  type ToolKind,
  type WireToolDeclaration,
} from "./protocol.js";
import { Session, type CallInfo } from "./session.js";

/** A tool's declaration (the JSON Schema is explicit). */
export interface ToolSpec {
  /** 1 to 64 ASCII letters, digits, `_` or `-`; unique; not a tool of the agent file. */
  name: string;
  /** What the model reads to decide when to call it. */
  description: string;
  /** JSON Schema (draft 2020-12) with `"type": "object"`; brisvox validates the arguments against it. */
  parameters: JsonSchema;
  /** `read_only` (ToolKind.ReadOnly) or `side_effect` (ToolKind.SideEffect). */
  kind: ToolKind;
  /** How long the caller waits, 1..30000 ms (default 5000). */
  timeoutMs?: number;
  /** A filler ("One moment, please.") may play after this many ms; null or absent: never. */
  fillerAfterMs?: number | null;
  /** The identical call may repeat within one turn (default false). */
  repeatable?: boolean;
  /** SideEffect only: run only after the caller says yes (default false). */
  confirm?: boolean;
  /** false: declared only in the sessions whose `onSession` hook names it (default true). */
  offer?: boolean;
}

export interface AgentOptions {
  /**
   * The shared secret (or several, during a rotation) that signs the handshake.
   * Default: the environment variable BRISVOX_AGENT_SECRET. Required.
   */
  secret?: string | readonly string[];
  /** Accept upgrades on this path only (default "/brisvox"); null: any path. */
  path?: string | null;
  /** Serve `wss://` directly: key and cert (node:https options). Default: plain `ws://` (put TLS in front). */
  tls?: TlsOptions;
  /** Where the SDK logs (default: warnings and errors to stderr). */
  logger?: Logger;
  /** Override limits and timers (tests); the protocol's bounds are the defaults. */
  limits?: Partial<Limits>;
}

const defaultLogger: Logger = {
  info: () => {},
  warn: (msg, ...rest) => console.error(msg, ...rest),
  error: (msg, ...rest) => console.error(msg, ...rest),
};

function reject(socket: Duplex, status: number, text: string, reason: string = text): void {
  const body = `${reason}\n`;
  socket.end(
    `HTTP/1.1 ${status} ${text}\r\nConnection: close\r\nContent-Type: text/plain\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
}

function header(req: IncomingMessage, name: string): string | undefined {
  const v = req.headers[name];
  return Array.isArray(v) ? v.join(",") : v;
}

/**
 * An agent service: the tools, event handlers and session hooks; one WebSocket per call.
 *
 * ```ts
 * const agent = new Agent({ secret: process.env.BRISVOX_AGENT_SECRET });
 * agent.tool({ name: "check", description: "...", parameters: {...}, kind: ToolKind.ReadOnly }, async (args, ctx) => ...);
 * await agent.listen(9100, "127.0.0.1");
 * ```
 */
export class Agent {
  readonly limits: Limits;
  readonly logger: Logger;
  private readonly secrets: readonly string[];
  private readonly path: string | null;
  private readonly tls: TlsOptions | undefined;
  private readonly known = new Map<string, { session: Session; expiry: NodeJS.Timeout | null }>();
  private readonly toolMap = new Map<string, RegisteredTool>();
  private readonly sessionHooks: SessionHook[] = [];
  private readonly handlers = new Map<LocalEventName, ((payload: any, session: Session) => unknown)[]>();
  private readonly connections = new Set<Connection>();
  private readonly wss: WebSocketServer;
  private server: Server | null = null;
  private closing = false;
  private readonly nonces: NonceCache;
  /** Refused upgrades by reason (a replayed handshake: "replayed handshake"). */
  readonly handshakesRefused = new Map<string, number>();

  constructor(options: AgentOptions = {}) {
    const secret = options.secret ?? process.env.BRISVOX_AGENT_SECRET;
    const secrets = (typeof secret === "string" ? [secret] : [...(secret ?? [])]).filter((s) => s.length > 0);
    if (secrets.length === 0) {
      throw new Error("brisvox-agent: no secret: pass { secret } or set BRISVOX_AGENT_SECRET (the agent file's [agent_link] secret_env)");
    }
    this.secrets = Object.freeze(secrets);
    this.path = options.path === undefined ? "/brisvox" : options.path;
    this.tls = options.tls;
    this.logger = options.logger ?? defaultLogger;
    this.limits = Object.freeze({ ...DEFAULT_LIMITS, ...(options.limits ?? {}) });
    this.wss = new WebSocketServer({ noServer: true, maxPayload: this.limits.hardMaxFrameBytes, perMessageDeflate: false });
    this.nonces = new NonceCache(this.limits.signatureWindowS, this.limits.maxNonces);
  }

  /** Declare a tool. Throws on an invalid declaration (name, schema, kind, timeout, duplicate, over 64). */
  tool<A extends Record<string, any> = Record<string, any>, R = unknown>(spec: ToolSpec, handler: ToolHandler<A, R>): this {
    const declaration = this.validate(spec);
    if (typeof handler !== "function") throw new TypeError(`tool ${spec.name}: the handler must be a function`);
    this.toolMap.set(declaration.name, { declaration, handler: handler as ToolHandler, offer: spec.offer !== false });
    return this;
  }

  /** The declared tools' names. */
  get toolNames(): string[] {
    return [...this.toolMap.keys()];
  }

  /**
   * Handle a call event (`user_turn`, `bot_turn`, `tool_outcome`, `hangup`: the service
   * subscribes to exactly those with a handler) or a local one (`ready`, `close`, `error`).
   * A handler's exception is logged; it never ends the call.
   */
  on<K extends LocalEventName>(event: K, handler: LocalEventMap[K]): this {
    const known: readonly string[] = [...CALL_EVENTS, "ready", "close", "error"];
    if (!known.includes(event)) throw new TypeError(`unknown event '${String(event)}' (one of ${known.join(", ")})`);
    const list = this.handlers.get(event) ?? [];
    list.push(handler as (payload: any, session: Session) => unknown);
    this.handlers.set(event, list);
    return this;
  }

  /**
   * A hook run at each `session.offer` (a re-dial too: `session.resumed`), before the answer
   * (all hooks together within 4 s). Refuse with `throw new Refuse("reason")`,
   * `return new Refuse("reason")` or `return { refuse: "reason" }`; return tool names
   * (`["vip_upgrade"]` or `{ tools: [...] }`) to declare tools registered with `offer: false`
   * in this session too. Any other exception refuses the session.
   */
  onSession(hook: SessionHook): this {
    this.sessionHooks.push(hook);
    return this;
  }

  /** The sessions with a connection (accepted or deciding). */
  get sessions(): Session[] {
    return [...this.connections].map((c) => c.session).filter((s): s is Session => s !== null);
  }

  /** Listen for brisvox on host:port (default 127.0.0.1:9100). Resolves with the bound address. */
  listen(port = 9100, host = "127.0.0.1"): Promise<AddressInfo> {
    if (this.server) return Promise.reject(new Error("brisvox-agent: already listening"));
    const onRequest: RequestListener = (req, res) => {
      if (req.url === "/healthz") {
        res.writeHead(200, { "Content-Type": "text/plain" }).end("ok\n");
        return;
      }
      res.writeHead(426, { "Content-Type": "text/plain", Upgrade: "websocket" }).end("a brisvox agent service: WebSocket only\n");
    };
    const server: Server = this.tls ? createTlsServer(this.tls, onRequest) : createServer(onRequest);
    server.on("upgrade", (req, socket, head) => this.handleUpgrade(req, socket, head));
    this.server = server;
    return new Promise((resolve, rejectListen) => {
      server.once("error", rejectListen);
      server.listen(port, host, () => {
        server.off("error", rejectListen);
        resolve(server.address() as AddressInfo);
      });
    });
  }

  /** The bound address once listening. */
  get address(): AddressInfo | null {
    return (this.server?.address() as AddressInfo | null) ?? null;
  }

  /**
   * Serve one upgrade request (to mount the agent on your own http.Server): checks the
   * path and the signed handshake, answers 401 when it is wrong, otherwise opens the session.
   */
  handleUpgrade(req: IncomingMessage, socket: Duplex, head: Buffer): void {
    socket.on("error", () => {});
    if (this.closing) return reject(socket, 503, "Service Unavailable");
    const path = (req.url ?? "/").split("?")[0];
    if (this.path !== null && path !== this.path) return reject(socket, 404, "Not Found");
    const session = header(req, SESSION_HEADER);
    const verdict = verifyHandshake(this.secrets, session, header(req, SIGNATURE_HEADER), this.limits.signatureWindowS,
      Date.now() / 1000, this.nonces);
    if (!verdict.ok) {
      const n = (this.handshakesRefused.get(verdict.reason) ?? 0) + 1;
      this.handshakesRefused.set(verdict.reason, n);
      const status = verdict.reason === REFUSALS.nonceFull ? 503 : 401;
      // the 1st, 2nd, 4th, 8th ... of a reason: a flood of refusals logs a handful of lines
      if ((n & (n - 1)) === 0) this.logger.warn(`brisvox-agent: handshake refused (${status}): ${verdict.reason} (${n} so far)`);
      return reject(socket, status, status === 503 ? "Service Unavailable" : "Unauthorized", verdict.reason);
    }
    this.wss.handleUpgrade(req, socket, head, (ws) => {
      const conn = new Connection(ws, this.core, session as string);
      this.connections.add(conn);
      void conn.closed.then(() => this.connections.delete(conn));
    });
  }

  /**
   * Graceful close: stop accepting, close every session's socket (1001), wait for them
   * up to `timeoutMs`, then terminate what is left.
   */
  async close(timeoutMs = 5000): Promise<void> {
    this.closing = true;
    const server = this.server;
    const serverClosed = server ? new Promise<void>((r) => server.close(() => r())) : Promise.resolve();
    const conns = [...this.connections];
    for (const c of conns) c.close(1001, "service shutting down");
    let timer: NodeJS.Timeout | undefined;
    const waited = await Promise.race([
      Promise.all(conns.map((c) => c.closed)).then(() => true),
      new Promise<boolean>((r) => (timer = setTimeout(() => r(false), timeoutMs))),
    ]);
    clearTimeout(timer);
    if (!waited) for (const c of this.connections) c.terminate();
    server?.closeAllConnections();
    await serverClosed;
    this.wss.close();
    this.server = null;
    for (const k of this.known.values()) if (k.expiry) clearTimeout(k.expiry);
    this.known.clear();
  }

  private get core(): Core {
    const self = this;
    return {
      limits: this.limits,
      logger: this.logger,
      tools: this.toolMap,
      hooks: this.sessionHooks,
      subscribed: () => CALL_EVENTS.filter((e) => (self.handlers.get(e)?.length ?? 0) > 0),
      emit: (event, payload, session) => self.emit(event, payload, session),
      sessionFor: (id, call, resume, localTools, link) => self.sessionFor(id, call, resume, localTools, link),
      released: (session) => self.released(session),
    };
  }

  private sessionFor(id: string, call: CallInfo, resume: boolean, localTools: string[], link: Connection): Session {
    const k = this.known.get(id);
    if (resume && k && !k.session.hungUp) {
      if (k.expiry) clearTimeout(k.expiry);
      k.expiry = null;
      k.session._attach(link);
      return k.session;
    }
    if (k?.expiry) clearTimeout(k.expiry);
    const session = new Session(id, call, resume, localTools, link, this.limits);
    this.known.set(id, { session, expiry: null });
    return session;
  }

  private released(session: Session): void {
    const k = this.known.get(session.id);
    if (!k || k.session !== session) return;
    if (k.expiry) clearTimeout(k.expiry);
    if (session.hungUp || this.closing || (session.ready === null && !session.resumed)) {
      this.known.delete(session.id); // hung up, refused or never ready: no re-dial to wait for
      return;
    }
    k.expiry = setTimeout(() => {
      if (this.known.get(session.id) === k) this.known.delete(session.id);
    }, this.limits.resumeGraceMs);
    k.expiry.unref();
  }

  private async emit(event: LocalEventName, payload: unknown, session: Session): Promise<void> {
    for (const handler of this.handlers.get(event) ?? []) {
      try {
        await handler(payload, session);
      } catch (err) {
        this.logger.error(`brisvox-agent: '${event}' handler failed`, err);
      }
    }
  }

  private validate(spec: ToolSpec): WireToolDeclaration {
    const where = `tool ${JSON.stringify(spec?.name)}`;
    if (!spec || typeof spec !== "object") throw new TypeError("a tool spec is an object");
    if (typeof spec.name !== "string" || !TOOL_NAME.test(spec.name)) {
      throw new TypeError(`${where}: a name is 1 to 64 ASCII letters, digits, '_' or '-'`);
    }
    if (RESERVED_TOOL_NAMES.has(spec.name)) throw new TypeError(`${where}: the name is reserved`);
    if (this.toolMap.has(spec.name)) throw new TypeError(`${where}: declared twice`);
    if (this.toolMap.size >= this.limits.maxTools) throw new RangeError(`${where}: at most ${this.limits.maxTools} tools per service`);
    if (typeof spec.description !== "string" || spec.description.trim() === "") throw new TypeError(`${where}: needs a description`);
    const p = spec.parameters as unknown;
    if (typeof p !== "object" || p === null || Array.isArray(p) || (p as { type?: unknown }).type !== "object") {
      throw new TypeError(`${where}: parameters must be a JSON Schema object with "type": "object"`);
    }
    try {
      JSON.stringify(p);
    } catch {
      throw new TypeError(`${where}: parameters must be JSON`);
    }
    if (spec.kind !== "read_only" && spec.kind !== "side_effect") throw new TypeError(`${where}: kind is "read_only" or "side_effect"`);
    const timeout = spec.timeoutMs ?? 5000;
    if (!Number.isInteger(timeout) || timeout < 1 || timeout > this.limits.maxTimeoutMs) {
      throw new RangeError(`${where}: timeoutMs is an integer in 1..${this.limits.maxTimeoutMs}`);
    }
    const filler = spec.fillerAfterMs ?? null;
    if (filler !== null && (!Number.isFinite(filler) || filler < 0)) throw new RangeError(`${where}: fillerAfterMs is >= 0 or null`);
    if (spec.confirm && spec.kind !== "side_effect") throw new TypeError(`${where}: confirm is for side_effect tools only`);
    return Object.freeze({
      name: spec.name,
      description: spec.description,
      parameters: JSON.parse(JSON.stringify(p)) as JsonSchema,
      kind: spec.kind,
      timeout_ms: timeout,
      filler_after_ms: filler,
      repeatable: spec.repeatable === true,
      confirm: spec.confirm === true,
    });
  }
}

