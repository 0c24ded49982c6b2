// The lobby in real Chromium: two (or three) users in separate browser
// contexts on one server with a 1 s lease grace.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { launch, openAs, screenshot, startServer, TIMEOUT } from './support.mjs';

const GRACE_MS = 1000;
let srv, browser;

before(async () => {
  srv = await startServer(['--lease-grace', `${GRACE_MS}ms`]);
  browser = await launch();
});
after(async () => {
  await browser?.close();
  await srv?.stop();
});

const game = (page, name) => page.getByTestId('game').filter({ hasText: name });

async function createGame(page, name, mode, max) {
  await page.getByLabel('Game name').fill(name);
  await page.getByLabel('Mode', { exact: true }).selectOption(mode);
  await page.getByLabel('Players', { exact: true }).selectOption(String(max));
  await page.getByRole('button', { name: 'Create game' }).click();
}

test('a game created by A appears for B within a second and is gone after A closes the tab', async () => {
  const room = `/lobby.html?room=lobby:e2e-lease`;
  const a = await openAs(browser, srv.url, room, 'Ann');
  const b = await openAs(browser, srv.url, room, 'Ben');
  try {
    await b.page.getByTestId('online').getByText('Ann').waitFor();
    await createGame(a.page, 'Dune', 'duel', 2);
    await game(b.page, 'Dune').waitFor({ timeout: 1000 });
    assert.match(await game(b.page, 'Dune').textContent(), /Duel.*1\/2 players.*host Ann/);

    // Filter by mode: Co-op hides the duel, Duel shows it again.
    await b.page.getByRole('button', { name: /^Co-op/ }).click();
    await game(b.page, 'Dune').waitFor({ state: 'detached' });
    await b.page.getByRole('button', { name: /^Duel/ }).click();
    await game(b.page, 'Dune').waitFor();

    await a.page.close();
    const closed = Date.now();
    await game(b.page, 'Dune').waitFor({ state: 'detached', timeout: GRACE_MS + TIMEOUT });
    const took = Date.now() - closed;
    assert.ok(took >= GRACE_MS * 0.8, `the game vanished ${took} ms after the tab closed: sooner than the lease grace`);
    await b.page.getByTestId('online').getByText('Ann').waitFor({ state: 'detached' });
    assert.deepEqual([...a.errors, ...b.errors], []);
  } finally {
    await a.context.close();
    await b.context.close();
  }
});

test('two players race for the last seat: exactly one gets it, the other is told who was faster', async () => {
  const room = `/lobby.html?room=lobby:e2e-race`;
  const a = await openAs(browser, srv.url, room, 'Ann');
  const b = await openAs(browser, srv.url, room, 'Ben', { route: true });
  const c = await openAs(browser, srv.url, room, 'Cleo', { route: true });
  try {
    for (const [name, mode, max] of [['Sunday raid', 'coop', 4], ['Open brawl', 'ffa', 6], ['Race', 'duel', 2]]) {
      await createGame(a.page, name, mode, max);
      await game(a.page, name).waitFor();
    }
    await game(b.page, 'Race').getByText('1/2 players').waitFor();
    await game(c.page, 'Race').getByText('1/2 players').waitFor();

    // Neither hears of the other's join before sending its own: both send
    // a put of the same free seat, and the server decides.
    b.sw.hold();
    c.sw.hold();
    await Promise.all([b, c].map((u) => game(u.page, 'Race').getByRole('button', { name: 'Join' }).click()));
    for (const u of [b, c]) {
      for (let i = 0; !u.sw.sent.some((f) => f.includes('"put"') && f.includes('seats/')); i++) {
        assert.ok(i < 100, 'the join was not sent');
        await u.page.waitForTimeout(50);
      }
    }
    b.sw.release();
    c.sw.release();

    const outcome = /You joined “Race”|taken by/;
    await Promise.all([b, c].map((u) => u.page.getByTestId('notice').filter({ hasText: outcome }).waitFor()));
    const [nb, nc] = await Promise.all([b, c].map((u) => u.page.getByTestId('notice').textContent()));
    const winners = [nb, nc].filter((t) => t.startsWith('You joined'));
    assert.equal(winners.length, 1, `exactly one winner: Ben saw "${nb}", Cleo saw "${nc}"`);
    const [winner, loserText] = nb.startsWith('You joined') ? ['Ben', nc] : ['Cleo', nb];
    assert.equal(loserText, `The last seat in “Race” was taken by ${winner} just before you.`);
    for (const u of [a, b, c]) await game(u.page, 'Race').getByText('2/2 players').waitFor();
    assert.equal(await game(a.page, 'Race').getByRole('button', { name: 'Close' }).count(), 1);

    await b.page.getByTestId('online').getByText('Cleo').waitFor();
    await screenshot(winner === 'Ben' ? b.page : c.page, 'lobby');
    const phone = await openAs(browser, srv.url, room, 'Dev', { viewport: { width: 375, height: 740 } });
    await game(phone.page, 'Race').getByText('2/2 players').waitFor();
    await screenshot(phone.page, 'lobby-phone', { fullPage: true });
    await phone.context.close();
    assert.deepEqual([...a.errors, ...b.errors, ...c.errors], []);
  } finally {
    for (const u of [a, b, c]) await u.context.close();
  }
});
