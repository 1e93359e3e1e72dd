/** JSON logs (pino). Child loggers carry `correlation_id` and `execution_id`. */
import { pino, type Logger } from 'pino';

export type { Logger };

/** The root logger. */
export function createLogger(level: string = process.env.SVC_LOG_LEVEL ?? 'info'): Logger {
  return pino({
    level,
    base: { service: 'sandpod' },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
  });
}

/** A logger that drops everything, for tests and tools. */
export const silentLogger: Logger = pino({ level: 'silent' });
