/**
 * Optional bearer-token authentication (issue #13). With tokens configured, every request except the
 * probes (`/livez`, `/readyz`, `/health`) must carry `Authorization: Bearer <token>` naming one of
 * them; anything else is a 401 with the error body and `WWW-Authenticate: Bearer`. Without tokens
 * (the local default) nothing is checked.
 *
 * Tokens come from `auth.tokens` / `SVC_API_TOKENS` and from `auth.tokens_file` (one per line, `#`
 * comments), which is read again when it changes, at most once a second: a rotated Kubernetes Secret
 * mounted as that file takes effect without a restart. A file that becomes unreadable keeps the last
 * tokens read (and logs why) rather than locking everyone out or letting everyone in.
 *
 * Our own code rather than hono's `bearerAuth`: that one takes a fixed list and compares strings;
 * this needs a list that changes under it and comparisons whose time does not depend on how much of
 * a guess was right (sha256 digests compared with timingSafeEqual, every token tried).
 */
import { createHash, timingSafeEqual } from 'node:crypto';
import { readFileSync, statSync } from 'node:fs';
import type { MiddlewareHandler } from 'hono';
import type { Clock } from '../../clock.ts';
import { ConfigError } from '../../config.ts';
import { AppError } from '../../errors.ts';
import type { Logger } from '../../logger.ts';
import type { AppEnv } from '../deps.ts';
import { errorResponse } from '../errors.ts';
import { requestHeader } from '../request-header.ts';

/** Paths answered without a token (probes). */
export const OPEN_PATHS: ReadonlySet<string> = new Set(['/livez', '/readyz', '/health']);
/** Shortest token accepted from configuration. */
export const MIN_TOKEN_LENGTH = 16;
const RECHECK_MS = 1000;

/** Where tokens come from. */
export interface TokenSources {
  tokens: readonly string[];
  tokensFile: string | null;
}

/** The tokens in a file's text: one per line, blank lines and `#` comments skipped. */
export function parseTokens(text: string): string[] {
  return text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
}

const digest = (s: string) => createHash('sha256').update(s, 'utf8').digest();

/** The accepted tokens, kept as digests; re-reads the file when its mtime or size changes. */
export class TokenSet {
  private fixed: Buffer[];
  private fromFile: Buffer[] = [];
  private fileStamp = '';
  private checkedAt = -Infinity;

  constructor(
    private readonly sources: TokenSources,
    private readonly clock: Clock,
    private readonly log: Logger,
  ) {
    this.fixed = sources.tokens.map(digest);
    if (sources.tokensFile) this.reload(true);
  }

  /** Whether any token is configured (authentication is on). */
  get enabled(): boolean {
    return this.sources.tokens.length > 0 || this.sources.tokensFile !== null;
  }

  /** Whether `token` is one of the accepted ones. */
  accepts(token: string): boolean {
    this.maybeReload();
    const d = digest(token);
    let ok = false;
    for (const t of [...this.fixed, ...this.fromFile]) ok = timingSafeEqual(t, d) || ok;
    return ok;
  }

  private maybeReload(): void {
    if (!this.sources.tokensFile) return;
    const now = this.clock.now();
    if (now - this.checkedAt < RECHECK_MS) return;
    this.checkedAt = now;
    this.reload(false);
  }

  /** Reads the file when it changed; at start a problem is thrown (the service must not start open). */
  private reload(atStart: boolean): void {
    const file = this.sources.tokensFile!;
    try {
      const st = statSync(file);
      const stamp = `${st.mtimeMs}:${st.size}:${st.ino}`;
      if (stamp === this.fileStamp) return;
      const tokens = parseTokens(readFileSync(file, 'utf8'));
      const short = tokens.filter((t) => t.length < MIN_TOKEN_LENGTH).length;
      if (short > 0) throw new Error(`${short} token(s) shorter than ${MIN_TOKEN_LENGTH} characters`);
      if (tokens.length === 0 && this.sources.tokens.length === 0) throw new Error('it holds no token');
      this.fromFile = tokens.map(digest);
      this.fileStamp = stamp;
      if (!atStart) this.log.info({ file, tokens: tokens.length }, 'API tokens reloaded');
    } catch (err) {
      const why = `auth.tokens_file ${file}: ${(err as Error).message}`;
      if (atStart) throw new ConfigError(`invalid configuration: ${why}`);
      this.log.warn({ err: why }, 'API tokens not reloaded; keeping the previous ones');
    }
  }
}

/** The middleware: a no-op when the set is not enabled. */
export function bearerAuth(tokens: TokenSet): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    if (!tokens.enabled || OPEN_PATHS.has(c.req.path)) return next();
    const header = requestHeader(c, 'authorization');
    const m = header ? /^Bearer[ ]+([^\s]+)\s*$/i.exec(header) : null;
    if (!m || !tokens.accepts(m[1]!)) {
      const res = errorResponse(new AppError('unauthorized', header ? 'the bearer token is not valid' : 'authentication required: send Authorization: Bearer <token>'), c);
      res.headers.set('WWW-Authenticate', header ? 'Bearer realm="sandpod", error="invalid_token"' : 'Bearer realm="sandpod"');
      return res;
    }
    return next();
  };
}
