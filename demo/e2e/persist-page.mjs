// The page of the persistence tests (e2e/persist.test.mjs) and figures
// (scripts/bench-persist.mjs): the SDK bundles on one room, its keys listed,
// served by a route of the browser context so it loads with the network off.
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TIMEOUT } from './support.mjs';

const sdk = fileURLToPath(new URL('../sdk/', import.meta.url));

// The page: one watch of ?room (with ?token, if given; ?tabs: tabs share one connection), its entries as
// <li data-key data-pending>, the client's status; t.changes: the watch's changes; t.persistErrors:
// persist()'s onError calls (name:cause).
export const PAGE = `<!doctype html><meta charset="utf-8"><title>persist</title><p id="status"></p><ul id="list"></ul>
<script type="module">
import { createClient } from '/sdk/statecast.js';
import { persist } from '/sdk/persist.js';
const q = new URLSearchParams(location.search);
const persistErrors = [];
const client = createClient({ url: '/v1/ws', token: q.get('token') ?? undefined,
  persist: q.has('memory') ? undefined : persist({ saveDelayMs: 20, tabs: q.has('tabs'), onError: (e) => persistErrors.push(e.name + ':' + e.cause?.name) }) });
const room = client.room(q.get('room'));
const w = room.watch();
const t = (window.t = { client, room, w, syncs: [], rollbacks: [], changes: [], persistErrors, firstRender: undefined });
const list = document.getElementById('list');
const render = () => {
  list.replaceChildren(...w.entries().map((e) => {
    const li = document.createElement('li');
    li.dataset.key = e.key;
    li.dataset.pending = String(!!e.pending);
    li.textContent = e.key + '=' + JSON.stringify(e.value);
    return li;
  }));
  if (w.size && t.firstRender === undefined) t.firstRender = performance.now(); // ms since navigation
};
w.on('changes', render);
w.on('change', (c) => t.changes.push(c.key + '=' + JSON.stringify(c.value) + (c.entry?.pending ? ' pending ' : ' ') + c.cause));
w.on('sync', (s) => t.syncs.push(s.kind + (s.reason ? ':' + s.reason : '')));
client.on('status', ({ status }) => (document.getElementById('status').dataset.status = status));
client.on('rollback', (r) => t.rollbacks.push(r.keys.join() + ':' + r.error.code));
</script>`;

/**
 * Chromium's flags for these pages: a page fulfilled by a route has no
 * address, so Chromium counts it as public and would refuse its socket to
 * the loopback server (Local Network Access).
 */
export const PAGE_ARGS = ['--disable-features=LocalNetworkAccessChecks'];

/** Serves the page and the SDK bundles from this process: they load with the network off. */
export async function serve(context) {
  await context.route(/\/persist\.html/, (r) => r.fulfill({ contentType: 'text/html', body: PAGE }));
  await context.route(/\/sdk\/(statecast|persist)\.js$/, (r) =>
    r.fulfill({ contentType: 'text/javascript', body: readFileSync(join(sdk, new URL(r.request().url()).pathname.split('/').pop())) }));
}

/**
 * A page of `context` on `room` of the server at `base`: what it logs as errors, the bytes its
 * sockets received, the sockets it opened. `prepare(page)` runs before it loads.
 */
export async function open(context, base, room, query = '', prepare = async () => {}) {
  const page = await context.newPage();
  await prepare(page);
  page.setDefaultTimeout(TIMEOUT);
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  page.on('console', (m) => m.type() === 'error' && errors.push(m.text()));
  const bytes = { received: 0 };
  const sockets = [];
  page.on('websocket', (ws) => (sockets.push(ws.url()), ws.on('framereceived', (f) => (bytes.received += Buffer.byteLength(f.payload)))));
  await page.goto(`${base}/persist.html?room=${encodeURIComponent(room)}${query}`);
  return { page, errors, bytes, sockets };
}

/** Writes `key` over HTTP. */
export const put = async (base, room, key, value) => {
  const r = await fetch(`${base}/v1/rooms/${encodeURIComponent(room)}/kv/${encodeURIComponent(key)}`, {
    method: 'PUT', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(value),
  });
  assert.equal(r.status, 200, await r.text());
};
/** The room's entries, read over HTTP. */
export const items = async (base, room) => (await (await fetch(`${base}/v1/rooms/${encodeURIComponent(room)}/kv`)).json()).items;
export const status = (page, s) => page.locator(`#status[data-status=${s}]`).waitFor({ state: 'attached' });
export const shown = (page) => page.evaluate(() => [...document.querySelectorAll('li')].map((li) => li.textContent + (li.dataset.pending === 'true' ? ' (pending)' : '')));
