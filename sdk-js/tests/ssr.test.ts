// Construction is side-effect free and safe during server rendering in Node:
// no WebSocket global and no document base for a relative URL are errors only
// when connecting (an `error` event, `ready()` rejects), never at
// construction (issue 13, defect 6).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, StatecastError } from '../dist/index.js';
import { record, until } from './support/util.js';

/** Runs fn with no global WebSocket (as in Node 20, or an SSR runtime). */
async function withoutWebSocket(fn: () => Promise<void>) {
  const g = globalThis as any;
  const saved = Object.getOwnPropertyDescriptor(g, 'WebSocket');
  delete g.WebSocket;
  try {
    await fn();
  } finally {
    if (saved) Object.defineProperty(g, 'WebSocket', saved);
  }
}

test('ssr: with autoConnect false, no WebSocket global and a relative URL, construction does not throw and does nothing', async () => {
  await withoutWebSocket(async () => {
    const c = createClient({ url: '/v1/ws', autoConnect: false });
    assert.equal(c.status, 'disconnected');
    assert.equal(c.url, '/v1/ws', 'kept as given until it can be resolved');
    const w = c.room('lobby:eu').watch('games/');
    assert.equal(w.status, 'pending');
    assert.deepEqual(w.entries(), []);
    const p = c.room('lobby:eu').presence();
    assert.equal(p.others.size, 0);
    c.close();
  });
});

test('ssr: connecting without a WebSocket is an error event (and ready() rejects), not a throw', async () => {
  await withoutWebSocket(async () => {
    const c = createClient({ url: 'ws://127.0.0.1:9/v1/ws', autoConnect: false });
    const errors = record(c, 'error');
    assert.doesNotThrow(() => c.connect());
    const ready = assert.rejects(c.ready(), { name: 'NotConnectedError' });
    await until(() => errors.length === 1, 'error event');
    await ready;
    assert.ok(errors[0] instanceof StatecastError);
    assert.equal(errors[0]!.code, 'invalid_option');
    assert.match(errors[0]!.message, /WebSocket/);
    assert.equal(c.status, 'disconnected');
  });
});

test('ssr: a relative URL outside a browser is an error only when connecting (autoConnect: an error event after construction)', async () => {
  const c = createClient({ url: '/v1/ws', WebSocket });
  const errors = record(c, 'error');
  await until(() => errors.length === 1, 'error event');
  assert.equal(errors[0]!.code, 'invalid_option');
  assert.match(errors[0]!.message, /relative/);
  assert.equal(c.status, 'disconnected');
  await assert.rejects(c.room('r').put('k', 1), { name: 'NotConnectedError' });
});
