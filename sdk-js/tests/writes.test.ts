// Writes against a scripted fake server: wire format, typed errors, what
// happens to writes in flight and queued across a dropped socket, timeouts,
// read-your-writes. Optimistic views, chains and the offline queue: optimistic.test.ts.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import {
  createClient,
  ConflictError,
  ForbiddenError,
  NotConnectedError,
  OutcomeUnknownError,
  RateLimitedError,
  StatecastError,
  TimeoutError,
  TooLargeError,
  UnauthorizedError,
  InvalidValueError,
  type ClientOptions,
} from '../dist/index.js';
import { FakeServer } from './support/fake-server.js';
import { sleep, until } from './support/util.js';

async function setup(opts: Partial<ClientOptions> = {}, accept = true) {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, reconnect: { minDelayMs: 5, maxDelayMs: 20 }, ...opts });
  const conn = await srv.nextConn();
  if (accept) {
    await conn.accept();
    await until(() => c.status === 'connected');
  }
  return { srv, c, conn, room: c.room('r'), done: async () => (c.close(), await srv.close()) };
}

test('writes: put, delete, conditional put and txn on the wire; resolve with the committed rev', async () => {
  const { conn, room, done } = await setup();
  try {
    const p1 = room.put('k', { a: 1 });
    const m1 = await conn.next('put');
    assert.deepEqual({ ...m1, id: 0, wid: '' }, { t: 'put', id: 0, room: 'r', key: 'k', value: { a: 1 }, lease: 'keep', wid: '' }, 'a put keeps the lease by default');
    assert.match(m1.wid, /^[!-~]{1,64}$/, 'a write id: 1..64 printable ASCII bytes');
    conn.send({ t: 'ok', id: m1.id, rev: 4 });
    assert.deepEqual(await p1, { rev: 4 });

    const p2 = room.put('k', 2, { ifModRev: 4, lease: 'session' });
    const m2 = await conn.next('put');
    assert.equal(m2.if_rev, 4);
    assert.equal(m2.lease, 'session');
    conn.send({ t: 'ok', id: m2.id, rev: 5 });
    await p2;

    const p3 = room.delete('k', { ifModRev: 0 });
    const m3 = await conn.next('del');
    assert.equal(m3.if_rev, 0, 'ifModRev 0 (must not exist) is sent, not dropped');
    conn.send({ t: 'ok', id: m3.id, rev: 5 });
    await p3;

    const p4 = room.txn({ if: [{ key: 'a', modRev: 3 }], ops: [{ type: 'put', key: 'a', value: 1, lease: 'session' }, { type: 'delete', key: 'b' }, { type: 'put', key: 'c', value: 2 }, { type: 'put', key: 'd', value: 3, lease: null }] });
    const m4 = await conn.next('txn');
    assert.deepEqual(m4.if, [{ key: 'a', mod_rev: 3 }]);
    assert.deepEqual(m4.ops, [{ type: 'put', key: 'a', value: 1, lease: 'session' }, { type: 'delete', key: 'b' }, { type: 'put', key: 'c', value: 2, lease: 'keep' }, { type: 'put', key: 'd', value: 3, lease: null }]);
    conn.send({ t: 'ok', id: m4.id, rev: 6 });
    assert.deepEqual(await p4, { rev: 6 });

    const p5 = room.put('k', 3, { lease: null });
    const m5 = await conn.next('put');
    assert.equal(m5.lease, null, 'lease null unbinds: sent as null, which the server reads as no lease');
    conn.send({ t: 'ok', id: m5.id, rev: 7 });
    await p5;
    const wids = [m1, m2, m3, m4, m5].map((m) => m.wid);
    assert.equal(new Set(wids).size, 5, 'every write has its own id');
    assert.ok([m1, m2, m3, m4, m5].every((m) => m.since === undefined), 'since only on a write sent again');

    await assert.rejects(room.put('k', undefined), InvalidValueError);
  } finally {
    await done();
  }
});

