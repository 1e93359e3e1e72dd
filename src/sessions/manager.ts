/**
 * Sessions on this process (issue 19): each live session owns one sandbox from the runtime
 * (`Runtime.openSession`), for it only, never reused. Its cells are execution records
 * (`Executions.runCell`), one at a time. Expiry (idle, lifetime) and the sessions of a process that
 * died are settled by a sweep on an injected clock (`decide.ts` decides); everything a session is
 * lives in the `sessions` table, so a restart finds it: locally a sandbox dies with its service, so
 * its sessions end `service_restart` (at a graceful stop at once, after a crash once the old
 * owner's heartbeat is stale).
 */
import { randomUUID } from 'node:crypto';
import type { Clock } from '../clock.ts';
import type { Config } from '../config.ts';
import { AppError } from '../errors.ts';
import { liveLeases } from '../queue/leases.ts';
import { buildRow, checkRequirements, mergedRequirements, resolveJobType, type RequestMeta } from '../executions/requests.ts';
import type { Executions } from '../executions/service.ts';
import type { JobTypeRegistry } from '../jobtypes/job-type.ts';
import type { Logger } from '../logger.ts';
import { runEnv, type Runtime } from '../runtime/runtime.ts';
import { SessionDependencyError, type SessionFiles, type SessionSandbox } from '../runtime/session.ts';
import { hostWorkspaceFiles } from './files.ts';
import type { Db, ExecutionRow, SessionRow } from '../store/database.ts';
import { claimSession, endSession, getSession, heartbeatSessions, insertSessionAdmitted, listSessions, liveSessions, RELEASED_OWNER, releaseSession, releaseSessions, requestHandoff, updateLiveSession } from '../store/sessions.repository.ts';
import { SessionStreams } from './event-stream.ts';
import { admitSession, afterCell, decideExpiry, decideOrphanAction, sessionSettings, type EndReason, type SessionStatus } from './decide.ts';

/** Options of {@link SessionManager}. */
export interface SessionManagerOptions {
  db: Db;
  runtime: Runtime;
  registry: JobTypeRegistry;
  config: Config;
  executions: Executions;
  clock: Clock;
  logger: Logger;
  /** Sweep period, ms (expiry is checked this often). */
  sweepMs?: number;
  /** A session whose owner has not heart-beaten for this long ends `service_restart`, ms (default 5 sweeps). */
  staleMs?: number;
}

/** A `POST /sessions` body after validation. */
export interface SessionRequest {
  job_type?: string | undefined;
  requirements?: string[] | undefined;
  idle_timeout?: number | undefined;
  max_lifetime?: number | undefined;
  timeout?: number | undefined;
}

/** A `POST /sessions/{id}/execute` body after validation. */
export interface CellRequest {
  code: string;
  input_data: Record<string, unknown>;
  timeout?: number | undefined;
  /** The cell's completion webhook (issue 21); absent: the job type's or the configured default; null: none. */
  callback_url?: string | null | undefined;
}

interface Live {
  sandbox: SessionSandbox;
  /** The session's own requirements (beside its job type's): its cells' records carry both. */
  requirements: string[];
  cells: number;
  running: string | null;
  closing: boolean;
  /** File operations in flight (a hand-over waits for none). */
  ops: number;
}

/** How long a request waits for another replica to hand a session over, ms. */
const HANDOFF_WAIT_MS = 10_000;

/** The sessions this process holds. */
export class SessionManager {
  private readonly live = new Map<string, Live>();
  /** Adoptions in progress, by session id (the sweep and a request may both want one). */
  private readonly adopting = new Map<string, Promise<void>>();
  private timer: NodeJS.Timeout | null = null;
  private admission: Promise<unknown> = Promise.resolve();
  private readonly sweepMs: number;
  private readonly staleMs: number;
  /** `GET /sessions/{id}/events` (event-stream.ts): told when a cell's record exists and when a session ends. */
  readonly streams: SessionStreams;

  constructor(private readonly o: SessionManagerOptions) {
    this.sweepMs = o.sweepMs ?? 1000;
    this.staleMs = o.staleMs ?? 5 * this.sweepMs;
    this.streams = new SessionStreams(o.db);
  }

  private now(): Date {
    return new Date(this.o.clock.now());
  }

  /** Settles what an earlier process left, then sweeps every `sweepMs`. */
  async start(): Promise<void> {
    await this.streams.start();
    await this.sweep();
    this.timer = setInterval(() => void this.sweep().catch((err) => this.o.logger.warn({ err: String(err) }, 'session sweep failed')), this.sweepMs);
    this.timer.unref();
  }

