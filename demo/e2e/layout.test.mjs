// What a newcomer sees before doing anything: every page fits a phone, and
// every control stays readable in every state it can be in (a selected
// filter chip while hovered was white on near-white).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { launch, startServer, withUsers } from './support.mjs';

let srv, browser;

before(async () => {
  srv = await startServer();
  browser = await launch();
});
after(async () => {
  await browser?.close();
  await srv?.stop();
});

const LONG = 'Supercalifragilisticexpialidocious-without-any-break-at-all';

/** Writes what the pages will show over HTTP: long words, several cards, a game, so layouts are filled. */
async function seed(doc, lobby, board) {
  const put = async (room, key, value) => {
    const res = await fetch(`${srv.url}/v1/rooms/${room}/kv/${key}`, { method: 'PUT', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(value) });
    assert.equal(res.status, 200, `PUT ${room} ${key}`);
  };
  await put(doc, 'doc/title', { text: `Trip to Lisbon ${LONG}`, by: LONG });
  for (let i = 0; i < 3; i++) await put(doc, `doc/cards/c${i}`, { text: `Book flights ${LONG}`, done: i === 1, order: i, by: LONG });
  await put(lobby, 'games/g1', { name: `Friday night ${LONG}`, mode: 'ffa', max: 8, host: LONG, hostId: 'someone', created: 1 });
  await put(lobby, 'seats/g1/1', { id: 'other', name: LONG });
  for (const [i, column] of ['todo', 'doing', 'done'].entries()) await put(board, `board/cards/c${i}`, { title: `Plan ${LONG}`, column, order: i, by: LONG });
}

test('no demo page is wider than a 390 px phone', async () => {
  await seed('doc:e2e-phone', 'lobby:e2e-phone', 'board:e2e-phone');
  for (const path of ['/', '/lobby.html?room=lobby:e2e-phone', '/doc.html?room=doc:e2e-phone', '/board.html?room=board:e2e-phone', '/inspector.html']) {
    await withUsers(browser, srv.url, path, [[LONG, { viewport: { width: 390, height: 844 }, wait: path.includes('?room=') }]], async (u) => {
      if (path.startsWith('/doc') || path.startsWith('/board')) await u.page.getByTestId('card').nth(2).waitFor();
      if (path.startsWith('/lobby')) await u.page.getByTestId('game').waitFor();
      if (path.startsWith('/inspector')) await u.page.getByTestId('room').first().waitFor();
      const { scroll, client } = await u.page.evaluate(() => ({ scroll: document.scrollingElement.scrollWidth, client: document.scrollingElement.clientWidth }));
      assert.ok(scroll <= client, `${path} is ${scroll} px wide in a ${client} px viewport`);
    });
  }
});

/** WCAG contrast ratio of el's text on its background (the first opaque one up its ancestors). Runs in the page. */
function contrastOf(el) {
  const rgb = (c) => (c.match(/[\d.]+/g) ?? []).map(Number);
  const lum = ([r, g, b]) => {
    const f = (v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  let bg = [255, 255, 255];
  for (let e = el; e; e = e.parentElement) {
    const c = rgb(getComputedStyle(e).backgroundColor);
    if (c.length === 3 || c[3] === 1) {
      bg = c.slice(0, 3);
      break;
    }
  }
  const [a, b] = [lum(rgb(getComputedStyle(el).color)), lum(bg)];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}

test('every button stays readable while hovered, the selected filter chip too', async () => {
  await seed('doc:e2e-hover', 'lobby:e2e-hover', 'board:e2e-hover');
  for (const path of ['/lobby.html?room=lobby:e2e-hover', '/doc.html?room=doc:e2e-hover', '/board.html?room=board:e2e-hover']) {
    await withUsers(browser, srv.url, path, [['Ann']], async (u) => {
      await u.page.locator('[data-testid=game], [data-testid=card]').first().waitFor();
      const buttons = u.page.locator('button:enabled');
      const n = await buttons.count();
      assert.ok(n >= 4, `${path}: ${n} buttons`);
      const unreadable = [];
      for (let i = 0; i < n; i++) {
        const button = buttons.nth(i);
        await button.hover();
        const ratio = await button.evaluate(contrastOf);
        if (ratio < 4.5) unreadable.push(`${(await button.textContent()).trim() || await button.getAttribute('aria-label')}: ${ratio.toFixed(2)}`);
      }
      assert.deepEqual(unreadable, [], `${path}: contrast below 4.5:1 while hovered`);
      if (path.startsWith('/lobby')) {
        const chip = u.page.getByRole('button', { name: /^All/ });
        assert.equal(await chip.getAttribute('aria-pressed'), 'true', 'the chip checked is the selected one');
      }
    });
  }
});
