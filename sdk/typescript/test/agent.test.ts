import assert from "node:assert/strict";
import { after, describe, it } from "node:test";
import {
  CommandError,
  CommandRefused,
  CommandTimeout,
  NonceCache,
  REFUSALS,
  Refuse,
  ToolError,
  ToolKind,
  signHandshake,
  verifyHandshake,
  type Agent,
  type Session,
  type ToolContext,
} from "../src/index.js";
import { FakeBrisvox, HandshakeRefused, SECRET, deferred, startAgent } from "./fake_brisvox.js";

const OBJ = { type: "object", properties: { x: { type: "integer" } }, required: ["x"] } as const;

const agents: Agent[] = [];
async function serve(setup: (agent: Agent) => void, options = {}) {
  const r = await startAgent(setup, options);
  agents.push(r.agent);
  return r;
}
after(async () => {
  await Promise.all(agents.map((a) => a.close(500)));
});

describe("handshake", () => {
  it("accepts a signed offer with the tool declarations and the call metadata", async () => {
    let seen: Session | null = null;
    const { url } = await serve((a) => {
      a.tool(
        { name: "book_table", description: "Book a table.", parameters: { ...OBJ }, kind: ToolKind.SideEffect, timeoutMs: 5000, fillerAfterMs: 1200 },
        () => ({}),
      );
      a.tool({ name: "check", description: "Check.", parameters: { type: "object" }, kind: ToolKind.ReadOnly, repeatable: true }, () => ({}));
      a.onSession((s) => {
        seen = s;
      });
    });
    const b = await FakeBrisvox.connect(url);
    const accept = await b.offer();
    assert.equal(accept.type, "session.accept");
    assert.equal(accept.session, b.session);
    assert.deepEqual(accept.subscribe, []);
    assert.deepEqual(accept.tools, [
      { name: "book_table", description: "Book a table.", parameters: OBJ, kind: "side_effect", timeout_ms: 5000, filler_after_ms: 1200, repeatable: false, confirm: false },
      { name: "check", description: "Check.", parameters: { type: "object" }, kind: "read_only", timeout_ms: 5000, filler_after_ms: null, repeatable: true, confirm: false },
    ]);
    const s = seen as unknown as Session;
    assert.equal(s.id, b.session);
    assert.deepEqual(s.call, { callId: b.session, agent: "booking", transport: "twilio", caller: "+4930123", called: "+4930999", params: { tier: "gold" } });
    assert.deepEqual(s.localTools, ["end_call"]);
    assert.equal(s.resumed, false);
    await b.close();
  });

  it("refuses a bad signature with HTTP 401", async () => {
    const { url } = await serve(() => {});
    await assert.rejects(FakeBrisvox.connect(url, { secret: "not-the-secret" }), (e: unknown) => e instanceof HandshakeRefused && e.status === 401);
    await assert.rejects(FakeBrisvox.connect(url, { signature: "garbage" }), (e: unknown) => e instanceof HandshakeRefused && e.status === 401);
    // a signature for another session
    const other = await import("../src/index.js").then((m) => m.signHandshake(SECRET, "other-session"));
    await assert.rejects(FakeBrisvox.connect(url, { session: "this-session", signature: other }), (e: unknown) => e instanceof HandshakeRefused && e.status === 401);
  });

  it("refuses a stale (or future) timestamp with HTTP 401", async () => {
    const { url } = await serve(() => {});
    const now = Math.floor(Date.now() / 1000);
    await assert.rejects(FakeBrisvox.connect(url, { t: now - 31 }), (e: unknown) => e instanceof HandshakeRefused && e.status === 401);
    await assert.rejects(FakeBrisvox.connect(url, { t: now + 31 }), (e: unknown) => e instanceof HandshakeRefused && e.status === 401);
    const b = await FakeBrisvox.connect(url, { t: now - 25 }); // inside the window
    await b.close();
  });

  it("refuses a replayed handshake with HTTP 401 and counts it", async () => {
    const { url, agent } = await serve(() => {});
    const session = "replayed-session";
    const captured = signHandshake(SECRET, session);
    const first = await FakeBrisvox.connect(url, { session, signature: captured });
    await assert.rejects(FakeBrisvox.connect(url, { session, signature: captured }), (e: unknown) => e instanceof HandshakeRefused && e.status === 401);
    assert.equal(agent.handshakesRefused.get(REFUSALS.replayed), 1);
    const again = await FakeBrisvox.connect(url, { session }); // a fresh nonce: accepted
    await first.close();
    await again.close();
  });

  it("keeps a nonce for the window, then forgets it; refuses when full", () => {
    const cache = new NonceCache(30, 2);
    assert.equal(cache.admit("a".repeat(32), 1000, 1000), null);
    assert.equal(cache.admit("a".repeat(32), 1000, 1029), REFUSALS.replayed);
    assert.equal(cache.admit("b".repeat(32), 1000, 1001), null);
    assert.equal(cache.admit("c".repeat(32), 1000, 1002), REFUSALS.nonceFull);
    assert.equal(cache.admit("c".repeat(32), 1031, 1031), null); // the others left the window
    assert.equal(cache.size, 1);
    const v1 = "t=1000,v1=" + "0".repeat(64);
    assert.deepEqual(verifyHandshake([SECRET], "s", v1, 30, 1000), { ok: false, reason: REFUSALS.oldScheme });
    const h = signHandshake(SECRET, "s", 1000, "d".repeat(32));
    assert.deepEqual(verifyHandshake([SECRET], "s", h.replace("d".repeat(32), "e".repeat(32)), 30, 1000), { ok: false, reason: "bad signature" });
  });

  it("answers session.refuse when an onSession hook refuses, and closes", async () => {
    const { url } = await serve((a) => {
      a.onSession((s) => (s.call.params.tier === "blocked" ? new Refuse("closed today") : undefined));
      a.onSession((s) => {
        if (s.call.caller === "+1") throw new Refuse("no callers from +1");
      });
      a.onSession((s) => (s.call.caller === "+2" ? { refuse: "not you" } : undefined));
    });
    for (const [call, reason] of [
      [{ params: { tier: "blocked" } }, "closed today"],
      [{ caller: "+1" }, "no callers from +1"],
      [{ caller: "+2" }, "not you"],
    ] as const) {
      const b = await FakeBrisvox.connect(url);
      const answer = await b.offer(call);
      assert.deepEqual(answer, { type: "session.refuse", session: b.session, reason });
      const closed = await b.closed;
      assert.equal(closed.code, 1000);
    }
    const b = await FakeBrisvox.connect(url);
    assert.equal((await b.offer()).type, "session.accept");
    await b.close();
  });

  it("refuses an offer of another protocol version; a hook may add offer:false tools to a session", async () => {
    const { url } = await serve((a) => {
      a.tool({ name: "a", description: "A.", parameters: { type: "object" }, kind: "read_only" }, () => 1);
      a.tool({ name: "vip", description: "V.", parameters: { type: "object" }, kind: "read_only", offer: false }, () => 2);
      a.onSession((s) => (s.call.params.tier === "gold" ? ["vip"] : undefined));
    });
    const v2 = await FakeBrisvox.connect(url);
    const refused = await v2.offer({}, { v: 2 });
    assert.equal(refused.type, "session.refuse");
    const gold = await FakeBrisvox.live(url);
    assert.deepEqual(gold.accept.tools.map((t: { name: string }) => t.name), ["a", "vip"]);
    assert.equal((await gold.b.result(gold.b.call("vip", {}))).result, 2);
    const plain = await FakeBrisvox.live(url, { params: {} });
    assert.deepEqual(plain.accept.tools.map((t: { name: string }) => t.name), ["a"]);
    const r = await plain.b.result(plain.b.call("vip", {}));
    assert.equal(r.ok, false);
    assert.match(r.error.message, /unknown_tool/);
    await gold.b.close();
    await plain.b.close();
  });

  it("answers 404 on another path", async () => {
    const { url } = await serve(() => {});
    await assert.rejects(FakeBrisvox.connect(url.replace("/brisvox", "/other")), (e: unknown) => e instanceof HandshakeRefused && e.status === 404);
  });

  it("a re-dial (resume: true) gets the same Session back, and its tools.set narrowing again", async () => {
    const offers: { session: Session; resumed: boolean }[] = [];
    const { url } = await serve((a) => {
      a.tool({ name: "a", description: "A.", parameters: { type: "object" }, kind: "read_only" }, () => 1);
      a.tool({ name: "b", description: "B.", parameters: { type: "object" }, kind: "read_only" }, () => 2);
      a.onSession((s) => {
        offers.push({ session: s, resumed: s.resumed });
      });
    });
    const { b } = await FakeBrisvox.live(url);
    await new Promise((r) => setTimeout(r, 20));
    const s = offers[0]!.session;
    s.state.set("guest", "Ada");
    await s.setTools(["b"]);
    await b.next("tools.set");
    b.ws.terminate(); // the connection drops
    await b.closed;
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(s.live, false);
    const again = await FakeBrisvox.connect(url, { session: b.session });
    const accept = await again.offer({}, { resume: true });
    assert.equal(accept.type, "session.accept");
    again.send({ type: "session.ready", tools: ["a", "b"], refused: [] });
    assert.deepEqual(await again.next("tools.set"), { type: "tools.set", names: ["b"] });
    assert.equal(offers.length, 2);
    assert.equal(offers[1]!.session, s);
    assert.equal(offers[1]!.resumed, true);
    assert.equal(s.state.get("guest"), "Ada");
    assert.equal(s.live, true);
    await again.close();
  });

  it("a command sent before session.ready waits for it", async () => {
    const said = deferred<string>();
    const { url } = await serve((a) =>
      a.onSession((s) => {
        s.say("Welcome back.").then(() => said.resolve("acked"), (e: Error) => said.resolve(e.message));
      }),
    );
    const b = await FakeBrisvox.connect(url);
    await b.offer();
    await b.none("command", 100); // not before ready
    b.send({ type: "session.ready", tools: [], refused: [] });
    const cmd = await b.next("command");
    b.send({ type: "command.ack", id: cmd.id, ok: true });
    assert.equal(await said.promise, "acked");
    await b.close();
  });
});