  /**
   * Ends every session of this process (`service_restart`: its sandbox goes with the service), or,
   * where sandboxes outlive the service (`Runtime.adoptSession`), lets them go for the next process
   * to adopt: their sandboxes released, their rows marked released.
   */
  async stop(): Promise<void> {
    if (this.timer) clearInterval(this.timer);
    this.timer = null;
    if (this.o.runtime.adoptSession) {
      const held = this.live.size;
      for (const live of this.live.values()) {
        live.closing = true;
        live.sandbox.release?.();
      }
      this.live.clear();
      // Unreleased (the database already gone), they are adopted once this owner is stale instead.
      const n = held > 0 ? await releaseSessions(this.o.db.kysely, this.o.executions.workerId).catch(() => 0) : 0;
      if (n > 0) this.o.logger.info({ sessions: n }, 'sessions released for another process to adopt');
    } else await Promise.all([...this.live.keys()].map((id) => this.finish(id, 'service_restart')));
    await this.streams.stop();
  }

  /** Creates a session and starts its sandbox (SPEC-style 201 body from `sessionView`). */
  async create(req: SessionRequest, meta: RequestMeta): Promise<SessionRow> {
    const { config, registry, runtime, db } = this.o;
    const jt = resolveJobType(registry, req.job_type ?? 'default');
    const extra = (req.requirements ?? []).map((r) => r.trim());
    checkRequirements(config, jt, extra);
    if (!runtime.openSession) throw new AppError('not_implemented', `the ${runtime.name} runtime has no sessions yet`);
    let settings: ReturnType<typeof sessionSettings>;
    try {
      settings = sessionSettings(req, { cellTimeoutS: jt.timeout, maxTimeoutS: config.max_timeout });
    } catch (err) {
      throw new AppError('validation_error', (err as Error).message);
    }
    const id = randomUUID();
    // Count and insert in one transaction under an advisory lock (sessions.repository.ts): two creates,
    // in this process or any other on the database, cannot both take the last place.
    const turn = this.admission.then(async () => {
      const now = this.now();
      const admit = (live: number) => {
        const a = admitSession(live, config.max_sessions);
        if (!a.ok) throw new AppError('service_unavailable', a.message, { max_sessions: config.max_sessions });
      };
      return insertSessionAdmitted(db.kysely, admit, {
        id,
        status: 'starting',
        job_type: jt.name,
        idle_timeout_s: settings.idleTimeoutS,
        max_lifetime_s: settings.maxLifetimeS,
        cell_timeout_s: settings.cellTimeoutS,
        owner: this.o.executions.workerId,
        heartbeat_at: now,
        created_at: now,
        last_used_at: now,
        requirements: JSON.stringify(extra),
        client_ip: meta.clientIp,
        correlation_id: meta.correlationId,
      });
    });
    this.admission = turn.catch(() => {});
    await turn;
    let sandbox: SessionSandbox;
    try {
      // Installing requirements (once; cached for later sessions and runs) counts against the start.
      sandbox = await runtime.openSession(jt, { maxStreamBytes: config.max_stdout_bytes, startupMs: 300_000, requirements: mergedRequirements(jt, extra), sessionId: id, lifetimeSec: settings.maxLifetimeS });
    } catch (err) {
      await endSession(db.kysely, id, 'crashed', this.now());
      if (err instanceof SessionDependencyError) throw new AppError('dependency_error', `the session's requirements could not be installed: ${err.message}`);
      throw new AppError('service_unavailable', `the session's sandbox could not be started: ${(err as Error).message}`);
    }
    this.hold(id, sandbox, extra, 0);
    const row = await updateLiveSession(db.kysely, id, { status: 'ready', warm: sandbox.warm === true });
    if (!row) throw new AppError('conflict', `session '${id}' ended while it started`);
    return row;
  }

  /** Holds a session's sandbox here; its end (crash, OOM) between cells ends the session. */
  private hold(id: string, sandbox: SessionSandbox, requirements: string[], cells: number): Live {
    const live: Live = { sandbox, requirements, cells, running: null, closing: false, ops: 0 };
    this.live.set(id, live);
    sandbox.onEnd((e) => {
      if (!live.closing && !live.running) void this.finish(id, e.reason === 'oom' ? 'oom' : 'crashed');
    });
    return live;
  }

  /**
   * Takes over a session another process held, whose sandbox lives on (a cluster's pod): claimed in
   * the database first (one process wins), then reached again through the runtime. A sandbox that is
   * gone ends the session `crashed`.
   */
  private adopt(r: SessionRow, now: Date): Promise<void> {
    const inFlight = this.adopting.get(r.id);
    if (inFlight) return inFlight;
    const p = this.adoptNow(r, now).finally(() => this.adopting.delete(r.id));
    this.adopting.set(r.id, p);
    return p;
  }

