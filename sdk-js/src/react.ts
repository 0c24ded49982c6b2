/**
 * React bindings (`@statecast/sdk/react`, React ≥ 18): a provider for the
 * client, one for a room, and hooks built on `useSyncExternalStore`.
 *
 * ```tsx
 * const client = createClient({ url: '/v1/ws', autoConnect: false });
 * <StatecastProvider client={client}>
 *   <RoomProvider id="board:1"><Todos /></RoomProvider>
 * </StatecastProvider>
 * function Todos() {
 *   const todos = useWatch('todo/');            // undefined while loading
 *   return todos ? <ul>{todos.map((e) => <li key={e.key}>{String(e.value)}</li>)}</ul> : <p>loading…</p>;
 * }
 * ```
 *
 * Nothing connects or subscribes during render: the provider connects in an
 * effect, and a hook's server subscription is taken when React subscribes
 * (an effect). Server rendering renders the loading state. Subscriptions are
 * shared per (room, prefix or exact key, filter) and counted; the last release ends one only
 * after `lingerMs`, so StrictMode's subscribe → unsubscribe → subscribe (and
 * a quick remount) never reaches the server.
 * @packageDocumentation
 */
import { createContext, createElement, useCallback, useContext, useEffect, useMemo, useRef, useState, useSyncExternalStore, type ReactElement, type ReactNode } from 'react';
import type { Client } from './client.js';
import type { Presence } from './presence.js';
import type { Room } from './room.js';
import type { ConnectionStatus, RollbackEvent } from './types.js';
import type { Entry, SyncEvent, Watch } from './watch.js';
import { cached, defineRoom, type RoomType, type TypedRoom, type ValueAt, type ValuesUnder } from './typed.js';

interface ClientContextValue {
  client: Client;
  lingerMs: number;
}

const ClientContext = createContext<ClientContextValue | null>(null);
const RoomContext = createContext<Room | null>(null);

/** Props of {@link StatecastProvider}. */
export interface StatecastProviderProps {
  /** The client; create it once (outside render, or in `useState`), with `autoConnect: false` for server rendering. */
  client: Client;
  /** Connect in an effect when mounted (default true). The provider never closes the client: that is the application's. */
  connect?: boolean;
  /** How long a subscription no component uses is kept before it ends, in ms (default 1000). */
  lingerMs?: number;
  children?: ReactNode;
}

/** Makes a client available to the hooks below it, and connects it once mounted. */
export function StatecastProvider({ client, connect = true, lingerMs = 1000, children }: StatecastProviderProps): ReactElement {
  useEffect(() => {
    if (connect) client.connect();
  }, [client, connect]);
  const value = useMemo(() => ({ client, lingerMs }), [client, lingerMs]);
  return createElement(ClientContext.Provider, { value }, children);
}

/** Props of {@link RoomProvider}. */
export interface RoomProviderProps {
  /** The room's name. */
  id: string;
  children?: ReactNode;
}

/** Makes the room `id` the one the hooks below it use. */
export function RoomProvider({ id, children }: RoomProviderProps): ReactElement {
  const room = useClient().room(id); // cached per name; creating a Room has no side effect
  return createElement(RoomContext.Provider, { value: room }, children);
}

function useClientContext(): ClientContextValue {
  const ctx = useContext(ClientContext);
  if (!ctx) throw new Error('statecast: this hook needs a <StatecastProvider client={…}> above it');
  return ctx;
}

/** The client of the nearest {@link StatecastProvider}. */
export function useClient(): Client {
  return useClientContext().client;
}

/** The room `id`, or without `id` the one of the nearest {@link RoomProvider}. */
export function useRoom(id?: string): Room {
  const client = useClient();
  const room = useContext(RoomContext);
  if (id !== undefined) return client.room(id);
  if (!room) throw new Error('statecast: useRoom() without an id needs a <RoomProvider id={…}> above it');
  return room;
}

/** The client's connection status (`connecting` on the server and while hydrating). */
export function useStatus(): ConnectionStatus {
  const client = useClient();
  const subscribe = useCallback((cb: () => void) => client.on('status', cb), [client]);
  return useSyncExternalStore(subscribe, () => client.status, () => 'connecting');
}

