// Watches against a scripted fake server: snapshot, ordering, duplicate
// dropping, resume positions, replay, diff-on-resync, coalesced messages.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, ForbiddenError, type ChangeEvent, type SyncEvent } from '../dist/index.js';
import { FakeServer, type FakeConn } from './support/fake-server.js';
import { record, sleep, until } from './support/util.js';

const item = (key: string, value: unknown, mod: number, create = mod, version = 1) => ({ key, value, create_rev: create, mod_rev: mod, version });
const put = (key: string, value: unknown, mod: number, create = mod, version = 1) => ({ type: 'put', ...item(key, value, mod, create, version) });
const del = (key: string, mod: number) => ({ type: 'delete', key, mod_rev: mod });
const brief = (cs: ChangeEvent[]) => cs.map((c) => `${c.type} ${c.key}=${JSON.stringify(c.value)} prev=${JSON.stringify(c.prev)} @${c.rev} ${c.cause}`);

async function setup() {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, reconnect: { minDelayMs: 5, maxDelayMs: 20 } });
  const conn = await srv.nextConn();
  await conn.accept();
  await until(() => c.status === 'connected');
  const w = c.room('doc:1').watch('');
  const changes = record(w, 'change');
  const syncs = record(w, 'sync');
  const statuses = record(w, 'status');
  return { srv, c, conn, w, changes, syncs, statuses, done: async () => (c.close(), await srv.close()) };
}

/** Drops the socket and returns the next connection, accepted, with its sub. */
async function reconnect(srv: FakeServer, conn: FakeConn) {
  conn.terminate();
  const next = await srv.nextConn();
  await next.accept();
  return next;
}

test('watch: initial snapshot becomes initial changes, sync initial, a readable view', async () => {
  const { conn, w, changes, syncs, done } = await setup();
  try {
    assert.equal(w.status, 'pending');
    const sub = await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 7, reason: 'initial', items: [item('a', 1, 3), item('b', { x: [1] }, 7, 5, 2)] });
    assert.equal(sub.from, undefined);
    assert.equal(sub.room, 'doc:1');
    await w.ready();
    assert.deepEqual(brief(changes), ['put a=1 prev=undefined @7 initial', 'put b={"x":[1]} prev=undefined @7 initial']);
    assert.deepEqual(syncs, [{ kind: 'initial', reason: 'initial', rev: 7, epoch: 'e1', changes: 2 }] satisfies SyncEvent[]);
    assert.equal(w.status, 'live');
    assert.equal(w.rev, 7);
    assert.equal(w.epoch, 'e1');
    assert.deepEqual(w.get('b'), { x: [1] });
    assert.deepEqual(w.entry('b'), { key: 'b', value: { x: [1] }, createRev: 5, modRev: 7, version: 2, lease: false });
    assert.deepEqual(w.entries().map((e) => e.key), ['a', 'b']);
  } finally {
    await done();
  }
});

test('watch: events apply in revision order; duplicates and older revisions are dropped', async () => {
  const { conn, w, changes, done } = await setup();
  try {
    const sub = await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 3, reason: 'initial', items: [item('a', 1, 3)] });
    const s = sub.id;
    conn.send(
      { t: 'events', s, rev: 4, events: [put('a', 2, 4, 3, 2)] },
      { t: 'events', s, rev: 5, events: [put('b', 1, 5), del('a', 5)] }, // one revision, two keys
      { t: 'events', s, rev: 5, events: [put('b', 99, 5)] }, // duplicate
      { t: 'events', s, rev: 2, events: [put('a', 0, 2)] }, // older
      { t: 'snapshot', s, epoch: 'e1', rev: 4, reason: 'slow', items: [] }, // older snapshot, same epoch
      { t: 'events', s, rev: 9, events: [put('c', 1, 9)] }, // a gap is not loss
    );
    await until(() => w.rev === 9, 'rev 9');
    assert.deepEqual(brief(changes).slice(1), [
      'put a=2 prev=1 @4 live',
      'put b=1 prev=undefined @5 live',
      'delete a=undefined prev=2 @5 live',
      'put c=1 prev=undefined @9 live',
    ]);
    assert.deepEqual(w.entries().map((e) => [e.key, e.value]), [['b', 1], ['c', 1]]);
  } finally {
    await done();
  }
});

