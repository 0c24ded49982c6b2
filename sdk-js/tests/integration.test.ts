// Integration tests against the real Go server (STATECAST_BIN, or built
// with `go build`), started on a free loopback port with the memory store
// (the file store for the restart that keeps the epoch).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, jsonCodec, json2Codec, ConflictError, InvalidFilterError, OutcomeUnknownError, type ChangeEvent, type Client, type ClientOptions, type Codec } from '../dist/index.js';
import { msgpackCodec } from '../dist/msgpack.js';
import { controlledWebSocket, replyLosingWebSocket, startServer, startServerOnFreePort, tempDataDir, type Server } from './support/server.js';
import { FakeStorage, fakeWindow, nextEvent, record, sleep, until } from './support/util.js';

const GRACE_MS = 600;
let srv: Server;
const clients: Client[] = [];

before(async () => {
  // Rooms named tiny:* keep 3 events of history, so a short absence already falls to a snapshot.
  srv = await startServer(['--lease-grace', `${GRACE_MS}ms`, '--history-class', 'tiny:=3']);
});
after(async () => {
  clients.forEach((c) => c.close());
  await srv.stop();
});

let seq = 0;
const roomName = (prefix: string) => `${prefix}${process.pid}-${seq++}`;
function client(opts: Partial<ClientOptions> = {}): Client {
  const c = createClient({ url: srv.http, WebSocket, reconnect: { minDelayMs: 20, maxDelayMs: 100 }, ...opts });
  clients.push(c);
  return c;
}
const brief = (cs: ChangeEvent[]) => cs.map((c) => `${c.type} ${c.key}=${JSON.stringify(c.value)} ${c.cause}`);
const codecs: [string, Codec][] = [
  ['json', jsonCodec],
  ['json v2', json2Codec],
  ['msgpack', msgpackCodec],
];

for (const [name, codec] of codecs) {
  test(`integration (${name}): resume after a dropped socket replays exactly what was missed — no gap, no duplicate`, async () => {
    const ctl = controlledWebSocket();
    const a = client({ WebSocket: ctl.WebSocket, codec });
    const b = client();
    const room = roomName('resume:');
    const wa = a.room(room).watch();
    const seen = record(wa, 'change');
    const syncs = record(wa, 'sync');
    await wa.ready();
    const rb = b.room(room);
    for (let i = 0; i < 3; i++) await rb.put(`k${i}`, i);
    await until(() => wa.rev === 3, 'live events');

    ctl.block(true);
    ctl.drop();
    await until(() => a.status === 'reconnecting', 'reconnecting');
    await rb.put('k0', 'changed');
    await rb.delete('k1');
    await rb.txn({ ops: [{ type: 'put', key: 'k5', value: 5 }, { type: 'put', key: 'k6', value: [6] }] });
    const { rev } = await rb.put('k2', { deep: [1, 2.5] });
    ctl.block(false);

    await until(() => syncs.some((s) => s.kind === 'resumed'), 'resumed');
    assert.equal(wa.rev, rev);
    assert.deepEqual(syncs.map((s) => s.kind), ['initial', 'resumed']);
    assert.deepEqual(brief(seen), [
      'put k0=0 live',
      'put k1=1 live',
      'put k2=2 live',
      'put k0="changed" replay',
      'delete k1=undefined replay',
      'put k5=5 replay',
      'put k6=[6] replay',
      'put k2={"deep":[1,2.5]} replay',
    ]);
    // Revisions never go back; each (key, rev) is delivered once.
    const ids = seen.map((c) => `${c.key}@${c.rev}`);
    assert.equal(new Set(ids).size, ids.length);
    assert.deepEqual(seen.map((c) => c.rev), [...seen.map((c) => c.rev)].sort((x, y) => x - y));
    // The view equals a fresh snapshot of the room.
    const fresh = b.room(room).watch();
    await fresh.ready();
    assert.deepEqual(wa.entries(), fresh.entries());
    // Live again.
    await rb.put('k9', 9);
    await until(() => wa.has('k9'));
    assert.equal(seen.at(-1)!.cause, 'live');
  });
}

