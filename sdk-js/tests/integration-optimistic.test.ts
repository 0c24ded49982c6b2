// Optimistic writes, the offline queue and write ids against the real
// server: an offline write confirmed after the reconnect, a conflicting one
// rolled back, and writes whose reply was lost resolved exactly once.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, ConflictError, OutcomeUnknownError, type Client, type ClientOptions } from '../dist/index.js';
import { controlledWebSocket, replyLosingWebSocket, startServer, type Server } from './support/server.js';
import { record, until } from './support/util.js';

let srv: Server;
const clients: Client[] = [];

before(async () => {
  // Rooms named tiny:* keep 3 events of history, so a short absence already falls to a snapshot.
  srv = await startServer(['--history-class', 'tiny:=3']);
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

test('integration (wids): a write whose reply was lost is confirmed by its event in the replay, never sent again', async () => {
  const lossy = replyLosingWebSocket();
  const a = client({ WebSocket: lossy.WebSocket, url: srv.ws });
  const room = roomName('lost:');
  const w = a.room(room).watch();
  await w.ready();
  lossy.loseReplyTo('put');
  const { rev } = await a.room(room).put('k', 1, { ifModRev: 0 });
  assert.equal(lossy.sent.filter((m) => m.t === 'put').length, 1, 'not sent again');
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
