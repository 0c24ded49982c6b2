// A page reload keeps the client's id and session (sessionStore), against a
// scripted fake server, a fake storage and fake window events: written on
// pagehide only, taken (and removed) at startup, never left in the store of
// a running page, so a duplicated tab starts a session of its own.
import { afterEach, beforeEach, test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, type Client, type ClientOptions } from '../dist/index.js';
import { FakeServer, type FakeConn } from './support/fake-server.js';
import { FakeStorage, fakeWindow, sleep, until } from './support/util.js';

let srv: FakeServer;
let win: ReturnType<typeof fakeWindow>;
const clients: Client[] = [];
beforeEach(async () => {
  srv = await FakeServer.start();
  win = fakeWindow();
});
afterEach(async () => {
  clients.splice(0).forEach((c) => c.close());
  win.restore();
  await srv.close();
});

/** A page's client on the fake server: connects and is answered `connected` with `fields`. */
async function page(store: FakeStorage | false, fields: Record<string, unknown> = {}, opts: Partial<ClientOptions> = {}) {
  const c = createClient({ url: srv.url, WebSocket, sessionStore: store, reconnect: { minDelayMs: 5, maxDelayMs: 20 }, ...opts });
  clients.push(c);
  const conn: FakeConn = await srv.nextConn();
  const hello = await conn.accept(fields);
  await until(() => c.status === 'connected');
  return { c, conn, hello };
}
const key = () => 'statecast:' + srv.url;

test('reload: pagehide leaves {clientId, session, resume}; the next page takes it, removes it at once and resumes with it', async () => {
  const store = new FakeStorage();
  const first = await page(store, { session: 's_A', resume: 'r_1' });
  assert.deepEqual([first.hello.session, first.hello.resume], [undefined, undefined], 'nothing to resume on a first load');
  assert.equal(store.m.size, 0, 'a running page leaves nothing in the store');
  win.fire('pagehide');
  assert.deepEqual(JSON.parse(store.getItem(key())!), { clientId: first.c.clientId, session: 's_A', resume: 'r_1' });
  first.c.close(); // the old page is gone

  const second = await page(store, { session: 's_A', resume: 'r_2', resumed: true });
  assert.equal(store.m.size, 0, 'taken and removed at startup');
  assert.deepEqual([second.hello.session, second.hello.resume], ['s_A', 'r_1']);
  assert.equal(second.c.clientId, first.c.clientId, 'the same presence id');
  assert.equal(second.c.session?.resumed, true);
  // A second reload presents the secret of the latest connected.
  win.fire('pagehide');
  assert.deepEqual(JSON.parse(store.getItem(key())!), { clientId: first.c.clientId, session: 's_A', resume: 'r_2' });
});

test('reload: a duplicated tab (a copy of the running tab\'s store) neither finds nor takes over the session', async () => {
  const store = new FakeStorage();
  const orig = await page(store, { session: 's_A', resume: 'r_1' });
  win.fire('pagehide');
  orig.c.close();
  const reloaded = await page(store, { session: 's_A', resume: 'r_2', resumed: true });
  // The user duplicates the reloaded, running tab: its store is copied now.
  const dup = await page(store.copy(), { session: 's_B', resume: 'r_9' });
  assert.deepEqual([dup.hello.session, dup.hello.resume], [undefined, undefined], 'the duplicate starts its own session');
  assert.notEqual(dup.c.clientId, reloaded.c.clientId, 'and has its own presence id');
  assert.equal(reloaded.conn.closed, false);
});

test('reload: a refused resume (resumed:false) goes on with the new session, and the next pagehide keeps that one', async () => {
  const store = new FakeStorage();
  store.setItem(key(), JSON.stringify({ clientId: 'me', session: 's_old', resume: 'r_old' }));
  const p = await page(store, { session: 's_new', resume: 'r_5', resumed: false });
  assert.deepEqual([p.hello.session, p.hello.resume], ['s_old', 'r_old']);
  assert.equal(p.c.clientId, 'me');
  assert.equal(p.c.session?.session, 's_new');
  win.fire('pagehide');
  assert.deepEqual(JSON.parse(store.getItem(key())!), { clientId: 'me', session: 's_new', resume: 'r_5' });
});

test('reload: beforeunload (the fallback) saves, and takes it back when the page runs on (unload cancelled); pageshow takes it back', async () => {
  const store = new FakeStorage();
  await page(store, { session: 's_A', resume: 'r_1' });
  win.fire('beforeunload');
  assert.ok(store.getItem(key()), 'saved for an unload');
  await until(() => store.m.size === 0, 'the running page took it back');
  win.fire('pagehide');
  win.fire('pageshow'); // back from the back/forward cache
  assert.equal(store.m.size, 0);
});

test('reload: nothing is kept after close(), with sessionStore: false, or in another server\'s key; an option clientId wins', async () => {
  const store = new FakeStorage();
  const closed = await page(store);
  closed.c.close();
  win.fire('pagehide');
  assert.equal(store.m.size, 0, 'a closed client leaves nothing');

  const off = await page(false, { session: 's_X' });
  win.fire('pagehide');
  assert.equal(store.m.size, 0);
  off.c.close();

  store.setItem('statecast:ws://elsewhere/v1/ws', JSON.stringify({ clientId: 'other', session: 's_O', resume: 'r_O' }));
  const p = await page(store, {}, { clientId: 'fixed', sessionKey: 'mine' });
  assert.equal(p.c.clientId, 'fixed');
  assert.equal(p.hello.session, undefined, 'another key\'s session is not ours');
  win.fire('pagehide');
  assert.deepEqual(JSON.parse(store.getItem('mine')!).clientId, 'fixed');
  assert.ok(store.getItem('statecast:ws://elsewhere/v1/ws'), 'left alone');
});

test('reload: a store that throws or holds garbage is ignored: a random id, a new session, no error', async () => {
  const bad = new FakeStorage();
  bad.setItem(key(), '{not json');
  const p = await page(bad);
  assert.match(p.c.clientId, /^c[0-9a-z]+$/);
  assert.equal(p.hello.session, undefined);
  bad.fail = true;
  const q = await page(bad);
  win.fire('pagehide');
  win.fire('pageshow');
  assert.equal(q.c.status, 'connected');
});

test('reload: without a browser document (Node, SSR) the default keeps nothing and construction does not throw', async () => {
  win.restore();
  const g = globalThis as any;
  const ss = new FakeStorage();
  ss.setItem('statecast:wss://example.com/v1/ws', JSON.stringify({ clientId: 'kept', session: 's', resume: 'r' }));
  g.sessionStorage = ss; // a sessionStorage global alone (Deno, Node's --experimental-webstorage) is not a page
  try {
    const c = createClient({ url: 'https://example.com', WebSocket, autoConnect: false });
    assert.notEqual(c.clientId, 'kept');
    assert.equal(ss.m.size, 1, 'not touched');
    g.document = {}; // a browser page: sessionStorage is the default store
    const d = createClient({ url: 'https://example.com', WebSocket, autoConnect: false });
    assert.equal(d.clientId, 'kept');
    assert.equal(ss.m.size, 0);
  } finally {
    delete g.sessionStorage;
    delete g.document;
    win = fakeWindow();
  }
  await sleep(0);
});
