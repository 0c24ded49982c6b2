// Figures of the SDK's persistence (docs/BENCHMARKS.md), in headless
// Chromium against a local server (memory store), persisted vs not in the
// same run, on a room of 1,000 keys:
//   - time from navigation to the first render of the list, over reloads
//     (median and max of RUNS);
//   - bytes the page's WebSocket receives when it is opened again after 10
//     writes it missed (replay from the kept revision vs a snapshot).
// Run from demo/: STATECAST_BIN=… node scripts/bench-persist.mjs
import { launch, startServer } from '../e2e/support.mjs';
import { PAGE_ARGS, open, put, serve, status } from '../e2e/persist-page.mjs';

const KEYS = 1000;
const RUNS = 7;
const srv = await startServer(['--write-rate', '10000']); // the 1,000 keys are written at once
const browser = await launch(PAGE_ARGS);
try {
  const room = `bench-persist:${process.pid}`;
  for (let i = 0; i < KEYS; i += 100) {
    const ops = Array.from({ length: 100 }, (_, j) => ({ type: 'put', key: `k${String(i + j).padStart(4, '0')}`, value: { n: i + j, name: `item ${i + j}` } }));
    const r = await fetch(`${srv.url}/v1/rooms/${encodeURIComponent(room)}/txn`, { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ ops }) });
    if (r.status !== 200) throw new Error(await r.text());
  }
  const median = (xs) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
  const rows = [];
  for (const [mode, query] of [['persisted', ''], ['not persisted', '&memory']]) {
    const context = await browser.newContext();
    await serve(context);
    const { page, errors, bytes } = await open(context, srv.url, room, query);
    await status(page, 'connected');
    await page.waitForFunction((n) => document.querySelectorAll('li').length === n, KEYS);
    await page.waitForTimeout(500); // kept
    const times = [];
    for (let i = 0; i < RUNS; i++) {
      await page.reload();
      await page.waitForFunction(() => window.t?.firstRender !== undefined);
      times.push(await page.evaluate(() => t.firstRender));
      await status(page, 'connected');
      await page.waitForFunction(() => t.w.status === 'live');
      await page.waitForTimeout(300);
    }
    await page.close();
    for (let i = 0; i < 10; i++) await put(srv.url, room, `k${String(i * 97).padStart(4, '0')}`, { n: -i, missed: true });
    const again = await open(context, srv.url, room, query);
    await status(again.page, 'connected');
    await again.page.waitForFunction(() => t.w.status === 'live' && t.w.get('k0873')?.missed === true);
    await again.page.waitForTimeout(300);
    rows.push({ mode, medianMs: median(times).toFixed(1), maxMs: Math.max(...times).toFixed(1), bytesAfter10Missed: again.bytes.received, syncs: await again.page.evaluate(() => t.syncs.join(' ')) });
    if (errors.length || again.errors.length) throw new Error(`console errors: ${[...errors, ...again.errors]}`);
    await context.close();
  }
  console.log(`${KEYS} keys, ${RUNS} reloads each; Chromium ${browser.version()}`);
  console.table(rows);
} finally {
  await browser.close();
  await srv.stop();
}
