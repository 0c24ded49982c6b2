import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { backoffDelay, createClient, type DisconnectedEvent } from '../dist/index.js';
import { FakeServer } from './support/fake-server.js';
import { FakeClock, until } from './support/util.js';

test('backoff: full jitter, exponential, capped', () => {
  const half = () => 0.5;
  assert.deepEqual(
    [0, 1, 2, 3, 4, 5, 6, 40].map((n) => backoffDelay(n, 100, 2000, half)),
    [50, 100, 200, 400, 800, 1000, 1000, 1000],
  );
  assert.equal(backoffDelay(3, 100, 2000, () => 0), 0);
  assert.equal(backoffDelay(3, 100, 2000, () => 0.999999), 799);
});

test('backoff: the client waits the jittered delays between failed attempts, from its injected clock and random', async () => {
  const srv = await FakeServer.start();
  const clock = new FakeClock();
  const c = createClient({ url: srv.url, WebSocket, clock, random: () => 0.5, reconnect: { minDelayMs: 100, maxDelayMs: 1000 }, autoConnect: false });
  const closes: DisconnectedEvent[] = [];
  c.on('disconnected', (e) => closes.push(e));
  try {
    c.connect();
    for (let i = 0; i < 6; i++) {
      const conn = await srv.nextConn();
      conn.close(1011, 'boom');
      await until(() => closes.length === i + 1, 'disconnected');
      assert.equal(c.status, 'connecting');
      // Nothing happens until the clock reaches the delay.
      clock.advance(closes[i]!.retryInMs! - 1);
      assert.equal(srv.conns.length, i + 1);
      clock.advance(1);
    }
    assert.deepEqual(closes.map((e) => e.retryInMs), [50, 100, 200, 400, 500, 500]);
    assert.deepEqual(closes.map((e) => e.action), Array(6).fill('backoff'));
    // A successful connection resets the ladder.
    const conn = await srv.nextConn();
    await conn.accept();
    await until(() => c.status === 'connected', 'connected');
    conn.close(1011);
    await until(() => closes.length === 7, 'disconnected');
    assert.equal(closes[6]!.retryInMs, 50);
    assert.equal(c.status, 'reconnecting');
  } finally {
    c.close();
    await srv.close();
  }
});
