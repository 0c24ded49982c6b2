/**
 * `@statecast/sdk/persist`: keeps a client's watches' views and pending
 * writes across reloads and browser restarts (IndexedDB, or any storage
 * adapter), so a reload renders the cached state at once and resumes it by
 * replay from its epoch and revision. See README "Persistence".
 * @packageDocumentation
 */
import type { Client } from './client.js';
import type { Write } from './pending.js';
import type { SubMessage, WireItem } from './protocol.js';
import { tabs, type TabLocks, type TabsOptions } from './tabs.js';
import type { Persistence } from './types.js';
import type { Watch } from './watch.js';

export type { TabsOptions, TabLocks, TabChannel } from './tabs.js';

/**
 * Where persistence keeps its records: string keys, structured-cloneable
 * values. `indexedDBStorage()` in browsers, `memoryStorage()` for tests; a
 * React Native app can wrap AsyncStorage (JSON.stringify the values).
 */
export interface PersistStorage {
  get(key: string): Promise<unknown>;
  /**
   * Resolves once the record is stored. `durable`: the pending writes, which
   * nothing else holds, so the storage should make them survive a crash of
   * the machine (IndexedDB: a transaction of `strict` durability).
   */
  set(key: string, value: unknown, opts?: { durable?: boolean }): Promise<void>;
  delete(key: string): Promise<void>;
  /** Every key that starts with `prefix`. */
  keys(prefix: string): Promise<string[]>;
}

/** Options of {@link persist}. */
export interface PersistOptions {
  /** Default: `indexedDBStorage()` where IndexedDB exists, else `memoryStorage()`. */
  storage?: PersistStorage;
  /** Views kept per server and subject (default 32): the least recently saved go first. */
  maxViews?: number;
  /** A view with more keys than this (default 10 000) is not kept. */
  maxKeys?: number;
  /** How long after a change a view is saved, in ms (default 250; also saved when the page is hidden). */
  saveDelayMs?: number;
  /**
   * Tabs of this origin (same server URL and token subject) share one
   * connection: the leader tab (a Web Lock) holds the socket, the others
   * talk to the server through it (BroadcastChannel), each tab shows the
   * others' pending writes, and the next tab takes over when the leader
   * closes. Ignored without Web Locks or BroadcastChannel. See README "Tabs". Default false.
   */
  tabs?: boolean | TabsOptions;
  /**
   * Called with a {@link PersistError} when keeping the pending writes
   * starts failing (the storage is full, denied, or was closed under the
   * page), once until it works again. Default: `console.error`.
   */
  onError?: (error: PersistError) => void;
}

/**
 * The pending writes could not be kept in the page's storage: they are sent
 * as usual while the page lives, but a reload before they are acknowledged
 * loses them. See {@link PersistOptions.onError}.
 */
export class PersistError extends Error {
  /** What the storage failed with (IndexedDB: a `DOMException`, e.g. `QuotaExceededError`). */
  readonly cause: unknown;
  constructor(cause: unknown) {
    super(`statecast: the pending writes could not be kept: ${cause instanceof Error ? cause.message || cause.name : String(cause)}`);
    this.name = 'PersistError';
    this.cause = cause;
  }
}

/** A kept view: the confirmed state of a watch at (epoch, rev). */
interface SavedView {
  epoch: string;
  rev: number;
  /** When it was saved (eviction order). */
  at: number;
  items: WireItem[];
}

/** A kept pending write: its request (with its wid) and the `since` it was first sent with (null: never sent). */
interface SavedWrite {
  room: string;
  msg: Record<string, unknown>;
  since: number | null;
}

/**
 * Persistence for `createClient({ persist: persist() })`. Records are
 * partitioned by server URL and token subject: another subject's client
 * never reads them, and opening one subject deletes the other subjects'
 * views (their pending writes stay, for their subject only).
 */
