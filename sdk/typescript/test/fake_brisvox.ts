/** A fake brisvox for the tests: a ws client that speaks the protocol as the daemon would. */
import { randomBytes } from "node:crypto";
import WebSocket from "ws";
import { Agent, signHandshake, type AgentOptions } from "../src/index.js";

export const SECRET = "s3cret-for-tests";

export type Frame = { type: string } & Record<string, any>;

export async function startAgent(setup: (agent: Agent) => void, options: AgentOptions = {}): Promise<{ agent: Agent; url: string }> {
  const quiet = { info() {}, warn() {}, error() {} };
  const agent = new Agent({ secret: SECRET, logger: quiet, ...options });
  setup(agent);
  const addr = await agent.listen(0, "127.0.0.1");
  return { agent, url: `ws://127.0.0.1:${addr.port}/brisvox` };
}

export class HandshakeRefused extends Error {
  constructor(readonly status: number) {
    super(`handshake refused: HTTP ${status}`);
  }
}

export interface ConnectOptions {
  secret?: string;
  session?: string;
  t?: number;
  signature?: string;
  /** false: never answer the service's pings (a silent peer) */
  autoPong?: boolean;
}

export class FakeBrisvox {
  readonly session: string;
  readonly ws: WebSocket;
  private readonly buffer: Frame[] = [];
  private waiters: { pred: (f: Frame) => boolean; resolve: (f: Frame) => void }[] = [];
  closed: Promise<{ code: number; reason: string }>;
  private nextId = 1;

  private constructor(ws: WebSocket, session: string) {
    this.ws = ws;
    this.session = session;
    this.closed = new Promise((resolve) => ws.on("close", (code, reason) => resolve({ code, reason: reason.toString() })));
    ws.on("message", (data, isBinary) => {
      if (isBinary) throw new Error("the service sent a binary frame");
      const frame = JSON.parse(data.toString()) as Frame;
      const i = this.waiters.findIndex((w) => w.pred(frame));
      if (i >= 0) {
        const [w] = this.waiters.splice(i, 1);
        w!.resolve(frame);
      } else {
        this.buffer.push(frame);
      }
    });
  }

  static connect(url: string, opts: ConnectOptions = {}): Promise<FakeBrisvox> {
    const session = opts.session ?? randomBytes(8).toString("hex");
    const signature = opts.signature ?? signHandshake(opts.secret ?? SECRET, session, opts.t);
    const ws = new WebSocket(url, {
      headers: { "X-Brisvox-Signature": signature, "X-Brisvox-Session": session },
      autoPong: opts.autoPong ?? true,
    });
    return new Promise((resolve, reject) => {
      ws.once("open", () => resolve(new FakeBrisvox(ws, session)));
      ws.once("unexpected-response", (_req, res) => {
        reject(new HandshakeRefused(res.statusCode ?? 0));
        res.resume();
        ws.terminate();
      });
      ws.once("error", (err) => reject(err));
    });
  }

  /** Connect, offer, read the accept, send session.ready with every declared tool. */
  static async live(url: string, call: Record<string, unknown> = {}): Promise<{ b: FakeBrisvox; accept: Frame }> {
    const b = await FakeBrisvox.connect(url);
    const accept = await b.offer(call);
    if (accept.type !== "session.accept") throw new Error(`expected session.accept, got ${JSON.stringify(accept)}`);
    b.send({ type: "session.ready", tools: accept.tools.map((t: { name: string }) => t.name), refused: [] });
    return { b, accept };
  }

  send(frame: Record<string, unknown>): void {
    this.ws.send(JSON.stringify(frame));
  }

  sendRaw(data: string | Buffer, binary = false): void {
    this.ws.send(data, { binary });
  }

  offer(call: Record<string, unknown> = {}, extra: Record<string, unknown> = {}): Promise<Frame> {
    this.send({
      type: "session.offer",
      v: 1,
      session: this.session,
      resume: false,
      call: { call_id: this.session, agent: "booking", transport: "twilio", caller: "+4930123", called: "+4930999", params: { tier: "gold" }, ...call },
      local_tools: ["end_call"],
      ...extra,
    });
    return this.next((f) => f.type === "session.accept" || f.type === "session.refuse");
  }

  /** Send a tool.call; returns its id. */
  call(name: string, args: Record<string, unknown>, opts: { id?: string; key?: string; epoch?: number; callId?: string } = {}): string {
    const id = opts.id ?? `r${this.nextId++}`;
    this.send({
      type: "tool.call",
      id,
      call_id: opts.callId ?? `t${opts.epoch ?? 1}.0`,
      name,
      arguments: args,
      idempotency_key: opts.key ?? randomBytes(16).toString("hex"),
      epoch: opts.epoch ?? 1,
      deadline_ms: 5000,
    });
    return id;
  }

  result(id: string, timeoutMs?: number): Promise<Frame> {
    return this.next((f) => f.type === "tool.result" && f.id === id, timeoutMs);
  }

  next(pred: string | ((f: Frame) => boolean) = () => true, timeoutMs = 3000): Promise<Frame> {
    const p = typeof pred === "string" ? (f: Frame) => f.type === pred : pred;
    const i = this.buffer.findIndex(p);
    if (i >= 0) return Promise.resolve(this.buffer.splice(i, 1)[0]!);
    return new Promise((resolve, reject) => {
      const waiter = {
        pred: p,
        resolve: (f: Frame) => {
          clearTimeout(timer);
          resolve(f);
        },
      };
      const timer = setTimeout(() => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(new Error(`no matching frame within ${timeoutMs} ms; buffered: ${JSON.stringify(this.buffer).slice(0, 500)}`));
      }, timeoutMs);
      this.waiters.push(waiter);
    });
  }

  /** Resolves if no matching frame arrives within ms; rejects with the frame otherwise. */
  async none(pred: string | ((f: Frame) => boolean), ms = 200): Promise<void> {
    try {
      const f = await this.next(pred, ms);
      throw new Error(`unexpected frame ${JSON.stringify(f)}`);
    } catch (err) {
      if ((err as Error).message.startsWith("unexpected frame")) throw err;
    }
  }

  close(): Promise<{ code: number; reason: string }> {
    this.ws.close(1000, "test done");
    return this.closed;
  }
}

export function deferred<T = void>(): { promise: Promise<T>; resolve: (v: T) => void } {
  let resolve!: (v: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}