test('watch: a delete event of a key the view lacks emits nothing; changes of one message come together', async () => {
  const { conn, w, done } = await setup();
  try {
    const batches = record(w, 'changes');
    const sub = await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 1, reason: 'initial', items: [] });
    conn.send({ t: 'events', s: sub.id, rev: 2, events: [del('nope', 2), put('x', 1, 2), put('y', 2, 2)] });
    await until(() => w.rev === 2);
    assert.equal(batches.length, 1);
    assert.deepEqual(batches[0]!.changes.map((c) => c.key), ['x', 'y']);
  } finally {
    await done();
  }
});

test('watch: resume sends from = {epoch, last rev + 1} (progress counts), replays, then synced → resumed', async () => {
  const { srv, conn, w, changes, syncs, statuses, done } = await setup();
  try {
    const sub = await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 3, reason: 'initial', items: [item('a', 1, 3)] });
    conn.send({ t: 'events', s: sub.id, rev: 4, events: [put('a', 2, 4, 3, 2)] }, { t: 'progress', s: sub.id, rev: 6 });
    await until(() => w.rev === 6, 'progress');
    const conn2 = await reconnect(srv, conn);
    const sub2 = await conn2.next('sub');
    assert.deepEqual(sub2.from, { epoch: 'e1', rev: 7 });
    assert.equal(w.status, 'syncing');
    conn2.send(
      { t: 'ok', id: sub2.id },
      { t: 'events', s: sub2.id, rev: 6, events: [put('a', 'dup', 6)] }, // at the view's revision: dropped
      { t: 'events', s: sub2.id, rev: 7, events: [put('b', 1, 7)] },
      { t: 'events', s: sub2.id, rev: 8, events: [del('a', 8)] },
      { t: 'synced', s: sub2.id, rev: 10 },
    );
    await until(() => syncs.length === 2, 'sync');
    assert.deepEqual(syncs[1], { kind: 'resumed', rev: 10, epoch: 'e1', changes: 2 });
    assert.deepEqual(brief(changes).slice(1), ['put a=2 prev=1 @4 live', 'put b=1 prev=undefined @7 replay', 'delete a=undefined prev=2 @8 replay']);
    assert.deepEqual(statuses.map((s) => s.status), ['live', 'stale', 'syncing', 'live']);
    assert.equal(w.rev, 10);
    // Live again after synced.
    conn2.send({ t: 'events', s: sub2.id, rev: 11, events: [put('c', 1, 11)] });
    await until(() => w.rev === 11);
    assert.equal(changes.at(-1)!.cause, 'live');
  } finally {
    await done();
  }
});

test('watch: a snapshot instead of a replay (compacted) replaces the view and emits exactly the difference', async () => {
  const { srv, conn, w, changes, syncs, done } = await setup();
  try {
    await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 10, reason: 'initial', items: [item('a', 1, 2), item('b', 2, 3), item('c', 3, 4), item('d', { n: 1 }, 10)] });
    await w.ready();
    changes.length = 0;
    const conn2 = await reconnect(srv, conn);
    const sub2 = await conn2.next('sub');
    assert.deepEqual(sub2.from, { epoch: 'e1', rev: 11 });
    conn2.send(
      { t: 'ok', id: sub2.id },
      {
        t: 'snapshot', s: sub2.id, epoch: 'e1', rev: 50, reason: 'compacted',
        // a: unchanged; b: changed; c: deleted; d: rewritten with the same value (new mod_rev); e: new
        items: [item('a', 1, 2), item('b', 20, 40, 3, 5), item('d', { n: 1 }, 45, 10, 2), item('e', 5, 50)],
      },
    );
    await until(() => syncs.length === 2, 'sync');
    assert.deepEqual(syncs[1], { kind: 'resync', reason: 'compacted', rev: 50, epoch: 'e1', changes: 4 });
    assert.deepEqual(brief(changes), [
      'put b=20 prev=2 @50 resync',
      'delete c=undefined prev=3 @50 resync',
      'put d={"n":1} prev={"n":1} @50 resync',
      'put e=5 prev=undefined @50 resync',
    ]);
    assert.deepEqual(w.entries().map((e) => [e.key, e.value]), [['a', 1], ['b', 20], ['d', { n: 1 }], ['e', 5]]);
    assert.equal(w.status, 'live');
    // Events continue from the snapshot's revision.
    conn2.send({ t: 'events', s: sub2.id, rev: 50, events: [put('a', 'dup', 50)] }, { t: 'events', s: sub2.id, rev: 51, events: [put('a', 'x', 51, 2, 2)] });
    await until(() => w.rev === 51);
    assert.deepEqual(brief(changes).slice(4), ['put a="x" prev=1 @51 live']);
  } finally {
    await done();
  }
});