/**
 * The others present in the current room (a Map by presence id, the same
 * object until someone joins, updates or leaves), undefined while loading.
 * With `value`, this client is present with it while the component is
 * mounted (written again when it changes as JSON). The room's presence is
 * held by the hooks: it is disposed (this client leaves) `lingerMs` after the
 * last component using it unmounts.
 */
export function usePresence<V = unknown>(value?: V): ReadonlyMap<string, V> | undefined {
  const room = useRoom();
  const { lingerMs } = useClientContext();
  const json = value === undefined ? undefined : JSON.stringify(value);
  useEffect(() => {
    if (json === undefined) return;
    const [p, release] = hold(room, PRESENCE, lingerMs);
    p.set(JSON.parse(json)).catch((e) => console.error('statecast: usePresence could not set this client\'s presence', e));
    return release;
  }, [room, lingerMs, json]);
  const subscribe = useCallback(
    (cb: () => void) => {
      const [p, release] = hold(room, PRESENCE, lingerMs);
      return all([p.on('change', cb), p.watch.on('status', cb), release]);
    },
    [room, lingerMs],
  );
  const get = useCallback(() => {
    const p = peek(room, PRESENCE);
    return p && loaded(p.watch) ? (p.others as ReadonlyMap<string, V>) : undefined;
  }, [room]);
  return useSyncExternalStore(subscribe, get, serverSnapshot);
}

/** The options form of {@link RoomHooks.useWatch}. */
export interface UseWatchOptions<E, T> {
  /**
   * The server's filter of the watch (`where` of `room.watch`): only the
   * entries it selects. Components with the same prefix and `where` share
   * one subscription.
   */
  where?: string;
  /** What to return of the entries (default: the entries). */
  select?: (entries: readonly E[]) => T;
  /** When two selections are the same (default `Object.is`). */
  isEqual?: (a: T, b: T) => boolean;
}

/** The hooks of rooms of one type (see {@link createRoomHooks}). */
export interface RoomHooks<W, R> {
  /** The room `id` (or the {@link RoomProvider}'s), typed. */
  useRoom(id?: string): TypedRoom<W, R>;
  /**
   * The entries under `prefix` (sorted by key, frozen, the same array until
   * one of them changes), or `select` of them; undefined while loading. With
   * `where`, only the entries the server's filter selects. The component
   * re-renders only when the selection changes by `isEqual` (default
   * `Object.is`): pass stable `select`/`isEqual` functions (module level or
   * `useCallback`). Throws the watch's error (to an error boundary) if the
   * server refused the subscription before it had a view (an
   * `InvalidFilterError` for a `where` that does not compile).
   */
  useWatch<P extends string, T>(prefix: P, options: UseWatchOptions<Entry<ValuesUnder<R, P>>, T> & Required<Pick<UseWatchOptions<Entry<ValuesUnder<R, P>>, T>, 'select'>>): T | undefined;
  useWatch<P extends string>(prefix: P, options?: Pick<UseWatchOptions<never, never>, 'where'>): readonly Entry<ValuesUnder<R, P>>[] | undefined;
  useWatch<P extends string, T>(prefix: P, select: (entries: readonly Entry<ValuesUnder<R, P>>[]) => T, isEqual?: (a: T, b: T) => boolean): T | undefined;
  /**
   * The entry at `key` (the same object while the key is unchanged), null
   * when absent, undefined while loading. It subscribes to `key` alone (an
   * exact-key watch: never `key` + anything): for many keys, `useWatch`
   * their common prefix instead.
   */
  useEntry<K extends string>(key: K): Entry<ValueAt<R, K>> | null | undefined;
  /**
   * `useWatch` for Suspense: never undefined. While the watch has no view the
   * component suspends (to the nearest `<Suspense>`) until it has one (a kept
   * view counts: see README "Persistence"); a refused subscription is thrown
   * to the error boundary. A `select` must not return undefined.
   */
  useSuspenseWatch<P extends string, T>(prefix: P, options: UseWatchOptions<Entry<ValuesUnder<R, P>>, T> & Required<Pick<UseWatchOptions<Entry<ValuesUnder<R, P>>, T>, 'select'>>): T;
  useSuspenseWatch<P extends string>(prefix: P, options?: Pick<UseWatchOptions<never, never>, 'where'>): readonly Entry<ValuesUnder<R, P>>[];
  useSuspenseWatch<P extends string, T>(prefix: P, select: (entries: readonly Entry<ValuesUnder<R, P>>[]) => T, isEqual?: (a: T, b: T) => boolean): T;
  /** {@link useMyPresence}, typed by the room type's values under `presence/`. */
  useMyPresence(options?: MyPresenceOptions): [ValuesUnder<R, 'presence/'> | undefined, (patch: Partial<ValuesUnder<R, 'presence/'>>) => void];
  /** {@link usePresence} without a value (the others), typed by the room type's values under `presence/`. */
  useOthers(): ReadonlyMap<string, ValuesUnder<R, 'presence/'>> | undefined;
}

