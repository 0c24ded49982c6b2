// Tabs sharing one connection (`persist({ tabs })`) against the real
// server: clients of one process stand for the tabs of one browser, with
// fake Web Locks and BroadcastChannel (tests/support/tabs.ts). The leader's
// socket is the only one; a write of one tab shows in the other at once;
// when the leader closes the next tab takes over, resumes, and its write
// whose reply was lost lands once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import type { ChangeEvent, WebSocketConstructor } from '../dist/index.js';
import { memoryStorage, persist } from '../dist/persist.js';
import { useServer } from './support/server.js';
import { Browser, type Tab } from './support/tabs.js';
import { record, until } from './support/util.js';

const t = useServer();
const { client, roomName } = t;
/** A tab's client: its own storage (the views are not the point here), the tab's locks and channels. */
const inTab = (tab: Tab) => client({ persist: persist({ storage: memoryStorage(), saveDelayMs: 5, tabs: tab.tabs }) });
const brief = (cs: ChangeEvent[]) => cs.map((c) => `${c.type} ${c.key}=${JSON.stringify(c.value)}${c.entry?.pending ? ' pending' : ''} ${c.cause}`);
const WS = WebSocket as unknown as WebSocketConstructor;
/** The server's open WebSocket connections (its metrics). */
async function connections(): Promise<number> {
  const text = await (await fetch(`${t.srv.http}/metrics`)).text();
  return Number(/^statecast_connections (\d+)/m.exec(text)?.[1]);
}

test('tabs: two tabs share one socket; a write of one shows in the other at once as pending, then confirmed; a failed one rolls back there too', async () => {
  const room = roomName('tabs-share:');
  const browser = new Browser();
  const [ta, tb] = [browser.tab(WS), browser.tab(WS)];
  const a = inTab(ta);
  const va = a.room(room).watch();
  await va.ready();
  const b = inTab(tb);
  const vb = b.room(room).watch();
  await vb.ready();
  assert.deepEqual([ta.sockets.length, tb.sockets.length], [1, 0], 'only the leader (the first tab) opened a socket');
  assert.equal(await connections(), 1, 'the server sees one connection');
  assert.equal(a.session?.session, b.session?.session, 'one session');

  const seen = record(va, 'change');
  const { rev } = await b.room(room).put('k', 1);
  await until(() => va.entry('k')?.pending === undefined, 'then confirmed');
  assert.equal(va.entry('k')!.modRev, rev);
  assert.deepEqual(brief(seen), ['put k=1 pending local', 'put k=1 live']);

  const failed = b.room(room).put('k', 2, { ifModRev: 7 }).catch((e) => e.code);
  assert.equal(await failed, 'conflict');
  await until(() => va.get('k') === 1, 'rolled back in the other tab');
  assert.deepEqual(brief(seen.slice(2)), ['put k=2 pending local', 'put k=1 rollback']);
  assert.deepEqual(vb.entries(), va.entries());
  ta.kill();
  tb.kill();
});

test('tabs: the leader closes; the next tab takes over, resumes its watch, gets later writes, and its write whose reply was lost lands once', async () => {
  const room = roomName('tabs-handover:');
  const browser = new Browser();
  const [ta, tb] = [browser.tab(WS), browser.tab(WS)];
  const a = inTab(ta);
  const b = inTab(tb);
  const vb = b.room(room).watch();
  await Promise.all([a.room(room).watch().ready(), vb.ready()]);
  const other = client();
  const rb = b.room(room);
  const syncs = record(vb, 'sync');

  ta.hold = true; // the leader's socket hears nothing more: the write's reply is lost with it
  const put = rb.put('x', 'b');
  await until(async () => (await fetch(`${t.srv.http}/v1/rooms/${encodeURIComponent(room)}/kv/x`)).status === 200, 'the write committed');
  await other.room(room).put('y', 1); // while no tab hears: a replay for the next leader
  ta.kill();
  a.close();

  const { rev } = await put;
  assert.equal(tb.sockets.length, 1, 'the next tab opened the socket');
  await until(() => vb.get('y') === 1, 'y replayed');
  assert.deepEqual(syncs.map((s) => s.kind), ['resumed'], 'resumed from its revision, no snapshot');
  await other.room(room).put('z', 2);
  await until(() => vb.get('z') === 2, 'a later write of another client');
  const x = await (await fetch(`${t.srv.http}/v1/rooms/${encodeURIComponent(room)}/kv/x`)).json();
  assert.deepEqual([x.value, x.version, x.mod_rev], ['b', 1, rev], 'applied once, at the revision its promise gave');
  tb.kill();
});