test('watch: a snapshot of another epoch (state lost) diffs by value, not by revision', async () => {
  const { srv, conn, w, changes, syncs, done } = await setup();
  try {
    await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 9, reason: 'initial', items: [item('a', 1, 2), item('b', 2, 9), item('c', 3, 5)] });
    await w.ready();
    changes.length = 0;
    const conn2 = await reconnect(srv, conn);
    const sub2 = await conn2.next('sub');
    // The new epoch restarted at low revisions: b has the same mod_rev with another value; a is identical.
    conn2.send({ t: 'ok', id: sub2.id }, { t: 'snapshot', s: sub2.id, epoch: 'e2', rev: 9, reason: 'epoch', items: [item('a', 1, 2), item('b', 'other', 9)] });
    await until(() => syncs.length === 2);
    assert.equal(syncs[1]!.reason, 'epoch');
    assert.deepEqual(brief(changes), ['put b="other" prev=2 @9 resync', 'delete c=undefined prev=3 @9 resync']);
    assert.equal(w.epoch, 'e2');
  } finally {
    await done();
  }
});

test('watch: a coalesced message applies the latest state of each key as changes', async () => {
  const { conn, w, changes, done } = await setup();
  try {
    const sub = await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 5, reason: 'initial', items: [item('a', 1, 2), item('b', 2, 5)] });
    conn.send({ t: 'coalesced', s: sub.id, rev: 30, events: [put('x', 'old?', 4), del('b', 12), put('a', 9, 29, 2, 7), put('n', 1, 30)] });
    await until(() => w.rev === 30);
    assert.deepEqual(brief(changes).slice(2), [
      'delete b=undefined prev=2 @30 coalesced',
      'put a=9 prev=1 @30 coalesced',
      'put n=1 prev=undefined @30 coalesced',
    ]);
    // A coalesced message at or below the view's revision is a duplicate.
    conn.send({ t: 'coalesced', s: sub.id, rev: 30, events: [put('z', 1, 30)] }, { t: 'progress', s: sub.id, rev: 31 });
    await until(() => w.rev === 31);
    assert.equal(w.has('z'), false);
  } finally {
    await done();
  }
});

test('watch: unsubscribed by the server → subscribes again from its resume point', async () => {
  const { conn, w, done } = await setup();
  try {
    const sub = await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 5, reason: 'initial', items: [] });
    conn.send({ t: 'unsubscribed', s: sub.id, code: 'unavailable', message: 'room reset' });
    const sub2 = await conn.next('sub');
    assert.notEqual(sub2.id, sub.id);
    assert.deepEqual(sub2.from, { epoch: 'e1', rev: 6 });
    // Messages of the ended subscription are ignored.
    conn.send({ t: 'events', s: sub.id, rev: 7, events: [put('ghost', 1, 7)] }, { t: 'ok', id: sub2.id }, { t: 'synced', s: sub2.id, rev: 6 });
    await sleep(30);
    assert.equal(w.has('ghost'), false);
  } finally {
    await done();
  }
});

test('watch: a refused subscription closes the watch with a typed error; close() unsubscribes', async () => {
  const { c, conn, w, done } = await setup();
  try {
    const s = await conn.next('sub');
    const errs = record(w, 'error');
    conn.send({ t: 'err', id: s.id, code: 'forbidden', message: 'no' });
    await until(() => w.status === 'closed');
    assert.ok(w.error instanceof ForbiddenError);
    assert.equal(errs.length, 1);
    await assert.rejects(w.ready(), ForbiddenError);

    const w2 = c.room('doc:2').watch(['a/', 'b/']);
    const s2 = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [] });
    assert.deepEqual(s2.prefixes, ['a/', 'b/']);
    await w2.ready();
    w2.close();
    const un = await conn.next('unsub');
    assert.equal(un.sub, s2.id);
    conn.send({ t: 'events', s: s2.id, rev: 2, events: [put('a/1', 1, 2)] });
    await sleep(20);
    assert.equal(w2.size, 0);
    assert.equal(w2.status, 'closed');
  } finally {
    await done();
  }
});

