// The document view in real Chromium: live edits, a conflict shown and
// resolved, and a reader cut off while 50 edits happen (resumed by replay)
// or while more edits than the room's history holds happen (resynced from a
// snapshot). Rooms named doc:tiny* keep 10 events of history.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { launch, reconnect, screenshot, startServer, status, TIMEOUT, withUsers } from './support.mjs';

let srv, browser;

before(async () => {
  srv = await startServer(['--lease-grace', '1s', '--history-class', 'doc:tiny=10']);
  browser = await launch();
});
after(async () => {
  await browser?.close();
  await srv?.stop();
});

/** What the page shows: the title and each card's checkbox and text, in order. Runs in the page. */
function readView() {
  return {
    title: document.querySelector('[data-testid=title]').value,
    cards: [...document.querySelectorAll('[data-testid=card]')].map((li) =>
      `${li.querySelector('[data-testid=done]').checked ? '[x]' : '[ ]'} ${li.querySelector('[data-testid=card-text]').value}`),
  };
}
const view = (page) => page.evaluate(readView);

/** Waits until pred(view, arg) holds in the page. */
const until = (page, pred, arg) => page.waitForFunction(
  ([read, src, a]) => new Function('a', `return (${src})((${read})(), a)`)(a),
  [readView.toString(), pred.toString(), arg], { timeout: TIMEOUT });

async function addCards(page, texts) {
  const input = page.getByTestId('new-card');
  for (const t of texts) {
    await input.fill(t);
    await input.press('Enter');
  }
}

/** The badge's parts, e.g. { status: 'live', keys: '2 keys', rev: 'rev 2', sync: '' }. Runs in the page. */
function readBadge() {
  const part = (id) => document.querySelector(`[data-testid=badge] [data-testid=${id}]`)?.textContent ?? '';
  return { status: part('status'), keys: part('keys'), rev: part('rev'), sync: part('last-sync') };
}

/** Waits until the page's badge shows `want` (each part a string or a RegExp); returns what it shows, else fails with that. */
async function badgeShows(page, want) {
  const matches = (seen) => Object.entries(want).every(([k, w]) => (w instanceof RegExp ? w.test(seen[k]) : seen[k] === w));
  let seen;
  for (const end = Date.now() + TIMEOUT; Date.now() < end; await page.waitForTimeout(50)) {
    seen = await page.evaluate(readBadge);
    if (matches(seen)) return seen;
  }
  assert.fail(`the badge shows ${JSON.stringify(seen)}, not ${JSON.stringify(want, (k, v) => (v instanceof RegExp ? String(v) : v))}`);
}
const revOf = (badge) => Number(badge.rev.replace('rev ', ''));

async function setTitle(page, text) {
  const title = page.getByTestId('title');
  await title.fill(text);
  await title.press('Enter');
}

test('edits by A appear for B; a title both changed shows both versions and B picks', async () => {
  const room = '/doc.html?room=doc:e2e-live';
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben']], async (a, b) => {
    await b.page.getByTestId('editors').getByText('Ann').waitFor();
    await setTitle(a.page, 'Trip to Lisbon');
    await addCards(a.page, ['Book flights', 'Find a place to stay', 'Pack sunscreen']);
    await until(b.page, (v) => v.title === 'Trip to Lisbon' && v.cards.length === 3);
    await b.page.getByTestId('done').first().check();
    await until(a.page, (v) => v.cards[0] === '[x] Book flights');
    // Moving a card is one transaction over two keys; B sees the new order.
    await a.page.getByRole('button', { name: 'Move up' }).last().click();
    await until(b.page, (v) => v.cards.join('|') === '[x] Book flights|[ ] Pack sunscreen|[ ] Find a place to stay');

    // Both start editing the title; Ann saves first, then Ben.
    await b.page.getByTestId('title').click();
    await a.page.getByTestId('title').click();
    await b.page.getByTestId('editor').filter({ hasText: 'Ann' }).getByText('editing the title').waitFor();
    await setTitle(a.page, 'Lisbon in May');
    await b.page.getByText('Title edited by Ann').waitFor();
    await setTitle(b.page, 'Lisbon, long weekend');
    const conflict = b.page.getByTestId('conflict');
    await conflict.getByText('Ann changed the title meanwhile').waitFor();
    assert.equal(await conflict.getByTestId('theirs').textContent(), 'Lisbon in May');
    assert.equal(await conflict.getByTestId('mine').textContent(), 'Lisbon, long weekend');
    await b.page.getByTestId('editor').filter({ has: b.page.locator('.you') }).getByText('viewing').waitFor({ timeout: 1000 }); // B is done editing
    await a.page.getByTestId('card-text').nth(1).click(); // for the screenshot: Ann is editing a card
    await b.page.locator('.editing-by').waitFor();
    await b.page.locator('.flash').first().waitFor({ state: 'detached' });
    await screenshot(b.page, 'document');
    await conflict.getByRole('button', { name: 'Use mine' }).click();
    await conflict.waitFor({ state: 'detached' });
    await until(a.page, (v) => v.title === 'Lisbon, long weekend');
    assert.deepEqual(await view(b.page), await view(a.page));
  });
});

