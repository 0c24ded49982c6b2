/**
 * The client's pending writes: shown at once by its watches over the
 * confirmed state, sent in order, kept across reconnects, and settled by the
 * server: confirmed once the watches show the write's revision, or rolled
 * back by recomputing from the confirmed state.
 * @internal
 * @packageDocumentation
 */
import type { Client } from './client.js';
import { DependencyFailedError, NotConnectedError, OutcomeUnknownError, QueueFullError, type StatecastError } from './errors.js';
import type { WriteResult } from './room.js';
import type { ChangeCause, Watch } from './watch.js';

/** One change a write makes (a `put` or a `delete` of a key). */
export interface WriteOp {
  type: 'put' | 'delete';
  key: string;
  value?: unknown;
  lease?: string;
}

/** @internal */
export type Op = WriteOp;

/**
 * A write from its call until it settles: `queued` (offline, or waiting for
 * the writes it applies on) → `sent` → `acked` (the server's ok; waiting for
 * the watches to show its revision) → `done`. `lost`: sent, and the socket
 * closed before the reply; it is sent again with the same wid.
 * @internal
 */
export interface Write {
  room: string;
  /** The request, without `id` and `room`; it carries the write's `wid`. */
  msg: Record<string, unknown>;
  ops: Op[];
  /** The keys of `ops`. */
  keys: string[];
  /** Per key, the earlier pending write of it this one applies on (it waits for that one's ok); cleared once sent. */
  deps: Map<string, Write>;
  state: 'queued' | 'sent' | 'lost' | 'acked' | 'done';
  rev: number;
  /** The room's revision seen before the first send. */
  since?: number;
  bytes: number;
  timeoutMs: number;
  waitFor?: Watch<any>;
  resolve(r: WriteResult): void;
  reject(e: StatecastError): void;
}

type Cond = { key: string; mod_rev: number };

/** @internal The pending writes of one client, in the order they were made. */
export class Writes {
  list: Write[] = [];
  /** The last pending op of each `room \0 key`. */
  private shown = new Map<string, Op>();

  constructor(
    private readonly c: Client,
    private readonly maxWrites = 500,
    private readonly maxBytes = 1 << 20,
  ) {}

  /** The pending op a watch of `room` shows for `key`. */
  overlay(room: string, key: string): Op | undefined {
    return this.shown.get(room + '\0' + key);
  }

  /** The keys pending writes of `room` show. */
  keys(room: string): string[] {
    return this.list.filter((w) => w.room === room).flatMap((w) => w.keys);
  }

  /** Shows a write at once, and sends it as soon as it can go. */
  add(w: Pick<Write, 'room' | 'msg' | 'bytes' | 'timeoutMs' | 'waitFor'>, restored?: number | null): Promise<WriteResult> {
    const bytes = this.list.reduce((n, x) => n + x.bytes, w.bytes);
    if (this.list.length >= this.maxWrites || bytes > this.maxBytes)
      return Promise.reject(new QueueFullError(`${this.list.length} writes (${bytes} bytes with this one) pending; not queued`));
    const m = w.msg;
    const ops: Op[] = ((m.t === 'txn' ? m.ops : [m]) as Record<string, any>[]).map((o) => ({
      type: o.t === 'del' || o.type === 'delete' ? 'delete' : 'put',
      key: o.key,
      value: o.value,
      lease: o.lease,
    }));
    // A write applies on the earlier pending writes of the keys it changes or names in conditions.
    const keys = ops.map((o) => o.key);
    const deps = new Map<string, Write>();
    for (const k of [...keys, ...((m.if as Cond[] | undefined) ?? []).map((c) => c.key)])
      for (const p of this.list) if (p.room === w.room && p.keys.includes(k)) deps.set(k, p);
    return new Promise((resolve, reject) => {
      // A restored write (`restored`: the `since` it was kept with, null if never sent) may have
      // been sent before the reload: it goes as a lost one, with its wid.
      const x: Write = { ...w, ops, keys, deps, state: restored === undefined ? 'queued' : 'lost', since: restored ?? undefined, rev: 0, resolve, reject };
      this.list.push(x);
      this.changed([x], 'local');
      this.flush();
    });
  }

  /** Sends, in order, the writes that can go: connected, their room caught up, and what they apply on acknowledged. */
  flush(): void {
    for (const w of this.list)
      if ((w.state === 'queued' || w.state === 'lost') && [...w.deps.values()].every((d) => d.state === 'acked' || d.state === 'done') && this.c._canSend(w.room)) {
        // Its conditions now name what it applies on: it holds no earlier write (no chain while typing).
        w.msg = request(w);
        w.deps.clear();
        this.c._send(w, { ...w.msg });
      }
  }

