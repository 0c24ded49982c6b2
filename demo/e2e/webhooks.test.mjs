// The inspector's webhook panel in real Chromium: a server with a webhook to
// a receiver started here (a few lines of Node that check every signature,
// as the README's example does) shows which node delivers the hook and each
// room's cursor catching up with its head.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac, timingSafeEqual } from 'node:crypto';
import { createServer } from 'node:http';
import { launch, openAs, startServer } from './support.mjs';

const secret = 'e2e-webhook-secret';
let srv, browser, receiver;
const got = []; // verified deliveries

function verify(header, body) {
  const sig = Object.fromEntries((header || '').split(',').map((p) => p.split('=')));
  const mac = createHmac('sha256', secret).update(`${sig.t}.`).update(body).digest();
  const v1 = Buffer.from(sig.v1 || '', 'hex');
  return v1.length === mac.length && timingSafeEqual(v1, mac) && Math.abs(Date.now() / 1000 - sig.t) <= 300;
}

before(async () => {
  receiver = createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (!verify(req.headers['statecast-signature'], body)) return res.writeHead(401).end();
      got.push(JSON.parse(body));
      res.writeHead(204).end();
    });
  });
  await new Promise((ok) => receiver.listen(0, '127.0.0.1', ok));
  const url = `http://127.0.0.1:${receiver.address().port}/hooks/doc`;
  srv = await startServer(['--webhook', `doc:*=${url}`, '--webhook-secret', secret]);
  browser = await launch();
});
after(async () => {
  await browser?.close();
  await srv?.stop();
  receiver?.close();
});

test('the inspector shows the webhook delivering each room up to its head', async () => {
  for (let i = 1; i <= 3; i++) {
    const res = await fetch(`${srv.url}/v1/rooms/doc:hooked/kv/k${i}`, {
      method: 'PUT', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(i),
    });
    assert.equal(res.status, 200);
  }
  const ins = await openAs(browser, srv.url, '/inspector.html', 'ops');
  try {
    const row = ins.page.getByTestId('hook').filter({ hasText: 'doc:hooked' });
    await row.filter({ hasText: 'this node' }).waitFor();
    await row.locator('td').nth(3).filter({ hasText: /^3$/ }).waitFor(); // cursor
    assert.equal(await row.locator('td').nth(5).textContent(), '0'); // lag
    const revs = got.filter((d) => d.room === 'doc:hooked').flatMap((d) => d.revisions.map((r) => r.rev));
    assert.deepEqual(revs, [1, 2, 3]);
    assert.deepEqual(ins.errors, []);
  } finally {
    await ins.context.close();
  }
});
