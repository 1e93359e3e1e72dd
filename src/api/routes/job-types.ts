/** Job types (SPEC §4.9). The image build is answered 501 until a runtime implements it. */
import { Hono } from 'hono';
import { AppError } from '../../errors.ts';
import { toView } from '../../jobtypes/job-type.ts';
import type { AppDeps, AppEnv } from '../deps.ts';

export function jobTypeRoutes(deps: AppDeps) {
  const app = new Hono<AppEnv>();
  app.get('/job-types', (c) => c.json(deps.registry.list().map(toView)));
  app.get('/job-types/:name', (c) => {
    const jt = deps.registry.get(c.req.param('name'));
    if (!jt) throw new AppError('not_found', `job type '${c.req.param('name')}' not found`);
    return c.json(toView(jt));
  });
  app.post('/job-types/:name/build', (c) => {
    if (!deps.registry.get(c.req.param('name'))) throw new AppError('not_found', `job type '${c.req.param('name')}' not found`);
    throw new AppError('not_implemented', 'image builds are not implemented yet; requirements are installed at run time and cached');
  });
  return app;
}
