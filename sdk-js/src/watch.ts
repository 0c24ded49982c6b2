import { Emitter } from './emitter.js';
import { NotConnectedError, StatecastError } from './errors.js';
import type { Op } from './pending.js';
import type { WatchOptions } from './room.js';
import type { SubMessage, WireEvent, WireItem } from './protocol.js';

/** A key with its value and revisions (etcd's KeyValue). */
export interface Entry<V = unknown> {
  key: string;
  value: V;
  /** Revision at which the key was created. */
  createRev: number;
  /** Revision of the key's last write: pass it as `ifModRev` for a conditional write. */
  modRev: number;
  /** Writes since creation (1 for a new key). */
  version: number;
  /** The key is bound to a lease (it vanishes when the lease ends). */
  lease: boolean;
  /**
   * A write of this client not yet confirmed: the value it writes, shown at
   * once over the confirmed entry (whose revisions it carries; 0 for a new
   * key). Absent on confirmed entries.
   */
  pending?: true;
}

/**
 * Why a change was delivered:
 * - `initial`: part of the first snapshot of the watch;
 * - `live`: a write as it happened;
 * - `replay`: a write missed while disconnected, replayed on resume;
 * - `coalesced`: the latest state of a key after the socket fell behind;
 * - `resync`: part of the difference between the view and a fresh snapshot
 *   the server sent instead of a replay (history compacted, epoch changed,
 *   socket too slow);
 * - `local`: a write of this client, shown before the server confirms it
 *   (the entry is `pending`);
 * - `rollback`: a write of this client failed; the key shows the confirmed
 *   state again.
 */
export type ChangeCause = 'initial' | 'live' | 'replay' | 'coalesced' | 'resync' | 'local' | 'rollback';

/**
 * One key's change, as seen by one watch. `leave` happens only on a filtered
 * watch (`where`): the key is no longer selected, or was deleted (the server
 * does not say which); `prev` is its last value in the view.
 */
export interface ChangeEvent<V = unknown> {
  type: 'put' | 'delete' | 'leave';
  key: string;
  /** The new value (undefined for a delete or a leave). */
  value: V | undefined;
  /** The value this watch held before (undefined: the key was absent). */
  prev: V | undefined;
  /** The new entry (undefined for a delete or a leave). */
  entry: Entry<V> | undefined;
  /** The entry this watch held before. */
  prevEntry: Entry<V> | undefined;
  /** Revision of the message that carried the change (for resync and coalesced: the revision covered). */
  rev: number;
  cause: ChangeCause;
}

/** All changes of one message (one revision), delivered after their `change` events. */
export interface ChangeBatch<V = unknown> {
  rev: number;
  cause: ChangeCause;
  changes: ChangeEvent<V>[];
}

/** Emitted when a watch is in sync with the room. */
export interface SyncEvent {
  /**
   * `initial`: the first snapshot was applied; `resumed`: the replay of
   * missed writes ended (or nothing was missed); `resync`: a fresh snapshot
   * replaced the view and its difference was emitted as changes.
   */
  kind: 'initial' | 'resumed' | 'resync';
  /** The server's reason for a snapshot: `initial`, `compacted`, `epoch` or `slow`. */
  reason?: string;
  rev: number;
  epoch: string;
  /** How many change events the initial snapshot, the replay or the resync produced. */
  changes: number;
}

/**
 * A watch's status:
 * - `pending`: no view yet (waiting for the connection or the first snapshot);
 * - `syncing`: resuming after a reconnect, missed writes being replayed;
 * - `live`: in sync, receiving changes as they happen;
 * - `stale`: the connection is down; the view is the last one known;
 * - `closed`: closed by the application, or by an error (see `error`).
 */
export type WatchStatus = 'pending' | 'syncing' | 'live' | 'stale' | 'closed';

/** Events of a {@link Watch}. */
export interface WatchEvents<V> {
  change: ChangeEvent<V>;
  changes: ChangeBatch<V>;
  sync: SyncEvent;
  status: { status: WatchStatus; prev: WatchStatus };
  error: StatecastError;
}

