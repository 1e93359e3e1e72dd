/**
 * The `webhooks` configuration key (issue 21): where completion callbacks may go, how they are signed,
 * and how long delivery is tried. Kept beside the code that uses it, out of config.ts.
 */
import * as v from 'valibot';
import { isHostPattern } from '../jobtypes/host-patterns.ts';

/** A Standard Webhooks secret: `whsec_` and the base64 of 24 to 64 random bytes. */
export const SECRET_RE = /^whsec_[A-Za-z0-9+/]{32,88}={0,2}$/;

const int = (min: number, max = Number.MAX_SAFE_INTEGER) => v.pipe(v.number(), v.integer(), v.minValue(min), v.maxValue(max));

/** `webhooks:` in SVC_CONFIG. */
export const WebhooksConfigSchema = v.optional(
  v.object({
    /**
     * Signing secrets. Every delivery carries one signature per secret, so during a rotation the old
     * and the new secret are both valid for receivers; the first one listed is the current one.
     */
    secrets: v.optional(v.array(v.pipe(v.string(), v.regex(SECRET_RE, 'must be a Standard Webhooks secret: whsec_ followed by base64 (24 to 64 bytes)'))), []),
    /** A file with more secrets, one per line (the chart mounts a Kubernetes Secret here); read at start. */
    secrets_file: v.optional(v.nullable(v.pipe(v.string(), v.minLength(1))), null),
    /** Host patterns a callback URL must match (the egress rules of jobtypes/host-patterns.ts). Empty: no callbacks. */
    allowed_hosts: v.optional(
      v.array(v.pipe(v.string(), v.check(isHostPattern, 'must be a host pattern: a name, *.domain, * or an IP address, optionally with :port'))),
      [],
    ),
    /**
     * Let a host name lead to a loopback, private, link-local or other non-public address. Off: only
     * an address written literally in `allowed_hosts` may be one (the operator named it).
     */
    allow_private_addresses: v.optional(v.boolean(), false),
    /** The callback of every submission that names none (after its job type's default). */
    default_callback_url: v.optional(v.nullable(v.pipe(v.string(), v.minLength(1))), null),
    /** Attempts per delivery before it is given up (and put in the DLQ as `webhook_failed`). */
    max_attempts: v.optional(int(1, 100), 8),
    /** No attempt starts later than this after the first one. */
    max_age_seconds: v.optional(int(1, 7 * 24 * 3600), 3600),
    /** Delay before the second attempt; each later one doubles it (with jitter). */
    base_delay_seconds: v.optional(int(1, 3600), 25),
    /** One attempt's deadline: connect, send, and the answer's status line. */
    timeout_seconds: v.optional(int(1, 120), 10),
    /** Most bytes of an answer read (then the connection is closed); none are stored. */
    max_response_bytes: v.optional(int(0, 1024 * 1024), 4096),
    /** Deliveries sent at once by this process. */
    concurrency: v.optional(int(1, 64), 4),
    /** Run the delivery worker in this process. */
    deliver: v.optional(v.boolean(), true),
  }),
  {},
);

export type WebhooksConfig = v.InferOutput<typeof WebhooksConfigSchema>;
