// The SDK's persistence in real Chromium (IndexedDB, Web Locks, the
// browser's offline/online events): a page of the SDK bundles that lists one
// room's keys, served to the browser by a route (so a reload works offline
// too), against a real server. No console error in any of them.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { CHROMIUM, CHROMIUM_ARGS, launch, startServer } from './support.mjs';
import { PAGE_ARGS, items, open as openAt, put as putAt, serve, shown, status } from './persist-page.mjs';

let srv, browser;
before(async () => {
  srv = await startServer();
  browser = await launch(PAGE_ARGS);
});
after(async () => {
  await browser?.close();
  await srv?.stop();
});

const open = (context, room, query) => openAt(context, srv.url, room, query);
const put = (room, key, value) => putAt(srv.url, room, key, value);
let rooms = 0;
const roomName = (p) => `${p}${process.pid}-${rooms++}`;

/** A page of a new context (closed with tc) on a new room holding a=1, connected and showing it. */
async function pageWithA(tc, prefix) {
  const room = roomName(prefix);
  await put(room, 'a', 1);
  const context = await browser.newContext();
  tc.after(() => context.close());
  await serve(context);
  const { page, errors } = await open(context, room);
  await status(page, 'connected');
  await page.locator('li[data-key=a]').waitFor();
  return { room, context, page, errors };
}

test('persist: a reload while offline shows the kept view and the pending write at once, dials nothing, and sends the write once back online', async (tc) => {
  const { room, context, page, errors } = await pageWithA(tc, 'e2e-offline:');

  await context.setOffline(true);
  await status(page, 'reconnecting'); // the offline event, not a probe
  await page.evaluate(() => void t.room.put('b', 2).catch(() => {})); // pending: not awaited
  await page.waitForFunction(() => t.client.pendingWrites === 1);
  await page.waitForTimeout(200); // kept (saveDelayMs 20)
  await page.reload();
  await page.locator('li[data-key=b][data-pending=true]').waitFor();
  assert.deepEqual(await shown(page), ['a=1', 'b=2 (pending)'], 'the kept view and the kept write, before any socket');
  assert.deepEqual(await page.evaluate(() => t.syncs), ['initial:cache']);
  await page.waitForTimeout(500);
  assert.equal(await page.evaluate(() => t.client.status), 'connecting', 'no dial while offline');

  await context.setOffline(false);
  await page.locator('li[data-key=b][data-pending=false]').waitFor();
  assert.deepEqual(await page.evaluate(() => t.syncs), ['initial:cache', 'resumed']);
  const b = (await items(srv.url, room)).find((i) => i.key === 'b');
  assert.deepEqual([b.value, b.version], [2, 1], 'written once');
  assert.deepEqual(errors, [], 'no console errors');
});

