// The lobby in real Chromium: two (or three) users in separate browser
// contexts on one server with a 1 s lease grace.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { launch, openAs, reconnect, screenshot, startServer, status, TIMEOUT, withUsers } from './support.mjs';

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

/** The watches the server holds in `room` (its inspector), with their filters. */
async function watchesIn(room) {
  const res = await fetch(`${srv.url}/v1/admin/inspect`);
  return (await res.json()).clients.flatMap((c) => c.watches.filter((w) => w.room === room).map((w) => ({ ...w, session: c.session })));
}

/** The seat keys of a lobby room, read over HTTP. */
async function seats(room) {
  const res = await fetch(`${srv.url}/v1/rooms/${room}/kv?prefix=seats/`);
  return (await res.json()).items;
}

async function createGame(page, name, mode, max) {
  await page.getByLabel('Game name').fill(name);
  await page.getByLabel('Mode', { exact: true }).selectOption(mode);
  await page.getByLabel('Players', { exact: true }).selectOption(String(max));
  await page.getByRole('button', { name: 'Create game' }).click();
}

test('a game created by A appears for B within a second and is gone after A closes the tab', async () => {
  const room = `/lobby.html?room=lobby:e2e-lease`;
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben']], async (a, b) => {
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
  });
});

test('two players race for the last seat: exactly one gets it, the other is told who was faster', async () => {
  const room = `/lobby.html?room=lobby:e2e-race`;
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben', { route: true }], ['Cleo', { route: true }]], async (a, b, c) => {
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
  });
});

test('a user who renames themself sees the new name in the online list at once, and so do others', async () => {
  const room = `/lobby.html?room=lobby:e2e-rename`;
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben']], async (a, b) => {
    await b.page.getByTestId('online').getByText('Ann').waitFor();
    a.page.once('dialog', (d) => d.accept('Anna'));
    await a.page.getByRole('button', { name: 'Ann', exact: true }).click();
    await a.page.getByTestId('person').filter({ has: a.page.locator('.you') }).getByText('Anna', { exact: true }).waitFor({ timeout: 1000 });
    await b.page.getByTestId('online').getByText('Anna', { exact: true }).waitFor();
  });
});

test('a game created offline is said to wait for the connection, and is created when it is back', async () => {
  const room = `/lobby.html?room=lobby:e2e-offline`;
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben', { route: true }]], async (a, b) => {
    await b.sw.cut();
    await status(b.page, 'reconnecting');
    await createGame(b.page, 'Tea', 'coop', 3);
    await b.page.getByTestId('notice').filter({ hasText: /^Offline: “Tea” is created when the connection is back\.$/ }).waitFor({ timeout: 1000 });
    await reconnect(b);
    await game(a.page, 'Tea').getByText('host Ben').waitFor();
    await b.page.getByTestId('notice').filter({ hasText: '“Tea” is open.' }).waitFor();
  });
});

test("a seated player is told when the host's game disappears, and their seat is freed", async () => {
  const room = `/lobby.html?room=lobby:e2e-gone`;
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben']], async (a, b) => {
    await createGame(a.page, 'Picnic', 'coop', 4);
    await game(b.page, 'Picnic').getByRole('button', { name: 'Join' }).click();
    await b.page.getByTestId('notice').getByText('You joined “Picnic”').waitFor();

    await a.page.close(); // the host leaves: the game ends a lease grace later
    await game(b.page, 'Picnic').waitFor({ state: 'detached', timeout: GRACE_MS + TIMEOUT });
    await b.page.getByTestId('notice').filter({ hasText: /^“Picnic” has ended: its host left or closed it\. Your seat is free\.$/ }).waitFor();
    for (let i = 0; (await seats('lobby:e2e-gone')).length; i++) {
      assert.ok(i < 100, "Ben's seat in the game that ended was not freed");
      await b.page.waitForTimeout(50);
    }
  });
});

for (const lag of [false, true]) {
  const when = lag ? ", even when the page's view of its games had not followed the seat yet" : '';
  test(`a player away longer than the lease grace is told that their game and their seat are gone${when}`, async () => {
    const room = `/lobby.html?room=lobby:e2e-away${lag ? '-lag' : ''}`;
    await withUsers(browser, srv.url, room, [['Ann'], ['Ben', { route: true }]], async (a, b) => {
      await createGame(a.page, 'Theirs', 'ffa', 4);
      await createGame(b.page, 'Mine', 'duel', 2);
      // The watch of Ben's games that names his new seat never reaches the
      // server, before or after the reconnect: the page must tell the losses
      // from the watch it shows.
      const namesSeat = (f) => f.includes('"filter"') && f.includes('key in [\\"games/'); // a sub whose filter names a seated game
      if (lag) b.sw.withhold(namesSeat);
      await game(b.page, 'Theirs').getByRole('button', { name: 'Join' }).click();
      await game(a.page, 'Theirs').getByText('2/4 players').waitFor();
      if (lag) await b.page.getByTestId('notice').getByText('You joined “Theirs”').waitFor();

      await b.sw.cut();
      await game(a.page, 'Mine').waitFor({ state: 'detached', timeout: GRACE_MS + TIMEOUT }); // Ben's session ended
      await game(a.page, 'Theirs').getByText('1/4 players').waitFor();
      await reconnect(b);
      await b.page.getByTestId('notice').filter({ hasText: 'Your game “Mine” has ended: this tab was offline longer than the lease grace.' })
        .filter({ hasText: 'You lost your seat in “Theirs”: this tab was offline longer than the lease grace.' }).waitFor()
        .catch(async (e) => assert.fail(`${e.message}\nthe notice: ${await b.page.getByTestId('notice').textContent()}`));
      await game(b.page, 'Theirs').getByRole('button', { name: 'Join' }).waitFor();
      if (lag) assert.ok(b.sw.sent.some(namesSeat), 'the page sent no watch naming the seat');
    });
  });
}

