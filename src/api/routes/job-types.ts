/** Job types (SPEC §4.9). The image build is answered 501 until a runtime implements it. */
import { Hono } from 'hono';
import { describeRoute } from 'hono-openapi';
import { AppError } from '../../errors.ts';
import { toView } from '../../jobtypes/job-type.ts';
import type { AppDeps, AppEnv } from '../deps.ts';
import { errorResponses, jsonResponse, pathParam } from '../openapi.ts';
import { JobTypeListSchema, JobTypeSchema } from '../responses.ts';

const nameParam = pathParam('name', 'Job type name');

/** Sub-app for `/job-types`, `/job-types/{name}`, the 501 build. */
export function jobTypeRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  const mustGet = (name: string) => {
    const jt = deps.registry.get(name);
    if (!jt) throw new AppError('not_found', `job type '${name}' not found`);
    return jt;
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
      summary: 'Build a job type image (not implemented: 501)',
      description: 'Requirements are installed at run time and cached, so there is nothing to build yet.',
      parameters: [nameParam, { name: 'version_tag', in: 'query', description: 'Semantic version label (accepted, unused until builds exist)', schema: { type: 'string' } }],
      responses: errorResponses(404, 501),
    }),
    (c) => {
      mustGet(c.req.param('name'));
      throw new AppError('not_implemented', 'image builds are not implemented yet; requirements are installed at run time and cached');
    },
  );
  return app;
}
