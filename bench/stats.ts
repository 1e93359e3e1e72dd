/** Small statistics helpers for the benchmark report. */

/** The q-quantile (0..1) of a sample, nearest-rank. */
export function quantile(xs: readonly number[], q: number): number {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const i = Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1));
  return s[i]!;
}

/** `12.3` with one decimal. */
export const ms = (x: number) => x.toFixed(1);
