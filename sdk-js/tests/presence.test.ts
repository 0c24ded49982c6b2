// Presence against a scripted fake server: the leased key, latest-wins
// writes, re-announcing after a session was lost, join/update/leave.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient } from '../dist/index.js';
import { FakeServer } from './support/fake-server.js';
import { record, sleep, until } from './support/util.js';

async function setup() {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, clientId: 'me', reconnect: { minDelayMs: 5, maxDelayMs: 20 } });
  const conn = await srv.nextConn();
  await conn.accept({ session: 's_1' });
  await until(() => c.status === 'connected');
  return { srv, c, conn, done: async () => (c.close(), await srv.close()) };
}

test('presence: set writes presence/<user>/<clientId> (no token: the clientId) with a session lease; sets during a write in flight merge (latest wins)', async () => {
  const { c, conn, done } = await setup();
  try {
    const p = c.room('r').presence<{ n: number }>();
    const sub = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [] });
    assert.deepEqual(sub.prefixes, ['presence/']);
    const r1 = p.set({ n: 1 });
    const m1 = await conn.next('put');
    assert.deepEqual([m1.key, m1.value, m1.lease], ['presence/me/me', { n: 1 }, 'session']);
    const r2 = p.set({ n: 2 });
    const r3 = p.set({ n: 3 });
    assert.equal(r2, r3, 'merged into one write');
    conn.commit(m1, 2, sub.id);
    const m2 = await conn.next('put');
    assert.deepEqual(m2.value, { n: 3 });
    conn.commit(m2, 3, sub.id);
    assert.deepEqual([await r1, await r3], [{ rev: 2 }, { rev: 3 }]);
    assert.deepEqual(p.self, { n: 3 });
    const cl = p.clear();
    const d = await conn.next('del');
    assert.equal(d.key, 'presence/me/me');
    conn.commit(d, 4, sub.id);
    await cl;
    assert.equal(conn.all('put').length, 2);
  } finally {
    await done();
  }
});

test('presence: after a reconnect that lost the session, the value is written again; after a resumed one, not', async () => {
  const { srv, c, conn, done } = await setup();
  try {
    const p = c.room('r').presence();
    const s = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [] });
    const r = p.set('here');
    const m = await conn.next('put');
    conn.commit(m, 2, s.id);
    await r;

    conn.terminate();
    const conn2 = await srv.nextConn();
    await conn2.accept({ session: 's_1', resumed: true });
    await conn2.sub({ t: 'synced', rev: 2 });
    await sleep(40);
    assert.equal(conn2.all('put').length, 0, 'resumed: the lease was kept');

    conn2.terminate();
    const conn3 = await srv.nextConn();
    await conn3.accept({ session: 's_2', resumed: false });
    await conn3.sub({ t: 'synced', rev: 2 });
    const again = await conn3.next('put');
    assert.deepEqual([again.key, again.value, again.lease], ['presence/me/me', 'here', 'session']);
  } finally {
    await done();
  }
});

test('presence: others, join, update and leave (own key excluded), also across a resync', async () => {
  const { srv, c, conn, done } = await setup();
  try {
    const p = c.room('r').presence<string>();
    const ev: string[] = [];
    p.on('join', (e) => ev.push(`join ${e.id}=${e.value}`));
    p.on('update', (e) => ev.push(`update ${e.id}=${e.value} (was ${e.prev})`));
    p.on('leave', (e) => ev.push(`leave ${e.id} (was ${e.prev})`));
    const changes = record(p, 'change');
    const it = (id: string, v: string, rev: number) => ({ key: `presence/${id}`, value: v, create_rev: rev, mod_rev: rev, version: 1, lease: true });
    const s = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 2, reason: 'initial', items: [it('ann', 'a', 1), it('me/me', 'm', 2)] });
    await until(() => ev.length === 1);
    conn.send(
      { t: 'events', s: s.id, rev: 3, events: [{ type: 'put', ...it('bob', 'b', 3) }] },
      { t: 'events', s: s.id, rev: 4, events: [{ type: 'put', ...it('ann', 'a2', 4) }] },
      { t: 'events', s: s.id, rev: 5, events: [{ type: 'put', ...it('me/me', 'm2', 5) }] },
    );
    await until(() => ev.length === 3);
    assert.deepEqual([...p.others], [['ann', 'a2'], ['bob', 'b']]);
    // Reconnect: history compacted; bob left and cy came meanwhile.
    conn.terminate();
    const conn2 = await srv.nextConn();
    await conn2.accept({ resumed: true });
    await conn2.sub({ t: 'snapshot', epoch: 'e', rev: 9, reason: 'compacted', items: [it('ann', 'a2', 4), it('cy', 'c', 8), it('me/me', 'm2', 5)] });
    await until(() => ev.length === 5);
    assert.deepEqual(ev, ['join ann=a', 'join bob=b', 'update ann=a2 (was a)', 'leave bob (was b)', 'join cy=c']);
    assert.deepEqual([...changes.at(-1)!], [['ann', 'a2'], ['cy', 'c']]);
  } finally {
    await done();
  }
});

