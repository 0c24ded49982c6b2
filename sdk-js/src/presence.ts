import { Emitter } from './emitter.js';
import { StatecastError } from './errors.js';
import { checkValue, type Room, type WriteResult } from './room.js';
import type { Watch } from './watch.js';

/** Events of {@link Presence}. `id` is the other client's presence id, `<user>/<clientId>`. */
export interface PresenceEvents<V> {
  /** Someone appeared in the room. */
  join: { id: string; value: V };
  /** Someone changed their presence value. */
  update: { id: string; value: V; prev: V };
  /** Someone left (closed, or their session ended after the server's lease grace). */
  leave: { id: string; prev: V };
  /** The others, after any join, update or leave. */
  change: ReadonlyMap<string, V>;
}

/** The key prefix of presence entries. */
export const PRESENCE_PREFIX = 'presence/';

/**
 * Presence in one room: this client's value, kept under
 * `presence/<user>/<clientId>` as a session-leased key (the server deletes it
 * shortly after this client's session ends), and everyone else's. `<user>` is
 * the `sub` of the client's token, so that the grant
 * `presence/{sub}/` (rw) covers it and nothing of another subject; without a
 * token or a `sub` in it, the clientId. Each client (tab) has its own key.
 *
 * `set` and `clear` are latest-wins: calls made while an earlier presence
 * write is in flight are merged into one write of the latest state, and
 * their promises settle together. When a reconnect could not resume the
 * session (the lease ended), the current value is written again by itself.
 */
export class Presence<V = unknown> extends Emitter<PresenceEvents<V>> {
  /** The watch of `presence/` behind this object. */
  readonly watch: Watch<V>;
  private readonly room: Room;
  private k: string | undefined;
  private value: V | undefined;
  private active = false;
  private chain: Promise<unknown> = Promise.resolve();
  private queued: Promise<WriteResult> | undefined;
  private session: string | undefined;
  private readonly offConnected: () => void;
  private disposed = false;
  /** others, kept until someone else changes. */
  private snap: ReadonlyMap<string, V> | undefined;

  /** @internal Use `room.presence()`. */
  constructor(room: Room) {
    super();
    this.room = room;
    this.watch = room.watch<V>(PRESENCE_PREFIX);
    this.watch.on('changes', ({ changes }) => {
      let any = false;
      for (const c of changes) {
        const id = c.key.slice(PRESENCE_PREFIX.length);
        if (id === this.id) continue;
        any = true;
        if (c.type === 'delete') this.emit('leave', { id, prev: c.prev as V });
        else if (c.prevEntry) this.emit('update', { id, value: c.value as V, prev: c.prev as V });
        else this.emit('join', { id, value: c.value as V });
      }
      if (!any) return;
      this.snap = undefined;
      this.emit('change', this.others);
    });
    this.offConnected = room.client.on('connected', (e) => {
      if (!e.resumed && this.active && this.session !== undefined && this.session !== e.session) void this.sync().catch(() => {});
    });
  }

  /**
   * The key this client's presence is written at, `presence/<user>/<clientId>`
   * (see the class). Fixed once known; undefined while a token callback has
   * not given the first token.
   */
  get key(): string | undefined {
    const user = this.k === undefined ? this.room.client._presenceUser() : undefined;
    if (user !== undefined) this.k = `${PRESENCE_PREFIX}${user}/${this.room.client.clientId}`;
    return this.k;
  }

  /** This client's presence id, `<user>/<clientId>`: its key without `presence/`. */
  get id(): string | undefined {
    return this.key?.slice(PRESENCE_PREFIX.length);
  }

  /** This client's presence value (undefined when not set). */
  get self(): V | undefined {
    return this.value;
  }

  /**
   * Everyone else present, by presence id: a snapshot that keeps its identity
   * until someone else joins, updates or leaves (for `useSyncExternalStore`).
   * Do not change it.
   */
  get others(): ReadonlyMap<string, V> {
    return (this.snap ??= this.collect());
  }

  private collect(): ReadonlyMap<string, V> {
    const m = new Map<string, V>();
    for (const e of this.watch.entries()) {
      const id = e.key.slice(PRESENCE_PREFIX.length);
      if (id !== this.id) m.set(id, e.value);
    }
    return m;
  }

  /** Sets this client's presence value (any JSON value). */
  set(value: V): Promise<WriteResult> {
    try {
      checkValue(value, 'value'); // refused before it replaces the current value
    } catch (e) {
      return Promise.reject(e);
    }
    this.value = value;
    this.active = true;
    return this.sync();
  }

  /** Removes this client's presence (others see it leave at once). */
  clear(): Promise<WriteResult> {
    this.value = undefined;
    this.active = false;
    return this.sync();
  }

  /**
   * Ends this presence object: clears this client's value if it was set
   * (others see it leave), closes the watch and removes its client listener.
   * `room.presence()` then returns a new one. Later `set`/`clear` reject.
   */
  dispose(): void {
    if (this.disposed) return;
    if (this.active) void this.clear().catch(() => {});
    this.disposed = true;
    this.offConnected();
    this.watch.close();
    this.room._forget(this);
  }

  private sync(): Promise<WriteResult> {
    if (this.disposed) return Promise.reject(new StatecastError('closed', 'this presence was disposed'));
    if (this.queued) return this.queued;
    const p = this.chain.then(async () => {
      try {
        await this.room.client._presenceUserKnown();
      } finally {
        this.queued = undefined; // calls until here merged into this write
      }
      const res = this.active
        ? await this.room.put(this.key!, this.value, { lease: 'session' })
        : await this.room.delete(this.key!);
      this.session = this.room.client.session?.session;
      return res;
    });
    this.queued = p;
    this.chain = p.catch(() => {});
    return p;
  }
}
