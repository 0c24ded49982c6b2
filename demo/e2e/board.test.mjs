// The board page (React, StrictMode, optimistic writes) in real Chromium:
// an offline edit shows at once as pending and is confirmed after the
// reconnect; an offline edit that lost a race is rolled back visibly and
// never shown to others; presence of both users with no console error.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildBoard } from '../scripts/build-board.mjs';
import { launch, reconnect, screenshot, startServer, status, TIMEOUT, withUsers } from './support.mjs';

let srv, browser;
// React's development build of the page: StrictMode's double render and mount, and React's warnings, happen only there.
const tmp = mkdtempSync(join(tmpdir(), 'statecast-board-dev-'));
const devBuild = join(tmp, 'board.js');

before(async () => {
  srv = await startServer(['--lease-grace', '1s']);
  browser = await launch();
  await buildBoard(devBuild, { dev: true });
});
after(async () => {
  await browser?.close();
  await srv?.stop();
  rmSync(tmp, { recursive: true, force: true });
});

const card = (page, title) => page.getByTestId('card').filter({ has: page.locator(`[data-testid=card-title][value="${title}"]`) });
const titles = (page) => page.getByTestId('card-title').evaluateAll((els) => els.map((e) => e.value));

/** Adds a card to the "todo" column; resolves once it is confirmed (no longer pending). */
async function addCard(page, title) {
  const input = page.getByTestId('new-card-todo');
  await input.fill(title);
  await input.press('Enter');
  await page.locator('[data-testid=card]:not([data-pending])').filter({ has: page.locator(`[value="${title}"]`) }).waitFor();
}

/** Renames the card at index i (commits on Enter). */
async function rename(page, i, title) {
  const input = page.getByTestId('card-title').nth(i);
  await input.fill(title);
  await input.press('Enter');
}

/** The prefixes of each client's watches of `room`, as the server's inspector lists them. */
async function watchesOn(room) {
  const { clients } = await (await fetch(`${srv.url}/v1/admin/inspect`)).json();
  return clients.map((c) => c.watches.filter((w) => w.room === room).map((w) => w.prefixes.join(' ')).sort()).filter((w) => w.length);
}

/** Runs check until it passes, for up to TIMEOUT (then fails with its last error). */
async function eventually(check) {
  for (const end = Date.now() + TIMEOUT; ; await new Promise((r) => setTimeout(r, 100))) {
    try {
      return await check();
    } catch (e) {
      if (Date.now() > end) throw e;
    }
  }
}

/**
 * Waits until the page's own writes (its presence, written once the board has
 * loaded) are saved and it shows `others` present: a socket cut before that
 * would leave the presence pending too, and the badge would count it.
 */
async function settled(page, ...others) {
  await page.getByTestId('pending').getByText('all saved').waitFor();
  for (const name of others) await page.getByTestId('here').getByTestId('person').filter({ hasText: name }).waitFor();
}

/** Records, in the page, every card title painted from now on (window.seenTitles). */
const recordTitles = (page) => page.evaluate(() => {
  window.seenTitles = new Set();
  const frame = () => {
    for (const e of document.querySelectorAll('[data-testid=card-title]')) window.seenTitles.add(e.value);
    requestAnimationFrame(frame);
  };
  frame();
});

test('an edit made offline shows at once as pending, and is confirmed and seen by A after the reconnect', async () => {
  await withUsers(browser, srv.url, '/board.html?room=board:e2e-offline', [['Ann'], ['Ben', { route: true }]], async (a, b) => {
    await addCard(a.page, 'Write the agenda');
    await card(b.page, 'Write the agenda').waitFor();
    await settled(b.page, 'Ann');
    await b.sw.cut();
    await status(b.page, 'reconnecting');
    await rename(b.page, 0, 'Write and send the agenda');
    const edited = card(b.page, 'Write and send the agenda');
    await edited.and(b.page.locator('[data-pending]')).getByText('saving when online…').waitFor({ timeout: 1000 });
    await b.page.getByTestId('pending').getByText('1 change saving…').waitFor();

    await reconnect(b);
    await status(b.page, 'connected');
    await edited.and(b.page.locator(':not([data-pending])')).getByText('Ben').waitFor();
    await b.page.getByTestId('pending').getByText('all saved').waitFor();
    await card(a.page, 'Write and send the agenda').getByText('Ben').waitFor();
    assert.deepEqual(await titles(a.page), ['Write and send the agenda']);
  });
});

