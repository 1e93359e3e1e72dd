/**
 * The `http` section of the configuration (issue 22): which Host names the API answers when
 * authentication is off, and the caps on concurrent event streams. Kept beside the API that reads it;
 * `config.ts` includes it in the one schema.
 */
import * as v from 'valibot';

/** An entry of `http.allowed_hosts`: a name, `*.domain`, an IPv4 or `[IPv6]` address (no port), or `*`. */
export const ALLOWED_HOST_RE = /^(\*|(\*\.)?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:.]+\])$/i;

/** Schema of the `http` section. */
export const HttpConfigSchema = v.optional(
  v.object({
    /**
     * With authentication off, the API answers only requests whose Host is a loopback name
     * (`localhost`, `127.0.0.1`, `[::1]`, any port) or one of these (DNS rebinding: issue 22). `*`
     * turns the check off. Ignored when tokens are configured (the token is the check then).
     */
    allowed_hosts: v.optional(
      v.array(v.pipe(v.string(), v.regex(ALLOWED_HOST_RE, 'must be a host name, *.domain, an IPv4 address, [IPv6 address] or *, without a port'))),
      [],
    ),
    /** Concurrent `GET /jobs/{id}/events` streams this process serves in all; past it, 429. */
    max_event_streams: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(100_000)), 256),
    /** Concurrent event streams per token (with authentication off, all callers share one allowance); past it, 429. */
    max_event_streams_per_token: v.optional(v.pipe(v.number(), v.integer(), v.minValue(1), v.maxValue(100_000)), 32),
  }),
  {},
);
