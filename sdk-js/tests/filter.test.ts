// Filtered watches (`where`) against a scripted fake server: the filter sent
// on every subscribe, leave events, resync as leaves, invalid_filter, and
// pending writes, which a filtered watch shows only over keys in its view and
// never waits for when its filter may send it nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, InvalidFilterError, type ChangeEvent } from '../dist/index.js';
import { FakeServer, type FakeConn } from './support/fake-server.js';
import { record, sleep, until } from './support/util.js';

const WHERE = 'value.mode == "duel" && value.players < value.max';
const item = (key: string, value: unknown, mod: number, create = mod, version = 1) => ({ key, value, create_rev: create, mod_rev: mod, version });
const put = (key: string, value: unknown, mod: number, create = mod, version = 1) => ({ type: 'put', ...item(key, value, mod, create, version) });
const leave = (key: string, mod: number, wid?: string) => ({ type: 'leave', key, mod_rev: mod, wid });
const brief = (cs: ChangeEvent[]) =>
  cs.map((c) => `${c.type} ${c.key}=${JSON.stringify(c.value)} prev=${JSON.stringify(c.prev)}${c.entry?.pending ? ' pending' : ''} ${c.cause}`);
const duel = (players: number, max = 2) => ({ mode: 'duel', players, max });

/** A client with a watch of games/ filtered by WHERE, at the snapshot `items` (rev 5). */
async function setup(items = [item('games/a', duel(1), 5)]) {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, reconnect: { minDelayMs: 5, maxDelayMs: 20 } });
  const conn = await srv.nextConn();
  await conn.accept();
  const room = c.room('lobby');
  const w = room.watch('games/', { where: WHERE });
  const sub = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 5, reason: 'initial', items });
  await w.ready();
  const changes = record(w, 'change');
  return { srv, c, conn, sub, s: sub.id as number, room, w, changes, done: async () => (c.close(), await srv.close()) };
}

async function reconnect(srv: FakeServer, conn: FakeConn) {
  conn.terminate();
  const next = await srv.nextConn();
  await next.accept();
  return next;
}

test('filter: the where text goes as filter on the subscribe and on the resume; leave events drop keys as changes of type leave, with prev', async () => {
  const { srv, conn, sub, s, w, changes, done } = await setup([item('games/a', duel(1), 3), item('games/b', duel(0), 5)]);
  try {
    assert.deepEqual([sub.prefixes, sub.filter, sub.from], [['games/'], WHERE, undefined]);
    assert.equal(w.where, WHERE);
    conn.send({ t: 'events', s, rev: 6, events: [leave('games/a', 6)] }, { t: 'events', s, rev: 7, events: [put('games/c', duel(1), 7)] });
    await until(() => w.rev === 7);
    assert.deepEqual(brief(changes), ['leave games/a=undefined prev={"mode":"duel","players":1,"max":2} live', 'put games/c={"mode":"duel","players":1,"max":2} prev=undefined live']);
    assert.deepEqual(w.entries().map((e) => e.key), ['games/b', 'games/c']);

    const conn2 = await reconnect(srv, conn);
    const again = await conn2.next('sub');
    assert.deepEqual([again.prefixes, again.filter, again.from], [['games/'], WHERE, { epoch: 'e', rev: 8 }]);
    conn2.send({ t: 'ok', id: again.id }, { t: 'events', s: again.id, rev: 9, events: [leave('games/b', 9)] }, { t: 'synced', s: again.id, rev: 12 });
    await until(() => w.rev === 12);
    assert.deepEqual(brief(changes.slice(2)), ['leave games/b=undefined prev={"mode":"duel","players":0,"max":2} replay']);
  } finally {
    await done();
  }
});

