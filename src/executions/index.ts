/**
 * What the layers above (the HTTP API, main.ts) use of the record lifecycle. They import from here,
 * not from the files behind it, so the lifecycle can be arranged without touching its callers.
 */
export { Executions, type SubmittedJob } from './service.ts';
export { CompletionWaiter } from './waiter.ts';
export { EventFeed } from './event-feed.ts';
export { inputArtifactFiles, recordView, syncView } from './views.ts';
export * from './status.ts';
export { TakenOverError } from './outcome.ts';
/** Whether an error means the database is out of reach (the API answers 503 for it). */
export { isDatabaseUnavailable } from '../store/database.ts';