/**
 * Hooks typed by a room type from `defineRoom` (entries validated by its
 * schemas, if any: an entry a schema refuses is left out, never thrown):
 * `const { useWatch, useEntry, useRoom } = createRoomHooks(Board)`.
 */
export function createRoomHooks<W, R>(type: RoomType<W, R>): RoomHooks<W, R> {
  const entriesOf = (w: Watch<unknown>) => type.view(w).entries();
  type Args<T> = [UseWatchOptions<Entry<unknown>, T> | ((entries: readonly Entry<unknown>[]) => T) | undefined, ((a: T, b: T) => boolean) | undefined];
  const options = <T>([a, b]: Args<T>) => (typeof a === 'function' ? { select: a, isEqual: b } : (a ?? {}));
  const useWatch = <T>(prefix: string, ...args: Args<T>) => {
    const { where, select, isEqual = Object.is } = options(args);
    const [subscribe, get] = useWatchStore(prefix, entriesOf, where);
    return useSelected(subscribe, get, select, isEqual);
  };
  return {
    useRoom: (id?: string) => type.of(useRoom(id)),
    useWatch,
    useMyPresence,
    useOthers: () => usePresence(),
    useSuspenseWatch<T>(prefix: string, ...args: Args<T>) {
      const room = useRoom();
      const { lingerMs } = useClientContext();
      const v = useWatch(prefix, ...args);
      if (v === undefined) throw suspend(room, prefix, lingerMs, options(args).where);
      return v;
    },
    useEntry(key: string) {
      const read = useCallback((w: Watch<unknown>) => type.view(w).entry(key) ?? null, [key]);
      return useSyncExternalStore(...useWatchStore(key, read, undefined, true), serverSnapshot);
    },
  } as RoomHooks<W, R>;
}

/**
 * The subscribe and getSnapshot of `read` of the room's shared watch of
 * `prefix` (and `where`): undefined while the watch has no view (or no
 * component holds it), and its error thrown if the server refused it before
 * it had one.
 */
function useWatchStore<T>(prefix: string, read: (w: Watch<unknown>) => T, where?: string, exact?: boolean): [(cb: () => void) => () => void, () => T | undefined] {
  const room = useRoom();
  const { lingerMs } = useClientContext();
  const subscribe = useCallback(
    (cb: () => void) => {
      const [w, release] = hold(room, prefix, lingerMs, where, exact);
      return all([w.on('changes', cb), w.on('status', cb), release]);
    },
    [room, prefix, where, lingerMs, exact],
  );
  const get = useCallback(() => {
    const w = peek(room, prefix, where, exact);
    if (w && !loaded(w) && w.error) throw w.error;
    return w && loaded(w) ? read(w) : undefined;
  }, [room, prefix, where, read, exact]);
  return [subscribe, get];
}

const untyped = createRoomHooks(defineRoom<Record<string, unknown>>());
/** {@link RoomHooks.useWatch} of an untyped room (values `unknown`). */
export const useWatch = untyped.useWatch;
/** {@link RoomHooks.useEntry} of an untyped room (values `unknown`). */
export const useEntry = untyped.useEntry;
/** {@link RoomHooks.useSuspenseWatch} of an untyped room (values `unknown`). */
export const useSuspenseWatch = untyped.useSuspenseWatch;