test('writes: server errors reject with typed errors', async () => {
  const { conn, room, done } = await setup();
  try {
    const cases: [string, Function, Record<string, unknown>?][] = [
      ['conflict', ConflictError, { key: 'k', mod_rev: 8, rev: 9 }],
      ['unauthorized', UnauthorizedError],
      ['forbidden', ForbiddenError],
      ['too_large', TooLargeError],
      ['rate_limited', RateLimitedError],
      ['outcome_unknown', OutcomeUnknownError],
      ['invalid_key', StatecastError],
    ];
    for (const [code, cls, extra] of cases) {
      const p = room.put('k', 1);
      const m = await conn.next('put');
      conn.send({ t: 'err', id: m.id, code, message: `msg ${code}`, ...extra });
      // The server cannot tell: the SDK reads the key as it is now.
      if (code === 'outcome_unknown') await conn.sub({ t: 'snapshot', epoch: 'e', rev: 9, reason: 'initial', items: [{ key: 'k', value: 7, create_rev: 3, mod_rev: 9, version: 2 }] });
      const err = await p.then(() => assert.fail('resolved'), (e: unknown) => e);
      assert.ok(err instanceof cls, `${code}: ${err}`);
      assert.equal((err as StatecastError).code, code);
      if (code === 'conflict') {
        const c = err as ConflictError;
        assert.deepEqual([c.key, c.modRev, c.rev], ['k', 8, 9]);
      }
      if (code === 'outcome_unknown') {
        assert.deepEqual((err as OutcomeUnknownError).observed?.map((e) => [e.key, e.value, e.modRev]), [['k', 7, 9]]);
        await conn.next('unsub'); // the watch that read it is closed
      }
    }
  } finally {
    await done();
  }
});

test('writes: a write in flight when the socket drops is sent again after the reconnect with the same wid and since; dup:true resolves it at the original rev', async () => {
  const { srv, c, conn, room, done } = await setup();
  try {
    const p = room.put('k', 1);
    const m = await conn.next('put');
    assert.equal(c.pendingWrites, 1);
    conn.terminate();
    const conn2 = await srv.nextConn();
    await conn2.accept();
    const again = await conn2.next('put');
    assert.deepEqual([again.wid, again.key, again.value], [m.wid, 'k', 1]);
    assert.equal(again.since, 0, 'no watch of the room: no revision seen');
    conn2.send({ t: 'ok', id: again.id, rev: 4, dup: true });
    assert.deepEqual(await p, { rev: 4 });
    assert.equal(c.pendingWrites, 0);
    assert.equal(conn2.all('put').length, 1);
  } finally {
    await done();
  }
});

test('writes: a write in flight when the client closes rejects OutcomeUnknown; one never sent NotConnected', async () => {
  const { c, conn, room, done } = await setup();
  try {
    const sent = room.put('k', 1);
    await conn.next('put');
    const after = room.put('k', 2); // waits for the first one's reply: never sent
    c.close();
    const err = await sent.then(() => assert.fail('resolved'), (e: unknown) => e);
    assert.ok(err instanceof OutcomeUnknownError && !(err instanceof TimeoutError));
    await assert.rejects(after, (e: any) => e.code === 'dependency_failed' && e.cause === err);
    assert.equal(conn.all('put').length, 1);
    assert.equal(c.pendingWrites, 0);
  } finally {
    await done();
  }
});

test('writes: issued while disconnected, a write waits for the connection and is sent once', async () => {
  const { srv, c, conn, room, done } = await setup();
  try {
    conn.terminate();
    await until(() => c.status === 'reconnecting');
    const p = room.put('k', 1);
    assert.equal(c.pendingWrites, 1);
    const conn2 = await srv.nextConn();
    await conn2.accept();
    const m = await conn2.next('put');
    conn2.send({ t: 'ok', id: m.id, rev: 2 });
    assert.deepEqual(await p, { rev: 2 });
  } finally {
    await done();
  }
});

test('writes: never connected, a write stays queued past requestTimeoutMs; close() rejects it NotConnected, never sent', async () => {
  const { c, conn, room, done } = await setup({ requestTimeoutMs: 50 }, false);
  try {
    await conn.next('connect'); // never answered
    let settled = false;
    const p = room.put('k', 1).finally(() => (settled = true));
    await sleep(120);
    assert.equal(settled, false, 'queued: the timeout counts from sending');
    assert.equal(c.pendingWrites, 1);
    c.close();
    await assert.rejects(p, NotConnectedError);
    assert.equal(conn.all('put').length, 0);
  } finally {
    await done();
  }
});