test('watch: a transient sub error is retried', async () => {
  const { conn, w, done } = await setup();
  try {
    const s = await conn.next('sub');
    conn.send({ t: 'err', id: s.id, code: 'unavailable', message: 'store unreachable' });
    await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [] });
    await w.ready();
    assert.equal(w.status, 'live');
  } finally {
    await done();
  }
});

test('watch: a subscription in flight when the socket drops is sent again on the next one', async () => {
  const { srv, conn, w, done } = await setup();
  try {
    await conn.next('sub'); // never answered
    const conn2 = await reconnect(srv, conn);
    const s2 = await conn2.sub({ t: 'snapshot', epoch: 'e', rev: 2, reason: 'initial', items: [item('a', 1, 2)] });
    assert.equal(s2.from, undefined, 'no view yet: a snapshot is asked for');
    await w.ready();
    assert.equal(w.status, 'live');
    assert.equal(w.get('a'), 1);
  } finally {
    await done();
  }
});

test('watch: entries() is an immutable snapshot that keeps its identity until the view changes (useSyncExternalStore) (issue 13, defect 7)', async () => {
  const { srv, conn, w, done } = await setup();
  try {
    const s = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 2, reason: 'initial', items: [item('a', 1, 1), item('b', { x: 1 }, 2)] });
    await until(() => w.size === 2);
    const e1 = w.entries();
    assert.equal(w.entries(), e1, 'same array until something changes');
    assert.ok(Object.isFrozen(e1) && e1.every((e) => Object.isFrozen(e)), 'frozen');
    const b = w.entry('b');
    conn.send({ t: 'progress', s: s.id, rev: 3 }, { t: 'events', s: s.id, rev: 2, events: [put('a', 9, 2)] }); // no change: a progress mark, a duplicate
    await sleep(20);
    assert.equal(w.entries(), e1);
    conn.send({ t: 'events', s: s.id, rev: 4, events: [put('a', 2, 4, 1, 2)] });
    await until(() => w.get('a') === 2);
    const e2 = w.entries();
    assert.notEqual(e2, e1, 'a change gives a new snapshot');
    assert.equal(w.entries(), e2);
    assert.equal(w.entry('b'), b, 'an unchanged entry keeps its identity');
    // A resync snapshot equal to the view changes nothing, identities included.
    const next = await reconnect(srv, conn);
    await next.sub({ t: 'snapshot', epoch: 'e', rev: 5, reason: 'compacted', items: [item('a', 2, 4, 1, 2), item('b', { x: 1 }, 2)] });
    await until(() => w.rev === 5);
    assert.equal(w.entries(), e2);
    assert.equal(w.entry('b'), b);
  } finally {
    await done();
  }
});

test('watch: ready() settles when the client closes before the first view: NotConnectedError; a read-your-writes wait resolves (issue 13, defect 8)', { timeout: 5000 }, async () => {
  const { c, conn, w, done } = await setup();
  try {
    const ready = assert.rejects(w.ready(), { name: 'NotConnectedError' });
    const room = c.room('doc:2'); // writes to doc:1 would wait for w's first view
    const other = room.watch('x/');
    const s = await conn.next('sub', (m) => m.prefixes?.[0] === 'x/');
    conn.send({ t: 'ok', id: s.id }, { t: 'snapshot', s: s.id, epoch: 'e', rev: 1, reason: 'initial', items: [] });
    await other.ready();
    const write = room.put('x/k', 1, { waitFor: other });
    const m = await conn.next('put');
    conn.send({ t: 'ok', id: m.id, rev: 5 }); // acknowledged; the watch has not seen rev 5 yet
    await sleep(20);
    c.close();
    await ready;
    assert.deepEqual(await write, { rev: 5 }, 'the write committed: its wait ends with the client');
    await other.ready(); // a watch with a view stays ready
    await assert.rejects(room.watch('y/').ready(), { name: 'NotConnectedError' }, 'a closed client: at once');
  } finally {
    await done();
  }
});
