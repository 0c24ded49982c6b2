// Tabs sharing one connection (`persist({ tabs: true })`) in real Chromium:
// two pages of one origin in one context (Web Locks, BroadcastChannel),
// against a real server. One WebSocket (the server's metrics and the pages
// agree); a write of one tab shows in the other as pending at once, then
// confirmed; when the leader tab closes with the other's write in flight (its
// reply held back), the other takes over, resumes, gets a third client's
// writes, and its write lands once. No console errors.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { launch, socketSwitch, startServer } from './support.mjs';
import { PAGE_ARGS, items, open as openAt, put as putAt, serve, status } from './persist-page.mjs';

let srv, browser;
before(async () => {
  srv = await startServer();
  browser = await launch(PAGE_ARGS);
});
after(async () => {
  await browser?.close();
  await srv?.stop();
});

const open = (context, room, prepare) => openAt(context, srv.url, room, '&tabs', prepare);
const put = (room, key, value) => putAt(srv.url, room, key, value);
/** The server's open WebSocket connections (its metrics). */
const connections = async () => Number(/^statecast_connections (\d+)/m.exec(await (await fetch(`${srv.url}/metrics`)).text())?.[1]);
const item = async (room, key) => (await items(srv.url, room)).find((i) => i.key === key);

test('tabs: two tabs of one origin share one socket, see each other\'s pending writes, and the next tab takes over when the leader closes', async (tc) => {
  const room = `e2e-tabs:${process.pid}`;
  await put(room, 'a', 1);
  const context = await browser.newContext();
  tc.after(() => context.close());
  await serve(context);
  let sw;
  const a = await open(context, room, async (page) => (sw = await socketSwitch(page)));
  await status(a.page, 'connected');
  const b = await open(context, room);
  await status(b.page, 'connected');
  await b.page.locator('li[data-key=a]').waitFor();
  assert.deepEqual([a.sockets.length, b.sockets.length], [1, 0], 'the leader (first tab) opened the only socket');
  assert.equal(await connections(), 1, 'the server sees one connection');

  await b.page.evaluate(() => t.room.put('k', 'b'));
  await a.page.locator('li[data-key=k][data-pending=false]').waitFor();
  assert.deepEqual(await a.page.evaluate(() => t.changes.filter((c) => c.startsWith('k='))), ['k="b" pending local', 'k="b" live'],
    'the other tab showed it pending at once, then confirmed');

  sw.hold(); // the leader hears nothing more: the reply to b's next write is lost with it
  await b.page.evaluate(() => void (t.x = t.room.put('x', 'b')));
  for (let i = 0; !(await item(room, 'x')); i++) {
    assert.ok(i < 200, 'x committed');
    await new Promise((r) => setTimeout(r, 10));
  }
  await put(room, 'y', 1); // missed by every tab: replayed to the next leader
  assert.equal(await b.page.evaluate(() => t.w.entry('x').pending), true, 'x pending in b');
  await a.page.close();

  await b.page.locator('li[data-key=y]').waitFor();
  await b.page.locator('li[data-key=x][data-pending=false]').waitFor();
  const rev = await b.page.evaluate(async () => (await t.x).rev);
  assert.equal(b.sockets.length, 1, 'b opened the socket');
  const syncs = await b.page.evaluate(() => t.syncs); // initial: the view the leader kept, or the server's
  assert.deepEqual([syncs.at(-1), syncs.some((s) => s.startsWith('resync'))], ['resumed', false], `resumed by replay: ${syncs}`);
  await put(room, 'z', 2);
  await b.page.locator('li[data-key=z]').waitFor();
  const x = await item(room, 'x');
  assert.deepEqual([x.value, x.version, x.mod_rev], ['b', 1, rev], 'x applied once');
  assert.equal(await connections(), 1);
  assert.deepEqual([...a.errors, ...b.errors], [], 'no console errors');
});