/** @internal What a watch needs from its client. */
export interface WatchOwner {
  readonly status: string;
  _unwatch(w: Watch<any>): void;
  /** The pending write shown over the confirmed value of a key. */
  _overlay(room: string, key: string): Op | undefined;
  /** Events of the write `wid`, on `keys` of `room`, were applied at `rev`. */
  _wid(wid: string, rev: number, room: string, keys: string[]): void;
  /** A watch caught up: writes held back for it may go. */
  _flush(): void;
}

/** Pending entries, one per write and key, so that they keep their identity. */
const shownOps = new WeakMap<Op, Entry<any>>();

/**
 * The live view of a room's keys under some prefixes: a local copy kept
 * equal to the room, plus a change event per key.
 *
 * The view is the confirmed state (what the server sent) with this client's
 * pending writes shown over it: a write shows at once, as a `pending`
 * entry, until the server confirms it (the watch reaches its revision) or it
 * fails (the key shows the confirmed state again: cause `rollback`).
 *
 * Messages are applied in revision order; any message at or below the
 * watch's revision is a duplicate and is dropped. Whatever the server sends
 * (replay, coalesced state, or a fresh snapshot after compaction), the view
 * ends up equal to the room and every difference is emitted as an ordinary
 * `change`, so application code that reacts to changes needs no reset path.
 * While `change` listeners run, the view already reflects the whole message.
 */
export class Watch<V = unknown> extends Emitter<WatchEvents<V>> {
  /** The room watched. */
  readonly room: string;
  /** Key prefixes watched (empty: the whole room); with `exact`, the keys watched. */
  readonly prefixes: readonly string[];
  /** Whether `prefixes` are exact keys (`room.watch`'s `exact`). */
  readonly exact: boolean | undefined;
  /** The filter the server applies (`where` of `room.watch`), if any. */
  readonly where: string | undefined;
  private st: WatchStatus = 'pending';
  /** @internal The confirmed state, as the server sent it (what a persisted view keeps). */
  _base = new Map<string, Entry<V>>();
  /** What the watch shows: base, with pending writes over it. */
  private view = new Map<string, Entry<V>>();
  /** entries(), kept until the view changes. */
  private snap: readonly Entry<V>[] | undefined;
  private r = 0;
  private ep: string | undefined;
  private started = false;
  private replaying = false;
  private replayed = 0;
  private err: StatecastError | undefined;
  private waiters: { rev: number; epoch: string | undefined; done: () => void; gone?: string[] }[] = [];
  /** ready() calls waiting for the first view, failed when the client stops. */
  private readies: ((e: StatecastError) => void)[] = [];
  /** @internal Current subscription id on the socket (0: none). */
  _sub = 0;
  /** @internal Retries of a subscription the server ended. */
  _retries = 0;

  /** @internal Use `room.watch()`. */
  constructor(
    private readonly owner: WatchOwner,
    room: string,
    prefixes: readonly string[],
    { where, exact }: WatchOptions,
  ) {
    super();
    this.room = room;
    this.prefixes = prefixes;
    this.exact = exact;
    this.where = where;
  }

  /** The watch's status. */
  get status(): WatchStatus {
    return this.st;
  }
  /** Revision of the view: the last message applied (0 before any). */
  get rev(): number {
    return this.r;
  }
  /** The room's epoch the view belongs to (undefined before any snapshot). */
  get epoch(): string | undefined {
    return this.ep;
  }
  /** Why the watch was closed by the SDK, if it was. */
  get error(): StatecastError | undefined {
    return this.err;
  }
  /** Number of keys in the view. */
  get size(): number {
    return this.view.size;
  }
  /** A key's value, or undefined. */
  get(key: string): V | undefined {
    return this.view.get(key)?.value;
  }
  /** A key's entry (value and revisions), or undefined. */
  entry(key: string): Entry<V> | undefined {
    return this.view.get(key);
  }
  /** Whether the view holds the key. */
  has(key: string): boolean {
    return this.view.has(key);
  }
  /**
   * Every entry of the view, sorted by key: a frozen array of frozen entries
   * that keeps its identity until the view changes (a snapshot for React's
   * `useSyncExternalStore`). An entry keeps its identity while its key is
   * unchanged. Values are not frozen; do not change them.
   */
  entries(): readonly Entry<V>[] {
    return (this.snap ??= Object.freeze([...this.view.values()].sort((a, b) => cmp(a.key, b.key))));
  }