test('integration: after compaction the server sends a snapshot; the watch emits exactly the difference', async () => {
  const ctl = controlledWebSocket();
  const a = client({ WebSocket: ctl.WebSocket });
  const b = client({ codec: msgpackCodec });
  const room = roomName('tiny:');
  const rb = b.room(room);
  for (const [k, v] of [['a', 1], ['b', 2], ['c', 3], ['d', 4]] as const) await rb.put(k, v);
  const wa = a.room(room).watch();
  const syncs = record(wa, 'sync');
  await wa.ready();
  const seen = record(wa, 'change');

  ctl.block(true);
  ctl.drop();
  await until(() => a.status === 'reconnecting');
  await rb.put('a', 10);
  await rb.delete('b');
  await rb.put('e', 5);
  await rb.put('c', 3); // same value, new mod_rev
  await rb.put('f', 1);
  await rb.delete('f'); // came and went: no net change
  await rb.put('a', 11);
  ctl.block(false);

  await until(() => syncs.length === 2, 'resync');
  assert.equal(syncs[1]!.kind, 'resync');
  assert.equal(syncs[1]!.reason, 'compacted');
  assert.deepEqual(brief(seen), ['put a=11 resync', 'delete b=undefined resync', 'put c=3 resync', 'put e=5 resync']);
  assert.deepEqual(seen.map((c) => c.prev), [1, 2, 3, undefined]);
  const fresh = b.room(room).watch();
  await fresh.ready();
  assert.deepEqual(wa.entries(), fresh.entries());
  assert.equal(wa.rev, fresh.rev);
});

test('integration: conditional writes conflict with the current mod_rev', async () => {
  const r = client().room(roomName('cas:'));
  const { rev: r1 } = await r.put('k', 1, { ifModRev: 0 });
  const e1 = await r.put('k', 2, { ifModRev: 0 }).then(() => assert.fail('resolved'), (e: unknown) => e);
  assert.ok(e1 instanceof ConflictError);
  assert.deepEqual([e1.key, e1.modRev, e1.rev], ['k', r1, r1]);
  const { rev: r2 } = await r.put('k', 2, { ifModRev: r1 });
  await assert.rejects(r.delete('k', { ifModRev: r1 }), (e: unknown) => e instanceof ConflictError && e.modRev === r2);
  await assert.rejects(
    r.txn({ if: [{ key: 'k', modRev: r1 }], ops: [{ type: 'put', key: 'x', value: 1 }] }),
    (e: unknown) => e instanceof ConflictError && e.key === 'k' && e.modRev === r2,
  );
  const w = r.watch();
  await w.ready();
  assert.equal(w.entry('k')!.modRev, r2);
  const { rev: r3 } = await r.txn({ if: [{ key: 'k', modRev: r2 }, { key: 'new', modRev: 0 }], ops: [{ type: 'put', key: 'new', value: 1 }, { type: 'delete', key: 'k' }] });
  assert.equal(r3, r2 + 1, 'a transaction is one revision');
  assert.deepEqual(await r.delete('missing'), { rev: r3 }, 'deleting a missing key writes nothing');
});

test('integration: read-your-writes resolves once the watch shows the write', async () => {
  const r = client().room(roomName('ryw:'));
  const w = r.watch();
  await w.ready();
  for (let i = 0; i < 10; i++) {
    const { rev } = await r.put('k', i, { waitFor: w });
    assert.equal(w.get('k'), i);
    assert.ok(w.rev >= rev);
  }
});