/** Options of {@link useMyPresence}. */
export interface MyPresenceOptions {
  /** At most one presence write per this many ms (default 100): the latest value, the others merged into it. */
  throttleMs?: number;
}

/**
 * This client's presence in the room as `[self, update]`: `update(patch)`
 * merges `patch` into `self` (an object), which re-renders at once; the
 * presence is written at most once per `throttleMs`, with the latest value.
 * This client is present from its first `update` while a component that
 * uses it is mounted (then it leaves a linger later, as with `usePresence`).
 */
export function useMyPresence<V extends object>(options?: MyPresenceOptions): [V | undefined, (patch: Partial<V>) => void] {
  const room = useRoom();
  const { lingerMs } = useClientContext();
  const wait = options?.throttleMs ?? 100;
  const s = useRef<{ p?: Presence<unknown>; self?: V; next?: V; timer?: ReturnType<typeof setTimeout>; last: number }>({ last: 0 }).current;
  const [self, setSelf] = useState<V | undefined>(() => (s.self = peek(room, PRESENCE)?.self as V | undefined));
  const flush = useCallback(() => {
    s.timer = undefined;
    if (!s.p || !s.next) return; // written once the presence is held
    s.last = Date.now();
    s.p.set(s.next).catch((e) => console.error('statecast: useMyPresence could not set this client\'s presence', e));
    s.next = undefined;
  }, [s]);
  useEffect(() => {
    const [p, release] = hold(room, PRESENCE, lingerMs);
    s.p = p;
    flush();
    return () => {
      clearTimeout(s.timer);
      s.timer = s.p = undefined;
      release();
    };
  }, [room, lingerMs, s, flush]);
  const update = useCallback(
    (patch: Partial<V>) => {
      s.next = s.self = { ...s.self, ...patch } as V;
      setSelf(s.self);
      s.timer ??= setTimeout(flush, Math.max(0, s.last + wait - Date.now()));
    },
    [s, flush, wait],
  );
  return [self, update];
}

/** Promises of the watches a suspended render waits for (one per watch, so React sees the same one). */
const readies = new WeakMap<Watch<unknown>, Promise<void>>();

/**
 * What a render that suspends throws: a suspended render commits nothing,
 * so no subscription holds the watch; it is held here and released at once,
 * so it lingers `lingerMs` for the render that follows its first view.
 */
function suspend(room: Room, prefix: string, lingerMs: number, where?: string): Promise<void> {
  const [w, release] = hold(room, prefix, lingerMs, where);
  release();
  return cached(readies, w, () => w.ready().catch(() => {})); // an error is thrown by the next render
}

/** The number of the client's writes not settled yet (`client.pendingWrites`): 0 when all are saved. */
export function usePendingWrites(): number {
  const client = useClient();
  const subscribe = useCallback((cb: () => void) => client.on('pending', cb), [client]);
  return useSyncExternalStore(subscribe, () => client.pendingWrites, () => 0);
}

/** Calls `fn` (the latest one given) with every `rollback` of the client's writes while mounted: a failed write, undone. */
export function useRollback(fn: (ev: RollbackEvent) => void): void {
  const client = useClient();
  const latest = useRef(fn);
  useEffect(() => {
    latest.current = fn;
  });
  useEffect(() => client.on('rollback', (ev) => latest.current(ev)), [client]);
}

/** The last `sync` of each held watch. */
const syncs = new WeakMap<Watch<unknown>, SyncEvent>();

/**
 * The last `sync` of the watch of `prefix` (and `where`) in this room:
 * `kind` `initial` (`reason` `cache` for a kept view), `resumed` or
 * `resync`; undefined until its first.
 */
export function useSync(prefix: string, where?: string): SyncEvent | undefined {
  const room = useRoom();
  const { lingerMs } = useClientContext();
  const subscribe = useCallback(
    (cb: () => void) => {
      const [w, release] = hold(room, prefix, lingerMs, where);
      return all([w.on('sync', cb), release]);
    },
    [room, prefix, where, lingerMs],
  );
  const get = useCallback(() => {
    const w = peek(room, prefix, where);
    return w && syncs.get(w);
  }, [room, prefix, where]);
  return useSyncExternalStore(subscribe, get, serverSnapshot);
}

