// Integration tests of auth and limits against the real server with JWT
// (HS256) auth and a low write rate.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import WebSocket from 'ws';
import { createClient, ForbiddenError, RateLimitedError, UnauthorizedError, type Client, type ClientOptions } from '../dist/index.js';
import { startServer, type Server } from './support/server.js';
import { record, sleep, until } from './support/util.js';

const SECRET = 'sdk-test-secret-0123456789abcdef0123456789';
let srv: Server;
const clients: Client[] = [];

before(async () => {
  srv = await startServer(['--jwt-hmac-secret', SECRET, '--write-rate', '5']);
});
after(async () => {
  clients.forEach((c) => c.close());
  await srv.stop();
});

const b64 = (o: object) => Buffer.from(JSON.stringify(o)).toString('base64url');
type Grant = { room: string; prefix?: string; access: string };
function jwt(sub: string, ttlS: number, grants: Grant[] = [{ room: 'auth:*', access: 'rw' }]): string {
  const now = Math.floor(Date.now() / 1000);
  const body = `${b64({ alg: 'HS256', typ: 'JWT' })}.${b64({ sub, iat: now, exp: now + ttlS, statecast: { grants } })}`;
  return `${body}.${createHmac('sha256', SECRET).update(body).digest('base64url')}`;
}
function client(opts: Partial<ClientOptions>): Client {
  const c = createClient({ url: srv.ws, WebSocket, reconnect: { minDelayMs: 20, maxDelayMs: 100 }, ...opts });
  clients.push(c);
  return c;
}

test('auth: the token is refreshed over the open socket when the server asks, without reconnecting', async () => {
  const reasons: string[] = [];
  // 31 s left: the server asks for a refresh at 30 s, so within a second.
  const c = client({ token: (ctx) => (reasons.push(ctx.reason), jwt('ann', reasons.length === 1 ? 31 : 3600)) });
  const errors = record(c, 'error');
  const closes = record(c, 'disconnected');
  await c.ready(5000);
  assert.ok(c.session!.expiresMs! <= 31_000);
  await until(() => reasons.length === 2, 'refresh', 3000);
  assert.deepEqual(reasons, ['connect', 'refresh']);
  await sleep(100); // the auth reply
  assert.deepEqual(errors, []);
  assert.deepEqual(closes, []);
  assert.equal(c.status, 'connected');
  await c.room('auth:r').put('k', 1);
});

test('auth: an invalid static token stops the client with UnauthorizedError (4501)', async () => {
  const c = client({ token: 'not-a-jwt' });
  const errors = record(c, 'error');
  const closes = record(c, 'disconnected');
  await until(() => c.status === 'disconnected', 'disconnected');
  assert.ok(errors[0] instanceof UnauthorizedError);
  assert.equal(closes[0]!.code, 4501);
  await assert.rejects(c.room('auth:r').put('k', 1), { name: 'NotConnectedError' });
});

test('auth: an expired token (4002) makes the callback give a new one, and the client connects', async () => {
  const reasons: string[] = [];
  const c = client({ token: (ctx) => (reasons.push(ctx.reason), jwt('ben', reasons.length === 1 ? -60 : 600)) });
  const closes = record(c, 'disconnected');
  await c.ready(5000);
  assert.deepEqual(reasons, ['connect', 'rejected']);
  assert.equal(closes[0]!.code, 4002);
});

test('auth: a write outside the grants is forbidden; presence under presence/{sub} is allowed', async () => {
  const grants = [
    { room: 'auth:*', access: 'r' },
    { room: 'auth:*', prefix: 'presence/{sub}', access: 'rw' },
  ];
  const c = client({ token: jwt('cat', 600, grants), clientId: 'cat' });
  const room = c.room('auth:p');
  await assert.rejects(room.put('games/1', 1), ForbiddenError);
  await room.presence().set({ here: true });
  await until(() => room.presence().watch.has('presence/cat'));
});

test('auth: writes over the rate limit reject with RateLimitedError, the others succeed', async () => {
  const c = client({ token: jwt('dan', 600) });
  const room = c.room('auth:rate');
  const results = await Promise.allSettled(Array.from({ length: 30 }, (_, i) => room.put(`k${i}`, i)));
  const limited = results.filter((r) => r.status === 'rejected' && r.reason instanceof RateLimitedError).length;
  const ok = results.filter((r) => r.status === 'fulfilled').length;
  assert.equal(limited + ok, 30);
  assert.ok(limited >= 10 && ok >= 5, `ok ${ok}, rate limited ${limited}`);
});
