/**
 * Verify a brisvox webhook (docs/PROTOCOL.md "Webhooks"). Every POST to a `[[webhooks]]` URL
 * carries `Brisvox-Signature: t=<unix seconds>,v1=<hex>`: the HMAC-SHA256, keyed with the
 * webhook's secret, of the ASCII `t`, a `.` and the raw request body. Check it against the body
 * exactly as received (before any JSON parsing); delivery is at least once, so deduplicate on
 * the event's `id`.
 */
import { createHmac, timingSafeEqual } from "node:crypto";

export const WEBHOOK_SIGNATURE_HEADER = "Brisvox-Signature";

/** The envelope of every webhook event. */
export interface WebhookEvent {
  id: string;
  type: "call.started" | "call.answered" | "call.ended" | "tool.called" | "campaign.row.done";
  created: number;
  data: Record<string, unknown>;
}

/** The signature header does not sign this body with this secret, or is too old. */
export class WebhookError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "WebhookError";
  }
}

function parse(header: string): { t: number | null; sigs: string[] } {
  let t: number | null = null;
  const sigs: string[] = [];
  for (const item of header.split(",")) {
    const at = item.indexOf("=");
    if (at < 0) continue;
    const k = item.slice(0, at).trim();
    const v = item.slice(at + 1).trim();
    if (k === "t" && /^\d{1,12}$/.test(v)) t = Number(v);
    else if (k === "v1" && v) sigs.push(v);
  }
  return { t, sigs };
}

/**
 * The event when `header` signs `body` with `secret` and its timestamp is within `toleranceS`
 * seconds of `nowS` (default: the clock); else throws {@link WebhookError}. Any one of several
 * `v1=` entries may match (secret rotation).
 */
export function verifyWebhook(
  secret: string | Buffer,
  header: string | null | undefined,
  body: string | Buffer | Uint8Array,
  toleranceS = 300,
  nowS: number = Date.now() / 1000,
): WebhookEvent {
  const raw = typeof body === "string" ? Buffer.from(body, "utf8") : Buffer.from(body);
  const { t, sigs } = parse(header ?? "");
  if (t === null || sigs.length === 0) throw new WebhookError("malformed Brisvox-Signature header");
  if (Math.abs(nowS - t) > toleranceS) throw new WebhookError(`timestamp ${t} is outside the tolerance of ${toleranceS} s`);
  const want = createHmac("sha256", secret).update(`${t}.`).update(raw).digest();
  const ok = sigs.some((s) => {
    const got = Buffer.from(s, "hex");
    return got.length === want.length && /^[0-9a-f]+$/i.test(s) && timingSafeEqual(got, want);
  });
  if (!ok) throw new WebhookError("no signature matches this body and secret");
  let event: unknown;
  try {
    event = JSON.parse(raw.toString("utf8"));
  } catch (e) {
    throw new WebhookError(`the body is not JSON: ${(e as Error).message}`);
  }
  if (event === null || typeof event !== "object" || Array.isArray(event)) {
    throw new WebhookError("the body is not a JSON object");
  }
  return event as WebhookEvent;
}