test("only the host may close a game: the lobby's backend refuses anyone else, and the page shows its message", async () => {
  // lobby:demo* rooms are validated by the lobby's backend (statecast serve --demo-hooks).
  const room = `/lobby.html?room=lobby:demo-e2e-close`;
  await withUsers(browser, srv.url, room, [['Ann'], ['Ben']], async (a, b) => {
    await createGame(a.page, 'Chess', 'duel', 2);
    await game(b.page, 'Chess').waitFor();
    await game(b.page, 'Chess').getByRole('button', { name: 'Close' }).click();
    await b.page.getByTestId('notice').filter({ hasText: /^Could not close the game: Only the host, Ann, may close “Chess”\.$/ }).waitFor();
    await game(a.page, 'Chess').getByText('1/2 players').waitFor();
    assert.equal(await game(b.page, 'Chess').count(), 1, 'the game is still listed for Ben');

    await game(a.page, 'Chess').getByRole('button', { name: 'Close' }).click();
    await a.page.getByTestId('notice').filter({ hasText: 'You closed “Chess”.' }).waitFor();
    await game(b.page, 'Chess').waitFor({ state: 'detached' });
  });
});

test('the list is filtered on the server: with Duel and free seats only, a game of another mode is never sent; a game that fills up leaves the list live, and comes back when a seat is freed', async () => {
  const roomId = 'lobby:e2e-filter';
  const room = `/lobby.html?room=${roomId}`;
  const where = 'value.mode == "duel" && (!has(value.players) || value.players < value.max)';
  await withUsers(browser, srv.url, room, [['Cleo', { route: true }]], async (c) => {
    await c.page.getByRole('button', { name: 'Duel', exact: true }).click();
    await c.page.getByRole('button', { name: 'Free seats only' }).click();
    await c.page.getByTestId('where').filter({ hasText: where }).waitFor();
    // The page's list is that filtered watch, and its unfiltered one is gone (so nothing in flight can carry other games).
    for (let i = 0; ; i++) {
      const games = (await watchesIn(roomId)).filter((w) => w.prefixes.join() === 'games/');
      if (games.some((w) => w.filter === where) && games.every((w) => w.filter)) break;
      assert.ok(i < 100, `the inspector shows no watch of games/ with the filter: ${JSON.stringify(games)}`);
      await c.page.waitForTimeout(50);
    }
    const from = c.sw.received.length;

    await withUsers(browser, srv.url, room, [['Ann'], ['Ben']], async (a, b) => {
      await createGame(a.page, 'Tea party', 'coop', 4);
      await createGame(a.page, 'Quick duel', 'duel', 2);
      await game(c.page, 'Quick duel').getByText('1/2 players').waitFor();
      assert.equal(await game(c.page, 'Tea party').count(), 0, 'a co-op game is not listed');
      assert.deepEqual(c.sw.received.slice(from).filter((f) => f.includes('Tea party')), [], 'nor ever sent to the page');

      // Ben takes the last seat: the host's tab counts 2/2, and the server takes the game out of Cleo's list.
      await game(b.page, 'Quick duel').getByRole('button', { name: 'Join' }).click();
      await b.page.getByTestId('notice').getByText('You joined “Quick duel”').waitFor();
      await game(c.page, 'Quick duel').waitFor({ state: 'detached' });
      await game(a.page, 'Quick duel').getByText('2/2 players').waitFor();
      // Ben filters for free seats too: his own game is full, and still shown among his games.
      await b.page.getByRole('button', { name: 'Free seats only' }).click();
      await b.page.getByTestId('where').waitFor();
      assert.equal(await b.page.getByTestId('games').getByTestId('game').filter({ hasText: 'Quick duel' }).count(), 0);
      await b.page.getByTestId('my-games').getByTestId('game').filter({ hasText: 'Quick duel' }).getByText('joined').waitFor();

      // Ben leaves: a seat is free again, and the game is back in Cleo's list.
      await game(b.page, 'Quick duel').getByRole('button', { name: 'Leave' }).click();
      await game(c.page, 'Quick duel').getByText('1/2 players').waitFor();
      assert.equal(await game(c.page, 'Tea party').count(), 0);
      assert.deepEqual(c.sw.received.slice(from).filter((f) => f.includes('Tea party')), []);
    });
  });
});