test('presence: dispose() removes its client listener, closes its watch and clears its value; 50 rooms leave no listener behind (issue 13, defect 3)', async () => {
  const { c, conn, done } = await setup();
  try {
    const base = c.listenerCount('connected');
    const ps = Array.from({ length: 50 }, (_, i) => c.room(`r${i}`).presence());
    assert.equal(c.listenerCount('connected'), base + 50);
    for (const p of ps) p.dispose();
    assert.equal(c.listenerCount('connected'), base, 'every presence removed its listener');
    assert.ok(ps.every((p) => p.watch.status === 'closed'));
    for (const _ of ps) await conn.next('sub'); // theirs, never answered

    const room = c.room('r');
    const p = room.presence();
    const s = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [] });
    const set = p.set('here');
    const m = await conn.next('put');
    conn.commit(m, 2, s.id);
    await set;
    p.dispose();
    p.dispose(); // idempotent
    const d = await conn.next('del');
    assert.equal(d.key, m.key, 'a set value is cleared: others see this client leave');
    conn.send({ t: 'ok', id: d.id, rev: 3 });
    await assert.rejects(p.set('again'), { code: 'closed' });
    assert.notEqual(room.presence(), p, 'the room hands out a new presence after dispose');
    assert.equal(c.listenerCount('connected'), base + 1);
  } finally {
    await done();
  }
});

test('presence: others keeps its identity until someone else changes (issue 13, defect 7)', async () => {
  const { c, conn, done } = await setup();
  try {
    const p = c.room('r').presence<string>();
    const it = (id: string, v: string, rev: number) => ({ key: `presence/${id}`, value: v, create_rev: rev, mod_rev: rev, version: 1, lease: true });
    const s = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [it('ann', 'a', 1)] });
    await until(() => p.others.size === 1);
    const o1 = p.others;
    assert.equal(p.others, o1, 'same object until something changes');
    conn.send({ t: 'progress', s: s.id, rev: 2 });
    await sleep(20);
    assert.equal(p.others, o1);
    conn.send({ t: 'events', s: s.id, rev: 3, events: [{ type: 'put', ...it('bob', 'b', 3) }] });
    await until(() => p.others.size === 2);
    assert.notEqual(p.others, o1);
    assert.equal(p.others, p.others);
    assert.deepEqual([...o1], [['ann', 'a']], 'an earlier snapshot is not changed afterwards');
  } finally {
    await done();
  }
});

test('presence: the key is presence/<token sub>/<clientId>; with a token callback it is known once the first token came, and a set waits for it', async () => {
  const srv = await FakeServer.start();
  const tok = (sub: string) => `h.${Buffer.from(JSON.stringify({ sub })).toString('base64url')}.s`;
  const c = createClient({ url: srv.url, WebSocket, clientId: 'tab1', token: async () => tok('zoë') });
  try {
    const p = c.room('r').presence();
    assert.equal(p.key, undefined, 'not known before the callback gave a token');
    const set = p.set('here'); // issued before connecting: waits for the token
    const conn = await srv.nextConn();
    await conn.accept();
    const s = await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [] });
    const m = await conn.next('put');
    assert.equal(m.key, 'presence/zoë/tab1');
    assert.equal(p.id, 'zoë/tab1');
    conn.commit(m, 2, s.id);
    await set;
  } finally {
    c.close();
    await srv.close();
  }
});
