// Optimistic writes against a scripted fake server: pending entries over the
// confirmed state, confirmation by revision, rollback, chained writes, the
// offline queue, and writes whose reply was lost (resent with their wid).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import {
  createClient,
  ConflictError,
  DependencyFailedError,
  OutcomeUnknownError,
  QueueFullError,
  type ChangeEvent,
  type ClientOptions,
} from '../dist/index.js';
import { FakeServer, type FakeConn, type Msg } from './support/fake-server.js';
import { record, sleep, until } from './support/util.js';

const item = (key: string, value: unknown, mod: number, create = mod, version = 1) => ({ key, value, create_rev: create, mod_rev: mod, version });
const put = (key: string, value: unknown, mod: number, create = mod, version = 1) => ({ type: 'put', ...item(key, value, mod, create, version) });
const brief = (cs: ChangeEvent[]) => cs.map((c) => `${c.type} ${c.key}=${JSON.stringify(c.value)}${c.entry?.pending ? ' pending' : ''} ${c.cause}`);

/** A client with a watch of the whole room `doc`, at the snapshot `items` (rev 5). */
async function setup(items: Msg[] = [], opts: Partial<ClientOptions> = {}) {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, reconnect: { minDelayMs: 5, maxDelayMs: 20 }, ...opts });
  const conn = await srv.nextConn();
  await conn.accept();
  const room = c.room('doc');
  const w = room.watch();
  const sub = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 5, reason: 'initial', items });
  await w.ready();
  const changes = record(w, 'change');
  return { srv, c, conn, s: sub.id as number, room, w, changes, done: async () => (c.close(), await srv.close()) };
}

/** Drops the socket; returns the next connection, accepted, and its (unanswered) sub. */
async function reconnect(srv: FakeServer, conn: FakeConn) {
  conn.terminate();
  const next = await srv.nextConn();
  await next.accept();
  return { conn: next, sub: await next.next('sub') };
}

test('optimistic: a write shows at once as pending; an ok before its event never shows the old value again; it settles (and resolves) once the watch shows its revision', async () => {
  const { c, conn, s, room, w, changes, done } = await setup([item('k', 'v1', 5), item('other', 1, 2)]);
  try {
    const other = w.entry('other');
    const entries = w.entries();
    let settled = false;
    const p = room.put('k', 'v2', { ifModRev: 5 }).then((r) => ((settled = true), r));
    assert.deepEqual(w.entry('k'), { key: 'k', value: 'v2', createRev: 5, modRev: 5, version: 1, lease: false, pending: true });
    assert.notEqual(w.entries(), entries);
    assert.equal(c.pendingWrites, 1);
    const m = await conn.next('put');
    conn.send({ t: 'ok', id: m.id, rev: 11 }, { t: 'events', s, rev: 10, events: [put('x', 1, 10)] });
    await until(() => w.rev === 10);
    await sleep(20);
    assert.equal(settled, false, 'acknowledged at 11, the watch is at 10');
    assert.equal(w.entry('k')!.pending, true);
    conn.send({ t: 'events', s, rev: 11, events: [{ ...put('k', 'v2', 11, 5, 2), wid: m.wid }] });
    assert.deepEqual(await p, { rev: 11 });
    assert.deepEqual(w.entry('k'), { key: 'k', value: 'v2', createRev: 5, modRev: 11, version: 2, lease: false }, 'read your write, confirmed');
    assert.deepEqual(brief(changes), ['put k="v2" pending local', 'put x=1 live', 'put k="v2" live']);
    assert.equal(w.entry('other'), other, 'an unrelated entry keeps its identity');
    assert.equal(c.pendingWrites, 0);
  } finally {
    await done();
  }
});