test('integration: presence join, update and leave across two clients (JSON and msgpack)', async () => {
  const a = client({ clientId: 'alice' });
  const b = client({ clientId: 'bob', codec: msgpackCodec });
  const room = roomName('lobby:');
  const pa = a.room(room).presence<{ name: string; away?: boolean }>();
  const pb = b.room(room).presence<{ name: string; away?: boolean }>();
  const joins = record(pa, 'join');
  const updates = record(pa, 'update');
  const leaves = record(pa, 'leave');
  await pa.set({ name: 'Alice' });
  await pb.set({ name: 'Bob' });
  await until(() => pa.others.has('bob/bob') && pb.others.has('alice/alice'), 'both present');
  assert.deepEqual([...pa.others], [['bob/bob', { name: 'Bob' }]]);
  assert.deepEqual([...pb.others], [['alice/alice', { name: 'Alice' }]]);
  assert.equal(pa.watch.entry('presence/bob/bob')!.lease, true, 'presence is session-leased');
  assert.deepEqual(joins, [{ id: 'bob/bob', value: { name: 'Bob' } }]);

  await pb.set({ name: 'Bob', away: true });
  await until(() => updates.length === 1);
  assert.deepEqual(updates[0], { id: 'bob/bob', value: { name: 'Bob', away: true }, prev: { name: 'Bob' } });

  await pb.clear();
  await until(() => leaves.length === 1);
  assert.deepEqual(leaves[0], { id: 'bob/bob', prev: { name: 'Bob', away: true } });
  await pb.set({ name: 'Bob again' });
  await until(() => joins.length === 2);

  // Bob's client goes away: the server ends his session lease after the grace.
  const t0 = Date.now();
  b.close();
  await until(() => leaves.length === 2, 'leave after the grace', 5000);
  const elapsed = Date.now() - t0;
  assert.ok(elapsed >= GRACE_MS - 100, `left after ${elapsed} ms, before the ${GRACE_MS} ms grace`);
  assert.equal(pa.others.size, 0);
});

for (const [name, codec] of codecs) {
  test(`integration (${name}): room.put keeps a session-leased key bound (deleted when that session ends); lease null unbinds`, async () => {
    const a = client({ codec });
    const b = client({ codec });
    const room = roomName('keep:');
    await a.room(room).put('presence/a', { typing: false }, { lease: 'session' });
    await a.room(room).put('games/a', 1, { lease: 'session' });
    const wb = b.room(room).watch();
    await wb.ready();
    // Rewritten by a plain put, by the session's own client and by another one, in a txn too.
    await a.room(room).put('presence/a', { typing: true });
    await b.room(room).put('presence/a', { typing: 'b' });
    await b.room(room).txn({ ops: [{ type: 'put', key: 'games/a', value: 2 }, { type: 'put', key: 'plain', value: 1 }] });
    await b.room(room).put('games/a', 3, { lease: null });
    await until(() => wb.get('games/a') === 3, 'the writes');
    assert.equal(wb.entry('presence/a')?.lease, true, 'still bound after plain puts');
    assert.equal(wb.entry('games/a')?.lease, false, 'lease null unbound it');
    assert.equal(wb.entry('plain')?.lease, false, 'a new key bound to none');
    a.close(); // its session ends after the grace: the kept key with it
    await until(() => !wb.has('presence/a'), 'the kept key deleted with its session', 5000);
    assert.ok(wb.has('games/a') && wb.has('plain'), 'the unbound keys stay');
  });
}

test('integration: a watch of an exact key (useEntry) never receives the keys it starts', async () => {
  const a = client();
  const room = roomName('exact:');
  const r = a.room(room);
  await r.put('games/70', 0);
  await r.put('games/7', 0);
  const w = r.watch('games/7', { exact: true });
  const seen = record(w, 'change');
  await w.ready();
  await r.txn({ ops: [{ type: 'put', key: 'games/7/x', value: 1 }, { type: 'put', key: 'games/7', value: 1 }, { type: 'put', key: 'games/71', value: 1 }] });
  await r.put('games/70', 2);
  await r.put('games/7', 2, { waitFor: w });
  assert.deepEqual([...w.entries()].map((e) => e.key), ['games/7']);
  assert.ok(seen.length >= 3 && seen.every((c) => c.key === 'games/7'), `changes of ${seen.map((c) => c.key)}`);
});