/**
 * useSyncExternalStore with a selection that keeps its identity while
 * `isEqual` says it is unchanged (so a new array from `select` does not
 * re-render, or loop); no selection while loading (undefined).
 */
function useSelected<S, T>(
  subscribe: (cb: () => void) => () => void,
  get: () => S | undefined,
  select: ((s: S) => T) | undefined,
  isEqual: (a: T, b: T) => boolean,
): T | undefined {
  const committed = useRef<T | undefined>(undefined);
  const getSelection = useMemo(() => {
    let memo: { snap: S | undefined; sel: T | undefined } | undefined;
    return () => {
      const snap = get();
      if (memo && memo.snap === snap) return memo.sel;
      const prev = memo ? memo.sel : committed.current;
      let sel = snap === undefined ? undefined : select ? select(snap) : (snap as unknown as T);
      if (prev !== undefined && sel !== undefined && isEqual(prev, sel)) sel = prev;
      memo = { snap, sel };
      return sel;
    };
  }, [get, select, isEqual]);
  const value = useSyncExternalStore(subscribe, getSelection, serverSnapshot);
  useEffect(() => {
    committed.current = value;
  });
  return value;
}

const serverSnapshot = () => undefined;

/** A watch has a view once its first snapshot came (an empty room's too). */
function loaded(w: Watch<unknown>): boolean {
  return w.epoch !== undefined;
}

/** The calls of fns, as one function. */
function all(fns: (() => void)[]): () => void {
  return () => fns.forEach((f) => f());
}

/**
 * What the hooks hold in a room: a watch per prefix (and filter), and the
 * presence under a name no prefix can have (a NUL is not allowed in one).
 */
const PRESENCE = '\0presence';
type HeldName = typeof PRESENCE | (string & {});
type Holdable<N> = N extends typeof PRESENCE ? Presence<unknown> : Watch<unknown>;

interface Held {
  value: Watch<unknown> | Presence<unknown>;
  refs: number;
  timer?: ReturnType<typeof setTimeout>;
}

const held = new WeakMap<Room, Map<string, Held>>();

/**
 * The name a watch of `prefix` filtered by `where` (or of the exact key) is
 * held under: never PRESENCE, never another prefix's or key's.
 */
function heldName(name: string, where: string | undefined, exact?: boolean): string {
  return (exact ? '\0=' : '') + (where === undefined ? name : `${name}\0?${where}`);
}

/**
 * Takes a reference on a room's watch of `name` (or its presence), opening it
 * on the first. The last release ends it only `lingerMs` later, and a new
 * reference meanwhile keeps it: the server never sees a subscription end
 * and start again for StrictMode's double mount or a quick remount.
 */
function hold<N extends HeldName>(room: Room, name: N, lingerMs: number, where?: string, exact?: boolean): [Holdable<N>, () => void] {
  const byName = cached(held, room, () => new Map<string, Held>());
  const key = heldName(name, where, exact);
  const h: Held = cached(byName, key, () => {
    if (name === PRESENCE) return { value: room.presence(), refs: 0 };
    const w = room.watch(name, { where, exact });
    w.on('sync', (ev) => syncs.set(w, ev)); // before the hooks' listeners: useSync reads it
    return { value: w, refs: 0 };
  });
  clearTimeout(h.timer);
  h.refs++;
  let released = false;
  const release = () => {
    if (released) return;
    released = true;
    if (--h.refs > 0) return;
    h.timer = setTimeout(() => {
      byName.delete(key);
      if ('dispose' in h.value) h.value.dispose();
      else h.value.close();
    }, lingerMs);
  };
  return [h.value as Holdable<N>, release];
}

/** What hold() holds now, without taking it (for reading during render). */
function peek<N extends HeldName>(room: Room, name: N, where?: string, exact?: boolean): Holdable<N> | undefined {
  return held.get(room)?.get(heldName(name, where, exact))?.value as Holdable<N> | undefined;
}