test('optimistic: a conflict rolls back to the confirmed state, a remote change made meanwhile included; rollback event; the write applying on it fails DependencyFailed, never sent', async () => {
  const { c, conn, s, room, w, changes, done } = await setup([item('k', 'A0', 5)]);
  try {
    const rollbacks = record(c, 'rollback');
    const p1 = room.put('k', 'A', { ifModRev: 5 });
    const p2 = room.put('k', 'C');
    assert.equal(w.get('k'), 'C', 'the last pending write shows');
    const m1 = await conn.next('put');
    conn.send({ t: 'events', s, rev: 6, events: [put('k', 'B', 6, 5, 2)] }); // someone else's
    await until(() => w.rev === 6);
    assert.deepEqual([w.get('k'), w.entry('k')!.pending], ['C', true], 'a remote change updates only the confirmed state');
    conn.send({ t: 'err', id: m1.id, code: 'conflict', message: 'conflict', key: 'k', mod_rev: 6, rev: 6 });
    const e1 = await p1.then(() => assert.fail('resolved'), (e: unknown) => e);
    assert.ok(e1 instanceof ConflictError);
    const e2 = await p2.then(() => assert.fail('resolved'), (e: unknown) => e);
    assert.ok(e2 instanceof DependencyFailedError && e2.cause === e1);
    assert.deepEqual(w.entry('k'), { key: 'k', value: 'B', createRev: 5, modRev: 6, version: 2, lease: false });
    assert.deepEqual(brief(changes), ['put k="A" pending local', 'put k="C" pending local', 'put k="B" rollback'], 'one change C → B');
    assert.deepEqual(
      rollbacks.map((r) => [r.room, r.keys, r.ops, r.error]),
      [
        ['doc', ['k'], [{ type: 'put', key: 'k', value: 'A', lease: 'keep' }], e1],
        ['doc', ['k'], [{ type: 'put', key: 'k', value: 'C', lease: 'keep' }], e2],
      ],
    );
    assert.equal(rollbacks[0]!.wid, m1.wid);
    await sleep(20);
    assert.equal(conn.all('put').length, 1, 'the dependent write was never sent');
    assert.equal(c.pendingWrites, 0);
  } finally {
    await done();
  }
});

test('optimistic: a write on a key with a pending write waits for its ok; its condition applies on that write\'s result (its rev; 0 after a delete)', async () => {
  const { conn, s, room, w, done } = await setup([item('k', 0, 5)]);
  try {
    const p1 = room.put('k', 1, { ifModRev: 5 });
    const p2 = room.put('k', 2, { ifModRev: w.entry('k')!.modRev }); // read from the pending entry
    const p3 = room.txn({ if: [{ key: 'k', modRev: 2 }, { key: 'j', modRev: 0 }], ops: [{ type: 'delete', key: 'k' }, { type: 'put', key: 'j', value: 'j' }] });
    const p4 = room.put('k', 4, { ifModRev: 0 });
    const m1 = await conn.next('put');
    await sleep(20);
    assert.equal(conn.all('put').length, 1, 'the second waits for the first one\'s ok');
    conn.send({ t: 'ok', id: m1.id, rev: 8 }); // its event comes later
    const m2 = await conn.next('put');
    assert.equal(m2.if_rev, 8);
    conn.commit(m2, 9, s);
    const m3 = await conn.next('txn');
    assert.deepEqual(m3.if, [{ key: 'k', mod_rev: 9 }, { key: 'j', mod_rev: 0 }]);
    conn.commit(m3, 10, s);
    const m4 = await conn.next('put');
    assert.equal(m4.if_rev, 0, 'after the delete: must not exist');
    conn.commit(m4, 11, s);
    assert.deepEqual(await Promise.all([p1, p2, p3, p4]), [{ rev: 8 }, { rev: 9 }, { rev: 10 }, { rev: 11 }]);
    assert.deepEqual(w.entries().map((e) => [e.key, e.value, e.modRev, !!e.pending]), [['j', 'j', 10, false], ['k', 4, 11, false]]);
  } finally {
    await done();
  }
});