  /**
   * Resolves once the watch has a view (its first `sync`), at once if it has
   * one. Rejects if the watch is closed first, and with NotConnectedError if
   * the client is or becomes `disconnected` (`close()`, a fatal close) first.
   */
  ready(): Promise<void> {
    if (this.started) return Promise.resolve();
    if (this.st === 'closed') return Promise.reject(this.err ?? new StatecastError('closed', 'watch closed'));
    if (this.owner.status === 'disconnected') return Promise.reject(new NotConnectedError('the client is disconnected'));
    return new Promise((resolve, reject) => {
      const done = (err?: StatecastError) => {
        offs.forEach((f) => f());
        this.readies = this.readies.filter((f) => f !== done);
        err ? reject(err) : resolve();
      };
      const offs = [
        this.on('sync', () => done()),
        this.on('status', ({ status }) => {
          if (status === 'closed') done(this.err ?? new StatecastError('closed', 'watch closed'));
        }),
      ];
      this.readies.push(done);
    });
  }

  /** Stops watching; the view stays readable but is no longer updated. */
  close(): void {
    if (this.st === 'closed') return;
    this.owner._unwatch(this);
    this.setStatus('closed');
    this.wake();
  }

  /** @internal Whether the watch's prefixes cover `key`. */
  _covers(key: string): boolean {
    return !this.prefixes.length || this.prefixes.some((p) => (this.exact ? key == p : key.startsWith(p)));
  }

  /**
   * @internal The keys of `ops` (a write's) whose settling needs no event on
   * this watch once they are not in its confirmed view: all of them on a
   * filtered watch (a write its filter neither selected before nor selects
   * after sends it nothing), else a delete's only (a delete of a missing key
   * writes nothing). Undefined: the watch is sure to get an event.
   */
  _silent(ops: readonly Op[]): string[] | undefined {
    const mine = ops.filter((o) => this._covers(o.key));
    if (this.where || (mine.length && mine.every((o) => o.type === 'delete'))) return mine.map((o) => o.key);
    return undefined;
  }

  /** @internal The confirmed entry of `key`, without pending writes. */
  _confirmed(key: string): Entry<V> | undefined {
    return this._base.get(key);
  }

  /** @internal Pending writes of `keys` came or went (`cause`): shows the keys anew. */
  _local(keys: string[], cause: ChangeCause): void {
    if (this.st !== 'closed') this.deliver(this.update(keys, this.r, cause), this.r, cause);
  }

  /**
   * @internal The request of subscription `id`: it resumes where the view
   * is, or asks for a snapshot. Empty prefixes (or keys) are the whole room.
   */
  _req(id: number): object {
    return { t: 'sub', id, room: this.room, [this.exact ? 'keys' : 'prefixes']: this.prefixes, filter: this.where, from: this.started ? { epoch: this.ep!, rev: this.r + 1 } : undefined };
  }

  /** @internal A subscription was sent with id `sub`. */
  _subscribed(sub: number): void {
    this._sub = sub;
    this.replaying = this.started;
    this.replayed = 0;
    if (this.started) this.setStatus('syncing');
  }

  /**
   * @internal Whether a subscription is resuming a view it had (writes
   * wait for it: see Client). A watch that never had a view holds no
   * write back: it cannot tell of a write's lost reply, and waiting for
   * its first snapshot would stall every write to the room meanwhile.
   */
  get _catchingUp(): boolean {
    return !!this._sub && this.started && (this.st === 'pending' || this.st === 'syncing');
  }