test('persist: a browser restart (persistent context closed and reopened) keeps the view and sends the offline write once; a conflict rolls back visibly', async () => {
  const room = roomName('e2e-restart:');
  await put(room, 'a', 1);
  const dir = mkdtempSync(join(tmpdir(), 'statecast-profile-'));
  const start = async () => {
    const context = await chromium.launchPersistentContext(dir, { executablePath: CHROMIUM, headless: true, args: [...CHROMIUM_ARGS, ...PAGE_ARGS] });
    await serve(context);
    return context;
  };
  let context;
  try {
    context = await start();
    let { page, errors } = await open(context, room);
    await status(page, 'connected');
    await context.setOffline(true);
    await status(page, 'reconnecting');
    await page.evaluate(() => {
      t.room.put('b', 'mine').catch(() => {});
      t.room.put('c', 'mine', { ifModRev: 0 }).catch(() => {}); // someone else writes c meanwhile
    });
    await page.waitForFunction(() => t.client.pendingWrites === 2);
    await page.waitForTimeout(200);
    assert.deepEqual(errors, []);
    await context.close();
    await put(room, 'c', 'theirs');

    context = await start();
    ({ page, errors } = await open(context, room));
    await page.locator('li[data-key=c]').filter({ hasText: 'theirs' }).waitFor();
    await page.locator('li[data-key=b][data-pending=false]').waitFor();
    assert.deepEqual(await shown(page), ['a=1', 'b="mine"', 'c="theirs"']);
    assert.deepEqual(await page.evaluate(() => t.rollbacks), ['c:conflict'], 'the conflict was rolled back visibly');
    const got = Object.fromEntries((await items(srv.url, room)).map((i) => [i.key, [i.value, i.version]]));
    assert.deepEqual(got, { a: [1, 1], b: ['mine', 1], c: ['theirs', 1] });
    assert.deepEqual(errors, [], 'no console errors');
  } finally {
    await context?.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('persist: a token of another subject sees nothing of the previous one\'s kept view and writes, which wait for their subject', async () => {
  const secret = 'e2e-persist-secret-0123456789abcdef0123';
  const auth = await startServer(['--jwt-hmac-secret', secret]);
  const b64 = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const jwt = (sub) => {
    const now = Math.floor(Date.now() / 1000);
    const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub, iat: now, exp: now + 600, statecast: { grants: [{ room: 'e2e-who:*', access: 'rw' }] } })}`;
    return `${body}.${createHmac('sha256', secret).update(body).digest('base64url')}`;
  };
  const context = await browser.newContext();
  try {
    await serve(context);
    const room = roomName('e2e-who:');
    const ann = await openAt(context, auth.url, room, `&token=${jwt('ann')}`);
    await status(ann.page, 'connected');
    await ann.page.evaluate(() => t.room.put('mine', 'ann\'s'));
    await context.setOffline(true);
    await status(ann.page, 'reconnecting');
    await ann.page.evaluate(() => void t.room.put('queued', 'ann\'s').catch(() => {}));
    await ann.page.waitForTimeout(200); // kept
    await ann.page.close();
    await context.setOffline(false);

    const ben = await openAt(context, auth.url, room, `&token=${jwt('ben')}`);
    await status(ben.page, 'connected');
    await ben.page.locator('li[data-key=mine]').waitFor(); // the room, from the server
    assert.deepEqual(await ben.page.evaluate(() => [t.syncs, t.client.pendingWrites]), [['initial:initial'], 0], 'no kept view, no queue of ann\'s');
    assert.deepEqual(await shown(ben.page), ['mine="ann\'s"'], 'ann\'s queued write was not sent under ben');
    await ben.page.close();

    const again = await openAt(context, auth.url, room, `&token=${jwt('ann')}`);
    await again.page.locator('li[data-key=queued][data-pending=false]').waitFor();
    assert.equal(await again.page.evaluate(() => t.w.get('queued')), 'ann\'s', 'sent by ann\'s next page');
    assert.deepEqual([...ann.errors, ...ben.errors, ...again.errors], [], 'no console errors');
  } finally {
    await context.close();
    await auth.stop();
  }
});

test('persist: site data cleared under the page (the browser closes its IndexedDB): the next pending write is kept again and survives an offline reload', async (tc) => {
  const { context, page, errors } = await pageWithA(tc, 'e2e-cleared:');
  await page.waitForTimeout(200); // the view kept

  const cdp = await context.newCDPSession(page);
  await cdp.send('Storage.clearDataForOrigin', { origin: new URL(srv.url).origin, storageTypes: 'indexeddb' });
  await cdp.detach();
  await context.setOffline(true);
  await status(page, 'reconnecting');
  await page.evaluate(() => void t.room.put('b', 2).catch(() => {}));
  await page.waitForFunction(() => t.client.pendingWrites === 1);
  await page.waitForTimeout(300); // kept (saveDelayMs 20), on a connection opened again
  await page.reload();
  await page.locator('li[data-key=b][data-pending=true]').waitFor();
  assert.deepEqual(await shown(page), ['a=1', 'b=2 (pending)'], 'the view and the write kept after the clearing');

  await context.setOffline(false);
  await page.locator('li[data-key=b][data-pending=false]').waitFor();
  assert.deepEqual(await page.evaluate(() => t.persistErrors), []);
  assert.deepEqual(errors, [], 'no console errors');
});