test('optimistic: offline, writes queue (bounded: the new one is refused QueueFull) and show as pending; after the reconnect they go once the watch caught up, in order, each once', async () => {
  const { srv, c, conn, room, w, done } = await setup([item('k', 'k0', 5)], { queue: { maxWrites: 3 } });
  try {
    conn.terminate();
    await until(() => c.status === 'reconnecting');
    const p1 = room.put('k', 'a', { ifModRev: 5 });
    const p2 = room.put('k', 'b', { ifModRev: 5 });
    const p3 = room.put('j', 'x', { ifModRev: 0 });
    await assert.rejects(room.put('z', 1), QueueFullError);
    assert.deepEqual(w.entries().map((e) => [e.key, e.value, e.pending]), [['j', 'x', true], ['k', 'b', true]]);
    assert.equal(c.pendingWrites, 3);
    const { conn: conn2, sub } = await reconnect(srv, conn);
    assert.deepEqual(sub.from, { epoch: 'e', rev: 6 });
    await sleep(30);
    assert.equal(conn2.all('put').length, 0, 'nothing is sent before the watch caught up');
    conn2.send({ t: 'ok', id: sub.id }, { t: 'events', s: sub.id, rev: 6, events: [put('other', 1, 6)] }, { t: 'synced', s: sub.id, rev: 6 });
    const m1 = await conn2.next('put');
    const m3 = await conn2.next('put');
    assert.deepEqual([m1.key, m1.value, m1.if_rev, m3.key, m3.if_rev], ['k', 'a', 5, 'j', 0]);
    conn2.commit(m1, 7, sub.id);
    const m2 = await conn2.next('put');
    assert.deepEqual([m2.value, m2.if_rev], ['b', 7]);
    conn2.commit(m3, 8, sub.id);
    conn2.commit(m2, 9, sub.id);
    assert.deepEqual(await Promise.all([p1, p2, p3]), [{ rev: 7 }, { rev: 9 }, { rev: 8 }]);
    assert.equal(conn2.all('put').length, 3, 'each sent once');
    assert.deepEqual(w.entries().map((e) => [e.key, e.value, e.modRev, !!e.pending]), [['j', 'x', 8, false], ['k', 'b', 9, false], ['other', 1, 6, false]]);
    assert.equal(c.pendingWrites, 0);
  } finally {
    await done();
  }
});

test('optimistic: the queue is bounded in bytes too; pendingWrites and the pending event count the writes not settled', async () => {
  const { c, conn, s, room, done } = await setup([], { queue: { maxBytes: 300 } });
  try {
    const counts = record(c, 'pending');
    const p1 = room.put('a', 'x'.repeat(150));
    await assert.rejects(room.put('b', 'y'.repeat(150)), QueueFullError);
    assert.equal(c.pendingWrites, 1);
    conn.commit(await conn.next('put'), 6, s);
    await p1;
    const p2 = room.put('b', 'y'.repeat(150));
    conn.commit(await conn.next('put'), 7, s);
    await p2;
    assert.deepEqual(counts.map((e) => e.writes), [1, 0, 1, 0]);
  } finally {
    await done();
  }
});

test('optimistic: the queue counts UTF-8 bytes: a write of 100 \'€\' (300 bytes, 100 UTF-16 units) does not fit in maxBytes 200', async () => {
  const { c, conn, s, room, done } = await setup([], { queue: { maxBytes: 200 } });
  try {
    await assert.rejects(room.put('a', '€'.repeat(100)), QueueFullError);
    assert.equal(c.pendingWrites, 0);
    const p = room.put('a', 'x'.repeat(100));
    conn.commit(await conn.next('put'), 6, s);
    await p;
  } finally {
    await done();
  }
});

test('optimistic: a write whose reply was lost is confirmed by its event in the replay, carrying its wid: it is not sent again', async () => {
  const { srv, conn, room, w, done } = await setup([item('k', 0, 5)]);
  try {
    const p = room.put('k', 1);
    const m = await conn.next('put');
    const { conn: conn2, sub } = await reconnect(srv, conn);
    conn2.send({ t: 'ok', id: sub.id }, { t: 'events', s: sub.id, rev: 6, events: [{ ...put('k', 1, 6, 5, 2), wid: m.wid }] }, { t: 'synced', s: sub.id, rev: 6 });
    assert.deepEqual(await p, { rev: 6 });
    await sleep(30);
    assert.equal(conn2.all('put').length, 0);
    assert.equal(w.entry('k')!.pending, undefined);
  } finally {
    await done();
  }
});

