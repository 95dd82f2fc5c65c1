/**
 * The signed handshake: `X-Brisvox-Signature: t=<unix seconds>,n=<nonce>,v2=<hex>` with
 * `v2 = HMAC-SHA256(secret, "v2.<t>.<n>.<session>")`: the timestamp and a fresh random
 * nonce are inside what is signed. A {@link NonceCache} (the Agent holds one) refuses a
 * nonce accepted before within the clock window, so a captured handshake replayed is refused.
 */
import { createHmac, randomBytes, timingSafeEqual } from "node:crypto";

/** The session header: printable ASCII, bounded. */
const SESSION_ID = /^[\x21-\x7e]{1,256}$/;
const NONCE = /^[0-9a-f]{16,64}$/;

/** Why a handshake is refused (HTTP 401; 503 for `nonceFull`). */
export const REFUSALS = Object.freeze({
  oldScheme: "unsigned nonce (a v1 signature): upgrade brisvox",
  replayed: "replayed handshake",
  nonceFull: "too many handshakes in the clock window",
});

export function signatureDigest(secret: string, t: number | string, nonce: string, session: string): string {
  return createHmac("sha256", secret).update(`v2.${t}.${nonce}.${session}`).digest("hex");
}

/** The header value brisvox sends (exported for tests and for writing a client): a fresh nonce unless given. */
export function signHandshake(
  secret: string,
  session: string,
  t: number = Math.floor(Date.now() / 1000),
  nonce: string = randomBytes(16).toString("hex"),
): string {
  return `t=${t},n=${nonce},v2=${signatureDigest(secret, t, nonce, session)}`;
}

export type Verdict = { ok: true; t: number; nonce: string } | { ok: false; reason: string };

/**
 * The nonces of the handshakes accepted within the clock window. A nonce is kept until its
 * `t` leaves the window (so every replay the clock check lets through is caught); at most
 * `capacity` are held, and when that many live ones are held a new handshake is refused
 * (fail closed: a live nonce is never forgotten to make room). Only handshakes whose
 * signature matched are recorded.
 */
export class NonceCache {
  private readonly until = new Map<string, number>();

  constructor(
    readonly windowS: number,
    readonly capacity: number = 65_536,
  ) {}

  get size(): number {
    return this.until.size;
  }

  /** Record `nonce` of a handshake signed at `t`: null, or why it is refused. */
  admit(nonce: string, t: number, nowS: number = Date.now() / 1000): string | null {
    for (const [n, u] of this.until) {
      if (u >= nowS) break; // the oldest accepted first; one still live ends the cheap sweep
      this.until.delete(n);
    }
    if (this.until.has(nonce)) return REFUSALS.replayed;
    if (this.until.size >= this.capacity) {
      for (const [n, u] of this.until) if (u < nowS) this.until.delete(n); // a full sweep before refusing
      if (this.until.size >= this.capacity) return REFUSALS.nonceFull;
    }
    this.until.set(nonce, t + this.windowS);
    return null;
  }
}

/**
 * Checks the handshake headers. Any of `secrets` may have signed (a rotation); the
 * comparison is constant time (timingSafeEqual over the 32 digest bytes). With `nonces`,
 * a nonce already accepted within the window is refused (and a new one remembered).
 */
export function verifyHandshake(
  secrets: readonly string[],
  session: string | undefined,
  header: string | undefined,
  windowS: number,
  nowS: number = Date.now() / 1000,
  nonces?: NonceCache,
): Verdict {
  if (typeof session !== "string" || !SESSION_ID.test(session)) return { ok: false, reason: "missing or malformed X-Brisvox-Session" };
  if (typeof header !== "string" || header.length > 1024) return { ok: false, reason: "missing X-Brisvox-Signature" };
  let t: string | undefined;
  let nonce: string | undefined;
  let v1 = false;
  const v2: string[] = [];
  for (const part of header.split(",")) {
    const eq = part.indexOf("=");
    if (eq < 0) continue;
    const k = part.slice(0, eq).trim();
    const v = part.slice(eq + 1).trim();
    if (k === "t") t = v;
    else if (k === "n") nonce ??= v;
    else if (k === "v2") v2.push(v);
    else if (k === "v1") v1 = true;
  }
  if (v1 && nonce === undefined && v2.length === 0) return { ok: false, reason: REFUSALS.oldScheme };
  if (t === undefined || !/^[0-9]{1,12}$/.test(t)) return { ok: false, reason: "malformed signature timestamp" };
  if (nonce === undefined || !NONCE.test(nonce)) return { ok: false, reason: "malformed signature nonce" };
  if (Math.abs(nowS - Number(t)) > windowS) return { ok: false, reason: "signature timestamp outside the window" };
  const given = v2.filter((h) => /^[0-9a-fA-F]{64}$/.test(h)).map((h) => Buffer.from(h, "hex"));
  if (given.length === 0) return { ok: false, reason: "malformed signature" };
  let match = false;
  for (const secret of secrets) {
    const want = Buffer.from(signatureDigest(secret, t, nonce, session), "hex");
    for (const g of given) if (g.length === want.length && timingSafeEqual(g, want)) match = true;
  }
  if (!match) return { ok: false, reason: "bad signature" };
  const why = nonces?.admit(nonce, Number(t), nowS) ?? null;
  return why === null ? { ok: true, t: Number(t), nonce } : { ok: false, reason: why };
}
