/**
 * The closed set of errors the service itself raises, and the HTTP status each maps to.
 * Error *types of runs* (SPEC §7.2) live in `executions/classify.ts`; these are API/operational codes.
 */
export const ERROR_STATUS = {
  bad_request: 400,
  validation_error: 400,
  /** The service's configuration refuses the request (production_mode without a built environment). */
  config_error: 400,
  unauthorized: 401,
  /** Authentication is off and the request's Host or Origin is not one the local default answers (issue 22). */
  forbidden: 403,
  not_found: 404,
  wait_timeout: 408,
  idempotency_conflict: 409,
  conflict: 409,
  /** A job-type build ran and failed (pip could not resolve or install); the body says why. */
  build_failed: 422,
  /** A session's requirements could not be installed (pip's words in the detail). */
  dependency_error: 422,
  payload_too_large: 413,
  unsupported_media_type: 415,
  /** A cap on concurrent use was reached (event streams per token or in all); retry later. */
  too_many_requests: 429,
  queue_full: 503,
  service_unavailable: 503,
  shutting_down: 503,
  database_unavailable: 503,
  internal_error: 500,
  not_implemented: 501,
} as const;

/** An error code known to the API; each has exactly one HTTP status. */
export type ErrorCode = keyof typeof ERROR_STATUS;

/**
 * A known, expected failure. `detail` is shown to the client as is; `extra` fields are merged
 * into the error body (for example `existing_job_id` on a 409).
 */
export class AppError extends Error {
  readonly code: ErrorCode;
  readonly status: number;
  readonly extra: Record<string, unknown>;
  constructor(code: ErrorCode, detail: string, extra: Record<string, unknown> = {}) {
    super(detail);
    this.name = 'AppError';
    this.code = code;
    this.status = ERROR_STATUS[code];
    this.extra = extra;
  }
}

/**
 * A failure that retrying cannot fix (bad spec, image that does not exist, refused by policy).
 * Retry helpers and controllers stop at once on it.
 */
export class UnretryableError extends Error {
  override readonly name = 'UnretryableError';
  /** SPEC §7.2 error type the run should end with. */
  readonly errorType: string;
  constructor(message: string, errorType = 'internal_error', options?: ErrorOptions) {
    super(message, options);
    this.errorType = errorType;
  }
}

/** Message of any thrown value, for logs and records. */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return typeof err === 'string' ? err : JSON.stringify(err);
}