describe("tool calls", () => {
  it("runs a tool with its context and answers tool.result once", async () => {
    let ctxSeen: ToolContext | null = null;
    const { url } = await serve((a) =>
      a.tool({ name: "add", description: "Add.", parameters: { ...OBJ }, kind: "read_only" }, (args: { x: number }, ctx) => {
        ctxSeen = ctx;
        return { y: args.x + 1 };
      }),
    );
    const { b } = await FakeBrisvox.live(url);
    const id = b.call("add", { x: 41 }, { key: "9f2c", epoch: 3, callId: "t3.0" });
    assert.deepEqual(await b.result(id), { type: "tool.result", id, ok: true, result: { y: 42 } });
    const ctx = ctxSeen as unknown as ToolContext;
    assert.equal(ctx.idempotencyKey, "9f2c");
    assert.equal(ctx.epoch, 3);
    assert.equal(ctx.callId, "t3.0");
    assert.equal(ctx.id, id);
    assert.equal(ctx.call.caller, "+4930123");
    assert.equal(ctx.deadlineMs, 5000);
    assert.equal(ctx.signal.aborted, false);
    await b.none("tool.result");
    await b.close();
  });

  it("answers a throwing tool with ok:false and a bounded message", async () => {
    const { url } = await serve((a) => {
      a.tool({ name: "full", description: "F.", parameters: { type: "object" }, kind: "side_effect" }, () => {
        throw new ToolError("no table left");
      });
      a.tool({ name: "crash", description: "C.", parameters: { type: "object" }, kind: "read_only" }, async () => {
        throw new Error("é".repeat(2000));
      });
      a.tool({ name: "cyclic", description: "C.", parameters: { type: "object" }, kind: "read_only" }, () => {
        const o: Record<string, unknown> = {};
        o.self = o;
        return o;
      });
    });
    const { b } = await FakeBrisvox.live(url);
    const r1 = await b.result(b.call("full", {}));
    assert.deepEqual({ ok: r1.ok, error: r1.error }, { ok: false, error: { message: "no table left" } });
    const r2 = await b.result(b.call("crash", {}));
    assert.equal(r2.ok, false);
    assert.ok(Buffer.byteLength(r2.error.message) <= 512, "bounded to 512 bytes");
    assert.ok(r2.error.message.startsWith("éé"));
    const r3 = await b.result(b.call("cyclic", {}));
    assert.equal(r3.ok, false);
    assert.match(r3.error.message, /not JSON-serializable/);
    const r4 = await b.result(b.call("nope", {}));
    assert.equal(r4.ok, false);
    assert.match(r4.error.message, /unknown_tool/);
    await b.close();
  });

  it("sends no result after tool.cancel and aborts the tool's signal", async () => {
    const aborted = deferred<unknown>();
    const { url } = await serve((a) =>
      a.tool({ name: "slow", description: "S.", parameters: { type: "object" }, kind: "read_only" }, (_args, ctx) => {
        return new Promise((resolve) => {
          ctx.signal.addEventListener("abort", () => {
            aborted.resolve(ctx.signal.reason);
            resolve({ late: true }); // a result after the cancel: must never be sent
          });
        });
      }),
    );
    const { b } = await FakeBrisvox.live(url);
    const id = b.call("slow", {});
    await new Promise((r) => setTimeout(r, 50));
    b.send({ type: "tool.cancel", id, reason: "barge_in" });
    assert.equal(await aborted.promise, "barge_in");
    await b.none((f) => f.type === "tool.result", 300);
    b.send({ type: "tool.cancel", id: "never-called", reason: "timeout" }); // harmless
    await b.none(() => true, 100);
    await b.close();
  });

  it("bounds a session to 32 calls waiting: the 33rd is answered busy at once", async () => {
    const gate = deferred();
    let started = 0;
    const { url } = await serve((a) =>
      a.tool({ name: "wait", description: "W.", parameters: { type: "object" }, kind: "read_only" }, async () => {
        started++;
        await gate.promise;
        return "done";
      }),
    );
    const { b } = await FakeBrisvox.live(url);
    const ids = Array.from({ length: 32 }, () => b.call("wait", {}));
    const extra = b.call("wait", {});
    const busy = await b.result(extra, 1000);
    assert.equal(busy.ok, false);
    assert.match(busy.error.message, /^busy/);
    assert.equal(started, 32);
    gate.resolve();
    for (const id of ids) assert.equal((await b.result(id)).ok, true);
    // freed: a new call runs
    assert.equal((await b.result(b.call("wait", {}))).result, "done");
    await b.close();
  });

  it("refuses a duplicate id while the first call runs, and a malformed call", async () => {
    const gate = deferred();
    const { url } = await serve((a) =>
      a.tool({ name: "wait", description: "W.", parameters: { type: "object" }, kind: "read_only" }, async () => {
        await gate.promise;
        return 1;
      }),
    );
    const { b } = await FakeBrisvox.live(url);
    b.call("wait", {}, { id: "r1" });
    b.call("wait", {}, { id: "r1" });
    const err = await b.next("error");
    assert.deepEqual([err.code, err.ref], ["bad_message", "r1"]);
    b.send({ type: "tool.call", id: "r2", name: "wait" });
    const err2 = await b.next("error");
    assert.deepEqual([err2.code, err2.ref], ["bad_message", "r2"]);
    gate.resolve();
    await b.result("r1");
    await b.none((f) => f.type === "tool.result");
    b.call("wait", {}, { id: "r1" }); // answered already: one result per id
    const err3 = await b.next("error");
    assert.deepEqual([err3.code, err3.ref], ["bad_message", "r1"]);
    await b.none((f) => f.type === "tool.result");
    await b.close();
  });
});

