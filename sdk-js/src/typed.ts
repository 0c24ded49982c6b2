/**
 * Typed rooms: the value type of each key prefix declared once, so that
 * writes and reads are type-checked, with an optional runtime validator per
 * prefix (any Standard Schema: zod, valibot, arktype, …; no dependency).
 * A thin layer over {@link Room} and {@link Watch}: nothing here talks to the
 * server by itself.
 *
 * ```ts
 * import { defineRoom } from '@statecast/sdk/typed';
 * const Board = defineRoom<{ 'todo/': Todo; 'cursor/': Cursor }>();
 * const board = Board.of(client.room('board:1'));
 * await board.put('todo/1', { text: 'milk', done: false }); // a Cursor here does not compile
 * const todos = board.watch('todo/');                          // TypedWatch<Todo>
 * ```
 * @packageDocumentation
 */
import { StatecastError } from './errors.js';
import type { DeleteOptions, PutOptions, Room, WatchOptions, WriteOptions, WriteResult } from './room.js';
import type { Entry, Watch } from './watch.js';

/**
 * A validator that implements the Standard Schema interface, version 1
 * (https://standardschema.dev): its shape only, so the SDK depends on no
 * package for it. Zod, Valibot and ArkType schemas fit it as they are.
 */
export interface StandardSchema<In = unknown, Out = In> {
  readonly '~standard': {
    readonly version: 1;
    readonly vendor: string;
    readonly validate: (value: unknown) => SchemaResult<Out> | Promise<SchemaResult<Out>>;
    readonly types?: { readonly input: In; readonly output: Out } | undefined;
  };
}

/** What a Standard Schema's `validate` returns. */
export type SchemaResult<Out> = { readonly value: Out; readonly issues?: undefined } | { readonly issues: readonly SchemaIssue[] };

/** One problem a schema found in a value. */
export interface SchemaIssue {
  readonly message: string;
  readonly path?: readonly (PropertyKey | { readonly key: PropertyKey })[] | undefined;
}

type SchemaIn<S> = S extends StandardSchema<infer I, any> ? I : never;
type SchemaOut<S> = S extends StandardSchema<any, infer O> ? O : never;

/**
 * A value was refused by the schema of its key's prefix: a write, before
 * sending (nothing written), so its promise rejects with this. `issues` are
 * the schema's.
 */
export class SchemaError extends StatecastError {
  /** The key written. */
  readonly key: string;
  /** What the schema found. */
  readonly issues: readonly SchemaIssue[];
  constructor(key: string, issues: readonly SchemaIssue[]) {
    super('invalid_value', `the value for "${key}" does not match its schema: ${issues.map((i) => i.message).join('; ')}; not sent`);
    this.name = 'SchemaError';
    this.key = key;
    this.issues = issues;
  }
}

type Prefixes<M> = keyof M & string;
/** The prefixes of M that K starts with. */
type Matching<M, K extends string> = { [P in Prefixes<M>]: K extends `${P}${string}` ? P : never }[Prefixes<M>];
/** The prefixes of M that start with K. */
type Within<M, K extends string> = { [P in Prefixes<M>]: P extends `${K}${string}` ? P : never }[Prefixes<M>];
/** The longest of a union of prefixes: the one no other starts with. */
type Longest<Ps extends string> = { [P in Ps]: [Extract<Exclude<Ps, P>, `${P}${string}`>] extends [never] ? P : never }[Ps];

/**
 * The value type of key K in a room whose prefixes map to value types M: that
 * of the longest prefix K starts with. `never` (so nothing compiles) when no
 * prefix matches; every value type of M when K is just `string`.
 */
export type ValueAt<M, K extends string> = string extends K ? M[Prefixes<M>] : M[Longest<Matching<M, K>>];

/**
 * The value types of the keys under prefix P: that of the longest prefix P
 * starts with, and those of the prefixes that start with P.
 */
export type ValuesUnder<M, P extends string> = string extends P ? M[Prefixes<M>] : M[Longest<Matching<M, P>> | Within<M, P>];

/** One operation of a typed transaction; a put's value is checked against a prefix its key starts with. */
export type TypedTxnOp<W> =
  | { [P in Prefixes<W>]: { type: 'put'; key: `${P}${string}`; value: W[P]; lease?: 'session' | (string & {}) } }[Prefixes<W>]
  | { type: 'delete'; key: string };