test('integration: a session-leased entry survives a quick reconnect and ends after the grace', async () => {
  const ctl = controlledWebSocket();
  const a = client({ WebSocket: ctl.WebSocket });
  const b = client();
  const room = roomName('lobby:');
  await a.room(room).put('games/a', { host: 'a' }, { lease: 'session' });
  const wb = b.room(room).watch('games/');
  await wb.ready();
  assert.equal(wb.entry('games/a')?.lease, true);
  const seen = record(wb, 'change');

  // Quick reconnect: the session is resumed and the lease kept.
  const again = nextEvent(a, 'connected');
  ctl.drop();
  assert.equal((await again).resumed, true);
  await sleep(GRACE_MS + 300);
  assert.ok(wb.has('games/a'), 'kept across the quick reconnect');
  assert.equal(seen.length, 0);

  // Away for longer than the grace: the entry is deleted, and the next connection is a new session.
  ctl.block(true);
  const t0 = Date.now();
  ctl.drop();
  await until(() => !wb.has('games/a'), 'lease end', 5000);
  const elapsed = Date.now() - t0;
  assert.ok(elapsed >= GRACE_MS - 100, `deleted after ${elapsed} ms`);
  assert.deepEqual(brief(seen), ['delete games/a=undefined live']);
  const back = nextEvent(a, 'connected');
  ctl.block(false);
  assert.equal((await back).resumed, false);
});

test('integration: a page reload resumes the session from sessionStore: same presence key, its leases kept, no leave', async () => {
  const win = fakeWindow();
  try {
    const store = new FakeStorage();
    const room = roomName('lobby:');
    const a = client({ sessionStore: store });
    const b = client({ clientId: 'bob' });
    const pa = a.room(room).presence<{ name: string }>();
    await pa.set({ name: 'Ann' });
    await a.room(room).put('games/ann', { host: 'Ann' }, { lease: 'session' });
    const wb = b.room(room).watch();
    await wb.ready();
    const annKey = `presence/${a.clientId}/${a.clientId}`; // no token: the clientId is the user too
    assert.ok(wb.has(annKey) && wb.has('games/ann'));
    const seen = record(wb, 'change');

    // The reload: pagehide, the old page's socket closes, a new page's client starts from the store.
    win.fire('pagehide');
    a.close();
    const a2 = client({ sessionStore: store, autoConnect: false });
    const connected = nextEvent(a2, 'connected');
    a2.connect();
    const ev = await connected;
    assert.equal(ev.resumed, true, 'the session was resumed');
    assert.equal(ev.session, a.session?.session);
    assert.equal(a2.clientId, a.clientId, 'the same presence id');
    await a2.room(room).presence<{ name: string }>().set({ name: 'Ann' });
    await sleep(GRACE_MS + 300);
    const presence = [...wb.entries()].filter((e) => e.key.startsWith('presence/')).map((e) => e.key);
    assert.deepEqual(presence, [annKey], 'one entry for Ann, under the same key');
    assert.ok(wb.has('games/ann'), 'her session-leased game outlived the grace');
    assert.deepEqual(seen.filter((c) => c.type === 'delete').map((c) => c.key), [], 'no delete event');
  } finally {
    win.restore();
  }
});

test('integration: values read back the same through every codec', async () => {
  const j = client(); // JSON v2
  const m = client({ codec: msgpackCodec });
  const room = roomName('codec:');
  const values: unknown[] = [{ a: 1.5, b: [1, 'x', null, true], n: 42, big: 2 ** 40, neg: -7, s: 'é😀"\n' }, 'str', 0, -1.25, null, [[]], {}];
  const wj = j.room(room).watch();
  const wm = m.room(room).watch();
  const w1 = client({ codec: jsonCodec }).room(room).watch();
  await Promise.all([wj.ready(), wm.ready(), w1.ready()]);
  for (let i = 0; i < values.length; i++) await m.room(room).put(`m${i}`, values[i]);
  for (let i = 0; i < values.length; i++) await j.room(room).put(`j${i}`, values[i]);
  await until(() => [wj, wm, w1].every((w) => w.size === 2 * values.length));
  for (let i = 0; i < values.length; i++) {
    for (const w of [wj, wm, w1]) {
      assert.deepEqual(w.get(`m${i}`), values[i]);
      assert.deepEqual(w.get(`j${i}`), values[i]);
    }
  }
});

