import type { Client } from './client.js';
import type { Watch } from './watch.js';
/** Public types of the client: options, status and events. */
import type { BackoffOptions } from './backoff.js';
import type { Codec } from './codec.js';
import type { CloseAction } from './codes.js';
import type { StatecastError } from './errors.js';
import type { WriteOp } from './pending.js';

/** The part of the WebSocket API the client uses; browsers' WebSocket and the `ws` package fit it. */
export interface WebSocketLike {
  binaryType: string;
  send(data: string | Uint8Array): void;
  close(code?: number, reason?: string): void;
  onopen: ((ev: any) => void) | null;
  onmessage: ((ev: any) => void) | null;
  onclose: ((ev: any) => void) | null;
  onerror: ((ev: any) => void) | null;
}

/** A WebSocket constructor (`globalThis.WebSocket`, or `WebSocket` from the `ws` package). */
export type WebSocketConstructor = new (url: string, protocols: string[]) => WebSocketLike;

/** Time source and timers; inject one to make tests deterministic. */
export interface Clock {
  now(): number;
  setTimeout(fn: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

/**
 * Returns an access token (a JWT). Called when a connection needs a token
 * and none is cached with more than 30 s left, before the token expires
 * (`refresh`), and after the server refused one (`rejected`). Throw an
 * {@link UnauthorizedError} to make the client stop; any other error is
 * retried with backoff.
 */
export type TokenProvider = (ctx: { reason: 'connect' | 'refresh' | 'rejected' }) => string | Promise<string>;

/**
 * Where a client keeps its session across a reload of the page:
 * `sessionStorage`, or anything with these three methods.
 */
export interface SessionStore {
  getItem(key: string): string | null;
  setItem(key: string, value: string): void;
  removeItem(key: string): void;
}

/**
 * What the client asks of a persistence layer (made by `persist()` of
 * `@statecast/sdk/persist`; see README "Persistence").
 */
export interface Persistence {
  /**
   * Called once, before the first socket opens, with the token's subject
   * (undefined without one): restores that subject's cached views into the
   * watches made so far, and its pending writes into the client.
   */
  open(client: Client, subject: string | undefined): Promise<void>;
  /** A watch was made: restored from its cached view once `open` loaded it. */
  watch(w: Watch<any>): void;
  /** Set by `open` when this tab shares another tab's connection (`tabs`): the client's sockets go through it. */
  readonly WebSocket?: WebSocketConstructor;
  /** Another tab's pending write of `key`, shown when this client has none. */
  overlay?(room: string, key: string): WriteOp | undefined;
}

/** Options of {@link createClient}. */
export interface ClientOptions {
  /**
   * The server's WebSocket endpoint, e.g. `wss://example.com/v1/ws`. An
   * `http(s)` URL is turned into `ws(s)`, a bare origin gets `/v1/ws`, and in
   * browsers a relative URL resolves against the page. Resolved when
   * connecting: a relative URL without a page (Node, server rendering) is an
   * `error` event then, never a throw at construction.
   */
  url: string;
  /** A token, or a function returning one (see {@link TokenProvider}). */
  token?: string | TokenProvider;
  /** The WebSocket constructor; defaults to `globalThis.WebSocket` (Node 20 has none: pass `ws`). */
  WebSocket?: WebSocketConstructor;
  /**
   * The wire codec, the only one offered: {@link json2Codec} (protocol v2),
   * {@link jsonCodec} (v1) or `msgpackCodec` from `@statecast/sdk/msgpack`.
   * Default: JSON, v2 where the server speaks it and v1 otherwise.
   */
  codec?: Codec;
  /** Reconnect delays (exponential backoff with full jitter). */
  reconnect?: BackoffOptions;
  /**
   * How long a sent request may wait for its reply, in ms (default 10 000);
   * a write without a reply by then rejects with TimeoutError.
   */
  requestTimeoutMs?: number;
  /**
   * Bounds of the pending writes (queued while offline, in flight, or
   * waiting for confirmation): `maxWrites` (default 500) and `maxBytes` of
   * their encoded messages (default 1 MiB). A write over them rejects with
   * QueueFullError; the earlier ones stay queued.
   */
  queue?: { maxWrites?: number; maxBytes?: number };
  /** How long opening a socket and getting `connected` may take, in ms (default 10 000). */
  connectTimeoutMs?: number;
  /**
   * How long a liveness probe (on the browser's `online` and
   * `visibilitychange` events, or `reconnect()` while connected) waits for
   * any message before dropping the socket, in ms (default 5000).
   */
  probeTimeoutMs?: number;
  /** Overrides the server's announced `ping_ms` (for tests). */
  pingIntervalMs?: number;
  /** The server's frame limit (`--max-frame`, default 1 MiB); larger writes reject with TooLargeError unsent. */
  maxFrameBytes?: number;
  /** This client's presence id (default: the one kept across a reload in `sessionStore`, else random). Match your token's subject if grants use `{sub}`. */
  clientId?: string;
  /**
   * Where this client's id and session are kept across a reload of the page,
   * so the reloaded page resumes the session and keeps its presence and
   * session leases: default `sessionStorage` in browsers (nothing elsewhere);
   * `false` keeps nothing. Written only when the page is hidden for
   * unloading (`pagehide`), read and removed at startup (see README "Page reloads").
   */
  sessionStore?: SessionStore | false;
  /** The key of the session in `sessionStore` (default `statecast:` + the WebSocket URL). */
  sessionKey?: string;
  /**
   * Keeps the watches' views and the pending writes across reloads and
   * browser restarts: `persist()` of `@statecast/sdk/persist` (IndexedDB, or
   * a storage adapter). Default: none, everything lives in memory.
   */
  persist?: Persistence;
  /** Connect at once (default true); otherwise call `connect()`. */
  autoConnect?: boolean;
  /**
   * Follow the browser's network (default true when available): no dial
   * while `navigator.onLine` is false, `offline` drops the socket, `online`
   * dials at once, `visibilitychange` probes.
   */
  networkEvents?: boolean;
  /** Random numbers in [0, 1) for jitter (default `Math.random`; inject for tests). */
  random?: () => number;
  /** Clock and timers (default the global ones; inject for tests). */
  clock?: Clock;
}

/**
 * The connection's status:
 * - `connecting`: opening the first connection (or after `connect()`);
 * - `connected`: the server answered `connected`; requests flow;
 * - `reconnecting`: the connection was lost; retrying with backoff;
 * - `disconnected`: closed by `close()`, or by a close code that says "do not reconnect".
 */
export type ConnectionStatus = 'connecting' | 'connected' | 'reconnecting' | 'disconnected';

/** The server's `connected`. */
export interface ConnectedEvent {
  /** The session id. */
  session: string;
  /** The previous session was taken over, so its session leases (presence, lobby entries) were kept. */
  resumed: boolean;
  pingMs: number;
  leaseGraceMs: number;
  /** Milliseconds until the token expires (absent without auth). */
  expiresMs?: number;
}

/** A socket closed (or failed to open). */
export interface DisconnectedEvent {
  code: number;
  reason: string;
  /** What the client does next (`closed`: it was closed by `close()`). */
  action: CloseAction | 'closed';
  /** The delay before the next attempt, when it will reconnect. */
  retryInMs?: number;
}

/** A write of this client failed: the keys it showed as pending show the confirmed state again. */
export interface RollbackEvent {
  room: string;
  /** The write's id (`wid` on the wire). */
  wid: string;
  /** What the write was to do. */
  ops: WriteOp[];
  /** The keys it wrote. */
  keys: string[];
  /** Why: the error its promise rejects with. */
  error: StatecastError;
}

/** Events of {@link Client}. */
export interface ClientEvents {
  status: { status: ConnectionStatus; prev: ConnectionStatus };
  connected: ConnectedEvent;
  disconnected: DisconnectedEvent;
  /** Errors that no promise reports: a fatal close, a failed token refresh. */
  error: StatecastError;
  /** A write failed and its pending value was taken back (before its promise rejects). */
  rollback: RollbackEvent;
  /** The number of pending writes changed (`client.pendingWrites`). */
  pending: { writes: number };
}
