// Offline is offline: against a scripted fake server and fake window events,
// a client does not dial while navigator.onLine is false, dials at once on
// `online`, and drops its socket on `offline` without waiting for a probe.
import { afterEach, beforeEach, test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, type Client } from '../dist/index.js';
import { FakeServer } from './support/fake-server.js';
import { fakeWindow, sleep, until } from './support/util.js';

let srv: FakeServer;
let win: ReturnType<typeof fakeWindow>;
const clients: Client[] = [];
const g = globalThis as any;
const saved = Object.getOwnPropertyDescriptor(g, 'navigator');
/** Sets what navigator.onLine says (the browser's view of the network). */
const online = (on: boolean) => Object.defineProperty(g, 'navigator', { value: { onLine: on }, configurable: true, writable: true });

beforeEach(async () => {
  srv = await FakeServer.start();
  win = fakeWindow();
});
afterEach(async () => {
  clients.splice(0).forEach((c) => c.close());
  win.restore();
  if (saved) Object.defineProperty(g, 'navigator', saved);
  else delete g.navigator;
  await srv.close();
});

function client(): Client {
  const c = createClient({ url: srv.url, WebSocket, sessionStore: false, reconnect: { minDelayMs: 5, maxDelayMs: 20 }, probeTimeoutMs: 60_000 });
  clients.push(c);
  return c;
}

test('offline: no dial while navigator.onLine is false; `online` dials at once', async () => {
  online(false);
  const c = client();
  await sleep(150);
  assert.equal(srv.conns.length, 0, 'nothing dialed while offline');
  assert.equal(c.status, 'connecting');
  online(true);
  win.fire('online');
  const conn = await srv.nextConn(1000);
  await conn.accept();
  await until(() => c.status === 'connected', 'connected');
});

test('offline: the `offline` event drops the socket at once (no probe wait), and nothing is dialed until `online`', async () => {
  const c = client();
  await (await srv.nextConn()).accept();
  await until(() => c.status === 'connected', 'connected');
  online(false);
  const t0 = Date.now();
  win.fire('offline');
  assert.equal(c.status, 'reconnecting', 'dropped synchronously');
  assert.ok(Date.now() - t0 < 1000);
  await sleep(150); // many backoff delays
  assert.equal(srv.conns.length, 1, 'no dial while offline');
  online(true);
  win.fire('online');
  await (await srv.nextConn(1000)).accept();
  await until(() => c.status === 'connected', 'reconnected');
});