  /** @internal The socket is gone; `stopped`: the client stopped (disconnected, no reconnect). */
  _offline(stopped = false): void {
    this._sub = 0;
    this.replaying = false;
    if (this.st !== 'closed') this.setStatus(this.started ? 'stale' : 'pending');
    if (!stopped) return;
    // Nothing more will arrive: settle what waits for it instead of leaving it hanging.
    for (const fail of this.readies.slice()) fail(new NotConnectedError('the client is disconnected'));
    for (const w of this.waiters.splice(0)) w.done(); // the writes committed; the view just will not show them
  }

  /** @internal The server refused the subscription for good. */
  _fail(err: StatecastError): void {
    if (this.st === 'closed') return;
    this.err = err;
    this.close();
    this.emit('error', err);
  }

  /**
   * @internal Calls `done` once the view reached `rev`, moved to another
   * epoch, or closed, or already lacks every key of `gone` (a delete of a
   * missing key writes nothing: no event will show it).
   */
  _reach(rev: number, done: () => void, gone?: string[]): void {
    this.waiters.push({ rev, epoch: this.ep, done, gone });
    this.wake();
  }

  /** @internal Applies one subscription message. */
  _apply(m: SubMessage): void {
    if (m.t === 'snapshot') this.snapshot(m);
    else if (m.t === 'events' || m.t === 'coalesced') this.events(m);
    else if (m.t === 'synced' || m.t === 'progress') {
      if (this.started && m.rev > this.r) this.r = m.rev;
      if (this.replaying && (m.t === 'synced' || this.st === 'syncing')) {
        this.replaying = false;
        this.setStatus('live');
        this.emit('sync', { kind: 'resumed', rev: this.r, epoch: this.ep!, changes: this.replayed });
      }
    }
    this._retries = 0;
    this.wake();
  }

  private snapshot(m: SubMessage): void {
    const same = this.started && m.epoch === this.ep;
    if (same && m.rev < this.r) return; // older than the view: dropped
    const cause: ChangeCause = this.started ? 'resync' : 'initial';
    const next = new Map<string, Entry<V>>();
    for (const it of m.items ?? []) {
      const e = toEntry<V>(it);
      const o = this._base.get(e.key);
      // unchanged: the same entry object (snapshot identity)
      next.set(e.key, o && o.modRev === e.modRev && (same || sameEntry(o, e)) ? o : e);
    }
    this._base = next;
    // The difference of what the watch shows: keys with pending writes keep showing them.
    const changes = this.update(new Set([...this.view.keys(), ...next.keys()]), m.rev, cause).sort((a, b) => cmp(a.key, b.key));
    this.ep = m.epoch;
    this.r = m.rev;
    this.started = true;
    this.replaying = false;
    this.setStatus('live');
    this.deliver(changes, m.rev, cause);
    this.emit('sync', { kind: cause === 'initial' ? 'initial' : 'resync', reason: m.reason, rev: m.rev, epoch: m.epoch!, changes: changes.length });
  }

  private events(m: SubMessage): void {
    if (m.rev <= this.r) return; // duplicate or out of order: dropped
    const coalesced = m.t === 'coalesced';
    const cause: ChangeCause = coalesced ? 'coalesced' : this.replaying ? 'replay' : 'live';
    const keys: string[] = [];
    // Each write of this client at the revision its own events carry (a coalesced message's rev covers
    // more), with the keys they changed: the server sends a wid only to its writer's own watches.
    const wids = new Map<string, { rev: number; keys: string[] }>();
    for (const ev of m.events ?? []) {
      if (coalesced && ev.mod_rev <= this.r) continue;
      if (ev.type === 'delete' || ev.type === 'leave') this._base.delete(ev.key);
      else this._base.set(ev.key, toEntry<V>(ev as WireItem));
      keys.push(ev.key);
      if (ev.wid) {
        const w = wids.get(ev.wid) ?? { rev: 0, keys: [] };
        w.rev = ev.mod_rev; // events come sorted by mod_rev (PROTOCOL.md §5): the last is the latest
        w.keys.push(ev.key);
        wids.set(ev.wid, w);
      }
    }
    this.r = m.rev;
    const changes = this.update(keys, m.rev, cause);
    if (this.replaying) this.replayed += changes.length;
    this.deliver(changes, m.rev, cause);
    // After the changes: confirming a write of this client shows its keys anew.
    for (const [wid, w] of wids) this.owner._wid(wid, w.rev, this.room, w.keys);
  }