  private async adoptNow(r: SessionRow, now: Date): Promise<void> {
    const db = this.o.db.kysely;
    if (!(await claimSession(db, r.id, r.owner, this.o.executions.workerId, now))) return;
    let sandbox: SessionSandbox | null = null;
    try {
      sandbox = (await this.o.runtime.adoptSession?.(r.id)) ?? null;
    } catch (err) {
      this.o.logger.warn({ session_id: r.id, err: String(err) }, 'could not adopt the session');
    }
    if (!sandbox) {
      if (await endSession(db, r.id, 'crashed', this.now())) this.streams.notify(r.id);
      this.o.logger.info({ session_id: r.id, from: r.owner }, 'session ended: its sandbox was gone when adopted');
      return;
    }
    let requirements: string[] = [];
    try {
      requirements = JSON.parse(r.requirements ?? '[]') as string[];
    } catch {
      /* none known */
    }
    this.hold(r.id, sandbox, requirements, r.cells);
    await updateLiveSession(db, r.id, { status: 'ready', running_cell_id: null });
    this.streams.notify(r.id);
    this.o.logger.info({ session_id: r.id, from: r.owner || 'released', cells: r.cells }, 'session adopted');
  }

  /** One session (404 when unknown). */
  async get(id: string): Promise<SessionRow> {
    const row = await getSession(this.o.db.kysely, id);
    if (!row) throw new AppError('not_found', `session '${id}' not found`);
    return row;
  }

  /** A page of sessions, newest first. */
  list(f: { status?: SessionStatus | undefined; limit: number; offset: number }): Promise<{ rows: SessionRow[]; hasMore: boolean }> {
    return listSessions(this.o.db.kysely, f);
  }

  /**
   * The live session's sandbox here, or the 404/409 that says why there is none. Where sandboxes
   * outlive their holder (a cluster's pods), a session another replica holds is asked for and
   * adopted once that replica lets it go between cells (`handoff_to`; at most HANDOFF_WAIT_MS).
   */
  async held(id: string): Promise<{ live: Live; row: SessionRow }> {
    let row = await this.get(id);
    let live = this.live.get(id);
    if (!live && row.status !== 'ended' && this.o.runtime.adoptSession) {
      live = await this.takeOver(row);
      row = await this.get(id);
    }
    if (row.status === 'ended') throw new AppError('conflict', `session '${id}' has ended (${row.end_reason})`, { status: row.status, end_reason: row.end_reason });
    if (!live || live.closing) throw new AppError('conflict', `session '${id}' is held by another process of the service (${row.owner})`);
    return { live, row };
  }

  /** Asks the holder of a session for it and adopts it once released; undefined when that did not happen in time. */
  private async takeOver(row: SessionRow): Promise<Live | undefined> {
    const db = this.o.db.kysely;
    const me = this.o.executions.workerId;
    if (row.owner !== RELEASED_OWNER && row.owner !== me) await requestHandoff(db, row.id, row.owner, me);
    for (const until = Date.now() + HANDOFF_WAIT_MS; Date.now() < until; ) {
      const r = await getSession(db, row.id);
      if (!r || r.status === 'ended') return undefined;
      if (r.owner === RELEASED_OWNER) await this.adopt(r, this.now());
      else await this.adopting.get(r.id);
      const live = this.live.get(row.id);
      if (live) return live;
      await new Promise((res) => setTimeout(res, 100));
    }
    return undefined;
  }

  /** Lets a session go to the replica that asked for it (between cells, no file operation in flight). */
  private async handOff(id: string, live: Live): Promise<void> {
    if (live.running || live.closing || live.ops > 0) return;
    live.closing = true;
    this.live.delete(id);
    live.sandbox.release?.();
    await releaseSession(this.o.db.kysely, id, this.o.executions.workerId);
    this.o.logger.info({ session_id: id }, 'session handed over to another replica');
  }

  /** Runs one cell (409 with the running cell's id while another runs). */
  async execute(id: string, req: CellRequest, meta: RequestMeta): Promise<{ record: ExecutionRow; cell: number }> {
    const { live, row } = await this.held(id);
    if (live.closing) throw new AppError('conflict', `session '${id}' moved to another process of the service; try again`);
    if (live.running) throw new AppError('conflict', `session '${id}' is running cell ${live.cells} (${live.running}); one cell at a time`, { running_cell_id: live.running });
    const { config, registry, executions, db } = this.o;
    const cellNo = live.cells + 1;
    const timeout = req.timeout ?? row.cell_timeout_s;
    const built = buildRow(config, registry, { code: req.code, input_data: req.input_data, timeout, job_type: row.job_type, requirements: live.requirements, callback_url: req.callback_url }, {
      mode: 'sync',
      status: 'running',
      meta,
      workerId: executions.workerId,
      now: this.now(),
    });
    const cellRow = { ...built, session_id: id, cell: cellNo, relationship: 'session' };
    live.running = cellRow.id;
    live.cells = cellNo;
    try {
      await updateLiveSession(db.kysely, id, { status: 'busy', running_cell_id: cellRow.id, cells: cellNo });
      const record = await executions.runCell(cellRow, (spec, options) => {
        this.streams.notify(id);
        return live.sandbox.runCell({
          cell: cellNo,
          code: spec.code,
          inputJson: spec.inputJson,
          timeoutSec: spec.timeoutSec,
          maxStdoutBytes: spec.maxStdoutBytes,
          maxArtifactBytes: spec.maxArtifactBytes,
          onOutput: options.onOutput,
          env: runEnv(spec),
        });
      });
      return { record, cell: cellNo };
    } finally {
      live.running = null;
      const ended = this.endedSandbox(live);
      const next = afterCell(ended);
      if (next.endReason) await this.finish(id, next.endReason);
      else if (!live.closing) await updateLiveSession(db.kysely, id, { status: 'ready', running_cell_id: null, last_used_at: this.now() });
    }
  }