test('integration: a server restart (memory store: new epoch) — writes wait for the reconnect, watches resync as a diff', async () => {
  const first = await startServer(['--lease-grace', `${GRACE_MS}ms`]);
  const ctl = controlledWebSocket();
  const opts = { url: first.http, reconnect: { minDelayMs: 20, maxDelayMs: 100 } };
  const a = client({ ...opts, WebSocket: ctl.WebSocket });
  const b = client(opts);
  const closes = record(a, 'disconnected');
  const wa = a.room('restart').watch();
  const syncs = record(wa, 'sync');
  const seen = record(wa, 'change');
  await b.room('restart').put('k1', 1);
  await b.room('restart').put('k2', 2);
  await until(() => wa.size === 2);
  ctl.block(true);
  await first.stop('SIGTERM'); // graceful: closes every socket with 1012
  await until(() => closes.length > 0);
  assert.equal(closes[0]!.code, 1012);
  assert.equal(closes[0]!.action, 'now');

  const second = await startServer(['--addr', first.http.replace('http://', '')]);
  try {
    // B's writes, issued while B may still be reconnecting, wait for the connection.
    await b.room('restart').put('k2', 20);
    await b.room('restart').put('k3', 3);
    assert.equal(b.session?.resumed, false, 'a new server: the session is new');
    ctl.block(false);
    await until(() => syncs.length === 2, 'resync');
    assert.equal(syncs[1]!.reason, 'epoch');
    assert.deepEqual(brief(seen.slice(2)), ['delete k1=undefined resync', 'put k2=20 resync', 'put k3=3 resync']);
  } finally {
    a.close();
    b.close();
    await second.stop();
  }
});

test('integration: a server restart on the file store (same epoch) — the watch resumes by replay, exactly the missed revisions', async () => {
  // Same data directory and same port: the restarted server is the same room history, and the
  // client reconnects to the URL it already has.
  const started = await startServerOnFreePort(['--store', 'file', '--data', tempDataDir(), '--lease-grace', `${GRACE_MS}ms`]);
  const args = started.args;
  let server = started.server;
  const ctl = controlledWebSocket();
  const opts = { url: server.http, reconnect: { minDelayMs: 20, maxDelayMs: 100 } };
  const a = client({ ...opts, WebSocket: ctl.WebSocket });
  const b = client(opts);
  const closes = record(a, 'disconnected');
  const wa = a.room('restart').watch();
  const syncs = record(wa, 'sync');
  const seen = record(wa, 'change');
  try {
    await wa.ready();
    const rb = b.room('restart');
    for (let i = 1; i <= 4; i++) assert.deepEqual(await rb.put(`k${i}`, i), { rev: i });
    await until(() => wa.rev === 4, 'revisions 1..4 seen');
    const epoch = wa.epoch!;
    assert.ok(epoch);

    ctl.block(true); // A stays away until B has written on the restarted server
    await server.stop('SIGTERM'); // graceful: closes every socket with 1012, closes the store
    await until(() => closes.length > 0);
    assert.equal(closes[0]!.code, 1012);
    server = await startServer(args);
    assert.equal(server.http, opts.url, 'the same address');

    // B's first write waits for B's reconnect; the history continues at revision 5.
    assert.deepEqual(await rb.put('k1', 'changed'), { rev: 5 });
    await rb.delete('k2');
    await rb.txn({ ops: [{ type: 'put', key: 'k5', value: 5 }, { type: 'delete', key: 'k3' }] });
    const { rev } = await rb.put('k4', { deep: [4] });
    assert.equal(rev, 8);
    assert.equal(a.status, 'reconnecting');
    ctl.block(false);

    await until(() => syncs.length === 2, 'the second sync');
    assert.deepEqual(
      syncs.map((s) => [s.kind, s.epoch]),
      [['initial', epoch], ['resumed', epoch]],
      'resumed by replay, not resync; the epoch is unchanged',
    );
    assert.equal(syncs[1]!.changes, 5);
    assert.equal(wa.epoch, epoch);
    assert.equal(wa.rev, rev);
    assert.deepEqual(brief(seen), [
      'put k1=1 live',
      'put k2=2 live',
      'put k3=3 live',
      'put k4=4 live',
      'put k1="changed" replay',
      'delete k2=undefined replay',
      'put k5=5 replay',
      'delete k3=undefined replay',
      'put k4={"deep":[4]} replay',
    ]);
    assert.deepEqual(seen.map((c) => c.rev), [1, 2, 3, 4, 5, 6, 7, 7, 8], 'exactly the missed revisions, each once, in order');
    const ids = seen.map((c) => `${c.key}@${c.rev}`);
    assert.equal(new Set(ids).size, ids.length, 'no duplicate');

    // The view equals the server's state (a fresh snapshot) — same epoch, same revision.
    const fresh = b.room('restart').watch();
    await fresh.ready();
    assert.deepEqual(wa.entries(), fresh.entries());
    assert.deepEqual([fresh.epoch, fresh.rev], [epoch, rev]);
    // Live again.
    await rb.put('k9', 9);
    await until(() => wa.has('k9'));
    assert.equal(seen.at(-1)!.cause, 'live');
  } finally {
    a.close();
    b.close();
    await server.stop();
  }
});