  /**
   * The server's ok at `rev` (or an event carrying the write's wid): the
   * write settles once every watch showing its keys has applied `rev`, so
   * its keys never show the older value in between.
   */
  ack(w: Write, rev: number): void {
    if (w.state === 'acked' || !this.list.includes(w)) return;
    w.state = 'acked';
    w.rev = rev;
    const watches = this.c._watchesOf(w.room).filter((v) => w.keys.some((k) => v._covers(k)));
    if (w.waitFor) watches.push(w.waitFor);
    let n = watches.length + 1;
    const done = () => {
      if (--n) return;
      w.state = 'done';
      this.remove([w], 'live');
      w.resolve({ rev });
    };
    // A watch that may get no event of the write waits only while its view holds one of the keys.
    for (const v of watches) v._reach(rev, done, v._silent(w.ops));
    done();
    this.flush();
  }

  /**
   * Events of the write `wid`, on `keys` of `room`, were applied at `rev`: it committed, whether or not
   * its reply comes. Only an event of this write can say so: same room, and keys it writes.
   */
  wid(wid: string, rev: number, room: string, keys: string[]): void {
    const w = this.list.find((x) => x.msg.wid === wid);
    if (w && w.room === room && keys.every((k) => w.keys.includes(k))) this.ack(w, rev);
  }

  /** Rolls back `w` and the writes that were to apply on it, and rejects them. */
  fail(w: Write, err: StatecastError): void {
    if (w.state === 'acked' || !this.list.includes(w)) return;
    const gone = [w];
    for (const x of this.list) if ([...x.deps.values()].some((d) => gone.includes(d))) gone.push(x);
    this.remove(gone, 'rollback');
    for (const x of gone) {
      const error = x === w ? err : new DependencyFailedError(err);
      this.c._emit('rollback', { room: x.room, wid: x.msg.wid as string, ops: x.ops, keys: x.keys, error });
      x.reject(error);
    }
  }

  /** The server cannot tell whether `w` applied: reads its keys as they are now, then fails it. It is never sent again. */
  async reread(w: Write, err: OutcomeUnknownError): Promise<void> {
    if (!w.keys.length) return this.fail(w, err); // conditions only: nothing to read (watch([]) is the whole room)
    const v = this.c.room(w.room).watch(w.keys);
    try {
      await v.ready();
      err.observed = w.keys.flatMap((k) => v._confirmed(k) ?? []);
    } catch {
      // the client stopped: it fails without what it would have read
    }
    v.close();
    this.fail(w, err);
  }

  /** The client stopped: what the server has not acknowledged fails (acknowledged writes settle as the watches stop). */
  stop(): void {
    for (const w of this.list)
      if (w.state !== 'acked')
        this.fail(
          w,
          w.state === 'queued'
            ? new NotConnectedError('the client is disconnected; the write was not sent')
            : new OutcomeUnknownError('the client stopped with the write in flight; it may or may not have been applied'),
        );
  }

  /** Takes `gone` out of the list and shows their keys anew. */
  private remove(gone: Write[], cause: ChangeCause): void {
    this.list = this.list.filter((x) => !gone.includes(x));
    this.changed(gone, cause);
  }

  /** The list changed by `ws`: the watches of their rooms show their keys anew. */
  private changed(ws: Write[], cause: ChangeCause): void {
    this.shown.clear();
    for (const x of this.list) for (const o of x.ops) this.shown.set(x.room + '\0' + o.key, o);
    for (const x of ws) for (const v of this.c._watchesOf(x.room)) v._local(x.keys, cause);
    this.c._emit('pending', { writes: this.list.length });
  }
}

/**
 * The request of `w`, with each condition on a key an earlier pending write
 * changed set to that write's result: its revision for a put, 0 (absent)
 * for a delete. A condition read from a pending entry means "on top of my
 * earlier write".
 */
function request(w: Write): Record<string, unknown> {
  const after = (key: string, modRev: unknown) => {
    const d = w.deps.get(key);
    return d ? (d.ops.find((o) => o.key === key)!.type === 'put' ? d.rev : 0) : modRev;
  };
  const m = { ...w.msg };
  if (m.if_rev !== undefined) m.if_rev = after(m.key as string, m.if_rev);
  if (m.if) m.if = (m.if as Cond[]).map((c) => ({ key: c.key, mod_rev: after(c.key, c.mod_rev) }));
  return m;
}
