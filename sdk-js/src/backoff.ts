/** Reconnect delays: exponential backoff with full jitter. */
export interface BackoffOptions {
  /** Base delay of the first retry, in ms (default 250). */
  minDelayMs?: number;
  /** Largest delay, in ms (default 15 000). */
  maxDelayMs?: number;
}

/**
 * The delay before retry number `attempt` (0 for the first): uniform in
 * `[0, min(maxDelayMs, minDelayMs · 2^attempt))` ("full jitter"), so that
 * many clients dropped at once by a server restart spread their reconnects
 * out instead of arriving together.
 *
 * @param random a source of numbers in [0, 1), e.g. `Math.random`
 */
export function backoffDelay(attempt: number, minDelayMs: number, maxDelayMs: number, random: () => number): number {
  const cap = Math.min(maxDelayMs, minDelayMs * 2 ** Math.min(Math.max(attempt, 0), 30));
  return Math.floor(random() * cap);
}
