// The inspector in real Chromium: it lists the rooms the server holds with
// their revisions and the clients with their watches, live.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { TIMEOUT, launch, openAs, screenshot, startServer } from './support.mjs';

let srv, browser;

before(async () => {
  srv = await startServer(['--history-class', 'doc:tiny=10']);
  browser = await launch();
});
after(async () => {
  await browser?.close();
  await srv?.stop();
});

test('the inspector shows the rooms with their revision and the clients with their watches, live', async () => {
  const users = [
    await openAs(browser, srv.url, '/doc.html?room=doc:tiny-notes', 'Ann'),
    await openAs(browser, srv.url, '/lobby.html?room=lobby:eu', 'Ben'),
  ];
  const ins = await openAs(browser, srv.url, '/inspector.html', 'ops');
  try {
    const doc = users[0].page;
    // More writes than the room's 10 events of history: the inspector shows the retained range.
    const texts = ['Agenda', 'Notes', 'Actions', 'Budget', 'Risks', 'Owners', 'Dates', 'Venue', 'Catering', 'Badges', 'Wi-Fi', 'Slides'];
    for (const t of texts) {
      await doc.getByTestId('new-card').fill(t);
      await doc.getByTestId('new-card').press('Enter');
    }
    await doc.getByTestId('card').nth(texts.length - 1).waitFor();

    // The page may still write after its cards (its presence): wait until
    // the inspector shows the revision the page holds, read together.
    const row = ins.page.locator('[data-testid=room][data-room="doc:tiny-notes"]');
    let rev = 0, shown = '';
    for (const end = Date.now() + TIMEOUT; Date.now() < end; await doc.waitForTimeout(100)) {
      rev = Number((await doc.getByTestId('rev').textContent()).replace('rev ', ''));
      shown = await row.getByTestId('room-rev').textContent().catch(() => '');
      if (rev >= texts.length && shown === String(rev)) break;
    }
    assert.equal(shown, String(rev), 'the inspector shows the revision the page holds');
    await row.getByText(`${rev - 9}..${rev}`).waitFor();
    await ins.page.locator('[data-testid=room][data-room="lobby:eu"]').waitFor();
    // Each page watches its data and presence/: two live watches per room, none behind.
    const watches = ins.page.getByTestId('watch').filter({ hasText: 'doc:tiny-notes' });
    await watches.nth(1).waitFor();
    assert.match(await watches.first().textContent(), /live0/);
    // The lobby's own games are a filtered watch: its filter is listed with it.
    await ins.page.getByTestId('watch').filter({ hasText: 'lobby:eu' }).getByTestId('watch-filter').filter({ hasText: /^where value\.hostId == "/ }).waitFor();
    assert.equal(await ins.page.getByLabel('Admin token').isVisible(), false, 'loopback needs no admin token');

    // Live: a write shows up without reloading.
    await doc.getByTestId('new-card').fill('Follow-ups');
    await doc.getByTestId('new-card').press('Enter');
    await row.getByTestId('room-rev').filter({ hasText: new RegExp(`^${rev + 1}$`) }).waitFor();
    await screenshot(ins.page, 'inspector', { fullPage: true });
    assert.deepEqual([...users, ins].flatMap((u) => u.errors), []);
  } finally {
    for (const u of [...users, ins]) await u.context.close();
  }
});