  private endedSandbox(live: Live): 'oom' | 'crashed' | 'closed' | null {
    return live.closing ? null : (live.sandbox.ended?.reason ?? null);
  }

  /** Closes a session (`closed`); an ended one is returned as it is. */
  async close(id: string): Promise<SessionRow> {
    const row = await this.get(id);
    if (row.status === 'ended') return row;
    if (!this.live.has(id)) await this.held(id);
    await this.finish(id, 'closed');
    return this.get(id);
  }

  /** Ends a session here: its sandbox destroyed, its row ended with `reason` (first reason wins). */
  private async finish(id: string, reason: EndReason): Promise<void> {
    const live = this.live.get(id);
    if (live) {
      live.closing = true;
      this.live.delete(id);
    }
    await endSession(this.o.db.kysely, id, reason, this.now());
    this.streams.notify(id);
    if (live) await live.sandbox.destroy().catch((err) => this.o.logger.warn({ session_id: id, err: String(err) }, 'session sandbox teardown failed'));
    this.o.logger.info({ session_id: id, reason }, 'session ended');
  }

  /** Expiry of this process's sessions, and the sessions of owners that stopped heart-beating. */
  async sweep(): Promise<void> {
    const db = this.o.db.kysely;
    const now = this.o.clock.now();
    await heartbeatSessions(db, this.o.executions.workerId, new Date(now));
    const rows = await liveSessions(db);
    // An owner whose holder lease is live (queue/leases.ts, the database's clock) is slow, not gone:
    // its sessions are not ended however old the heartbeat it wrote with its own clock looks.
    const owners = [...new Set(rows.filter((r) => !this.live.has(r.id) && r.owner !== this.o.executions.workerId).map((r) => r.owner))];
    const alive = await liveLeases(db, owners);
    for (const r of rows) {
      if (this.live.has(r.id) && r.handoff_to && r.handoff_to !== this.o.executions.workerId) await this.handOff(r.id, this.live.get(r.id)!);
      const mine = this.live.has(r.id);
      if (!mine && r.owner === this.o.executions.workerId) continue;
      const clock = { status: r.status as SessionStatus, createdAt: new Date(r.created_at).getTime(), lastUsedAt: new Date(r.last_used_at).getTime(), idleTimeoutS: r.idle_timeout_s, maxLifetimeS: r.max_lifetime_s };
      const expired = decideExpiry(clock, now);
      if (mine && expired) await this.finish(r.id, expired);
      else if (!mine && r.owner !== this.o.executions.workerId) {
        const released = r.owner === RELEASED_OWNER;
        const orphan = decideOrphanAction({ status: clock.status, heartbeatAt: new Date(r.heartbeat_at).getTime(), released, ownerAlive: !released && alive.has(r.owner) }, now, this.staleMs, !!this.o.runtime.adoptSession);
        if (orphan === 'adopt') await this.adopt(r, new Date(now));
        else if (orphan && (await endSession(db, r.id, orphan, new Date(now)))) this.streams.notify(r.id);
      }
    }
  }

  /** The files of a live session's `/workspace` (files API): on this host, or through the runtime. */
  async files(id: string): Promise<SessionFiles> {
    const { live } = await this.held(id);
    const files = live.sandbox.files ?? (live.sandbox.workspaceDir ? hostWorkspaceFiles(live.sandbox.workspaceDir) : null);
    if (!files) throw new AppError('not_implemented', 'this runtime has no session files API');
    // Counted while in flight: a hand-over to another replica waits for them.
    const counted = <A extends unknown[], R>(f: (...a: A) => Promise<R>) => async (...a: A): Promise<R> => {
      live.ops++;
      try {
        return await f(...a);
      } finally {
        live.ops--;
      }
    };
    return { list: counted(files.list), read: counted(files.read), write: counted(files.write), remove: counted(files.remove) };
  }
}