// Optimistic writes, the offline queue, and writes whose reply was lost (resolved exactly once by their wid).

test('integration: an offline write shows at once in its own client only, and is confirmed after the reconnect; a conflicting one rolls back to the other client\'s value', async () => {
  const ctl = controlledWebSocket();
  const a = client({ WebSocket: ctl.WebSocket });
  const b = client();
  const room = roomName('offline:');
  const [wa, wb] = [a.room(room).watch(), b.room(room).watch()];
  await Promise.all([wa.ready(), wb.ready()]);
  const { rev: r0 } = await b.room(room).put('x', 0);
  await until(() => wa.rev === r0);

  ctl.block(true);
  ctl.drop();
  await until(() => a.status === 'reconnecting');
  const rollbacks = record(a, 'rollback');
  const mine = a.room(room).put('k', 'offline', { ifModRev: 0 });
  const stale = a.room(room).put('x', 'A', { ifModRev: wa.entry('x')!.modRev });
  assert.deepEqual([wa.get('k'), wa.entry('k')!.pending, wa.get('x')], ['offline', true, 'A'], 'shown at once');
  await b.room(room).put('x', 'B', { ifModRev: r0, waitFor: wb }); // B wins x meanwhile
  assert.equal(wb.has('k'), false, 'pending state stays in its client');

  ctl.block(false);
  const { rev } = await mine;
  await assert.rejects(stale, ConflictError);
  assert.deepEqual(wa.entry('k'), { key: 'k', value: 'offline', createRev: rev, modRev: rev, version: 1, lease: false });
  assert.equal(wa.get('x'), 'B', 'rolled back to what the server holds');
  assert.deepEqual(rollbacks.map((r) => [r.keys, r.error.code]), [[['x'], 'conflict']]);
  await until(() => wb.get('k') === 'offline', 'B sees the confirmed write');
  assert.deepEqual(wb.entries(), wa.entries());
});

test('integration (wids): a write whose reply was lost, watched by its anonymous client, is sent again with its wid and applied once (anonymous clients are sent no ids: integration-auth has the confirmation by event)', async () => {
  const lossy = replyLosingWebSocket();
  const a = client({ WebSocket: lossy.WebSocket, url: srv.ws });
  const room = roomName('lost:');
  const w = a.room(room).watch();
  await w.ready();
  lossy.loseReplyTo('put');
  const { rev } = await a.room(room).put('k', 1, { ifModRev: 0 });
  const puts = lossy.sent.filter((m) => m.t === 'put');
  assert.equal(puts.length, 2, 'sent again');
  assert.equal(puts[1]!.wid, puts[0]!.wid, 'with the same wid');
  assert.equal(lossy.sent.filter((m) => m.t === 'connect').length, 2, 'the reply was lost with the socket');
  assert.deepEqual([w.get('k'), w.entry('k')!.modRev, w.entry('k')!.version, w.entry('k')!.pending], [1, rev, 1, undefined]);
});