test('writes: sent without a reply within the timeout → TimeoutError, an OutcomeUnknownError; a late reply is ignored', async () => {
  const { conn, room, done } = await setup();
  try {
    const p = room.put('k', 1, { timeoutMs: 60 });
    const m = await conn.next('put');
    const err = await p.then(() => assert.fail('resolved'), (e: unknown) => e);
    assert.ok(err instanceof TimeoutError);
    assert.ok(err instanceof OutcomeUnknownError);
    conn.send({ t: 'ok', id: m.id, rev: 3 });
    await sleep(20);
  } finally {
    await done();
  }
});

test('writes: after close() a write rejects NotConnected at once; an oversized one TooLarge, unsent', async () => {
  const { c, conn, room, done } = await setup({ maxFrameBytes: 200 });
  try {
    await assert.rejects(room.put('k', 'x'.repeat(300)), TooLargeError);
    await assert.rejects(room.put('k', 'é'.repeat(90)), TooLargeError, 'measured in UTF-8 bytes');
    assert.equal(conn.all('put').length, 0);
    c.close();
    await assert.rejects(room.put('k', 1), NotConnectedError);
  } finally {
    await done();
  }
});

test('writes: read-your-writes resolves only once the watch applied the write\'s revision', async () => {
  const { conn, room, done } = await setup();
  try {
    const w = room.watch('k');
    const s = await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 3, reason: 'initial', items: [] });
    await w.ready();
    let resolved = false;
    const p = room.put('k', 'v', { waitFor: w }).then((r) => ((resolved = true), r));
    const m = await conn.next('put');
    conn.send({ t: 'ok', id: m.id, rev: 4 });
    await sleep(30);
    assert.equal(resolved, false, 'acknowledged, but the watch is still at rev 3');
    conn.send({ t: 'events', s: s.id, rev: 4, events: [{ type: 'put', key: 'k', value: 'v', create_rev: 4, mod_rev: 4, version: 1 }] });
    assert.deepEqual(await p, { rev: 4 });
    assert.equal(w.get('k'), 'v');
    await assert.rejects(room.put('k', 1, { waitFor: room.client.room('other').watch() }), TypeError);
  } finally {
    await done();
  }
});

test('writes: a value JSON cannot represent as given is refused, unsent, as a rejected promise with InvalidValueError (issue 13, defect 2)', async () => {
  const { conn, room, done } = await setup();
  try {
    const cyclic: any = { a: 1 };
    cyclic.self = cyclic;
    const bad: [string, () => Promise<unknown>][] = [
      ['bigint', () => room.put('k', 10n)],
      ['nested bigint', () => room.put('k', { n: [1, 2n] })],
      ['Map', () => room.put('k', new Map([['a', 1]]))],
      ['Set', () => room.put('k', { s: new Set([1]) })],
      ['Date', () => room.put('k', new Date(0))],
      ['class instance', () => room.put('k', new (class P { x = 1 })())],
      ['function', () => room.put('k', { f: () => 1 })],
      ['symbol', () => room.put('k', Symbol('s'))],
      ['NaN', () => room.put('k', NaN)],
      ['Infinity', () => room.put('k', { x: -Infinity })],
      ['undefined in an array', () => room.put('k', [1, undefined])],
      ['undefined', () => room.put('k', undefined)],
      ['cycle', () => room.put('k', cyclic)],
      ['txn value', () => room.txn({ ops: [{ type: 'put', key: 'a', value: 1n }] })],
      ['txn without ops', () => room.txn({} as any)],
    ];
    for (const [what, write] of bad) {
      let p: Promise<unknown> | undefined;
      assert.doesNotThrow(() => void (p = write()), `${what}: no synchronous throw`);
      await assert.rejects(p!, (e: any) => e instanceof InvalidValueError && e.code === 'invalid_value', what);
    }
    // What JSON keeps as it is goes through; an undefined property is left out, as in JSON.
    const ok = room.put('k', { a: [1, 'x', null, true, { b: -0.5 }], u: undefined, o: Object.create(null) });
    const m = await conn.next('put');
    assert.deepEqual(m.value, { a: [1, 'x', null, true, { b: -0.5 }], o: {} });
    conn.send({ t: 'ok', id: m.id, rev: 2 });
    await ok;
    assert.equal(conn.all('put').length + conn.all('txn').length, 1, 'nothing refused was sent');
  } finally {
    await done();
  }
});