test('filter: a resync snapshot and a coalesced message show the keys no longer selected as leaves', async () => {
  const { srv, conn, w, changes, done } = await setup([item('games/a', duel(1), 3), item('games/b', duel(1), 5)]);
  try {
    const conn2 = await reconnect(srv, conn);
    const again = await conn2.sub({ t: 'snapshot', epoch: 'e', rev: 20, reason: 'compacted', items: [item('games/b', duel(1), 5), item('games/d', duel(0), 19)] });
    await until(() => w.rev === 20);
    assert.deepEqual(brief(changes), ['leave games/a=undefined prev={"mode":"duel","players":1,"max":2} resync', 'put games/d={"mode":"duel","players":0,"max":2} prev=undefined resync']);
    conn2.send({ t: 'coalesced', s: again.id, rev: 30, events: [leave('games/b', 25), put('games/e', duel(1), 28)] });
    await until(() => w.rev === 30);
    assert.deepEqual(brief(changes.slice(2)), ['leave games/b=undefined prev={"mode":"duel","players":1,"max":2} coalesced', 'put games/e={"mode":"duel","players":1,"max":2} prev=undefined coalesced']);
    assert.deepEqual(w.entries().map((e) => e.key), ['games/d', 'games/e']);
  } finally {
    await done();
  }
});

test('filter: invalid_filter closes the watch with InvalidFilterError carrying line and column; ready() rejects with it; it is not subscribed again', async () => {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, reconnect: { minDelayMs: 5, maxDelayMs: 20 } });
  try {
    const conn = await srv.nextConn();
    await conn.accept();
    const w = c.room('lobby').watch('games/', { where: 'value.mode ==' });
    const errors = record(w, 'error');
    const m = await conn.next('sub');
    assert.equal(m.filter, 'value.mode ==');
    conn.send({ t: 'err', id: m.id, code: 'invalid_filter', message: "invalid filter at 1:14: Syntax error: mismatched input '<EOF>'", line: 1, column: 14 });
    const err = await w.ready().then(() => assert.fail('ready resolved'), (e: unknown) => e);
    assert.ok(err instanceof InvalidFilterError, String(err));
    assert.deepEqual([err.code, err.line, err.column], ['invalid_filter', 1, 14]);
    assert.match(err.message, /1:14/);
    assert.deepEqual([w.status, w.error, errors], ['closed', err, [err]]);
    await sleep(50);
    assert.equal(conn.all('sub').length, 1, 'not retried');
    // Without a position (an expression over the size limit, say), line and column are undefined.
    const w2 = c.room('lobby').watch('games/', { where: 'x'.repeat(2000) });
    const m2 = await conn.next('sub');
    conn.send({ t: 'err', id: m2.id, code: 'invalid_filter', message: 'the filter is over 1024 bytes' });
    const err2 = await w2.ready().catch((e: InvalidFilterError) => e);
    assert.deepEqual([err2 instanceof InvalidFilterError, err2!.line, err2!.column], [true, undefined, undefined]);
  } finally {
    c.close();
    await srv.close();
  }
});