test('integration (wids): a write whose reply was lost, with no watch of its key, is sent again with the same wid and applied once (dup: its original revision)', async () => {
  const lossy = replyLosingWebSocket();
  const a = client({ WebSocket: lossy.WebSocket, url: srv.ws });
  const room = roomName('lost:');
  await a.ready();
  lossy.loseReplyTo('put');
  const { rev } = await a.room(room).put('k', 'once');
  const puts = lossy.sent.filter((m) => m.t === 'put');
  assert.equal(puts.length, 2);
  assert.equal(puts[1]!.wid, puts[0]!.wid);
  assert.equal(puts[1]!.since, 0, 'no revision of the room seen before');
  const w = client().room(room).watch();
  await w.ready();
  assert.deepEqual([w.get('k'), w.entry('k')!.modRev, w.entry('k')!.version, w.rev], ['once', rev, 1, rev], 'applied once, at its original revision');
});

test('integration (wids): after a compaction, a write whose reply was lost is resolved without being applied twice', async () => {
  const lossy = replyLosingWebSocket();
  const a = client({ WebSocket: lossy.WebSocket, url: srv.ws });
  const b = client();
  const room = roomName('tiny:');
  const w = a.room(room).watch();
  await w.ready();
  lossy.block(true);
  lossy.loseReplyTo('put');
  const write = a.room(room).put('k', 'mine').then(
    (r) => r,
    (e: unknown) => e,
  );
  await until(() => a.status === 'reconnecting');
  for (let i = 0; i < 5; i++) await b.room(room).put(`other${i}`, i); // history of 3: the write's event is compacted
  lossy.block(false);
  const outcome = await write;
  // The server either still knew the wid (dup: the original revision) or could not tell
  // (outcome_unknown: the SDK read the key again); never applied twice.
  if (outcome instanceof OutcomeUnknownError) assert.deepEqual(outcome.observed?.map((e) => [e.key, e.value, e.version]), [['k', 'mine', 1]]);
  else assert.deepEqual(outcome, { rev: 1 });
  assert.equal(lossy.sent.filter((m) => m.t === 'put').length, 2, 'sent again once, never a third time');
  assert.deepEqual([w.get('k'), w.entry('k')!.version, w.entry('k')!.pending], ['mine', 1, undefined]);
  assert.equal(w.rev, 6);
});

// Filtered watches (`where`): the filtered snapshot, keys entering and
// leaving (on an update and on a delete), a resume after a dropped socket
// that replays the filtered view, the invalid_filter error, and writes the
// filter does not select, which settle.
const WHERE = 'value.mode == "duel" && value.players < value.max';
const kinds = (cs: ChangeEvent[]) => cs.map((c) => `${c.type} ${c.key} ${c.cause}`);
const game = (mode: string, players: number, max = 2) => ({ mode, players, max });

for (const [name, codec] of codecs) {
  test(`integration-filter (${name}): snapshot filtered; keys enter, leave on an update and on a delete; a resume replays the filtered view`, async () => {
    const room = roomName('filter:');
    const b = client();
    const rb = b.room(room);
    await rb.put('games/a', game('duel', 1));
    await rb.put('games/b', game('ffa', 1, 4));
    await rb.put('games/c', game('duel', 2)); // full
    await rb.put('other/x', game('duel', 1)); // not under the prefix

    const ctl = controlledWebSocket();
    const a = client({ WebSocket: ctl.WebSocket, codec });
    const w = a.room(room).watch('games/', { where: WHERE });
    const seen = record(w, 'change');
    const syncs = record(w, 'sync');
    await w.ready();
    assert.deepEqual(w.entries().map((e) => e.key), ['games/a']);

    await rb.put('games/c', game('duel', 1)); // a seat freed: enters
    await rb.put('games/a', game('duel', 2)); // full: leaves
    await rb.put('games/b', game('ffa', 2, 4)); // neither before nor after: nothing
    await rb.put('games/d', game('duel', 0));
    const { rev } = await rb.delete('games/d'); // selected, then deleted: leaves
    await until(() => w.rev === rev, 'the live events');
    assert.deepEqual(kinds(seen), ['put games/a initial', 'put games/c live', 'leave games/a live', 'put games/d live', 'leave games/d live']);
    const leftA = seen.find((c) => c.type === 'leave' && c.key === 'games/a')!;
    assert.deepEqual(leftA.prev, game('duel', 1), 'a leave carries the value the view held');
    assert.deepEqual(w.entries().map((e) => e.key), ['games/c']);

    // Offline: every kind of change once more; the resume replays them filtered.
    ctl.block(true);
    ctl.drop();
    await until(() => a.status === 'reconnecting', 'reconnecting');
    await rb.put('games/a', game('duel', 1)); // enters
    await rb.put('games/c', game('coop', 1)); // another mode: leaves
    await rb.put('games/e', game('ffa', 0)); // never selected
    await rb.put('games/f', game('duel', 0));
    const last = await rb.delete('games/f'); // enters and leaves within the replay
    ctl.block(false);
    await until(() => syncs.some((s) => s.kind === 'resumed'), 'resumed');
    assert.equal(w.rev, last.rev);
    assert.deepEqual(kinds(seen.slice(5)), ['put games/a replay', 'leave games/c replay', 'put games/f replay', 'leave games/f replay']);
    assert.deepEqual(w.entries().map((e) => [e.key, e.value]), [['games/a', game('duel', 1)]]);
    // The view equals a fresh filtered snapshot.
    const fresh = b.room(room).watch('games/', { where: WHERE });
    await fresh.ready();
    assert.deepEqual(fresh.entries().map((e) => [e.key, e.modRev]), w.entries().map((e) => [e.key, e.modRev]));
  });
}