describe("framing", () => {
  it("answers an oversized frame with too_large and keeps the session", async () => {
    const { url } = await serve((a) => a.tool({ name: "one", description: "O.", parameters: { type: "object" }, kind: "read_only" }, () => 1));
    const { b } = await FakeBrisvox.live(url);
    const big = JSON.stringify({ type: "tool.call", id: "r-big", name: "one", arguments: { pad: "x".repeat(1024 * 1024) } });
    b.sendRaw(big);
    const err = await b.next("error");
    assert.equal(err.code, "too_large");
    assert.equal(err.ref, "r-big");
    assert.equal((await b.result(b.call("one", {}))).result, 1);
    await b.close();
  });

  it("answers unknown types, binary frames and non-objects with typed errors", async () => {
    const { url } = await serve(() => {});
    const { b } = await FakeBrisvox.live(url);
    b.send({ type: "tool.explode", id: "z" });
    const e1 = await b.next("error");
    assert.deepEqual([e1.code, e1.ref], ["unknown_type", "tool.explode"]);
    b.sendRaw(Buffer.from([1, 2, 3]), true);
    assert.equal((await b.next("error")).code, "bad_message");
    b.sendRaw("[1,2]");
    assert.equal((await b.next("error")).code, "bad_message");
    b.sendRaw("{not json");
    assert.equal((await b.next("error")).code, "bad_message");
    b.sendRaw('{"no":"type"}');
    assert.equal((await b.next("error")).code, "bad_message");
    assert.equal(b.ws.readyState, b.ws.OPEN);
    await b.close();
  });

  it("answers a tool.call before the session is accepted with not_live", async () => {
    const { url } = await serve(() => {});
    const b = await FakeBrisvox.connect(url);
    b.call("x", {}, { id: "early" });
    const err = await b.next("error");
    assert.deepEqual([err.code, err.ref], ["not_live", "early"]);
    await b.close();
  });
});

