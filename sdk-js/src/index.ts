/**
 * statecast TypeScript SDK: shared room state over one WebSocket, with
 * resume, resync-as-diff, writes with typed errors, presence and leases.
 *
 * ```ts
 * import { createClient } from '@statecast/sdk';
 * const client = createClient({ url: 'wss://example.com/v1/ws', token: getToken });
 * const room = client.room('lobby:eu');
 * const games = room.watch('games/');
 * games.on('change', (c) => render(c.key, c.value));
 * await room.put('games/7', { name: 'Dune' }, { ifModRev: 0 });
 * ```
 * @packageDocumentation
 */
export { createClient, Client } from './client.js';
export type {
  ClientOptions,
  ClientEvents,
  ConnectionStatus,
  ConnectedEvent,
  DisconnectedEvent,
  TokenProvider,
  WebSocketLike,
  WebSocketConstructor,
  Clock,
  SessionStore,
  RollbackEvent,
  Persistence,
} from './types.js';
export type { WriteOp } from './pending.js';
export { Room } from './room.js';
export type { WatchOptions, WriteResult, WriteOptions, PutOptions, Lease, DeleteOptions, Txn, TxnOp } from './room.js';
export { Watch } from './watch.js';
export type { Entry, ChangeEvent, ChangeBatch, ChangeCause, SyncEvent, WatchStatus, WatchEvents } from './watch.js';
export { Presence, PRESENCE_PREFIX } from './presence.js';
export type { PresenceEvents } from './presence.js';
export { jsonCodec, json2Codec } from './codec.js';
export type { Codec } from './codec.js';
export { CloseCode, closeAction } from './codes.js';
export type { CloseAction } from './codes.js';
export { backoffDelay } from './backoff.js';
export type { BackoffOptions } from './backoff.js';
export {
  StatecastError,
  ConflictError,
  UnauthorizedError,
  ForbiddenError,
  TooLargeError,
  InvalidValueError,
  InvalidFilterError,
  RateLimitedError,
  NotConnectedError,
  OutcomeUnknownError,
  TimeoutError,
  QueueFullError,
  DependencyFailedError,
  ClosedError,
  ListenerError,
} from './errors.js';
export type { Listener } from './emitter.js';
