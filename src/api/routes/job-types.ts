/**
 * Job types (SPEC §4.9) and their builds. `POST /job-types/{name}/build` builds the type's
 * environment with the runtime's builder (jobtypes/builds.ts); it waits for the build by default
 * (200), or answers 202 at once with `wait=false` and the build's URL in `Location`, which
 * `GET /job-types/{name}/builds/{id}` follows (`phase` shows progress). A runtime without a builder
 * answers 501.
 */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import * as v from 'valibot';
import { AppError } from '../../errors.ts';
import { buildView, checkVersionTag } from '../../jobtypes/builds.ts';
import { toView } from '../../jobtypes/job-type.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { errorResponses, jsonResponse, pathParam, queryValidator } from '../openapi.ts';
import { BuildListSchema, BuildSchema, ErrorSchema, JobTypeListSchema, JobTypeSchema } from '../responses.ts';
import { jsonBody } from '../validate.ts';

const nameParam = pathParam('name', 'Job type name');

const VERSION_TAG_TEXT = 'Semantic version label (semver 2.0.0, e.g. 1.4.0 or 2.0.0-rc.1); runs of this build record it as job_version. Default: `latest`.';

/** `POST /job-types/{name}/build` query. */
const BuildQuery = v.object({
  version_tag: v.optional(v.pipe(v.string('version_tag must be given once'), v.description(VERSION_TAG_TEXT))),
  wait: v.optional(
    v.pipe(
      v.picklist(['true', 'false', '1', '0'], 'wait must be true or false'),
      v.description('Wait for the build to end (default). false: answer 202 at once; follow Location.'),
      v.transform((s) => s === 'true' || s === '1'),
    ),
  ),
});

/** Optional JSON body of the build (the same fields as the query). */
const BuildBody = v.strictObject({
  version_tag: v.optional(v.nullable(v.pipe(v.string('version_tag must be a string'), v.description(VERSION_TAG_TEXT)))),
  wait: v.optional(v.boolean('wait must be a boolean')),
});

/** Sub-app for `/job-types`, `/job-types/{name}`, the build and its records. */
export function jobTypeRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const mustGet = (name: string) => {
    const jt = deps.registry.get(name);
    if (!jt) throw new AppError('not_found', `job type '${name}' not found`);
    return jt;
  };
  const builds = () => {
    if (!deps.builds?.supported) throw new AppError('not_implemented', 'job-type builds are not implemented for this runtime yet; requirements are installed at run time and cached');
    return deps.builds;
  };

  app.get(
    '/job-types',
    describeRoute({ operationId: 'listJobTypes', tags: ['job-types'], summary: 'Job types', responses: { 200: jsonResponse('Every job type, by name', JobTypeListSchema) } }),
    (c) => c.json(deps.registry.list().map(toView)),
  );

  app.get(
    '/job-types/:name',
    describeRoute({
      operationId: 'getJobType',
      tags: ['job-types'],
      summary: 'One job type',
      parameters: [nameParam],
      responses: { 200: jsonResponse('The job type', JobTypeSchema), ...errorResponses(404) },
    }),
    (c) => c.json(toView(mustGet(c.req.param('name')))),
  );

  app.post(
    '/job-types/:name/build',
    describeRoute({
      operationId: 'buildJobType',
      tags: ['job-types'],
      summary: 'Build a job type',
      description:
        'Resolves and installs the type\'s requirements into a pinned, content-addressed environment (local runtime). Concurrent builds of the same inputs share one build. version_tag and wait may come in the query or in an optional JSON body.',
      parameters: [nameParam],
      responses: {
        200: jsonResponse('Built', BuildSchema),
        202: jsonResponse('wait=false: the build runs; Location names GET /job-types/{name}/builds/{id}', BuildSchema),
        422: jsonResponse('The build failed (code build_failed); `build` is the failed build with the builder\'s message', ErrorSchema),
        ...errorResponses(400, 404, 413, 415, 501),
      },
    }),
    queryValidator(BuildQuery),
    async (c) => {
      const name = c.req.param('name');
      const q = c.req.valid('query');
      const body = await jsonBody(c, BuildBody, { optional: true, limit: deps.config.max_body_bytes });
      if (q.version_tag !== undefined && body.version_tag !== undefined && body.version_tag !== q.version_tag) {
        throw new AppError('validation_error', 'version_tag: the query and the body name different tags');
      }
      const tag = q.version_tag ?? body.version_tag ?? null;
      const wait = q.wait ?? body.wait ?? true;
      mustGet(name);
      checkVersionTag(tag);
      const handle = await builds().build(name, tag);
      if (!wait) {
        const row = await builds().getBuild(name, handle.id);
        c.header('Location', `/job-types/${encodeURIComponent(name)}/builds/${handle.id}`);
        return c.json(buildView(row), 202);
      }
      const row = await handle.done;
      if (row.status !== 'built') {
        throw new AppError('build_failed', `build of job type '${name}' failed: ${row.error ?? 'no message'}`, { build: buildView(row) });
      }
      return c.json(buildView(row), 200);
    },
  );

  app.get(
    '/job-types/:name/builds',
    describeRoute({
      operationId: 'listJobTypeBuilds',
      tags: ['job-types'],
      summary: 'Builds of a job type, newest first (at most 50)',
      parameters: [nameParam],
      responses: { 200: jsonResponse('The builds', BuildListSchema), ...errorResponses(404, 501) },
    }),
    async (c) => c.json((await builds().listBuilds(c.req.param('name'))).map(buildView)),
  );

  app.get(
    '/job-types/:name/builds/:id',
    describeRoute({
      operationId: 'getJobTypeBuild',
      tags: ['job-types'],
      summary: 'One build: its phase while it runs, its result after',
      parameters: [nameParam, pathParam('id', 'Build id')],
      responses: { 200: jsonResponse('The build', BuildSchema), ...errorResponses(404, 501) },
    }),
    async (c) => c.json(buildView(await builds().getBuild(c.req.param('name'), c.req.param('id')))),
  );
  return app;
}