  /** Shows `keys` as they are now (confirmed, or a pending write over it); returns the changes. */
  private update(keys: Iterable<string>, rev: number, cause: ChangeCause): ChangeEvent<V>[] {
    const changes: ChangeEvent<V>[] = [];
    for (const key of keys) {
      const o = this.view.get(key);
      const e = this._covers(key) ? this.shown(key) : undefined;
      if (e === o) continue;
      if (e) this.view.set(key, e);
      else this.view.delete(key);
      changes.push(change(e ? 'put' : this.gone(key), key, e, o, rev, cause));
    }
    return changes;
  }

  /** Why `key` is no longer shown: on a filtered watch it left the view, unless this client's pending write deletes it. */
  private gone(key: string): 'delete' | 'leave' {
    return this.where && this.owner._overlay(this.room, key)?.type !== 'delete' ? 'leave' : 'delete';
  }

  /**
   * What `key` shows: the last pending write of it over the confirmed entry.
   * A filtered watch shows pending writes only over keys in its confirmed
   * view: whether the server's filter selects a value is the server's to say,
   * and a key the view lacks shows no value until the server sends it.
   */
  private shown(key: string): Entry<V> | undefined {
    const op = this.owner._overlay(this.room, key);
    const b = this._base.get(key);
    if (!op || (this.where && !b)) return b; // (an empty filter is none: the server sends every key)
    if (op.type === 'delete') return undefined;
    let e = shownOps.get(op);
    if (!e) shownOps.set(op, (e = Object.freeze({ key, value: op.value, createRev: b?.createRev ?? 0, modRev: b?.modRev ?? 0, version: b?.version ?? 0, lease: !!(op.lease == 'keep' ? b?.lease : op.lease), pending: true as const })));
    return e;
  }

  private deliver(changes: ChangeEvent<V>[], rev: number, cause: ChangeCause): void {
    if (changes.length) this.snap = undefined;
    for (const c of changes) this.emit('change', c);
    if (changes.length) this.emit('changes', { rev, cause, changes });
  }

  private setStatus(status: WatchStatus): void {
    const prev = this.st;
    if (prev === status || prev === 'closed') return;
    this.st = status;
    this.emit('status', { status, prev });
    if (status === 'live') this.owner._flush();
  }

  private wake(): void {
    const due = this.waiters.filter(
      (w) => this.st === 'closed' || (this.started && (this.r >= w.rev || (w.epoch !== undefined && w.epoch !== this.ep) || !!w.gone?.every((k) => !this._base.has(k)))),
    );
    // Out of the list before they run: what they run (listeners) may wake this watch again.
    this.waiters = this.waiters.filter((w) => !due.includes(w));
    for (const w of due) w.done();
  }
}

function cmp(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

function toEntry<V>(it: WireItem | WireEvent): Entry<V> {
  return Object.freeze({
    key: it.key,
    value: it.value as V,
    createRev: it.create_rev ?? 0,
    modRev: it.mod_rev,
    version: it.version ?? 0,
    lease: !!it.lease,
  });
}

function change<V>(type: ChangeEvent['type'], key: string, e: Entry<V> | undefined, o: Entry<V> | undefined, rev: number, cause: ChangeCause): ChangeEvent<V> {
  return { type, key, value: e?.value, prev: o?.value, entry: e, prevEntry: o, rev, cause };
}

function sameEntry(a: Entry<unknown>, b: Entry<unknown>): boolean {
  return a.createRev === b.createRev && a.version === b.version && a.lease === b.lease && equal(a.value, b.value);
}

/** Deep equality of JSON values. */
function equal(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null || Array.isArray(a) !== Array.isArray(b)) return false;
  const ka = Object.keys(a);
  if (ka.length !== Object.keys(b).length) return false;
  return ka.every((k) => equal((a as Record<string, unknown>)[k], (b as Record<string, unknown>)[k]));
}
