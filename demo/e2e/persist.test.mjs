// The SDK's persistence in real Chromium (IndexedDB, Web Locks, the
// browser's offline/online events): a page of the SDK bundles that lists one
// room's keys, served to the browser by a route (so a reload works offline
// too), against a real server. No console error in any of them.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
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

test('persist: a reload while offline shows the kept view and the pending write at once, dials nothing, and sends the write once back online', async (tc) => {
  const room = roomName('e2e-offline:');
  await put(room, 'a', 1);
  const context = await browser.newContext();
  tc.after(() => context.close());
  await serve(context);
  const { page, errors } = await open(context, room);
  await status(page, 'connected');
  await page.locator('li[data-key=a]').waitFor();

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