test('an offline edit of a card A changed meanwhile is rolled back visibly on reconnect, and A never sees it', async () => {
  await withUsers(browser, srv.url, '/board.html?room=board:e2e-conflict', [['Ann'], ['Ben', { route: true }]], async (a, b) => {
    await addCard(a.page, 'Book a room');
    await card(b.page, 'Book a room').waitFor();
    await settled(b.page, 'Ann');
    await recordTitles(a.page);
    await b.sw.cut();
    await status(b.page, 'reconnecting');
    await rename(b.page, 0, 'Book the big room');
    await card(b.page, 'Book the big room').and(b.page.locator('[data-pending]')).waitFor({ timeout: 1000 });
    await rename(a.page, 0, 'Book the small room');
    await card(a.page, 'Book the small room').getByText('Ann').waitFor();

    await reconnect(b);
    const notice = b.page.getByTestId('rollback');
    await notice.getByText('Undone: your change to “Book the big room”. Ann changed this card meanwhile; it shows their version.').waitFor();
    await card(b.page, 'Book the small room').and(b.page.locator(':not([data-pending])')).waitFor();
    assert.deepEqual(await titles(b.page), ['Book the small room']);
    await b.page.getByTestId('pending').getByText('all saved').waitFor();
    assert.deepEqual(await a.page.evaluate(() => [...window.seenTitles]), ['Book a room', 'Book the small room'], 'what A ever showed');
    await addCard(a.page, 'Send the invitations');
    await card(b.page, 'Send the invitations').waitFor();
    await screenshot(b.page, 'board');
    await notice.getByRole('button', { name: 'Dismiss' }).click();
    await notice.waitFor({ state: 'detached' });
  });
});

test('the page in React development mode (StrictMode) loads with no console error, shows both users present, and moves and deletes cards', async () => {
  const logged = [];
  let served = 0;
  await withUsers(browser, srv.url, '/board.html?room=board:e2e-here', [['Ann'], ['Ben']], async (a, b) => {
    for (const u of [a, b]) {
      u.page.on('console', (m) => ['error', 'warning'].includes(m.type()) && logged.push(m.text()));
      await u.page.route('**/app/board.js', (r) => (served++, r.fulfill({ path: devBuild, contentType: 'text/javascript' })));
      await u.page.reload();
      await status(u.page, 'connected');
    }
    assert.equal(served, 2, 'both pages run the development build');
    for (const [u, other] of [[a, 'Ben'], [b, 'Ann']]) {
      const here = u.page.getByTestId('here');
      await here.getByTestId('person').filter({ hasText: other }).waitFor();
      await here.getByTestId('person').nth(2).waitFor({ state: 'detached' }); // A's presence before the reload resumes, or ends
      assert.equal(await here.getByTestId('person').count(), 2);
    }
    await addCard(a.page, 'Ship it');
    await card(a.page, 'Ship it').getByRole('button', { name: 'Move right' }).click();
    await card(b.page, 'Ship it').and(b.page.locator('[data-testid=column-doing] *')).waitFor();
    await card(b.page, 'Ship it').getByRole('button', { name: 'Delete' }).click();
    await a.page.getByTestId('card').waitFor({ state: 'detached' });
    // StrictMode mounted every hook twice: the server holds one watch of the cards and one of presence per page, none leaked.
    const one = [['board/cards/', 'presence/'], ['board/cards/', 'presence/']];
    await eventually(async () => assert.deepEqual(await watchesOn('board:e2e-here'), one));
  });
  assert.deepEqual(logged, [], 'console errors and warnings');
});
