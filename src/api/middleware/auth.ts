/**
 * Optional bearer-token authentication (issue #13). With tokens configured, every request except the
 * probes (`/livez`, `/readyz`, `/health`) must carry `Authorization: Bearer <token>` naming one of
 * them; anything else is a 401 with the error body and `WWW-Authenticate: Bearer`. Without tokens
 * (the local default) nothing is checked.
 *
 * Tokens come from `auth.tokens` / `SVC_API_TOKENS` and from `auth.tokens_file` (one per line, `#`
 * comments), which is read again when it changes, at most once a second: a rotated Kubernetes Secret
 * mounted as that file takes effect without a restart. A change of the file is authoritative and fails
 * closed (issue 22): a file emptied of tokens revokes every token it held; a file that cannot be read
 * or holds an invalid (too short) token makes no token valid at all, the configured ones included,
 * until it is fixed. Each such change is logged as an error and counted
 * (`sandpod_auth_tokens_file_errors_total`): an operator revoking a token must never find it still
 * working because the new file was malformed.
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
  /** The file's last change left it unusable: no token is valid until it changes again. */
  private failedClosed = false;
  /** Changes of the tokens file that left it unusable (missing, unreadable, invalid), since start. */
  fileErrors = 0;

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

  /** Whether the tokens file's last change left it unusable (every request is refused meanwhile). */
  get failed(): boolean {
    this.maybeReload();
    return this.failedClosed;
  }

  /** Whether `token` is one of the accepted ones. */
  accepts(token: string): boolean {
    return this.match(token) !== null;
  }

  /**
   * A short, stable name of the accepted token `token` is (a digest prefix, safe to log and to key
   * limits by), or null when it is not accepted.
   */
  match(token: string): string | null {
    this.maybeReload();
    const d = digest(token);
    let ok = false;
    for (const t of [...this.fixed, ...this.fromFile]) ok = timingSafeEqual(t, d) || ok;
    return ok && !this.failedClosed ? `token:${d.subarray(0, 6).toString('hex')}` : null;
  }

  private maybeReload(): void {
    if (!this.sources.tokensFile) return;
    const now = this.clock.now();
    if (now - this.checkedAt < RECHECK_MS) return;
    this.checkedAt = now;
    this.reload(false);
  }

  /**
   * Reads the file when it changed. At start a problem is thrown (the service must not start open);
   * later it fails closed: see the header.
   */
  private reload(atStart: boolean): void {
    const file = this.sources.tokensFile!;
    let stamp: string;
    try {
      const st = statSync(file);
      stamp = `${st.mtimeMs}:${st.size}:${st.ino}`;
    } catch (err) {
      stamp = `error:${(err as NodeJS.ErrnoException).code ?? 'unknown'}`;
    }
    if (stamp === this.fileStamp) return;
    this.fileStamp = stamp;
    try {
      const tokens = parseTokens(readFileSync(file, 'utf8'));
      const short = tokens.filter((t) => t.length < MIN_TOKEN_LENGTH).length;
      if (short > 0) throw new Error(`${short} token(s) shorter than ${MIN_TOKEN_LENGTH} characters`);
      if (tokens.length === 0 && this.sources.tokens.length === 0) {
        if (atStart) throw new Error('it holds no token');
        // Emptied on purpose (every token revoked): nothing is accepted, which is what was asked.
        this.fileErrors += 1;
        this.log.error({ file }, 'API tokens file holds no token: every request is refused until one is added');
      }
      this.fromFile = tokens.map(digest);
      this.failedClosed = false;
      if (!atStart) this.log.info({ file, tokens: tokens.length }, 'API tokens reloaded');
    } catch (err) {
      const why = `auth.tokens_file ${file}: ${(err as Error).message}`;
      if (atStart) throw new ConfigError(`invalid configuration: ${why}`);
      this.fromFile = [];
      this.failedClosed = true;
      this.fileErrors += 1;
      this.log.error({ err: why }, 'API tokens file is unusable: no token is accepted until it is fixed');
    }
  }
}

/**
 * The middleware: a no-op when the set is not enabled. On the probe paths a request is never refused,
 * but one carrying a valid token is marked (`principal`) so `/health` shows it the details.
 */
export function bearerAuth(tokens: TokenSet): MiddlewareHandler<AppEnv> {
  return async (c, next) => {
    if (!tokens.enabled) return next();
    const header = requestHeader(c, 'authorization');
    const m = header ? /^Bearer[ ]+([^\s]+)\s*$/i.exec(header) : null;
    const principal = m ? tokens.match(m[1]!) : null;
    if (principal) c.set('principal', principal);
    if (principal || OPEN_PATHS.has(c.req.path)) return next();
    const res = errorResponse(new AppError('unauthorized', header ? 'the bearer token is not valid' : 'authentication required: send Authorization: Bearer <token>'), c);
    res.headers.set('WWW-Authenticate', header ? 'Bearer realm="sandpod", error="invalid_token"' : 'Bearer realm="sandpod"');
    return res;
  };
}