test('optimistic: an event carrying a pending wid on a key the write does not change does not confirm it', async () => {
  const { conn, s, room, w, done } = await setup([item('k', 0, 5)]);
  try {
    let settled = false;
    const p = room.put('k', 1).then((r) => ((settled = true), r));
    const m = await conn.next('put');
    conn.send({ t: 'events', s, rev: 6, events: [{ ...put('other', 'x', 6), wid: m.wid }] });
    await until(() => w.rev === 6);
    await sleep(20);
    assert.equal(settled, false, 'another key under its wid is not its commit');
    assert.equal(w.entry('k')!.pending, true);
    conn.send({ t: 'events', s, rev: 7, events: [{ ...put('k', 1, 7, 5, 2), wid: m.wid }] }, { t: 'ok', id: m.id, rev: 7 });
    assert.deepEqual(await p, { rev: 7 });
  } finally {
    await done();
  }
});

test('optimistic: after a resync snapshot (no wids), a write whose reply was lost is sent again with the same wid and since; dup:true confirms it at its original revision', async () => {
  const { srv, conn, room, w, changes, done } = await setup([item('k', 0, 5), item('a', 'a', 3)]);
  try {
    const p = room.put('k', 1);
    const m = await conn.next('put');
    assert.equal(m.since, undefined);
    const { conn: conn2, sub } = await reconnect(srv, conn);
    // History compacted: a snapshot; the write committed at 6, then someone deleted a.
    conn2.send({ t: 'ok', id: sub.id }, { t: 'snapshot', s: sub.id, epoch: 'e', rev: 20, reason: 'compacted', items: [item('b', 'b', 20), item('k', 1, 6, 5, 2)] });
    const again = await conn2.next('put');
    assert.deepEqual([again.wid, again.since, again.value], [m.wid, 5, 1]);
    conn2.send({ t: 'ok', id: again.id, rev: 6, dup: true });
    assert.deepEqual(await p, { rev: 6 });
    assert.deepEqual(w.entry('k'), { key: 'k', value: 1, createRev: 5, modRev: 6, version: 2, lease: false });
    // The resync emitted the difference of what the watch shows: k showed 1 all along.
    assert.deepEqual(brief(changes), ['put k=1 pending local', 'delete a=undefined resync', 'put b="b" resync', 'put k=1 live']);
    assert.equal(conn2.all('put').length, 1);
  } finally {
    await done();
  }
});

test('optimistic: sent again, outcome_unknown (history compacted past since): the keys are read again, the write rejects OutcomeUnknown with them and is never repeated; its dependent fails', async () => {
  const { srv, c, conn, room, w, done } = await setup([item('k', 0, 5)]);
  try {
    const p1 = room.put('k', 1);
    const m = await conn.next('put');
    const p2 = room.put('k', 2); // applies on p1
    const { conn: conn2, sub } = await reconnect(srv, conn);
    conn2.send({ t: 'ok', id: sub.id }, { t: 'snapshot', s: sub.id, epoch: 'e', rev: 40, reason: 'compacted', items: [item('k', 'theirs', 30, 5, 3)] });
    const again = await conn2.next('put');
    assert.equal(again.wid, m.wid);
    conn2.send({ t: 'err', id: again.id, code: 'outcome_unknown', message: 'history since 5 compacted' });
    const read = await conn2.next('sub');
    assert.deepEqual(read.prefixes, ['k']);
    conn2.send({ t: 'ok', id: read.id }, { t: 'snapshot', s: read.id, epoch: 'e', rev: 40, reason: 'initial', items: [item('k', 'theirs', 30, 5, 3)] });
    const e1 = await p1.then(() => assert.fail('resolved'), (e: unknown) => e);
    assert.ok(e1 instanceof OutcomeUnknownError);
    assert.deepEqual(e1.observed?.map((e) => [e.key, e.value, e.modRev]), [['k', 'theirs', 30]]);
    await assert.rejects(p2, (e: unknown) => e instanceof DependencyFailedError && e.cause === e1);
    assert.deepEqual([w.get('k'), w.entry('k')!.pending], ['theirs', undefined], 'the view is the server\'s state');
    await conn2.next('unsub');
    await sleep(30);
    assert.equal(conn2.all('put').length, 1, 'never repeated; the dependent never sent');
    assert.equal(c.pendingWrites, 0);
  } finally {
    await done();
  }
});