export function persist(opts: PersistOptions = {}): Persistence {
  const storage = opts.storage ?? (typeof indexedDB === 'undefined' ? memoryStorage() : indexedDBStorage());
  const maxViews = opts.maxViews ?? 32;
  const maxKeys = opts.maxKeys ?? 10_000;
  const delay = opts.saveDelayMs ?? 250;
  const tabsOpts = opts.tabs === true ? {} : opts.tabs || undefined; // ignored without Web Locks or BroadcastChannel
  const locks = tabsOpts?.locks ?? (globalThis as { navigator?: { locks?: TabLocks } }).navigator?.locks;
  const g = globalThis as unknown as { addEventListener?: (t: string, f: () => void) => void };
  let part: string | undefined; // the partition, once open
  let c: Client;
  const views = new Map<string, SavedView>();
  const watches = new Set<Watch<any>>();
  const flushes = new Set<() => void>();
  const vkey = (w: Watch<any>) => `${part}v\0${w.room}\0${w.exact ? '=' : ''}${w.prefixes.join('\u0001')}\0${w.where ?? ''}`;

  /** Calls `fn` at most once per `delay`; `flushes` runs the pending ones now (page hidden). */
  const later = (fn: () => void) => {
    let t: ReturnType<typeof setTimeout> | undefined;
    const run = () => {
      clearTimeout(t);
      t = undefined;
      flushes.delete(run);
      fn();
    };
    return () => {
      if (t !== undefined) return;
      t = setTimeout(run, delay);
      flushes.add(run);
    };
  };

  const restoreView = (w: Watch<any>) => {
    const v = views.get(vkey(w));
    if (!v || w.epoch !== undefined) return;
    // As a first snapshot, then stale until the subscription resumes it from (epoch, rev + 1).
    w._apply({ t: 'snapshot', s: 0, epoch: v.epoch, rev: v.rev, items: v.items, reason: 'cache' } as SubMessage);
    w._offline();
  };

  const track = (w: Watch<any>) => {
    const save = later(() => {
      if (w.epoch === undefined || part === undefined) return;
      const k = vkey(w);
      if (w._base.size > maxKeys) return void storage.delete(k).catch(() => {});
      const items = [...w._base.values()].map((e) => ({ key: e.key, value: e.value, create_rev: e.createRev, mod_rev: e.modRev, version: e.version, lease: e.lease }));
      const v: SavedView = { epoch: w.epoch, rev: w.rev, at: Date.now(), items };
      views.set(k, v);
      storage.set(k, v).catch(() => {});
    });
    w.on('changes', save);
    w.on('sync', save);
    w.on('status', ({ status }) => status === 'closed' && watches.delete(w));
    if (part !== undefined) restoreView(w);
  };

  // Whether the last save of the pending writes succeeded: a failure is
  // told once, when keeping them starts failing.
  let writesKept = true;
  const onError = opts.onError ?? ((e: PersistError) => console.error(e));
  const saveWrites = later(() => {
    const list: SavedWrite[] = c._pending
      .filter((w: Write) => w.state !== 'acked' && w.state !== 'done')
      .map((w) => ({ room: w.room, msg: w.msg, since: w.state === 'queued' ? null : (w.since ?? null) }));
    const key = part + 'w\0' + c.clientId;
    (list.length ? storage.set(key, list, { durable: true }) : storage.delete(key)).then(
      () => void (writesKept = true),
      (e) => {
        if (writesKept) onError(new PersistError(e));
        writesKept = false;
      },
    );
  });

  /** Restores the writes kept under `key` and deletes them (they are this page's now). */
  const take = async (key: string) => {
    const list = (await storage.get(key)) as SavedWrite[] | undefined;
    await storage.delete(key);
    for (const w of list ?? []) c._restore(w.room, w.msg, w.since);
  };

  const p: { -readonly [K in keyof Persistence]: Persistence[K] } = {
    async open(client, subject) {
      c = client;
      const base = `statecast\0${client.url}\0`;
      part = `${base}${subject ?? ''}\0`;
      if (tabsOpts && locks && (tabsOpts.channel || typeof BroadcastChannel !== 'undefined')) ({ WebSocket: p.WebSocket, overlay: p.overlay } = await tabs(client, subject, locks, tabsOpts));
      try {
        // A tab holds its lock while it lives: the writes of a tab whose lock is free are orphans to take.
        locks?.request('statecast:' + client.clientId, {}, () => new Promise(() => {})).catch(() => {});
        const all = await storage.keys(base);
        const mine = all.filter((k) => k.startsWith(part!));
        // Other subjects' views go; their writes stay theirs.
        await Promise.all(all.filter((k) => !k.startsWith(part!) && k.slice(k.indexOf('\0', base.length) + 1).startsWith('v\0')).map((k) => storage.delete(k)));
        const vs = mine.filter((k) => k.startsWith(part + 'v\0'));
        const got = await Promise.all(vs.map((k) => storage.get(k) as Promise<SavedView | undefined>));
        const order = vs.map((k, i) => [k, got[i]] as const).filter(([, v]) => v).sort((a, b) => b[1]!.at - a[1]!.at);
        for (const [k, v] of order.slice(0, maxViews)) views.set(k, v!);
        await Promise.all(order.slice(maxViews).map(([k]) => storage.delete(k)));
        for (const w of watches) restoreView(w);
        for (const k of mine.filter((k) => k.startsWith(part + 'w\0'))) {
          const id = k.slice(part.length + 2);
          if (id === client.clientId || !locks) await take(k);
          else await locks.request('statecast:' + id, { ifAvailable: true }, (lock) => lock && take(k));
        }
      } catch {
        // storage denied or broken: the client goes on without what it kept
      }
      client.on('pending', saveWrites);
      saveWrites();
      g.addEventListener?.('pagehide', () => [...flushes].forEach((f) => f()));
    },
    watch(w) {
      watches.add(w);
      track(w);
    },
  };
  return p;
}