/**
 * A room's type: the value type per key prefix for writes (W) and reads (R),
 * which differ only for a schema that transforms what it validates, and the
 * runtime schemas if any.
 */
export interface RoomType<W, R> {
  /** The schemas by prefix (empty for a room typed without schemas). */
  readonly schemas: Readonly<Record<string, StandardSchema<unknown, unknown>>>;
  /** A room of this type. */
  of(room: Room): TypedRoom<W, R>;
  /** A typed view of a watch (of a room of this type) under prefix P. */
  view<P extends string = string>(watch: Watch<unknown>): TypedWatch<ValuesUnder<R, P>>;
}

/**
 * Declares a room's type, once: `defineRoom<{ 'todo/': Todo }>()` for types
 * only, or `defineRoom({ 'todo/': todoSchema })` with a Standard Schema per
 * prefix (types inferred from the schemas), validated at run time. A key
 * belongs to its longest matching prefix; a key no schema covers is not
 * validated.
 */
export function defineRoom<S extends Record<string, StandardSchema<any, any>>>(
  schemas: S,
): RoomType<{ [P in keyof S]: SchemaIn<S[P]> }, { [P in keyof S]: SchemaOut<S[P]> }>;
export function defineRoom<M extends object>(schemas?: { [P in keyof M]?: StandardSchema<M[P]> }): RoomType<M, M>;
export function defineRoom(schemas: Record<string, StandardSchema<unknown, unknown> | undefined> = {}): RoomType<any, any> {
  const checks = new Checks(schemas);
  // One typed object per room and per watch, so they keep their identity (React deps, snapshots).
  const rooms = new WeakMap<Room, TypedRoom<any, any>>();
  const views = new WeakMap<Watch<unknown>, TypedWatch<any>>();
  return {
    schemas: checks.schemas,
    of: (room) => cached(rooms, room, () => new TypedRoom(room, checks)),
    view: (watch) => cached(views, watch, () => new TypedWatch(watch, checks)),
  };
}

/** @internal The value of k in m, made and kept on the first call. */
export function cached<K, V>(m: { get(k: K): V | undefined; set(k: K, v: V): unknown }, k: K, make: () => V): V {
  let v = m.get(k);
  if (v === undefined) m.set(k, (v = make()));
  return v;
}

/** A read: the entry as validated (its value the schema's output), or the issues found. */
type Checked = Entry<unknown> | readonly SchemaIssue[];

/** @internal A room type's schemas, and the reads they checked: one result per entry object, so per (key, mod_rev). */
export class Checks {
  readonly schemas: Readonly<Record<string, StandardSchema<unknown, unknown>>>;
  private readonly byLength: [string, StandardSchema<unknown, unknown>][];
  private readonly reads = new WeakMap<Entry<unknown>, Checked>();

  constructor(schemas: Record<string, StandardSchema<unknown, unknown> | undefined>) {
    const defined = Object.entries(schemas).filter((e): e is [string, StandardSchema<unknown, unknown>] => !!e[1]);
    this.schemas = Object.freeze(Object.fromEntries(defined));
    this.byLength = defined.sort((a, b) => b[0].length - a[0].length);
  }

  /** Validates a value to be written at key; throws SchemaError. */
  write(key: string, value: unknown): void {
    const r = this.validate(key, value);
    if (r.issues) throw new SchemaError(key, r.issues);
  }

  /** The entry as its schema reads it, validated once per entry object (watches keep it while the key is unchanged). */
  read(e: Entry<unknown>): Checked {
    return cached(this.reads, e, () => {
      const r = this.validate(e.key, e.value);
      return r.issues ?? (r.value === e.value ? e : Object.freeze({ ...e, value: r.value }));
    });
  }

  private validate(key: string, value: unknown): SchemaResult<unknown> {
    const schema = this.byLength.find(([p]) => key.startsWith(p))?.[1];
    if (!schema) return { value };
    const r = schema['~standard'].validate(value);
    // A write is sent in call order and a read happens during render: neither can wait.
    if (r instanceof Promise) return { issues: [{ message: 'the schema validates asynchronously; statecast needs a synchronous one' }] };
    return r;
  }
}