describe("commands", () => {
  it("resolves at command.ack ok and rejects at ok:false, a timeout or over the say bound", async () => {
    const done = deferred<unknown[]>();
    const { url } = await serve(
      (a) =>
        a.tool({ name: "act", description: "A.", parameters: { type: "object" }, kind: "side_effect" }, async (_args, ctx) => {
          const out: unknown[] = [];
          await ctx.say("One moment please.");
          out.push("said");
          await ctx.transfer("+4930123456").catch((e: CommandError) => out.push(["transfer", e.error, e.command, e instanceof CommandRefused]));
          await ctx.endCall("done").catch((e: CommandError) => out.push(["end_call", e.error.split(":")[0], e instanceof CommandTimeout]));
          await ctx.say("x".repeat(1001)).catch((e: CommandError) => out.push(["say", e.error.split(":")[0]]));
          await ctx.note("gold member").catch((e: CommandError) => out.push(["note", e.error]));
          await ctx.note("again");
          out.push("noted");
          done.resolve(out);
          return "ok";
        }),
      { limits: { commandTimeoutMs: 200 } },
    );
    const { b } = await FakeBrisvox.live(url);
    b.call("act", {});
    const say = await b.next("command");
    assert.deepEqual({ ...say, id: undefined }, { type: "command", id: undefined, name: "say", text: "One moment please." });
    b.send({ type: "command.ack", id: say.id, ok: true });
    const transfer = await b.next("command");
    assert.deepEqual([transfer.name, transfer.target], ["transfer", "+4930123456"]);
    b.send({ type: "command.ack", id: transfer.id, ok: false, error: "not a transfer target" });
    const end = await b.next("command");
    assert.equal(end.name, "end_call"); // never acked: times out
    const note = await b.next("command", 2000);
    assert.deepEqual([note.name, note.text], ["note", "gold member"]);
    b.send({ type: "error", code: "rate_limited", message: "over 20 commands a second", ref: note.id }); // an error naming it refuses it
    const note2 = await b.next("command", 2000);
    assert.equal(note2.text, "again");
    b.send({ type: "command.ack", id: note2.id, ok: true });
    assert.deepEqual(await done.promise, ["said", ["transfer", "not a transfer target", "transfer", true], ["end_call", "timeout", true], ["say", "too_long"], ["note", "rate_limited: over 20 commands a second"], "noted"]);
    await b.close();
  });

  it("dial resolves with the new call's ids from the ack, rejects with brisvox's reason", async () => {
    const done = deferred<unknown[]>();
    const { url } = await serve((a) =>
      a.tool({ name: "call_back", description: "C.", parameters: { type: "object" }, kind: "side_effect" }, async (_args, ctx) => {
        const out: unknown[] = [];
        out.push(await ctx.dial("+4930123456", { agent: "callback" }));
        out.push(await ctx.dial("+4930123456", { via: "twilio" }));
        await ctx.dial("+4930999", { timeoutMs: 2000 }).catch((e: CommandError) => out.push([e.error, e instanceof CommandRefused]));
        await ctx.dial("+49", { via: "pigeon" as "sip" }).catch((e: CommandError) => out.push(e.error));
        done.resolve(out);
        return "ok";
      }),
    );
    const { b } = await FakeBrisvox.live(url);
    b.call("call_back", {});
    const sip = await b.next("command");
    assert.deepEqual([sip.name, sip.target, sip.agent, sip.via], ["dial", "+4930123456", "callback", "sip"]);
    b.send({ type: "command.ack", id: sip.id, ok: true, via: "sip", call_id: "c9", ringing_at_ms: 120, answered_at_ms: 2300, progress_at_ms: "soon" });
    const tw = await b.next("command");
    assert.deepEqual([tw.via, tw.agent], ["twilio", undefined]);
    b.send({ type: "command.ack", id: tw.id, ok: true, via: "twilio", call_sid: "CA1", status: "queued" });
    const refused = await b.next("command");
    b.send({ type: "command.ack", id: refused.id, ok: false, error: "not a dial target ([agent_link] dial_targets)" });
    assert.deepEqual(await done.promise, [
      { via: "sip", callId: "c9", callSid: "", status: "", ringingAtMs: 120, progressAtMs: null, answeredAtMs: 2300 },
      { via: "twilio", callId: "", callSid: "CA1", status: "queued", ringingAtMs: null, progressAtMs: null, answeredAtMs: null },
      ["not a dial target ([agent_link] dial_targets)", true],
      "via must be sip or twilio",
    ]);
    await b.close();
  });

  it("setTools sends tools.set for declared names and refuses others; commands reject once the session ended", async () => {
    const sessions = deferred<Session>();
    const { url } = await serve((a) => {
      a.tool({ name: "a", description: "A.", parameters: { type: "object" }, kind: "read_only" }, () => 1);
      a.tool({ name: "b", description: "B.", parameters: { type: "object" }, kind: "read_only" }, () => 2);
      a.on("ready", (_info, s) => sessions.resolve(s));
    });
    const { b } = await FakeBrisvox.live(url);
    const s = await sessions.promise;
    assert.deepEqual(s.ready?.tools, ["a", "b"]);
    await s.setTools(["b"]);
    assert.deepEqual(await b.next("tools.set"), { type: "tools.set", names: ["b"] });
    await assert.rejects(s.setTools(["zzz"]), (e: unknown) => e instanceof CommandError && e.error.startsWith("invalid_tool"));
    const pending = assert.rejects(s.say("still there?"), (e: unknown) => e instanceof CommandError && e.error.startsWith("not_live"));
    await b.next("command");
    await b.close();
    await pending;
    await assert.rejects(s.note("x"), (e: unknown) => e instanceof CommandError && e.error === "not_live");
    assert.equal(s.live, false);
  });
});