test('integration-filter: a where that does not compile closes the watch with InvalidFilterError at its line and column', async () => {
  const a = client();
  const w = a.room(roomName('filter:')).watch('games/', { where: 'value.mode ==' });
  const err = await w.ready().then(() => assert.fail('ready resolved'), (e: unknown) => e);
  assert.ok(err instanceof InvalidFilterError, String(err));
  assert.equal(err.code, 'invalid_filter');
  assert.deepEqual([err.line, err.column], [1, 14]);
  assert.equal(w.status, 'closed');
  // A filter that is not a bool is refused too.
  const w2 = a.room(roomName('filter:')).watch('games/', { where: 'value.players + 1' });
  await assert.rejects(w2.ready(), InvalidFilterError);
});

test('integration-filter: an optimistic write the filter does not select settles at once (no event comes), with waitFor the filtered watch too; one it selects shows when the write resolves', async () => {
  const a = client();
  const room = a.room(roomName('filter:'));
  const w = room.watch('games/', { where: WHERE });
  await w.ready();
  const t0 = Date.now();
  const r1 = await room.put('games/x', game('coop', 1, 4), { waitFor: w });
  await room.put('games/x', game('coop', 2, 4)); // the filtered watch is the only watch of the key
  assert.ok(Date.now() - t0 < 2000, `took ${Date.now() - t0} ms: it waited for a progress mark`);
  assert.equal(w.has('games/x'), false);
  assert.equal(w.rev, 0, 'the filtered watch heard nothing of those writes (a fresh room)');
  assert.equal(a.pendingWrites, 0);

  // Selected: read your write through waitFor.
  const r2 = await room.put('games/y', game('duel', 1), { waitFor: w });
  assert.deepEqual([w.get('games/y'), w.entry('games/y')!.modRev, w.entry('games/y')!.pending], [game('duel', 1), r2.rev, undefined]);
  // In the view, written to leave it: it shows pending, then leaves at the write's revision.
  const p = room.put('games/y', game('duel', 2), { waitFor: w });
  assert.deepEqual([w.get('games/y'), w.entry('games/y')!.pending], [game('duel', 2), true]);
  const r3 = await p;
  assert.equal(w.rev, r3.rev);
  assert.equal(w.has('games/y'), false);
});

test('integration: a page whose Origin the server does not allow stops with an error naming --allow-origin (no reconnect loop)', async () => {
  class ForeignPage extends WebSocket {
    constructor(url: string, protocols: string[]) {
      super(url, protocols, { origin: 'http://localhost:5173' }); // a Vite dev server on another port
    }
  }
  const c = client({ WebSocket: ForeignPage });
  const err = await nextEvent(c, 'error');
  assert.match(err.message, /4502.*--allow-origin localhost:5173/);
  await until(() => c.status === 'disconnected', 'stopped, not retrying');
});
