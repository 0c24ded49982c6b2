// Application listeners: an exception thrown by one never escapes into the
// SDK's timers (where it would be an uncaught exception that exits Node); it is
// reported as an `error` event, or on console.error when nobody listens to
// `error` (issue 13, defect 5).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, ListenerError } from '../dist/index.js';
import { FakeServer } from './support/fake-server.js';
import { record, sleep, until } from './support/util.js';

async function setup() {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, reconnect: { minDelayMs: 5, maxDelayMs: 20 } });
  const conn = await srv.nextConn();
  await conn.accept();
  await until(() => c.status === 'connected');
  return { srv, c, conn, done: async () => (c.close(), await srv.close()) };
}

/** Runs fn with uncaught exceptions and console.error recorded instead of failing the process. */
async function guarded(fn: (uncaught: unknown[], logged: unknown[][]) => Promise<void>) {
  const uncaught: unknown[] = [];
  const logged: unknown[][] = [];
  const onUncaught = (e: unknown) => uncaught.push(e);
  const saved = console.error;
  process.on('uncaughtException', onUncaught);
  console.error = (...a: unknown[]) => void logged.push(a);
  try {
    await fn(uncaught, logged);
    await sleep(30); // a rethrow from a timer would land here
  } finally {
    console.error = saved;
    process.off('uncaughtException', onUncaught);
  }
  assert.deepEqual(uncaught, [], 'no exception escaped into a timer');
}

test('listeners: a throwing change listener is reported as a ListenerError on the watch\'s error event; the others still run', async () => {
  const { conn, c, done } = await setup();
  try {
    await guarded(async (_u, logged) => {
      const w = c.room('r').watch();
      const boom = new Error('boom');
      w.on('change', () => {
        throw boom;
      });
      const seen = record(w, 'change');
      const errors = record(w, 'error');
      await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [{ key: 'a', value: 1, mod_rev: 1 }] });
      await until(() => errors.length === 1, 'error event');
      assert.equal(seen.length, 1, 'the next listener ran');
      assert.equal(w.get('a'), 1, 'the view was applied');
      assert.ok(errors[0] instanceof ListenerError);
      assert.equal((errors[0] as ListenerError).event, 'change');
      assert.equal((errors[0] as ListenerError).cause, boom);
      assert.equal(w.status, 'live', 'the watch goes on');
      assert.deepEqual(logged, []);
    });
  } finally {
    await done();
  }
});

test('listeners: with no error listener a throwing listener goes to console.error, not to an uncaught exception', async () => {
  const { conn, c, done } = await setup();
  try {
    await guarded(async (_u, logged) => {
      const w = c.room('r').watch();
      w.on('change', () => {
        throw new Error('boom');
      });
      c.on('status', () => {
        throw new Error('status boom');
      });
      await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [{ key: 'a', value: 1, mod_rev: 1 }] });
      await until(() => logged.length === 1, 'console.error');
      assert.match(String(logged[0]![0]), /"change" listener threw/);
      assert.equal((logged[0]![1] as Error).message, 'boom');
      // An error listener that throws is logged too (no loop).
      c.on('error', () => {
        throw new Error('error boom');
      });
      conn.terminate(); // status → reconnecting: its listener throws, reported to the error listener, which throws
      await until(() => logged.length === 2, 'console.error once more');
      assert.match(String(logged[1]![0]), /"error" listener threw/);
    });
  } finally {
    await done();
  }
});