describe("events", () => {
  it("subscribes exactly to the events with a handler, delivers only those, in order; closes after hangup", async () => {
    const turns: string[] = [];
    const hangups: string[] = [];
    const { url } = await serve((a) => {
      a.on("user_turn", async (ev) => {
        await new Promise((r) => setTimeout(r, ev.epoch === 3 ? 30 : 0)); // a slow first handler keeps the order
        turns.push(`${ev.epoch}:${ev.text}`);
      });
      a.on("hangup", (ev) => void hangups.push(ev.reason));
      a.on("user_turn", () => {
        throw new Error("a failing handler never ends the call");
      });
    });
    const { b, accept } = await FakeBrisvox.live(url);
    assert.deepEqual(accept.subscribe, ["user_turn", "hangup"]);
    b.send({ type: "event", name: "bot_turn", epoch: 3, text: "For two, at eight?" }); // not subscribed: ignored
    b.send({ type: "event", name: "user_turn", epoch: 3, text: "a table for two" });
    b.send({ type: "event", name: "user_turn", epoch: 4, text: "at eight" });
    b.send({ type: "event", name: "hangup", reason: "caller_hangup" });
    const closed = await b.closed; // the service closes once the hangup handlers ran
    assert.equal(closed.code, 1000);
    assert.deepEqual(turns, ["3:a table for two", "4:at eight"]);
    assert.deepEqual(hangups, ["caller_hangup"]);
  });
});