test('optimistic: without a watch of its key a write settles on its ok; a delete of a missing key settles on its ok (no event will come); a new watch shows pending writes', async () => {
  const { c, conn, room, done } = await setup([item('k', 0, 5)]);
  try {
    const other = c.room('elsewhere');
    const p1 = other.put('x', 1);
    const m1 = await conn.next('put');
    conn.send({ t: 'ok', id: m1.id, rev: 50 });
    assert.deepEqual(await p1, { rev: 50 });
    const p2 = room.delete('missing');
    const m2 = await conn.next('del');
    conn.send({ t: 'ok', id: m2.id, rev: 7 }); // the watch is at 5: the room moved elsewhere
    assert.deepEqual(await p2, { rev: 7 });
    room.put('k', 'mine').catch(() => {});
    const late = room.watch('k');
    assert.deepEqual([late.get('k'), late.entry('k')!.pending], ['mine', true]);
  } finally {
    await done();
  }
});

test('optimistic: a txn that puts a and deletes the missing b settles on its ok when the only watch of it covers b alone (no event will come there)', async () => {
  const { conn, room, w, done } = await setup();
  try {
    w.close();
    const wb = room.watch('b');
    await conn.sub({ t: 'snapshot', epoch: 'e', rev: 5, reason: 'initial', items: [] });
    await wb.ready();
    let result: unknown;
    room.txn({ ops: [{ type: 'put', key: 'a', value: 1 }, { type: 'delete', key: 'b' }] }).then((r) => (result = r));
    const m = await conn.next('txn');
    conn.send({ t: 'ok', id: m.id, rev: 7 }); // the watch of b is at 5, and no progress comes
    await sleep(30);
    assert.deepEqual(result, { rev: 7 });
  } finally {
    await done();
  }
});

test('optimistic: a listener that closes a watch while a write settles does not settle another write before its other watch shows it', async () => {
  const { conn, s, room, w, done } = await setup([item('k', 0, 5)]);
  try {
    const second = room.watch('k');
    const s2 = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 5, reason: 'initial', items: [item('k', 0, 5)] });
    await second.ready();
    const p1 = room.put('a', 1);
    let settled = false;
    const p2 = room.put('k', 2).then((r) => ((settled = true), r));
    const [m1, m2] = [await conn.next('put'), await conn.next('put')];
    conn.send({ t: 'ok', id: m1.id, rev: 6 }, { t: 'ok', id: m2.id, rev: 7 });
    await sleep(20);
    w.on('change', (c) => c.key === 'a' && !c.entry?.pending && w.close()); // while a settles
    conn.send({ t: 'events', s, rev: 6, events: [put('a', 1, 6)] }, { t: 'events', s, rev: 7, events: [put('k', 2, 7, 5, 2)] });
    assert.deepEqual(await p1, { rev: 6 });
    await sleep(30);
    assert.equal(w.status, 'closed');
    assert.deepEqual([settled, second.entry('k')!.pending], [false, true], 'the second watch is still at 5');
    conn.send({ t: 'events', s: s2.id, rev: 7, events: [put('k', 2, 7, 5, 2)] });
    assert.deepEqual(await p2, { rev: 7 });
    assert.equal(second.entry('k')!.pending, undefined);
  } finally {
    await done();
  }
});

test('optimistic: a write whose reply was lost, confirmed by a coalesced message, resolves at its event\'s mod_rev (not the message\'s rev); the write chained on it applies on that rev', async () => {
  const { srv, conn, room, w, done } = await setup([item('k', 0, 5)]);
  try {
    const p1 = room.put('k', 1, { ifModRev: 5 });
    const m1 = await conn.next('put');
    const p2 = room.put('k', 2, { ifModRev: w.entry('k')!.modRev });
    const { conn: conn2, sub } = await reconnect(srv, conn);
    conn2.send(
      { t: 'ok', id: sub.id },
      { t: 'coalesced', s: sub.id, rev: 20, events: [{ ...put('k', 1, 7, 5, 2), wid: m1.wid }, put('x', 1, 20)] },
      { t: 'synced', s: sub.id, rev: 20 },
    );
    assert.deepEqual(await p1, { rev: 7 });
    const m2 = await conn2.next('put');
    assert.equal(m2.if_rev, 7, 'on top of the first write, not a false conflict at 20');
    conn2.commit(m2, 21, sub.id);
    assert.deepEqual(await p2, { rev: 21 });
  } finally {
    await done();
  }
});

