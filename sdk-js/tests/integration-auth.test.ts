// Integration tests of auth and limits against the real server with JWT
// (HS256) auth and a low write rate.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import WebSocket from 'ws';
import { createClient, ForbiddenError, RateLimitedError, UnauthorizedError, type Client, type ClientOptions } from '../dist/index.js';
import { replyLosingWebSocket, startServer, type Server } from './support/server.js';
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

test('auth: a failed refresh is retried with backoff before the token expires: no 4002, no reconnect', async () => {
  const reasons: string[] = [];
  // 31 s left: the server asks for a refresh within a second; the first refresh fails.
  const c = client({
    token: (ctx) => {
      reasons.push(ctx.reason);
      if (reasons.length === 2) throw new Error('auth endpoint down');
      return jwt('ann', reasons.length === 1 ? 31 : 3600);
    },
  });
  const errors = record(c, 'error');
  const closes = record(c, 'disconnected');
  await c.ready(5000);
  await until(() => reasons.length === 3, 'the retry', 3000);
  assert.deepEqual(reasons, ['connect', 'refresh', 'refresh']);
  assert.deepEqual(errors.map((e) => e.message), ['auth endpoint down']);
  await sleep(100); // the auth reply
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

// Exactly the grants README.md ("Auth") recommends.
const README_GRANTS = [
  { room: 'lobby:*', prefix: '', access: 'r' },
  { room: 'lobby:*', prefix: 'presence/{sub}/', access: 'rw' },
  { room: 'doc:{sub}', access: 'rw' },
];

test('auth: presence works under the README\'s grants (presence/{sub}/), for a token callback and a static token; others are seen (issue 13, defect 1)', async () => {
  const a = client({ token: () => jwt('alice', 600, README_GRANTS) });
  const b = client({ token: jwt('bob', 600, README_GRANTS) });
  const pa = a.room('lobby:eu').presence<{ name: string }>();
  const pb = b.room('lobby:eu').presence<{ name: string }>();
  await pa.set({ name: 'Alice' });
  await pb.set({ name: 'Bob' });
  assert.equal(pa.key, `presence/alice/${a.clientId}`);
  assert.equal(pb.key, `presence/bob/${b.clientId}`);
  await until(() => pa.others.size === 1 && pb.others.size === 1, 'each sees the other');
  assert.deepEqual([...pb.others], [[`alice/${a.clientId}`, { name: 'Alice' }]]);
  await pa.set({ name: 'Alice 2' }); // an update under the same key
  await until(() => pb.others.get(pa.id!)?.name === 'Alice 2', 'update');
  await pa.clear();
  await until(() => pb.others.size === 0, 'leave');
  // The grants keep their promise: nothing outside the subject's own presence, nor a subject that is a prefix of another.
  const al = client({ token: jwt('al', 600, README_GRANTS) });
  await assert.rejects(al.room('lobby:eu').put('presence/alice/x', 1), ForbiddenError);
  await assert.rejects(al.room('lobby:eu').put('games/1', 1), ForbiddenError);
  await al.room('lobby:eu').presence().set('here');
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

test('auth (wids): a write whose reply was lost is confirmed by its event in the replay, never sent again; another subject is never sent its id', async () => {
  const lossy = replyLosingWebSocket();
  const a = client({ WebSocket: lossy.WebSocket, token: jwt('wid-ann', 600) });
  const frames: string[] = [];
  class Recording extends WebSocket {
    constructor(url: string, protocols: string[]) {
      super(url, protocols);
      this.on('message', (d) => frames.push(String(d)));
    }
  }
  const b = client({ WebSocket: Recording, token: jwt('wid-bob', 600) });
  const room = 'auth:lost';
  const [w, wb] = [a.room(room).watch(), b.room(room).watch()];
  await Promise.all([w.ready(), wb.ready()]);
  lossy.loseReplyTo('put');
  const { rev } = await a.room(room).put('k', 1, { ifModRev: 0 });
  assert.equal(lossy.sent.filter((m) => m.t === 'put').length, 1, 'not sent again');
  assert.equal(lossy.sent.filter((m) => m.t === 'connect').length, 2, 'the reply was lost with the socket');
  assert.deepEqual([w.get('k'), w.entry('k')!.modRev, w.entry('k')!.version, w.entry('k')!.pending], [1, rev, 1, undefined]);
  await until(() => wb.rev === rev);
  const wid = lossy.sent.find((m) => m.t === 'put')!.wid as string;
  assert.ok(!frames.some((f) => f.includes(wid)), 'bob was sent ann\'s write id');
});
