/**
 * Pure decisions about a session's pod (issue 19), in the style of runs/decide.ts: where its start
 * stands, whether its end was the OOM killer's, and what a collector's refusal means to the API.
 */
import type { V1Pod } from '@kubernetes/client-node';
import { AppError, type ErrorCode } from '../../../errors.ts';
import { CONTAINERS } from '../names.ts';
import { IMAGE_ERRORS, START_ERRORS, mainOomKilled } from '../runs/decide.ts';

/** Where a session pod stands: absent (not made or seen yet), starting, `attachable` (its collector runs), ended, gone (being deleted). */
export type PodEnd = 'absent' | 'starting' | 'attachable' | 'ended' | 'gone';

/** Waiting reasons of a container that will not start by waiting. */
const STUCK = new Set([...IMAGE_ERRORS, 'CreateContainerConfigError', 'CreateContainerError', 'RunContainerError']);

/** The pod's state as a session's start and end see it. */
export function podEnd(pod: V1Pod | undefined): PodEnd {
  if (!pod) return 'absent';
  if (pod.metadata?.deletionTimestamp) return 'gone';
  const phase = pod.status?.phase;
  if (phase === 'Failed' || phase === 'Succeeded') return 'ended';
  const all = [...(pod.status?.initContainerStatuses ?? []), ...(pod.status?.containerStatuses ?? [])];
  for (const c of pod.status?.containerStatuses ?? []) if (c.state?.terminated) return 'ended';
  if (all.some((c) => STUCK.has(c.state?.waiting?.reason ?? '') || START_ERRORS.has(c.state?.terminated?.reason ?? ''))) return 'ended';
  if (all.some((c) => c.name === CONTAINERS.deps && c.state?.terminated && c.state.terminated.exitCode !== 0)) return 'ended';
  const collector = pod.status?.containerStatuses?.find((c) => c.name === CONTAINERS.collector);
  return collector?.state?.running ? 'attachable' : 'starting';
}

/**
 * Whether the pod's status has said all it will about how it ended: gone or ending, its phase final,
 * a container that cannot start, or every container terminated. An OOM kill can show on any container
 * and the kubelet reports them one at a time (one terminated, the other's OOMKilled a moment later).
 */
export function podSettled(pod: V1Pod | undefined): boolean {
  if (!pod || pod.metadata?.deletionTimestamp) return true;
  const phase = pod.status?.phase;
  if (phase === 'Failed' || phase === 'Succeeded') return true;
  const all = [...(pod.status?.initContainerStatuses ?? []), ...(pod.status?.containerStatuses ?? [])];
  if (all.some((c) => STUCK.has(c.state?.waiting?.reason ?? '') || START_ERRORS.has(c.state?.terminated?.reason ?? ''))) return true;
  const containers = pod.status?.containerStatuses ?? [];
  // main ended by itself, not by a SIGKILL (137, what an OOM kill is): no OOM verdict is coming.
  const main = containers.find((c) => c.name === CONTAINERS.main)?.state?.terminated;
  if (main && main.exitCode !== 137 && main.reason !== 'OOMKilled') return true;
  return containers.length > 0 && containers.every((c) => !!c.state?.terminated);
}

/** Why a session pod could not start (for the 503's message), from its containers' states. */
export function podTrouble(pod: V1Pod | undefined): string {
  const all = [...(pod?.status?.initContainerStatuses ?? []), ...(pod?.status?.containerStatuses ?? [])];
  for (const c of all) {
    const w = c.state?.waiting;
    const t = c.state?.terminated;
    if (w?.reason && STUCK.has(w.reason)) return `${c.name}: ${w.reason}: ${w.message ?? ''}`.trim();
    if (t && (t.exitCode !== 0 || START_ERRORS.has(t.reason ?? ''))) return `${c.name} ended (exit ${t.exitCode}${t.reason ? `, ${t.reason}` : ''})${t.message ? `: ${t.message.slice(-300)}` : ''}`;
  }
  return `pod ${pod?.status?.phase ?? 'absent'}`;
}

/** Whether the pod's end was the OOM killer's: a container says `OOMKilled`, or main's 137 comes with the sandbox's memory gone (runs/decide.ts). */
export function podOom(pod: V1Pod | undefined): boolean {
  if (mainOomKilled(pod)) return true;
  const all = [...(pod?.status?.initContainerStatuses ?? []), ...(pod?.status?.containerStatuses ?? [])];
  return all.some((c) => c.state?.terminated?.reason === 'OOMKilled' || c.lastState?.terminated?.reason === 'OOMKilled');
}

/** The collector's codes of a refused file operation, as API errors. */
const ANSWER_CODES: Record<string, ErrorCode> = {
  not_found: 'not_found',
  conflict: 'conflict',
  payload_too_large: 'payload_too_large',
  bad_request: 'bad_request',
};

/** A refused file operation's answer as the AppError the API answers with (unknown codes: 409). */
export function answerError(reply: Record<string, unknown>): AppError {
  const code = typeof reply.code === 'string' ? ANSWER_CODES[reply.code] : undefined;
  const message = typeof reply.message === 'string' ? reply.message.slice(0, 500) : 'the file operation was refused';
  return new AppError(code ?? 'conflict', message);
}