/**
 * A {@link Room} with typed writes: `put` only compiles with a value of the
 * key's type, and a room type with schemas validates it before sending (a
 * {@link SchemaError} rejection, nothing sent).
 */
export class TypedRoom<W, R> {
  /** The untyped room. */
  readonly room: Room;
  private readonly checks: Checks;

  /** @internal Use `defineRoom(...).of(room)`. */
  constructor(room: Room, checks: Checks) {
    this.room = room;
    this.checks = checks;
  }

  /**
   * Watches the keys under `prefix` (with `where`: those the server's filter
   * selects), typed and validated (see {@link TypedWatch}). Close it when done.
   */
  watch<P extends string>(prefix: P, opts?: WatchOptions): TypedWatch<ValuesUnder<R, P>> {
    return new TypedWatch(this.room.watch(prefix, opts), this.checks);
  }

  /** {@link Room.put}, type-checked and validated. */
  put<K extends string>(key: K, value: ValueAt<W, K>, opts?: PutOptions): Promise<WriteResult> {
    return this.checked(() => this.checks.write(key, value), () => this.room.put(key, value, opts));
  }

  /** {@link Room.delete}. */
  delete(key: string, opts?: DeleteOptions): Promise<WriteResult> {
    return this.room.delete(key, opts);
  }

  /** {@link Room.txn}, each put type-checked and validated. */
  txn(txn: { if?: { key: string; modRev: number }[]; ops: TypedTxnOp<W>[] }, opts?: WriteOptions): Promise<WriteResult> {
    return this.checked(
      () => txn.ops.forEach((o) => o.type === 'put' && this.checks.write(o.key, o.value)),
      () => this.room.txn(txn, opts),
    );
  }

  private checked(check: () => void, write: () => Promise<WriteResult>): Promise<WriteResult> {
    try {
      check();
    } catch (e) {
      return Promise.reject(e);
    }
    return write();
  }
}

/**
 * A typed, validated view of a {@link Watch}. Reads are validated lazily, once
 * per entry (a key's entry object changes only with its `mod_rev`), and never
 * throw: an entry its schema refuses is left out of `entries()` and `entry()`
 * and its issues are in `issues(key)`. `entries()` keeps its identity until
 * the view changes, like the watch's. Events are the watch's own (`watch.on`),
 * with values as received: read them back through this view.
 */
export class TypedWatch<V> {
  /** The untyped watch (status, events, `ready()`, `close()`). */
  readonly watch: Watch<unknown>;
  private readonly checks: Checks;
  private raw: readonly Entry<unknown>[] | undefined;
  private snap: readonly Entry<V>[] = [];

  /** @internal Use `TypedRoom.watch()` or `RoomType.view()`. */
  constructor(watch: Watch<unknown>, checks: Checks) {
    this.watch = watch;
    this.checks = checks;
  }

  /** The valid entries, sorted by key: frozen, the same array until the view changes. */
  entries(): readonly Entry<V>[] {
    const raw = this.watch.entries();
    if (raw !== this.raw) {
      this.raw = raw;
      const read = raw.map((e) => this.checks.read(e));
      const valid = read.filter((c): c is Entry<unknown> => !Array.isArray(c));
      this.snap = (valid.length === raw.length && valid.every((c, i) => c === raw[i]) ? raw : Object.freeze(valid)) as readonly Entry<V>[];
    }
    return this.snap;
  }

  /** A key's entry, if present and valid: the same object while the key is unchanged. */
  entry(key: string): Entry<V> | undefined {
    const c = this.check(key);
    return Array.isArray(c) ? undefined : (c as Entry<V> | undefined);
  }

  /** A key's value, if present and valid. */
  get(key: string): V | undefined {
    return this.entry(key)?.value;
  }

  /** What the schema found wrong with a key's value (undefined: absent or valid). */
  issues(key: string): readonly SchemaIssue[] | undefined {
    const c = this.check(key);
    return Array.isArray(c) ? c : undefined;
  }

  private check(key: string): Checked | undefined {
    const e = this.watch.entry(key);
    return e && this.checks.read(e);
  }
}