test('what B adds, edits and deletes while offline is shown at once, marked unsaved, and written when the connection returns', async () => {
  const room = '/doc.html?room=doc:e2e-offline';
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben', { route: true }]], async (a, b) => {
    const before = ['[ ] Book flights', '[ ] Pack', '[ ] Old idea'];
    await addCards(a.page, before.map((c) => c.slice(4)));
    await until(b.page, (v) => v.cards.length === 3);
    await b.sw.cut();
    await status(b.page, 'reconnecting');
    const moveOffline = 'Offline: cards can be moved again once the connection is back.';
    await b.page.getByRole('button', { name: 'Move down' }).first().click(); // a transaction over two versions: not queued
    await b.page.getByTestId('notice').filter({ hasText: moveOffline }).waitFor({ timeout: 1000 });
    await addCards(b.page, ['Buy sunscreen']);
    await b.page.getByTestId('done').first().check();
    await b.page.getByRole('button', { name: 'Delete' }).nth(2).click(); // Old idea
    await setTitle(b.page, 'Lisbon');
    const offline = { title: 'Lisbon', cards: ['[x] Book flights', '[ ] Pack', '[ ] Buy sunscreen'] };
    await until(b.page, (v, want) => JSON.stringify(v) === JSON.stringify(want), offline);
    assert.equal(await b.page.getByTestId('new-card').inputValue(), '', 'the input is free for the next card');
    assert.equal(await b.page.locator('[data-testid=card].unsaved').count(), 2, 'the new card and the checked one are marked unsaved');
    await b.page.getByTestId('unsaved').getByText(/^Offline: 4 changes not saved yet\./).waitFor();

    // Past the SDK's 10 s request timeout, when a write that waits for the connection fails.
    await b.page.waitForTimeout(10_500);
    assert.deepEqual(await view(b.page), offline, 'nothing was lost');
    assert.equal(await b.page.getByTestId('notice').textContent(), moveOffline, 'no error since');
    assert.deepEqual((await view(a.page)).cards, before);

    await reconnect(b);
    await until(a.page, (v, want) => JSON.stringify(v) === JSON.stringify(want), offline);
    await b.page.locator('.unsaved').first().waitFor({ state: 'detached' });
    assert.equal(await b.page.getByTestId('unsaved').textContent(), '');
    assert.deepEqual(await view(b.page), await view(a.page));
  });
});

test('a card deleted while B edits it is shown as a conflict, and B can restore it with what B typed', async () => {
  const room = '/doc.html?room=doc:e2e-deleted';
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben']], async (a, b) => {
    await addCards(a.page, ['Rent a car', 'Pack']);
    await until(b.page, (v) => v.cards.length === 2);
    await b.page.getByTestId('card-text').first().fill('Rent a car with GPS'); // typing, not saved yet
    await a.page.getByRole('button', { name: 'Delete' }).first().click();
    const conflict = b.page.getByTestId('conflict');
    await conflict.getByText('Someone deleted this card meanwhile').waitFor();
    assert.equal(await conflict.getByTestId('mine').textContent(), 'Rent a car with GPS');
    await conflict.getByRole('button', { name: 'Restore mine' }).click();
    await until(a.page, (v) => v.cards.join('|') === '[ ] Rent a car with GPS|[ ] Pack');
  });
});

test('the badge shows the live state: keys and revision as events arrive, reconnecting while cut off, then how it caught up', async () => {
  const room = '/doc.html?room=doc:e2e-badge';
  await withUsers(browser, srv.url, room, [['Ann', { route: true }], ['Ben']], async (a, b) => {
    // The room's revision also counts presence writes: the test compares revisions.
    const REV = /^rev \d+$/;
    const empty = await badgeShows(a.page, { status: 'live', keys: '0 keys', rev: REV, sync: '' });
    await addCards(b.page, ['one', 'two']);
    const two = await badgeShows(a.page, { status: 'live', keys: '2 keys', rev: REV, sync: '' });
    assert.ok(revOf(two) >= revOf(empty) + 2, `rev ${revOf(empty)}, then ${revOf(two)} after two writes`);
    await a.sw.cut();
    await badgeShows(a.page, { status: 'reconnecting…', keys: '2 keys', rev: two.rev, sync: '' });
    await addCards(b.page, ['three']);
    await until(b.page, (v) => v.cards.length === 3);
    await reconnect(a);
    const back = await badgeShows(a.page, { status: 'live', keys: '3 keys', rev: REV, sync: /^resumed by replay of \d+ events?$/ });
    assert.ok(revOf(back) > revOf(two), `rev ${revOf(back)} after the reconnect`);
  });
});

/** Cuts B's socket, lets A add n cards, reconnects B; returns B's last-sync text once B shows all of A's cards. */
async function awayWhileAEdits(room, n) {
  return withUsers(browser, srv.url, room, [['Ann'], ['Ben', { route: true }]], async (a, b) => {
    await addCards(a.page, ['before the cut']);
    await until(b.page, (v) => v.cards.length === 1);
    await b.sw.cut();
    await status(b.page, 'reconnecting');
    await addCards(a.page, Array.from({ length: n }, (_, i) => `edit ${i + 1}`));
    await until(a.page, (v, want) => v.cards.length === want, n + 1);
    assert.equal((await view(b.page)).cards.length, 1, 'B saw edits while cut off');

    await reconnect(b);
    await status(b.page, 'connected');
    await until(b.page, (v, want) => v.cards.length === want, n + 1);
    assert.deepEqual(await view(b.page), await view(a.page));
    return await b.page.getByTestId('last-sync').textContent();
  });
}

test('B is cut off while A makes 50 edits: B resumes by replay and ends equal', async () => {
  assert.equal(await awayWhileAEdits('/doc.html?room=doc:e2e-replay', 50), 'resumed by replay of 50 events');
});

test('history compacted while B was away: B resyncs from a snapshot and ends equal', async () => {
  assert.equal(await awayWhileAEdits('/doc.html?room=doc:tiny-e2e', 20), 'resynced from snapshot (history compacted, 20 changes)');
});
