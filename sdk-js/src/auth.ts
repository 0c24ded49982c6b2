/**
 * The client's token: a fixed string, or a callback asked for a new one when
 * a connection needs it, before it expires, and after the server refused it.
 * @internal
 * @packageDocumentation
 */
import { UnauthorizedError } from './errors.js';
import type { Clock, TokenProvider } from './types.js';

/** A cached token is used for a new connection only with more than this left. */
const MIN_LEFT_MS = 30_000;

/** @internal Token cache with local-clock expiry. */
export class Tokens {
  private token: string | undefined;
  /** When the token expires, on the local clock (undefined: unknown). */
  expiresAt: number | undefined;
  private refused: string | undefined;
  private hasRefused = false;

  constructor(
    private readonly source: string | TokenProvider | undefined,
    private readonly clock: Clock,
  ) {}

  /** Whether new tokens can be had (the source is a callback). */
  get renewable(): boolean {
    return typeof this.source === 'function';
  }

  /**
   * The token for a new connection: the cached one while it has time left,
   * else a new one from the callback. Rejects with UnauthorizedError when the
   * server refused the token and no other one is to be had.
   */
  async forConnect(): Promise<string | undefined> {
    const src = this.source;
    if (typeof src !== 'function') {
      if (this.hasRefused) throw new UnauthorizedError('the server refused the token and no new one can be had');
      return src;
    }
    const fresh = this.expiresAt === undefined || this.expiresAt - this.clock.now() > MIN_LEFT_MS;
    if (this.token !== undefined && !this.hasRefused && fresh) return this.token;
    const token = await src({ reason: this.hasRefused ? 'rejected' : 'connect' });
    if (this.hasRefused && token === this.refused) throw new UnauthorizedError('the server refused the token and the callback gave it again');
    this.use(token);
    return token;
  }

  /**
   * The `sub` claim of the token in use (read, not verified: the server
   * verifies it). Undefined when there is no token or it has no readable
   * `sub`; null while a token callback has not given a token yet.
   */
  get subject(): string | undefined | null {
    const callback = typeof this.source === 'function';
    const token = callback ? this.token : (this.source as string | undefined);
    if (token === undefined) return callback ? null : undefined;
    const sub = jwtClaims(token)?.sub;
    return typeof sub === 'string' && sub !== '' ? sub : undefined;
  }

  /** A new token from the callback, to refresh the open connection's. */
  async renew(): Promise<string> {
    return (this.source as TokenProvider)({ reason: 'refresh' });
  }

  /** Records the token in use; returns ms until it expires (from its JWT claims) if known. */
  use(token: string): number | undefined {
    this.token = token;
    const left = jwtLifetime(token);
    this.expiresAt = left === undefined ? undefined : this.clock.now() + left;
    return left;
  }

  /** The server accepted the token (`connected`); `expiresMs` is its time left, if any. */
  accepted(expiresMs: number | undefined): void {
    this.hasRefused = false;
    this.refused = undefined;
    if (expiresMs) this.expiresAt = this.clock.now() + expiresMs;
  }

  /** The server refused the token (close 4501 or 4002). */
  refuse(): void {
    this.hasRefused = true;
    this.refused = this.token;
  }
}

/** When to refresh a token with `expiresMs` left: 45 s before expiry, or at 3/4 of its life if shorter. */
export function refreshDelay(expiresMs: number): number {
  return Math.max(expiresMs - 45_000, expiresMs * 0.75);
}

/**
 * A JWT's remaining lifetime in ms from its claims: `exp − iat` (measured
 * from now, in case this clock and the issuer's disagree), else `exp − now`.
 */
function jwtLifetime(token: string): number | undefined {
  const { exp, iat } = jwtClaims(token) ?? {};
  if (typeof exp !== 'number') return undefined;
  return (typeof iat === 'number' ? exp - iat : exp - Date.now() / 1000) * 1000;
}

/** A JWT's payload claims, read without verifying; undefined if it is not a JWT. */
function jwtClaims(token: string): Record<string, unknown> | undefined {
  try {
    const part = token.split('.')[1]!.replace(/-/g, '+').replace(/_/g, '/');
    const claims = JSON.parse(new TextDecoder().decode(Uint8Array.from(atob(part), (c) => c.charCodeAt(0)))) as unknown;
    return claims && typeof claims === 'object' ? (claims as Record<string, unknown>) : undefined;
  } catch {
    return undefined;
  }
}