test('optimistic: chained writes (typing, dragging) keep no chain: a sent write holds no earlier write, so settled writes are not retained', async () => {
  const { c, conn, s, room, done } = await setup([item('k', 0, 5)]);
  try {
    type W = { deps: Map<string, W> };
    const list = () => (c as unknown as { writes: { list: W[] } }).writes.list;
    /** The writes the pending ones hold through `deps`, transitively, that are no longer pending. */
    const retained = () => {
      const seen = new Set<W>();
      const visit = (w: W) => w.deps.forEach((d) => seen.has(d) || (seen.add(d), visit(d)));
      list().forEach(visit);
      return [...seen].filter((w) => !list().includes(w)).length;
    };
    const ps = [1, 2, 3, 4, 5].map((v) => room.put('k', v, { ifModRev: 5 }));
    for (let rev = 6; rev <= 9; rev++) {
      conn.commit(await conn.next('put'), rev, s);
      await ps[rev - 6];
    }
    const last = await conn.next('put');
    assert.equal(list().length, 1);
    assert.equal(retained(), 0);
    conn.commit(last, 10, s);
    assert.deepEqual(await ps[4], { rev: 10 });
  } finally {
    await done();
  }
});

test('optimistic: a write made in a connected or status listener after a reconnect waits for the watches: the sub goes before any write', async () => {
  const { srv, c, conn, room, done } = await setup([item('k', 0, 5)]);
  try {
    const ps: Promise<unknown>[] = [];
    c.on('status', (e) => e.status === 'connected' && ps.push(room.put('k', 'from status')));
    c.on('connected', () => ps.push(room.put('k', 'from connected')));
    conn.terminate();
    const conn2 = await srv.nextConn();
    await conn2.accept();
    const sub = await conn2.next('sub');
    await sleep(30);
    assert.deepEqual(conn2.received.map((m) => m.t).filter((t) => t === 'sub' || t === 'put'), ['sub'], 'no write before the sub, nor before the watch caught up');
    conn2.send({ t: 'ok', id: sub.id }, { t: 'synced', s: sub.id, rev: 5 });
    for (const rev of [6, 7]) conn2.commit(await conn2.next('put'), rev, sub.id);
    assert.deepEqual(await Promise.all(ps), [{ rev: 6 }, { rev: 7 }]);
  } finally {
    await done();
  }
});

test('optimistic: a watch opened while connected, still waiting for its first snapshot, holds no write back (only a watch resuming a view it had does)', async () => {
  const { conn, s, room, done } = await setup([item('k', 0, 5)]);
  try {
    const fresh = room.watch('other/');
    const sub = await conn.next('sub');
    assert.equal(fresh.status, 'pending', 'no snapshot sent yet');
    const p = room.put('k', 'now');
    conn.commit(await conn.next('put'), 6, s); // sent at once, before the new watch's snapshot
    assert.deepEqual(await p, { rev: 6 });
    conn.send({ t: 'ok', id: sub.id }, { t: 'snapshot', s: sub.id, epoch: 'e', rev: 6, reason: 'initial', items: [] });
    await fresh.ready();
  } finally {
    await done();
  }
});

test('optimistic: outcome_unknown for a txn of conditions only: nothing to read again (no watch of the whole room); it rejects OutcomeUnknown', async () => {
  const { srv, conn, room, done } = await setup([item('k', 0, 5)]);
  try {
    const p = room.txn({ if: [{ key: 'k', modRev: 5 }], ops: [] });
    await conn.next('txn');
    const { conn: conn2, sub } = await reconnect(srv, conn);
    conn2.send({ t: 'ok', id: sub.id }, { t: 'snapshot', s: sub.id, epoch: 'e', rev: 40, reason: 'compacted', items: [item('k', 0, 5)] });
    const again = await conn2.next('txn');
    conn2.send({ t: 'err', id: again.id, code: 'outcome_unknown', message: 'history since 5 compacted' });
    let error: unknown;
    p.catch((e: unknown) => (error = e));
    await sleep(30);
    assert.equal(conn2.all('sub').length, 1, 'no re-read');
    assert.ok(error instanceof OutcomeUnknownError);
  } finally {
    await done();
  }
});
