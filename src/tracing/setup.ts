/**
 * The one place that sets up tracing (OpenTelemetry, OTLP over HTTP). Off by default: on only when
 * `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set and `OTEL_SDK_DISABLED`
 * is not `true`. Off, the SDK and the exporter are never loaded and the code paths that record spans
 * test one boolean ({@link isTracing}); the API's no-op tracer is all that remains.
 *
 * The other standard variables apply as the SDK reads them: `OTEL_SERVICE_NAME`,
 * `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)`, `OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`,
 * `OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT`, `OTEL_BSP_*`.
 */
import { context, propagation, trace } from '@opentelemetry/api';

/** The tracer's name in exported spans (`scope.name`). */
export const TRACER_NAME = 'sandpod';

let on = false;

/** Whether spans are recorded in this process (a provider was started by {@link startTracing}). */
export function isTracing(): boolean {
  return on;
}

/** Whether the environment asks for tracing (see the file header). */
export function tracingRequested(env: NodeJS.ProcessEnv = process.env): boolean {
  if ((env.OTEL_SDK_DISABLED ?? '').trim().toLowerCase() === 'true') return false;
  return Boolean(env.OTEL_EXPORTER_OTLP_ENDPOINT?.trim() || env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT?.trim());
}

/** A started tracer provider. */
export interface Tracing {
  /** Exports every span ended so far. */
  flush(): Promise<void>;
  /** Exports what is left and unregisters the provider (tracing is off afterwards). */
  shutdown(): Promise<void>;
}

const NOOP: Tracing = { flush: async () => {}, shutdown: async () => {} };

/**
 * Starts the provider when the environment asks for it, else returns a no-op. Registers it globally
 * (tracer, W3C trace-context propagator, AsyncLocalStorage context manager): one per process.
 */
export async function startTracing(opts: { version: string }): Promise<Tracing> {
  // The exporter reads the same variables from process.env when it is built (below).
  if (on || !tracingRequested(process.env)) return NOOP;
  // Loaded only here: nothing of the SDK is in memory while tracing is off.
  const [{ NodeTracerProvider }, { BatchSpanProcessor }, { OTLPTraceExporter }, res] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/sdk-trace-base'),
    import('@opentelemetry/exporter-trace-otlp-http'),
    import('@opentelemetry/resources'),
  ]);
  // Ours first, then the environment's (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win).
  const resource = res
    .defaultResource()
    .merge(res.resourceFromAttributes({ 'service.name': 'sandpod', 'service.version': opts.version }))
    .merge(res.detectResources({ detectors: [res.envDetector] }));
  const provider = new NodeTracerProvider({ resource, spanProcessors: [new BatchSpanProcessor(new OTLPTraceExporter())] });
  provider.register();
  on = true;
  return {
    flush: () => provider.forceFlush(),
    async shutdown() {
      on = false;
      await provider.shutdown().catch(() => {});
      trace.disable();
      context.disable();
      propagation.disable();
    },
  };
}