test('filter: a pending write shows over a key in the view only; a put of a key outside the view settles on its ok though no event comes (with waitFor the filtered watch too)', async () => {
  const { conn, s, room, w, changes, done } = await setup();
  try {
    // Outside the view: whether the server selects it is the server's to say, so nothing shows.
    const p = room.put('games/z', { mode: 'ffa', players: 1, max: 4 }, { waitFor: w });
    assert.equal(w.has('games/z'), false);
    const m = await conn.next('put');
    conn.send({ t: 'ok', id: m.id, rev: 6 }); // the filter does not select it: no event, no progress
    assert.deepEqual(await p, { rev: 6 });
    assert.equal(w.rev, 5);

    // One the server selects arrives as its put (in the frame of the ok, as the server sends it): waitFor shows it.
    const p2 = room.put('games/y', duel(1), { waitFor: w });
    const m2 = await conn.next('put');
    conn.send({ t: 'ok', id: m2.id, rev: 7 }, { t: 'events', s, rev: 7, events: [{ ...put('games/y', duel(1), 7), wid: m2.wid }] });
    assert.deepEqual(await p2, { rev: 7 });
    assert.deepEqual(w.get('games/y'), duel(1));

    // In the view: shown at once, as pending.
    const p3 = room.put('games/a', duel(2), { waitFor: w });
    assert.deepEqual([w.get('games/a'), w.entry('games/a')!.pending], [duel(2), true]);
    const m3 = await conn.next('put');
    let settled = false;
    void p3.then(() => (settled = true));
    conn.send({ t: 'ok', id: m3.id, rev: 9 });
    await sleep(30);
    assert.equal(settled, false, 'the key is in the view: its event is sure to come');
    assert.equal(w.entry('games/a')!.pending, true, 'and the view keeps the pending value till then');
    conn.send({ t: 'events', s, rev: 9, events: [leave('games/a', 9, m3.wid)] }); // full: the filter drops it
    assert.deepEqual(await p3, { rev: 9 });
    assert.equal(w.has('games/a'), false);
    assert.deepEqual(brief(changes), [
      'put games/y={"mode":"duel","players":1,"max":2} prev=undefined live',
      'put games/a={"mode":"duel","players":2,"max":2} prev={"mode":"duel","players":1,"max":2} pending local',
      'leave games/a=undefined prev={"mode":"duel","players":2,"max":2} live',
    ]);
  } finally {
    await done();
  }
});

test('filter: a pending write over a key that another write took out of the view settles on that leave; a pending delete is a delete, its rollback a put', async () => {
  const { conn, s, room, w, changes, done } = await setup([item('games/a', duel(1), 5), item('games/b', duel(0), 4)]);
  try {
    const p = room.put('games/a', { ...duel(1), name: 'mine' });
    const m = await conn.next('put');
    // Someone else changed the mode first (rev 6: it left), then this write committed at 7, not selected: no event at 7.
    conn.send({ t: 'events', s, rev: 6, events: [leave('games/a', 6)] }, { t: 'ok', id: m.id, rev: 7 });
    assert.deepEqual(await p, { rev: 7 });
    assert.equal(w.rev, 6);
    assert.equal(w.has('games/a'), false);

    const d = room.delete('games/b', { ifModRev: 4 });
    assert.equal(w.has('games/b'), false);
    const md = await conn.next('del');
    conn.send({ t: 'err', id: md.id, code: 'conflict', message: 'changed', key: 'games/b', mod_rev: 8, rev: 8 });
    await assert.rejects(d);
    assert.deepEqual(brief(changes), [
      'put games/a={"mode":"duel","players":1,"max":2,"name":"mine"} prev={"mode":"duel","players":1,"max":2} pending local',
      'leave games/a=undefined prev={"mode":"duel","players":1,"max":2,"name":"mine"} live',
      'delete games/b=undefined prev={"mode":"duel","players":0,"max":2} local',
      'put games/b={"mode":"duel","players":0,"max":2} prev=undefined rollback',
    ]);
  } finally {
    await done();
  }
});

test('filter: an unfiltered watch of the same keys still shows the pending write and holds the write till its event', async () => {
  const { conn, s, room, w, done } = await setup([]);
  try {
    const all = room.watch('games/');
    const s2 = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 5, reason: 'initial', items: [] });
    await all.ready();
    let settled = false;
    const p = room.put('games/q', { mode: 'coop' }).then((r) => ((settled = true), r));
    assert.deepEqual([all.get('games/q'), w.has('games/q')], [{ mode: 'coop' }, false]);
    const m = await conn.next('put');
    conn.send({ t: 'ok', id: m.id, rev: 6 });
    await sleep(30);
    assert.equal(settled, false, 'the unfiltered watch has not shown it yet');
    conn.send({ t: 'events', s: s2.id, rev: 6, events: [{ ...put('games/q', { mode: 'coop' }, 6), wid: m.wid }] });
    assert.deepEqual(await p, { rev: 6 });
    assert.equal(w.rev, 5, 'the filtered watch got nothing');
    void s;
  } finally {
    await done();
  }
});
