import type { Client } from './client.js';
import { InvalidValueError, type InvalidFilterError } from './errors.js';
import { Presence } from './presence.js';
import type { Watch } from './watch.js';

/** The revision a write committed at. */
export interface WriteResult {
  rev: number;
}

/** Options of a watch. */
export interface WatchOptions {
  /**
   * A filter the server applies to each key (PROTOCOL.md §5, "Filtered
   * subscriptions"): a CEL expression over `key` (a string) and `value` (the
   * key's JSON value), e.g. `value.mode == "duel" && value.players < value.max`.
   * The watch then holds only the keys it selects; a key that stops being
   * selected, or is deleted, leaves the view (a change of type `leave`). A
   * filtered watch shows this client's pending writes only over keys already
   * in its view (see README "Filtered watches"). An expression the server
   * cannot compile closes the watch with {@link InvalidFilterError}.
   */
  where?: string;
  /**
   * The strings are exact keys, not prefixes: `room.watch('games/7', { exact: true })`
   * holds `games/7` alone, never `games/70` nor `games/7/x` (the server sends it nothing else).
   */
  exact?: boolean;
}

/** Options of every write. */
export interface WriteOptions {
  /**
   * Read-your-writes: resolve only once this watch (of the same room) has
   * applied the write's revision, so its view shows the write. Use a watch
   * whose prefixes cover the written keys; otherwise it may take until the
   * server's next progress mark (about 10 s).
   */
  waitFor?: Watch<any>;
  /** Overrides the client's `requestTimeoutMs` for this write. */
  timeoutMs?: number;
}

/** Options of a put. */
export interface PutOptions extends WriteOptions {
  /** Apply only if the key's current `mod_rev` is this (0: the key must not exist); else ConflictError. */
  ifModRev?: number;
  /**
   * The key's lease. By default (`'keep'`) a put keeps whatever lease the key
   * is bound to (none for a new key). `'session'` binds it to this client's
   * session: it is deleted shortly after the session ends (its socket closed
   * and not resumed within the server's lease grace); another string is a TTL
   * lease id from the HTTP API; `null` unbinds the key from its lease.
   */
  lease?: Lease;
}

/** A put's lease: see {@link PutOptions.lease}. */
export type Lease = 'keep' | 'session' | null | (string & {});

/** Options of a delete. */
export interface DeleteOptions extends WriteOptions {
  /** Apply only if the key's current `mod_rev` is this; else ConflictError. */
  ifModRev?: number;
}

/** One operation of a transaction. */
export type TxnOp =
  | { type: 'put'; key: string; value: unknown; lease?: Lease }
  | { type: 'delete'; key: string };

/** A transaction: all of `ops` at one revision, if every condition holds. */
export interface Txn {
  /** Each key's current `mod_rev` must equal `modRev` (0: must not exist). */
  if?: { key: string; modRev: number }[];
  ops: TxnOp[];
}

/**
 * A room, addressed on the client's one socket. Get it with
 * `client.room(name)`; it is cheap and cached per name.
 */
export class Room {
  /** The client this room belongs to. */
  readonly client: Client;
  /** The room's name. */
  readonly name: string;
  private pres: Presence<any> | undefined;

  /** @internal Use `client.room(name)`. */
  constructor(client: Client, name: string) {
    this.client = client;
    this.name = name;
  }

  /**
   * Watches the keys under `prefixes` (none: the whole room), with `exact`
   * those keys alone, with `where` only those a filter selects. The watch starts with a snapshot, then
   * follows every change; it survives reconnects. Close it when done.
   */
  watch<V = unknown>(prefixes?: string | readonly string[], opts: WatchOptions = {}): Watch<V> {
    return this.client._watch<V>(this.name, [prefixes ?? []].flat(), opts); // a copy: the caller's array may change
  }

  /**
   * Writes `value` (a JSON value: see {@link InvalidValueError} for what is
   * refused) at `key`. Resolves with the committed revision; every failure is
   * a rejection with a typed error.
   */
  put(key: string, value: unknown, opts: PutOptions = {}): Promise<WriteResult> {
    return this.write(() => (checkValue(value, 'value'), { t: 'put', key, value, if_rev: opts.ifModRev, lease: lease(opts.lease) }), opts);
  }

  /** Deletes `key`. Deleting a missing key writes nothing and resolves with the current revision. */
  delete(key: string, opts: DeleteOptions = {}): Promise<WriteResult> {
    return this.write(() => ({ t: 'del', key, if_rev: opts.ifModRev }), opts);
  }

  /** Applies a transaction at one revision, or rejects with ConflictError when a condition fails. */
  txn(txn: Txn, opts: WriteOptions = {}): Promise<WriteResult> {
    return this.write(() => {
      if (!Array.isArray(txn?.ops)) throw new InvalidValueError('txn.ops', 'not an array');
      const ops = txn.ops.map((o, i) =>
        o.type === 'put' ? (checkValue(o.value, `txn.ops[${i}].value`), { type: 'put', key: o.key, value: o.value, lease: lease(o.lease) }) : { type: 'delete', key: o.key },
      );
      const conds = txn.if?.map((c) => ({ key: c.key, mod_rev: c.modRev }));
      return { t: 'txn', if: conds, ops };
    }, opts);
  }

  /** Builds the message and sends it; whatever throws becomes a rejection (never a synchronous throw). */
  private write(msg: () => Record<string, unknown>, opts: WriteOptions): Promise<WriteResult> {
    try {
      return this.client._write(this.name, msg(), opts);
    } catch (e) {
      return Promise.reject(e);
    }
  }

  /**
   * This room's presence: this client's value under
   * `presence/<token sub>/<clientId>` (a session-leased key; see
   * {@link Presence}) and everyone else's. Cached per room until disposed.
   */
  presence<V = unknown>(): Presence<V> {
    return (this.pres ??= new Presence<any>(this));
  }

  /** @internal A disposed presence is no longer handed out. */
  _forget(p: Presence<any>): void {
    if (this.pres === p) this.pres = undefined;
  }
}

/**
 * Throws InvalidValueError where JSON would fail on `v` or silently change it
 * (a Map stored as `{}`, a Date as a string, NaN as null). An object property
 * that is undefined is left out, as JSON does.
 */
export function checkValue(v: unknown, path: string, seen: object[] = []): void {
  switch (typeof v) {
    case 'string':
    case 'boolean':
      return;
    case 'number':
      if (isFinite(v)) return;
      throw new InvalidValueError(path, String(v));
    case 'object': {
      if (v === null) return;
      if (seen.includes(v)) throw new InvalidValueError(path, 'a cycle');
      const proto = Object.getPrototypeOf(v);
      // Plain objects (of any realm) and arrays; a Map, Set, Date or class instance is not JSON.
      if (!Array.isArray(v) && proto !== null && Object.getPrototypeOf(proto) !== null)
        throw new InvalidValueError(path, `a ${(v as object).constructor?.name || 'non-plain object'}`);
      seen.push(v);
      if (Array.isArray(v)) for (let i = 0; i < v.length; i++) checkValue(v[i], `${path}[${i}]`, seen);
      else for (const [k, x] of Object.entries(v)) if (x !== undefined) checkValue(x, `${path}.${k}`, seen);
      seen.pop();
      return;
    }
  }
  throw new InvalidValueError(path, v === undefined ? 'undefined' : `a ${typeof v}`);
}

/** What a put sends as its lease: the key's own unless told (`null` unbinds it: the server reads null as no lease). */
const lease = (l: Lease = 'keep') => l;
