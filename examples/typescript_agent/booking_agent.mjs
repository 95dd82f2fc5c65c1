#!/usr/bin/env node
// @ts-check
/**
 * A booking agent service in Node, the TypeScript SDK's twin of examples/booking_tools.py.
 *
 *   (cd sdk/typescript && npm ci && npm run build)
 *   BRISVOX_AGENT_SECRET=... node examples/typescript_agent/booking_agent.mjs --port 9100 [--host 127.0.0.1]
 *
 * and in the agent file: [agent_link] url = "ws://127.0.0.1:9100/brisvox", secret_env = "BRISVOX_AGENT_SECRET".
 *
 * * check_availability(date, time, people): ReadOnly; may run speculatively and is
 *   cancelled at a barge-in (ctx.signal), so its "lookup" stops when it is aborted.
 * * book_table(name, date, time, people): SideEffect. brisvox already guarantees that
 *   ONE tool call never runs twice in a call; it does not know the business rule "one
 *   booking per guest and slot". That rule lives here, where the effect lives: the
 *   application key sha256(name, date, time) is unique in the store (a unique constraint
 *   in a real database, or a booking API's Idempotency-Key), and a second booking with the
 *   same key returns the EXISTING booking with already_booked: true, across calls and
 *   turns. ctx.idempotencyKey (the digest of session, epoch, call id) is recorded too: a
 *   redelivered call is recognised even if the guest's details were spelled differently.
 *
 * The store is in memory and shared by every call of the process (a stand-in for the
 * database); STORE.clear() resets it in tests.
 */
import { createHash } from "node:crypto";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { Agent, ToolError, ToolKind } from "../../sdk/typescript/dist/src/index.js";

export const SLOTS = ["17:00", "18:00", "19:00", "20:00", "21:00"];
export const CAPACITY = 4; // tables per slot

/** @typedef {{booking: string, name: string, date: string, time: string, people: number}} Booking */

export class BookingStore {
  constructor() {
    /** @type {Map<string, Booking>} application key -> booking */
    this.byKey = new Map();
    /** @type {Map<string, string>} brisvox idempotency key -> application key */
    this.byCall = new Map();
    this.nextId = 1001;
    this.writes = 0;
  }

  clear() {
    this.byKey.clear();
    this.byCall.clear();
    this.nextId = 1001;
    this.writes = 0;
  }

  /** @param {string} date @param {string} time */
  taken(date, time) {
    let n = 0;
    for (const b of this.byKey.values()) if (b.date === date && b.time === time) n++;
    return n;
  }

  /**
   * One synchronous step (no await inside), so two concurrent calls cannot both pass the
   * checks: the same guarantee the Python example gets from its lock.
   * @param {string} appKey @param {string} callKey @param {string} name @param {string} date @param {string} time @param {number} people
   * @returns {Booking & {already_booked?: boolean}}
   */
  book(appKey, callKey, name, date, time, people) {
    const again = this.byCall.get(callKey);
    if (again !== undefined) return { .../** @type {Booking} */ (this.byKey.get(again)), already_booked: true }; // the same tool call delivered again
    const existing = this.byKey.get(appKey);
    if (existing) {
      // the same guest and slot, from any call or turn
      this.byCall.set(callKey, appKey);
      return { ...existing, already_booked: true };
    }
    if (this.taken(date, time) >= CAPACITY) throw new ToolError(`no table is free at ${time} on ${date}; offer another time`);
    const booking = { booking: `BK-${this.nextId}`, name, date, time, people };
    this.nextId++;
    this.writes++;
    this.byKey.set(appKey, booking);
    this.byCall.set(callKey, appKey);
    return { ...booking };
  }
}

export const STORE = new BookingStore();

/** @param {string} name @param {string} date @param {string} time */
export function appKey(name, date, time) {
  return createHash("sha256").update(`${name.trim().toLowerCase()}|${date}|${time}`).digest("hex");
}

const SLOT_ARGS = {
  date: { type: "string", pattern: "^[0-9]{4}-[0-9]{2}-[0-9]{2}$" },
  time: { type: "string", enum: SLOTS },
  people: { type: "integer", minimum: 1, maximum: 12 },
};

/** @param {number} ms @param {AbortSignal} [signal] */
function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(t);
      reject(new Error(`cancelled: ${signal.reason}`));
    }, { once: true });
  });
}

/**
 * The booking service, not yet listening.
 * @param {{secret?: string, latencyMs?: number}} [options]
 */
export function createAgent(options = {}) {
  const latency = options.latencyMs ?? 50;
  const agent = new Agent(options.secret === undefined ? {} : { secret: options.secret });

  agent.tool(
    {
      name: "check_availability",
      description: "Whether a table is free on a date (YYYY-MM-DD) at a time.",
      parameters: { type: "object", properties: SLOT_ARGS, required: ["date", "time", "people"], additionalProperties: false },
      kind: ToolKind.ReadOnly,
      timeoutMs: 3000,
    },
    /** @param {{date: string, time: string, people: number}} args */
    async (args, ctx) => {
      await sleep(latency, ctx.signal); // the lookup of a real system; stops at a cancel
      const free = CAPACITY - STORE.taken(args.date, args.time);
      return { date: args.date, time: args.time, free_tables: Math.max(0, free) };
    },
  );

  agent.tool(
    {
      name: "book_table",
      description: "Book a table for a guest. Ask for the name, date, time and party size first.",
      parameters: {
        type: "object",
        properties: { name: { type: "string", minLength: 1, maxLength: 80 }, ...SLOT_ARGS },
        required: ["name", "date", "time", "people"],
        additionalProperties: false,
      },
      kind: ToolKind.SideEffect,
      timeoutMs: 5000,
      fillerAfterMs: 1000,
    },
    /** @param {{name: string, date: string, time: string, people: number}} args */
    async (args, ctx) => {
      await sleep(latency * 2); // the write of a real system: a SideEffect runs to completion, never aborted midway
      return STORE.book(appKey(args.name, args.date, args.time), ctx.idempotencyKey, args.name, args.date, args.time, Number(args.people));
    },
  );

  agent.onSession((session) => {
    const tier = session.call.params.tier;
    if (tier === "blocked") return { refuse: "this line does not take bookings" };
    return undefined;
  });

  agent.on("hangup", (event, session) => {
    console.log(`booking-agent: call ${session.call.callId} ended (${event.reason})`);
  });
  return agent;
}

async function main() {
  const { values } = parseArgs({
    options: { port: { type: "string", default: "9100" }, host: { type: "string", default: "127.0.0.1" } },
  });
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    console.error(`booking-agent: --port ${values.port} is not a port`);
    process.exit(2);
  }
  if (!process.env.BRISVOX_AGENT_SECRET) {
    console.error("booking-agent: set BRISVOX_AGENT_SECRET (the secret of the agent file's [agent_link] secret_env)");
    process.exit(2);
  }
  const agent = createAgent();
  const addr = await agent.listen(port, values.host);
  console.log(`booking-agent: listening on ws://${addr.address}:${addr.port}/brisvox`);
  const stop = () => {
    agent.close().then(() => process.exit(0), () => process.exit(1));
  };
  process.once("SIGINT", stop);
  process.once("SIGTERM", stop);
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  main().catch((err) => {
    console.error(`booking-agent: ${err instanceof Error ? err.message : err}`);
    process.exit(1);
  });
}
