import type { ServerMessage } from './protocol.js';
import type { Entry } from './watch.js';

/**
 * Base class of every error the SDK rejects with. `code` is the server's
 * error code (PROTOCOL.md §4, e.g. `forbidden`, `invalid_key`) or one of the
 * SDK's own: `not_connected`, `timeout`, `closed`.
 */
export class StatecastError extends Error {
  /** Machine-readable error code. */
  readonly code: string;
  constructor(code: string, message: string) {
    super(message);
    this.code = code;
    this.name = 'StatecastError';
  }
}

/**
 * A condition failed (`ifModRev` of a put or delete, `if` of a transaction):
 * nothing was written. Re-read and decide again.
 */
export class ConflictError extends StatecastError {
  /** The key whose condition failed. */
  readonly key: string;
  /** That key's current `mod_rev` (0: it does not exist). */
  readonly modRev: number;
  /** The room's current revision. */
  readonly rev: number;
  constructor(message: string, key: string, modRev: number, rev: number) {
    super('conflict', message);
    this.name = 'ConflictError';
    this.key = key;
    this.modRev = modRev;
    this.rev = rev;
  }
}

/**
 * The token is missing, invalid or expired. A token callback may also throw
 * it to make the client stop reconnecting.
 */
export class UnauthorizedError extends StatecastError {
  constructor(message = 'unauthorized') {
    super('unauthorized', message);
    this.name = 'UnauthorizedError';
  }
}

/** The token does not grant this room or key. */
export class ForbiddenError extends StatecastError {
  constructor(message: string) {
    super('forbidden', message);
    this.name = 'ForbiddenError';
  }
}

/** A key, value, transaction or frame is over the server's limits. Not sent or not applied. */
export class TooLargeError extends StatecastError {
  constructor(message: string) {
    super('too_large', message);
    this.name = 'TooLargeError';
  }
}

/**
 * A value JSON cannot carry as it is (a BigInt, Map, Set, Date or other class
 * instance, function, symbol, NaN or ±Infinity, undefined in an array or as
 * the value, a cycle): refused before sending, nothing written. `path` says
 * where (`value.a[2]`).
 */
export class InvalidValueError extends StatecastError {
  /** Where in the value the offending part is. */
  readonly path: string;
  constructor(path: string, what: string) {
    super('invalid_value', `${path} is ${what}, which JSON cannot carry as it is; not sent`);
    this.name = 'InvalidValueError';
    this.path = path;
  }
}

/**
 * A watch's `where` expression does not compile (or is over 1024 bytes): the
 * server refused the subscription, so the watch is closed with this error.
 * `line` and `column` (from 1) point at the fault when the server knows it.
 */
export class InvalidFilterError extends StatecastError {
  /** Line of the fault in the expression (from 1), if known. */
  readonly line: number | undefined;
  /** Column of the fault in the expression (from 1), if known. */
  readonly column: number | undefined;
  constructor(message: string, line?: number, column?: number) {
    super('invalid_filter', message);
    this.name = 'InvalidFilterError';
    this.line = line || undefined;
    this.column = column || undefined;
  }
}

/** Too many writes per second on this connection; nothing was written. Retry after a delay. */
export class RateLimitedError extends StatecastError {
  constructor(message: string) {
    super('rate_limited', message);
    this.name = 'RateLimitedError';
  }
}

/**
 * The write was never sent: the client is disconnected, or was not
 * connected again within `requestTimeoutMs`. It certainly was not applied.
 */
export class NotConnectedError extends StatecastError {
  constructor(message = 'not connected') {
    super('not_connected', message);
    this.name = 'NotConnectedError';
  }
}

/**
 * The write may or may not have been applied: the server could not tell
 * (its history no longer reached back to the write), its reply did not come
 * in time, or the client stopped with the write in flight. The SDK never
 * repeats it blindly. Look at `observed`, or re-read, and decide.
 */
export class OutcomeUnknownError extends StatecastError {
  /**
   * The write's keys as the server holds them now (a key that does not
   * exist is left out), when the SDK could re-read them.
   */
  observed?: Entry[];
  constructor(message = 'the outcome of the write is unknown', code = 'outcome_unknown') {
    super(code, message);
    this.name = 'OutcomeUnknownError';
  }
}

/**
 * Too many writes pending (queued while offline, in flight or awaiting
 * confirmation): over the client's `queue` bounds. The new write was
 * refused, nothing was sent; the earlier ones stay queued.
 */
export class QueueFullError extends StatecastError {
  constructor(message: string) {
    super('queue_full', message);
    this.name = 'QueueFullError';
  }
}

/**
 * An earlier pending write of this client to one of the same keys failed
 * (`cause`), so this one, which was to apply on its result, was not sent.
 */
export class DependencyFailedError extends StatecastError {
  /** Why the earlier write failed. */
  readonly cause: StatecastError;
  constructor(cause: StatecastError) {
    super('dependency_failed', `an earlier write to the same key failed (${cause.code}); this one was not sent`);
    this.name = 'DependencyFailedError';
    this.cause = cause;
  }
}

/**
 * A sent request got no reply within its timeout. For a write this is an
 * {@link OutcomeUnknownError}: it may still have been applied.
 */
export class TimeoutError extends OutcomeUnknownError {
  constructor(message = 'no reply in time') {
    super(message, 'timeout');
    this.name = 'TimeoutError';
  }
}

/** The connection was closed for good (a close code that says "do not reconnect"). */
export class ClosedError extends StatecastError {
  /** The WebSocket close code. */
  readonly closeCode: number;
  constructor(closeCode: number, reason: string) {
    super('closed', `connection closed (${closeCode})${reason ? ': ' + reason : ''}`);
    this.name = 'ClosedError';
    this.closeCode = closeCode;
  }
}

/**
 * An application listener threw while the SDK emitted `event`; emitted as an
 * `error` event of the same emitter (or logged with console.error when it has
 * no `error` listener). The SDK goes on as if the listener had returned.
 */
export class ListenerError extends StatecastError {
  /** The event whose listener threw. */
  readonly event: string;
  /** What it threw. */
  readonly cause: unknown;
  constructor(event: string, cause: unknown) {
    super('listener', `a "${event}" listener threw: ${cause instanceof Error ? cause.message : String(cause)}`);
    this.name = 'ListenerError';
    this.event = event;
    this.cause = cause;
  }
}

/** @internal The typed error for a server `err` reply. */
export function errorFromReply(m: ServerMessage): StatecastError {
  const msg = m.message || m.code || 'error';
  switch (m.code) {
    case 'conflict':
      return new ConflictError(msg, m.key ?? '', m.mod_rev ?? 0, m.rev ?? 0);
    case 'unauthorized':
      return new UnauthorizedError(msg);
    case 'forbidden':
      return new ForbiddenError(msg);
    case 'too_large':
      return new TooLargeError(msg);
    case 'rate_limited':
      return new RateLimitedError(msg);
    case 'outcome_unknown':
      return new OutcomeUnknownError(msg);
    case 'invalid_filter':
      return new InvalidFilterError(msg, m.line, m.column);
  }
  return new StatecastError(m.code || 'internal', msg);
}
