/**
 * Logs (pino). JSON, one object per line, for machines; a readable form (pino-pretty, in-process so
 * nothing is lost at exit) for people: `log_format: pretty`, or `auto` when stdout is a terminal.
 * Child loggers carry `correlation_id` and `execution_id`; the lines of a traced run carry `trace_id`.
 */
import { pino, type Logger } from 'pino';
import pretty from 'pino-pretty';
import { logTraceMixin } from './tracing/log-context.ts';

export type { Logger };

/** How lines are written. */
export type LogFormat = 'auto' | 'json' | 'pretty';

/** Whether `format` means the readable form, given whether stdout is a terminal. */
export function isPretty(format: LogFormat, stdoutIsTty: boolean): boolean {
  return format === 'pretty' || (format === 'auto' && stdoutIsTty);
}

/** The root logger; `destination` defaults to stdout. */
export function createLogger(
  level: string = process.env.SVC_LOG_LEVEL ?? 'info',
  format: LogFormat = 'auto',
  destination: NodeJS.WritableStream = process.stdout,
): Logger {
  const options = {
    level,
    base: { service: 'sandpod' },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
    // `trace_id` on every line written while a traced run is handled (tracing/log-context.ts).
    mixin: logTraceMixin,
  };
  const tty = destination === process.stdout && process.stdout.isTTY === true;
  if (isPretty(format, tty)) {
    return pino(options, pretty({ destination, sync: true, colorize: tty, translateTime: 'SYS:HH:MM:ss.l', ignore: 'pid,hostname,service' }));
  }
  return destination === process.stdout ? pino(options) : pino(options, destination);
}

/** A logger that drops everything, for tests and tools. */
export const silentLogger: Logger = pino({ level: 'silent' });
