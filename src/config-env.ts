/**
 * The environment variables that override configuration keys (kept out of config.ts to keep that
 * file to the schema and its checks). `PORT` is checked where it is merged, in `parseConfig`.
 */

/** Comma-separated list → trimmed, non-empty items. */
const list = (s: string) => s.split(',').map((t) => t.trim()).filter(Boolean);

/**
 * `raw` (the file's keys) with the environment's overrides merged in: `SVC_WORKSPACE`,
 * `SVC_DATABASE_URL`, `SVC_HOST`, `SVC_LOG_LEVEL`, `SVC_LOG_FORMAT`, `SVC_API_TOKENS`
 * (comma-separated), `SVC_API_TOKENS_FILE` and `SVC_ALLOWED_HOSTS` (comma-separated, replaces
 * `http.allowed_hosts`). The environment wins.
 */
export function withEnvOverrides(raw: Record<string, unknown>, env: NodeJS.ProcessEnv): Record<string, unknown> {
  const merged: Record<string, unknown> = { ...raw };
  if (env.SVC_WORKSPACE) merged.workspace = env.SVC_WORKSPACE;
  if (env.SVC_DATABASE_URL) merged.database_url = env.SVC_DATABASE_URL;
  if (env.SVC_LOG_LEVEL) merged.log_level = env.SVC_LOG_LEVEL;
  if (env.SVC_LOG_FORMAT) merged.log_format = env.SVC_LOG_FORMAT;
  if (env.SVC_HOST) merged.host = env.SVC_HOST;
  if (env.SVC_API_TOKENS || env.SVC_API_TOKENS_FILE) {
    const auth = { ...((merged.auth as Record<string, unknown> | undefined) ?? {}) };
    if (env.SVC_API_TOKENS) auth.tokens = list(env.SVC_API_TOKENS);
    if (env.SVC_API_TOKENS_FILE) auth.tokens_file = env.SVC_API_TOKENS_FILE;
    merged.auth = auth;
  }
  if (env.SVC_ALLOWED_HOSTS) merged.http = { ...((merged.http as Record<string, unknown> | undefined) ?? {}), allowed_hosts: list(env.SVC_ALLOWED_HOSTS) };
  return merged;
}
