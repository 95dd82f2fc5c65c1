import assert from "node:assert/strict";
import { createHmac } from "node:crypto";
import { describe, it } from "node:test";
import { WebhookError, verifyWebhook } from "../src/index.js";

const SECRET = "whsec_test";
const BODY = JSON.stringify({ id: "evt_1", type: "call.ended", created: 1767139200, data: { call_id: "c1" } });
const T = 1767139200;

function header(secret = SECRET, body = BODY, t = T): string {
  return `t=${t},v1=${createHmac("sha256", secret).update(`${t}.${body}`).digest("hex")}`;
}

describe("verifyWebhook", () => {
  it("verifies a signed body and returns the event", () => {
    const ev = verifyWebhook(SECRET, header(), BODY, 300, T + 10);
    assert.equal(ev.id, "evt_1");
    assert.deepEqual(ev.data, { call_id: "c1" });
    assert.equal(verifyWebhook(Buffer.from(SECRET), header(), Buffer.from(BODY), 300, T).type, "call.ended");
  });

  it("refuses a tampered body", () => {
    assert.throws(() => verifyWebhook(SECRET, header(), BODY.replace("c1", "c2"), 300, T), /no signature matches/);
  });

  it("refuses an old timestamp (and one from the future); the tolerance is the caller's", () => {
    assert.throws(() => verifyWebhook(SECRET, header(), BODY, 300, T + 301), /tolerance/);
    assert.throws(() => verifyWebhook(SECRET, header(), BODY, 300, T - 301), /tolerance/);
    assert.equal(verifyWebhook(SECRET, header(), BODY, 3600, T + 3000).id, "evt_1");
  });

  it("refuses a wrong secret", () => {
    assert.throws(() => verifyWebhook("another", header(), BODY, 300, T), WebhookError);
  });

  it("refuses malformed headers and accepts any matching v1", () => {
    for (const bad of [null, "", "v1=abc", `t=${T}`, "t=x,v1=abc", `t=${T},v0=abc`]) {
      assert.throws(() => verifyWebhook(SECRET, bad, BODY, 300, T), /malformed/);
    }
    assert.throws(() => verifyWebhook(SECRET, `t=${T},v1=zz`, BODY, 300, T), /no signature matches/);
    const rotated = `${header("old")},${header().split(",")[1]}`;
    assert.equal(verifyWebhook(SECRET, rotated, BODY, 300, T).id, "evt_1");
  });

  it("refuses a signed body that is not an object", () => {
    assert.throws(() => verifyWebhook(SECRET, header(SECRET, "[1]"), "[1]", 300, T), /not a JSON object/);
  });
});
