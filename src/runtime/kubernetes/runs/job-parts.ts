/** Small parts of a run's Job (build-job.ts): a built type's image and site directory, and the Secret's owner. */
import type { V1Secret } from '@kubernetes/client-node';
import type { JobType } from '../../../jobtypes/job-type.ts';
import { ENV_SITE } from '../builds/build-image.ts';

/** Where a built job type's image holds its installed requirements. */
export const BUILT_SITE_DIR = ENV_SITE;

/** The image of a job type built on this runtime (an image by digest), or null. */
export function builtImage(jobType: JobType): string | null {
  const ref = jobType.build?.imageRef;
  return ref && /@sha256:[a-f0-9]{64}$/.test(ref) ? ref : null;
}

/** Requirements of the run that the built type's own do not cover. */
export function extraRequirements(run: readonly string[], type: readonly string[]): string[] {
  const have = new Set(type.map((r) => r.trim()));
  return run.filter((r) => !have.has(r.trim()));
}

/** The Secret with an owner reference to its Job, so deleting the Job (or its TTL) removes it. */
export function ownSecret(secret: V1Secret, job: { metadata?: { name?: string; uid?: string } }): V1Secret {
  const uid = job.metadata?.uid;
  const jobName = job.metadata?.name;
  if (!uid || !jobName) throw new Error('ownSecret: the Job has no uid yet');
  return {
    ...secret,
    metadata: {
      ...secret.metadata,
      ownerReferences: [{ apiVersion: 'batch/v1', kind: 'Job', name: jobName, uid, blockOwnerDeletion: false }],
    },
  };
}

