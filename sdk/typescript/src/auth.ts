/** The signed handshake: `X-Brisvox-Signature: t=<unix seconds>,v1=HMAC-SHA256(secret, "<t>.<session>")`. */
import { createHmac, timingSafeEqual } from "node:crypto";

/** The session header: printable ASCII, bounded. */
const SESSION_ID = /^[\x21-\x7e]{1,256}$/;

export function signatureDigest(secret: string, t: number | string, session: string): string {
  return createHmac("sha256", secret).update(`${t}.${session}`).digest("hex");
}

/** The header value brisvox sends (exported for tests and for writing a client). */
export function signHandshake(secret: string, session: string, t: number = Math.floor(Date.now() / 1000)): string {
  return `t=${t},v1=${signatureDigest(secret, t, session)}`;
}

export type Verdict = { ok: true } | { ok: false; reason: string };

/**
 * Checks the handshake headers. Any of `secrets` may have signed (a rotation); the
 * comparison is constant time (timingSafeEqual over the 32 digest bytes).
 */
export function verifyHandshake(
  secrets: readonly string[],
  session: string | undefined,
  header: string | undefined,
  windowS: number,
  nowS: number = Date.now() / 1000,
): Verdict {
  if (typeof session !== "string" || !SESSION_ID.test(session)) return { ok: false, reason: "missing or malformed X-Brisvox-Session" };
  if (typeof header !== "string" || header.length > 1024) return { ok: false, reason: "missing X-Brisvox-Signature" };
  let t: string | undefined;
  const v1: string[] = [];
  for (const part of header.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    const k = part.slice(0, eq).trim();
    const v = part.slice(eq + 1).trim();
    if (k === "t") t = v;
    else if (k === "v1") v1.push(v);
  }
  if (t === undefined || !/^[0-9]{1,12}$/.test(t)) return { ok: false, reason: "malformed signature timestamp" };
  if (Math.abs(nowS - Number(t)) > windowS) return { ok: false, reason: "signature timestamp outside the window" };
  const given = v1.filter((h) => /^[0-9a-fA-F]{64}$/.test(h)).map((h) => Buffer.from(h, "hex"));
  if (given.length === 0) return { ok: false, reason: "malformed signature" };
  let match = false;
  for (const secret of secrets) {
    const want = Buffer.from(signatureDigest(secret, t, session), "hex");
    for (const g of given) if (g.length === want.length && timingSafeEqual(g, want)) match = true;
  }
  return match ? { ok: true } : { ok: false, reason: "bad signature" };
}