describe("lifecycle", () => {
  it("aborts running tools when the session ends and closes gracefully", async () => {
    const aborted = deferred<unknown>();
    const closed = deferred<number>();
    const { agent, url } = await startAgent((a) => {
      a.tool({ name: "hang", description: "H.", parameters: { type: "object" }, kind: "read_only" }, (_x, ctx) => {
        ctx.signal.addEventListener("abort", () => aborted.resolve(ctx.signal.reason));
        return new Promise(() => {});
      });
      a.on("close", (info) => closed.resolve(info.code));
    });
    const { b } = await FakeBrisvox.live(url);
    b.call("hang", {});
    await new Promise((r) => setTimeout(r, 30));
    assert.equal(agent.sessions.length, 1);
    await agent.close(1000);
    assert.equal((await b.closed).code, 1001);
    assert.equal(await closed.promise, 1001);
    assert.equal(await aborted.promise, "session_ended");
    await assert.rejects(FakeBrisvox.connect(url));
  });

  it("pings the peer and drops one that stays silent", async () => {
    const { url } = await serve(() => {}, { limits: { pingIntervalMs: 30, deadAfterMs: 10_000 } });
    const b = await FakeBrisvox.connect(url);
    const pinged = await new Promise<boolean>((r) => b.ws.once("ping", () => r(true)));
    assert.ok(pinged);
    await b.close();
    const { url: url2 } = await serve(() => {}, { limits: { pingIntervalMs: 30, deadAfterMs: 80 } });
    const silent = await FakeBrisvox.connect(url2, { autoPong: false });
    const code = (await silent.closed).code;
    assert.ok(code === 1006 || code === 1005, `terminated (${code})`);
  });

  it("refuses to construct without a secret and validates declarations", async () => {
    const { Agent } = await import("../src/index.js");
    const saved = process.env.BRISVOX_AGENT_SECRET;
    delete process.env.BRISVOX_AGENT_SECRET;
    assert.throws(() => new Agent(), /no secret/);
    if (saved !== undefined) process.env.BRISVOX_AGENT_SECRET = saved;
    const a = new Agent({ secret: "x" });
    const ok = { description: "D.", parameters: { type: "object" as const }, kind: "read_only" as const };
    assert.throws(() => a.tool({ ...ok, name: "bad name" }, () => 1), /name/);
    assert.throws(() => a.tool({ ...ok, name: "confirm_pending" }, () => 1), /reserved/);
    assert.throws(() => a.tool({ ...ok, name: "t", timeoutMs: 30_001 }, () => 1), /timeoutMs/);
    assert.throws(() => a.tool({ ...ok, name: "t", parameters: { type: "array" } as never }, () => 1), /JSON Schema/);
    assert.throws(() => a.tool({ ...ok, name: "t", confirm: true }, () => 1), /confirm/);
    a.tool({ ...ok, name: "t" }, () => 1);
    assert.throws(() => a.tool({ ...ok, name: "t" }, () => 1), /twice/);
    for (let i = 1; i < 64; i++) a.tool({ ...ok, name: `t${i}` }, () => 1);
    assert.throws(() => a.tool({ ...ok, name: "t64" }, () => 1), /at most 64/);
  });
});
