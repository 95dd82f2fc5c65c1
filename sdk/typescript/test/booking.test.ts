/** The booking example (examples/typescript_agent/booking_agent.mjs) over the protocol. */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { once } from "node:events";
import { fileURLToPath } from "node:url";
import { after, beforeEach, describe, it } from "node:test";
import type { Agent } from "../src/index.js";
import { FakeBrisvox, SECRET } from "./fake_brisvox.js";

const EXAMPLE = new URL("../../../../examples/typescript_agent/booking_agent.mjs", import.meta.url);

interface BookingModule {
  createAgent(options?: { secret?: string; latencyMs?: number }): Agent;
  STORE: { clear(): void; writes: number; byKey: Map<string, unknown> };
  CAPACITY: number;
}
const booking = (await import(EXAMPLE.href)) as BookingModule;

const agents: Agent[] = [];
async function serve(): Promise<string> {
  const agent = booking.createAgent({ secret: SECRET, latencyMs: 5 });
  agents.push(agent);
  const addr = await agent.listen(0, "127.0.0.1");
  return `ws://127.0.0.1:${addr.port}/brisvox`;
}
after(async () => {
  await Promise.all(agents.map((a) => a.close(500)));
});

const GUEST = { name: "Ada Lovelace", date: "2030-05-01", time: "19:00", people: 2 };

describe("booking example", () => {
  beforeEach(() => booking.STORE.clear());

  it("declares a ReadOnly check_availability and a SideEffect book_table", async () => {
    const url = await serve();
    const { b, accept } = await FakeBrisvox.live(url);
    assert.deepEqual(
      accept.tools.map((t: { name: string; kind: string }) => [t.name, t.kind]),
      [["check_availability", "read_only"], ["book_table", "side_effect"]],
    );
    assert.deepEqual(accept.subscribe, ["hangup"]);
    await b.close();
  });

  it("a redelivered call (same idempotency key) returns the existing booking; one write", async () => {
    const url = await serve();
    const { b } = await FakeBrisvox.live(url);
    const first = await b.result(b.call("book_table", GUEST, { key: "k-1" }));
    assert.equal(first.ok, true);
    assert.equal(first.result.booking, "BK-1001");
    assert.equal(first.result.already_booked, undefined);
    // the same call redelivered, even with the guest's name spelled differently
    const again = await b.result(b.call("book_table", { ...GUEST, name: "Ada Lovelace-King" }, { key: "k-1" }));
    assert.deepEqual({ ...again.result }, { ...first.result, already_booked: true });
    assert.equal(booking.STORE.writes, 1);
    await b.close();
  });

  it("the application key (name+date+time) holds across calls and sessions; a full slot is ok:false", async () => {
    const url = await serve();
    const { b } = await FakeBrisvox.live(url);
    await b.result(b.call("book_table", GUEST, { key: "k-1" }));
    const other = await FakeBrisvox.live(url);
    // another call, another key, the same guest and slot (case and spaces differ)
    const dup = await other.b.result(other.b.call("book_table", { ...GUEST, name: "  ada lovelace " }, { key: "k-2" }));
    assert.equal(dup.result.booking, "BK-1001");
    assert.equal(dup.result.already_booked, true);
    assert.equal(booking.STORE.writes, 1);
    // two concurrent bookings of the same guest and slot: still one write
    const ids = ["k-3", "k-4"].map((key) => b.call("book_table", { ...GUEST, time: "20:00" }, { key }));
    const results = await Promise.all(ids.map((id) => b.result(id)));
    assert.deepEqual(new Set(results.map((r) => r.result.booking)).size, 1);
    assert.equal(booking.STORE.writes, 2);
    // fill 21:00 and see the refusal
    for (let i = 0; i < booking.CAPACITY; i++) {
      assert.equal((await b.result(b.call("book_table", { ...GUEST, name: `guest ${i}`, time: "21:00" }))).ok, true);
    }
    const full = await b.result(b.call("book_table", { ...GUEST, name: "late", time: "21:00" }));
    assert.equal(full.ok, false);
    assert.match(full.error.message, /no table is free at 21:00/);
    const check = await b.result(b.call("check_availability", { date: GUEST.date, time: "21:00", people: 2 }));
    assert.deepEqual(check.result, { date: GUEST.date, time: "21:00", free_tables: 0 });
    await b.close();
    await other.b.close();
  });

  it("an onSession hook refuses a blocked tier", async () => {
    const url = await serve();
    const b = await FakeBrisvox.connect(url);
    const answer = await b.offer({ params: { tier: "blocked" } });
    assert.equal(answer.type, "session.refuse");
  });

  it("runs as a process: node booking_agent.mjs --port N with BRISVOX_AGENT_SECRET", async () => {
    const child = spawn(process.execPath, [fileURLToPath(EXAMPLE), "--port", "0"], {
      env: { ...process.env, BRISVOX_AGENT_SECRET: SECRET },
      stdio: ["ignore", "pipe", "inherit"],
    });
    try {
      let out = "";
      const url = await new Promise<string>((resolve, reject) => {
        child.stdout.on("data", (d: Buffer) => {
          out += d.toString();
          const m = /listening on (ws:\/\/\S+)/.exec(out);
          if (m) resolve(m[1]!);
        });
        child.once("exit", (code) => reject(new Error(`exited ${code}: ${out}`)));
      });
      const { b } = await FakeBrisvox.live(url);
      const r = await b.result(b.call("check_availability", { date: "2030-01-01", time: "18:00", people: 4 }));
      assert.deepEqual(r.result, { date: "2030-01-01", time: "18:00", free_tables: 4 });
      await b.close();
      child.kill("SIGTERM");
      const [code] = await once(child, "exit");
      assert.equal(code, 0);
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });

  it("exits 2 with a message when BRISVOX_AGENT_SECRET is unset", async () => {
    const env = { ...process.env };
    delete env.BRISVOX_AGENT_SECRET;
    const child = spawn(process.execPath, [fileURLToPath(EXAMPLE), "--port", "0"], { env, stdio: ["ignore", "ignore", "pipe"] });
    let err = "";
    child.stderr.on("data", (d: Buffer) => (err += d.toString()));
    const [code] = await once(child, "exit");
    assert.equal(code, 2);
    assert.match(err, /BRISVOX_AGENT_SECRET/);
  });
});