/** Records in memory: for tests, and where there is no IndexedDB (nothing survives the process). */
export function memoryStorage(): PersistStorage & { m: Map<string, unknown> } {
  const m = new Map<string, unknown>();
  return {
    m,
    get: async (k) => structuredClone(m.get(k)),
    set: async (k, v) => void m.set(k, structuredClone(v)),
    delete: async (k) => void m.delete(k),
    keys: async (p) => [...m.keys()].filter((k) => k.startsWith(p)),
  };
}

/**
 * Records in the browser's IndexedDB: database `name` (default `statecast`),
 * one object store. A write resolves once its transaction has committed (a
 * full disk aborts the transaction after the request itself succeeded). A
 * connection the browser closes (site data cleared, storage evicted) or
 * that another tab's upgrade asks to close is opened again by the next call.
 */
export function indexedDBStorage(name = 'statecast'): PersistStorage {
  let db: Promise<IDBDatabase> | undefined;
  const open = (): Promise<IDBDatabase> => {
    const p = (db ??= new Promise<IDBDatabase>((resolve, reject) => {
      const r = indexedDB.open(name, 1);
      r.onupgradeneeded = () => r.result.createObjectStore('kv');
      r.onsuccess = () => {
        const d = r.result;
        const drop = () => {
          d.close();
          if (db === p) db = undefined;
        };
        d.onclose = drop;
        d.onversionchange = drop;
        resolve(d);
      };
      r.onerror = () => reject(r.error);
    }));
    p.catch(() => db === p && (db = undefined)); // denied now, perhaps not later
    return p;
  };
  const tx = async (mode: IDBTransactionMode, durability?: 'strict'): Promise<IDBTransaction> => {
    const p = open();
    const d = await p;
    try {
      return d.transaction('kv', mode, durability && { durability });
    } catch {
      // Closing, the close event not yet come: a new connection.
      d.close();
      if (db === p) db = undefined;
      return (await open()).transaction('kv', mode, durability && { durability });
    }
  };
  const run = async <T>(mode: IDBTransactionMode, f: (s: IDBObjectStore) => IDBRequest<T>, durability?: 'strict'): Promise<T> => {
    const t = await tx(mode, durability);
    return new Promise((resolve, reject) => {
      const r = f(t.objectStore('kv'));
      t.oncomplete = () => resolve(r.result);
      t.onabort = () => reject(t.error ?? r.error ?? new DOMException('the transaction was aborted', 'AbortError'));
    });
  };
  return {
    get: (k) => run('readonly', (s) => s.get(k)),
    set: async (k, v, o) => void (await run('readwrite', (s) => s.put(v, k), o?.durable ? 'strict' : undefined)),
    delete: async (k) => void (await run('readwrite', (s) => s.delete(k))),
    // The keys from `p` up to `p` + U+FFFF: the ones that start with it.
    keys: async (p) => (await run('readonly', (s) => s.getAllKeys(IDBKeyRange.bound(p, p + '\uffff')))) as string[],
  };
}
