// Shared by the demo's browser tests: a statecast server on a free loopback
// port, one headless Chromium (Debian's, driven by playwright-core), pages
// as named users, and a switch to cut or hold one page's WebSocket.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium } from 'playwright-core';

export const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
// Screenshots go to a scratch directory unless SCREENSHOTS_DIR names one:
// `make screenshots` refreshes the committed demo/screenshots/.
export const SHOTS = process.env.SCREENSHOTS_DIR ?? join(tmpdir(), 'statecast-screenshots');
export const TIMEOUT = 10_000;

// STATECAST_STORE runs the tests on another store than memory, e.g.
// redis://127.0.0.1:6379/0 (each server then gets its own key prefix).
const STORE = process.env.STATECAST_STORE ?? 'memory';
let servers = 0;

/** Starts `statecast serve` on 127.0.0.1:0 with extra flags; resolves with { url, stop }. */
export function startServer(flags = []) {
  const bin = process.env.STATECAST_BIN;
  if (!bin) throw new Error('STATECAST_BIN is not set: run the tests with `npm test`');
  const store = ['--store', STORE];
  if (STORE.startsWith('redis')) store.push('--redis-prefix', `e2e${process.pid}-${servers++}`);
  const p = spawn(bin, ['serve', ...store, '--addr', '127.0.0.1:0', '--log-level', 'warn', ...flags], { stdio: ['ignore', 'pipe', 'inherit'] });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => (p.kill(), reject(new Error('the server printed no address within 20 s'))), 20_000);
    const early = (code) => reject(new Error(`the server exited early (${code})`));
    p.on('error', reject);
    p.on('exit', early);
    let out = '';
    p.stdout.on('data', (d) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (!m) return;
      clearTimeout(timer);
      p.stdout.removeAllListeners('data');
      p.stdout.resume();
      resolve({
        url: m[1],
        stop: () => new Promise((done) => {
          p.off('exit', early);
          if (p.exitCode !== null) return done();
          p.once('exit', done);
          p.kill('SIGTERM');
        }),
      });
    });
  });
}

export const CHROMIUM_ARGS = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync'];

/** Launches headless Chromium, with `args` added to CHROMIUM_ARGS. */
export function launch(args = []) {
  return chromium.launch({ executablePath: CHROMIUM, headless: true, args: [...CHROMIUM_ARGS, ...args] });
}

/**
 * Opens path as the user `name` in a new browser context (its own storage:
 * another user) and waits until the page is connected. With `route`, the
 * page's socket goes through a socketSwitch, returned as `sw`. `errors`
 * collects the page's uncaught errors. `wait: false` does not wait for a
 * connection (the landing page and the inspector have none).
 */
export async function openAs(browser, base, path, name, { viewport = { width: 1200, height: 760 }, route = false, wait = !path.startsWith('/inspector') } = {}) {
  const context = await browser.newContext({ viewport });
  const page = await context.newPage();
  page.setDefaultTimeout(TIMEOUT);
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  const sw = route ? await socketSwitch(page) : undefined;
  await page.goto(`${base}${path}${path.includes('?') ? '&' : '?'}name=${encodeURIComponent(name)}`);
  if (wait) await status(page, 'connected');
  return { context, page, errors, sw };
}

/**
 * Opens path for each user ([name, openAs options]), runs fn with them,
 * checks that no page threw, and closes them all, also when fn fails.
 * Resolves with what fn returned.
 */
export async function withUsers(browser, base, path, users, fn) {
  const opened = [];
  try {
    for (const [name, opts] of users) opened.push(await openAs(browser, base, path, name, opts));
    const result = await fn(...opened);
    assert.deepEqual(opened.flatMap((u) => u.errors), [], 'uncaught errors in the pages');
    return result;
  } finally {
    for (const u of opened) await u.context.close();
  }
}

/** Waits until the page's connection badge is in the client status `s` (connecting, connected, reconnecting, disconnected). */
export const status = (page, s) => page.locator(`[data-testid=badge][data-status=${s}]`).waitFor();

/**
 * Routes the page's statecast socket through the test: `cut()` closes it
 * (the page sees close code 4000) and refuses new ones until `restore()`;
 * `hold()` buffers what the server sends until `release()`; `withhold(f)`
 * keeps the frames the page sends for which f is true from the server;
 * `sent` lists the frames the page sent, `received` those the server sent it.
 */
export async function socketSwitch(page) {
  const sw = { open: true, held: null, route: null, sent: [], received: [], withheld: () => false };
  await page.routeWebSocket(/\/v1\/ws/, (ws) => {
    if (!sw.open) return void ws.close({ code: 4000, reason: 'test: network down' });
    sw.route = ws;
    const server = ws.connectToServer();
    server.onMessage((m) => (sw.received.push(String(m)), sw.held ? sw.held.push(m) : ws.send(m)));
    ws.onMessage((m) => (sw.sent.push(String(m)), sw.withheld(String(m)) || server.send(m)));
  });
  sw.cut = async () => {
    sw.open = false;
    await sw.route?.close({ code: 4000, reason: 'test: network down' });
  };
  sw.restore = () => (sw.open = true);
  sw.withhold = (f) => (sw.withheld = f);
  sw.hold = () => (sw.held = []);
  sw.release = () => {
    const q = sw.held ?? [];
    sw.held = null;
    for (const m of q) sw.route.send(m);
  };
  return sw;
}

/** Lets u's socket through again and has the page reconnect now (its Retry button) instead of after its backoff (≤ 5 s). */
export async function reconnect(u) {
  u.sw.restore();
  await u.page.getByRole('button', { name: 'Retry now' }).click({ timeout: 2000 }).catch(() => {}); // not shown: the backoff is already retrying
}

export function screenshot(page, name, opts = {}) {
  mkdirSync(SHOTS, { recursive: true });
  return page.screenshot({ path: `${SHOTS}/${name}.png`, ...opts });
}
