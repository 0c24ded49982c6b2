// A page reload in real Chromium: the reloading user resumes their session
// (the SDK keeps it in sessionStorage across the reload), so the other user
// never sees them twice and their session-leased game outlives the grace.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { launch, startServer, status, withUsers } from './support.mjs';

const GRACE_MS = 5000;
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

/** Starts counting, in the page, the entries named `name` in the online list (every 25 ms); returns a reader. */
async function countOnline(page, name) {
  await page.evaluate((name) => {
    const seen = (window.__seen = []);
    const count = () => [...document.querySelectorAll('[data-testid=person]')].filter((el) => [...el.children].some((c) => c.textContent === name)).length;
    window.__count = setInterval(() => seen.push(count()), 25);
    new MutationObserver(() => seen.push(count())).observe(document.getElementById('online'), { childList: true, subtree: true });
  }, name);
  return () => page.evaluate(() => window.__seen.slice());
}

test('a reload resumes the session: the other user never sees the reloading user twice, and the game outlives the grace', async () => {
  const room = `/lobby.html?room=lobby:e2e-reload`;
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben']], async (a, b) => {
    await b.page.getByTestId('online').getByText('Ann').waitFor();
    await a.page.getByLabel('Game name').fill('Reloaded');
    await a.page.getByRole('button', { name: 'Create game' }).click();
    await game(b.page, 'Reloaded').waitFor();

    const seen = await countOnline(b.page, 'Ann');
    await a.page.reload();
    await status(a.page, 'connected');
    await a.page.getByTestId('online').getByText('Ben').waitFor();
    await b.page.waitForTimeout(GRACE_MS + 1500); // past the grace of the session the reload would have left behind

    const counts = await seen();
    assert.ok(counts.length > 100, `B's list was sampled (${counts.length} samples)`);
    assert.equal(Math.max(...counts), 1, `B saw Ann at most once at a time (samples: ${[...new Set(counts)]})`);
    assert.equal(counts.at(-1), 1, 'Ann is still online for B');
    // Checked as they are now (a count, not a wait with a short timeout,
    // which a busy machine's round trip to the browser alone can exceed).
    assert.equal(await game(b.page, 'Reloaded').count(), 1, 'the game is still listed for B');
    // Still hers after the reload: the same session and presence id.
    await game(a.page, 'Reloaded').getByText('your game').waitFor({ timeout: 1000 });

    // "Duplicate tab": a new tab given a copy of A's sessionStorage (what Chromium does;
    // playwright cannot duplicate a tab). A running tab's storage holds no session, so
    // the duplicate starts its own and the original is not closed as replaced (4503).
    const copy = await a.page.evaluate(() => Object.entries(sessionStorage));
    assert.ok(!copy.some(([k]) => k.startsWith('statecast:')), `no session in a running tab's storage: ${JSON.stringify(copy)}`);
    const dup = await a.context.newPage();
    await dup.addInitScript((entries) => entries.forEach(([k, v]) => sessionStorage.setItem(k, v)), copy);
    await dup.goto(a.page.url());
    await status(dup, 'connected');
    await b.page.getByTestId('online').getByText('Ann').nth(1).waitFor(); // two tabs: two presences
    await a.page.waitForTimeout(500);
    await status(a.page, 'connected');
    assert.equal(await game(a.page, 'Reloaded').getByText('your game').count(), 1, 'the game is still A\'s');
    assert.equal(await game(dup, 'Reloaded').getByText('your game').count(), 0, 'the duplicate is another session');
  });
});
