// The connection state machine against a scripted fake server: status,
// session resume, close codes, heartbeat and token refresh.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, ClosedError, UnauthorizedError, type ClientOptions, type StatecastError } from '../dist/index.js';
import { FakeServer } from './support/fake-server.js';
import { FakeClock, nextEvent, record, sleep, until } from './support/util.js';

async function setup(opts: Partial<ClientOptions> = {}) {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, reconnect: { minDelayMs: 5, maxDelayMs: 20 }, autoConnect: false, ...opts });
  const statuses = record(c, 'status');
  const errors = record(c, 'error');
  c.connect();
  return { srv, c, statuses, errors, done: async () => (c.close(), await srv.close()) };
}

test('client: status connecting → connected → reconnecting → connected → disconnected; session resumed with the latest secret', async () => {
  const { srv, c, statuses, done } = await setup();
  try {
    const first = await (await srv.nextConn()).accept({ session: 's_A', resume: 'r_1' });
    assert.equal(first.session, undefined);
    await until(() => c.status === 'connected');
    assert.equal(c.session?.session, 's_A');
    srv.conns[0]!.terminate();
    const conn2 = await srv.nextConn();
    const second = await conn2.accept({ session: 's_A', resume: 'r_2', resumed: true });
    assert.deepEqual([second.session, second.resume], ['s_A', 'r_1']);
    await until(() => c.status === 'connected');
    assert.equal(c.session?.resumed, true);
    conn2.close(4000, 'slow');
    const third = await (await srv.nextConn()).accept({ session: 's_A', resume: 'r_3', resumed: true });
    assert.deepEqual([third.session, third.resume], ['s_A', 'r_2'], 'the resume secret of the latest connected');
    await until(() => c.status === 'connected');
    c.close();
    assert.deepEqual(
      statuses.map((s) => s.status),
      ['connecting', 'connected', 'reconnecting', 'connected', 'reconnecting', 'connected', 'disconnected'],
    );
    // The subprotocol offered is JSON's.
    assert.equal(srv.conns[0]!.protocol, 'statecast.v1.json');
  } finally {
    await done();
  }
});

for (const code of [4500, 4503, 1003, 1007]) {
  test(`client: close ${code} stops: disconnected, a ClosedError, no reconnect`, async () => {
    const { srv, c, errors, done } = await setup();
    try {
      const conn = await srv.nextConn();
      await conn.accept();
      await until(() => c.status === 'connected');
      const ev = nextEvent(c, 'disconnected');
      conn.close(code, 'go away');
      assert.equal((await ev).action, 'stop');
      await until(() => c.status === 'disconnected');
      assert.ok(errors[0] instanceof ClosedError);
      assert.equal((errors[0] as ClosedError).closeCode, code);
      await sleep(60);
      assert.equal(srv.conns.length, 1, 'no reconnect');
      await assert.rejects(c.room('r').put('k', 1), { name: 'NotConnectedError' });
    } finally {
      await done();
    }
  });
}

for (const [code, action] of [[1012, 'now'], [4000, 'backoff'], [4001, 'backoff'], [4003, 'backoff'], [4004, 'backoff'], [4005, 'backoff'], [1011, 'backoff'], [1000, 'backoff']] as const) {
  test(`client: close ${code} reconnects (${action}) and resumes the session`, async () => {
    const { srv, c, done } = await setup({ random: () => 0.5, reconnect: { minDelayMs: 40, maxDelayMs: 40 } });
    try {
      const conn = await srv.nextConn();
      await conn.accept();
      await until(() => c.status === 'connected');
      c.on('disconnected', () => {});
      const ev = nextEvent(c, 'disconnected');
      conn.close(code);
      const e = await ev;
      assert.equal(e.code, code);
      assert.equal(e.action, action);
      assert.equal(e.retryInMs, 20);
      assert.equal(c.status, 'reconnecting');
      const again = await (await srv.nextConn()).accept();
      assert.equal(again.session, 's_1');
    } finally {
      await done();
    }
  });
}

test('client: 4501 with a static token stops with UnauthorizedError', async () => {
  const { srv, c, errors, done } = await setup({ token: 'bad' });
  try {
    const conn = await srv.nextConn();
    assert.equal((await conn.next('connect')).token, 'bad');
    conn.close(4501, 'unauthorized: bad signature');
    await until(() => c.status === 'disconnected');
    assert.ok(errors[0] instanceof UnauthorizedError);
    await sleep(50);
    assert.equal(srv.conns.length, 1);
  } finally {
    await done();
  }
});

test('client: 4002 (token expired) asks the callback for a new token and reconnects with it; the same token again stops', async () => {
  const reasons: string[] = [];
  let n = 0;
  const tokens = ['t1', 't2', 't2'];
  const { srv, c, errors, done } = await setup({
    token: (ctx) => (reasons.push(ctx.reason), tokens[n++]!),
  });
  try {
    const c1 = await srv.nextConn();
    assert.equal((await c1.accept()).token, 't1');
    await until(() => c.status === 'connected');
    c1.close(4002, 'token expired');
    const c2 = await srv.nextConn();
    assert.equal((await c2.next('connect')).token, 't2');
    assert.deepEqual(reasons, ['connect', 'rejected']);
    c2.close(4501, 'unauthorized');
    await until(() => c.status === 'disconnected', 'disconnected');
    assert.ok(errors.at(-1) instanceof UnauthorizedError, String(errors.at(-1)));
    assert.equal(srv.conns.length, 2);
  } finally {
    await done();
  }
});

test('client: a token callback throwing UnauthorizedError stops; another error retries', async () => {
  let calls = 0;
  const { srv, c, errors, done } = await setup({
    token: async () => {
      calls++;
      if (calls === 1) throw new Error('auth endpoint down');
      throw new UnauthorizedError('logged out');
    },
  });
  try {
    await until(() => c.status === 'disconnected', 'disconnected');
    assert.equal(calls, 2);
    assert.deepEqual(errors.map((e: StatecastError) => e.message), ['auth endpoint down', 'logged out']);
    assert.equal(srv.conns.length, 0);
  } finally {
    await done();
  }
});

test('client: token refresh over the open socket, on the server\'s refresh and before expires_ms', async () => {
  const clock = new FakeClock();
  let n = 0;
  const reasons: string[] = [];
  const { srv, c, errors, done } = await setup({ clock, token: (ctx) => (reasons.push(ctx.reason), `tok${++n}`) });
  try {
    const conn = await srv.nextConn();
    assert.equal((await conn.accept({ expires_ms: 60_000 })).token, 'tok1');
    await until(() => c.status === 'connected');
    // The server says the token is about to expire.
    conn.send({ t: 'refresh', expires_ms: 30_000 });
    const a1 = await conn.next('auth');
    assert.equal(a1.token, 'tok2');
    conn.send({ t: 'ok', id: a1.id });
    await sleep(20);
    // The client's own timer, from connected.expires_ms: 45 s before expiry, or at 3/4 of it.
    clock.advance(44_999);
    await sleep(20);
    assert.equal(conn.all('auth').length, 1);
    clock.advance(1);
    const a2 = await conn.next('auth');
    assert.equal(a2.token, 'tok3');
    conn.send({ t: 'err', id: a2.id, code: 'unauthorized', message: 'a refreshed token must have the same subject' });
    await until(() => errors.length === 1, 'error event');
    assert.ok(errors[0] instanceof UnauthorizedError);
    assert.deepEqual(reasons, ['connect', 'refresh', 'refresh']);
    assert.equal(c.status, 'connected', 'a refresh never reconnects');
    assert.equal(srv.conns.length, 1);
  } finally {
    await done();
  }
});

test('client: a refreshed JWT schedules the next refresh from its exp − iat', async () => {
  const clock = new FakeClock();
  const b64 = (o: object) => Buffer.from(JSON.stringify(o)).toString('base64url');
  const jwt = (iat: number, exp: number) => `${b64({ alg: 'HS256' })}.${b64({ sub: 'a', iat, exp })}.sig`;
  let n = 0;
  const { srv, c, done } = await setup({ clock, token: () => (n++ === 0 ? 'plain' : jwt(1000, 1100)) });
  try {
    const conn = await srv.nextConn();
    await conn.accept();
    await until(() => c.status === 'connected');
    conn.send({ t: 'refresh', expires_ms: 30_000 });
    const a = await conn.next('auth');
    conn.send({ t: 'ok', id: a.id });
    await sleep(20);
    clock.advance(74_999);
    await sleep(20);
    assert.equal(conn.all('auth').length, 1);
    clock.advance(1); // 100 s lifetime: refresh at max(100 − 45, 75) s
    await conn.next('auth');
  } finally {
    await done();
  }
});

/** A client on a manual clock (backoff 1 s → 4 s, jitter 0.5) whose token callback throws on a refresh when `fails(its call count)`. */
async function failingRefreshes(fails: (calls: number) => boolean) {
  const clock = new FakeClock();
  const reasons: string[] = [];
  const s = await setup({
    clock,
    random: () => 0.5,
    reconnect: { minDelayMs: 1000, maxDelayMs: 4000 },
    token: (ctx) => {
      reasons.push(ctx.reason);
      if (ctx.reason === 'refresh' && fails(reasons.length)) throw new Error('auth endpoint down');
      return `tok${reasons.length}`;
    },
  });
  return { ...s, clock, reasons };
}

test('client: a failed token refresh is retried with backoff over the open socket, before the token expires', async () => {
  const { srv, c, errors, done, clock, reasons } = await failingRefreshes((n) => n <= 3);
  try {
    const conn = await srv.nextConn();
    await conn.accept({ expires_ms: 60_000 });
    await until(() => c.status === 'connected');
    conn.send({ t: 'refresh', expires_ms: 30_000 });
    await until(() => errors.length === 1, 'first failure');
    clock.advance(499); // backoff 0.5 × 1000 ms
    await sleep(20);
    assert.equal(errors.length, 1);
    clock.advance(1);
    await until(() => errors.length === 2, 'second failure');
    clock.advance(1000); // 0.5 × 2000 ms
    const a = await conn.next('auth');
    assert.equal(a.token, 'tok4');
    conn.send({ t: 'ok', id: a.id });
    assert.deepEqual(reasons, ['connect', 'refresh', 'refresh', 'refresh']);
    assert.equal(c.status, 'connected', 'no reconnect');
    assert.equal(srv.conns.length, 1);
  } finally {
    await done();
  }
});

test('client: a token refresh still failing when the token expires is not retried past expiry; the server\'s 4002 then reconnects with a new token', async () => {
  const { srv, c, errors, done, clock, reasons } = await failingRefreshes(() => true);
  try {
    const conn = await srv.nextConn();
    await conn.accept({ expires_ms: 5000 });
    await until(() => c.status === 'connected');
    clock.advance(3750); // at 3/4 of a short lifetime
    await until(() => errors.length === 1, 'first failure');
    clock.advance(500); // retried at 4.25 s; the next one (+1 s) would be past expiry
    await until(() => errors.length === 2, 'second failure');
    clock.advance(10_000);
    await sleep(20);
    assert.deepEqual(reasons, ['connect', 'refresh', 'refresh']);
    conn.close(4002, 'token expired');
    await until(() => c.status === 'reconnecting');
    clock.advance(1000);
    const conn2 = await srv.nextConn();
    assert.equal((await conn2.next('connect')).token, 'tok4');
    assert.deepEqual(reasons, ['connect', 'refresh', 'refresh', 'rejected']);
  } finally {
    await done();
  }
});

test('client: heartbeat pings when idle and drops a socket silent for 2 × ping_ms (4001), then reconnects', async () => {
  const clock = new FakeClock();
  const { srv, c, done } = await setup({ clock, random: () => 0 });
  try {
    const conn = await srv.nextConn();
    await conn.accept({ ping_ms: 1000 });
    await until(() => c.status === 'connected');
    clock.advance(250);
    await sleep(20);
    assert.equal(conn.all('ping').length, 0, 'not idle yet');
    clock.advance(250);
    await conn.next('ping');
    conn.send({ t: 'pong' });
    await sleep(20);
    clock.advance(1750); // 2.25 s after connected, 1.75 s after the pong
    assert.equal(c.status, 'connected', 'the pong kept it alive');
    const closed = nextEvent(c, 'disconnected');
    clock.advance(500); // nothing received for > 2 s
    const e = await closed;
    assert.equal(e.code, 4001);
    assert.equal(c.status, 'reconnecting');
    clock.advance(0);
    await (await srv.nextConn()).accept();
    await until(() => c.status === 'connected');
  } finally {
    await done();
  }
});

test('client: a wall-clock deadline passed while timers slept is noticed before sending', async () => {
  const clock = new FakeClock();
  const { srv, c, done } = await setup({ clock, random: () => 0 });
  try {
    const conn = await srv.nextConn();
    await conn.accept({ ping_ms: 1000 });
    await until(() => c.status === 'connected');
    clock.t += 5000; // a laptop lid closed: time moved, no timer ran
    const put = c.room('r').put('k', 1);
    assert.equal(c.status, 'reconnecting', 'the dead socket was dropped');
    clock.advance(0);
    const conn2 = await srv.nextConn();
    await conn2.accept();
    const p = await conn2.next('put');
    conn2.send({ t: 'ok', id: p.id, rev: 3 });
    assert.deepEqual(await put, { rev: 3 });
    assert.equal(conn.all('put').length, 0, 'never sent on the dead socket');
  } finally {
    await done();
  }
});

test('client: connect timeout drops a socket that never says connected', async () => {
  const clock = new FakeClock();
  const { srv, c, done } = await setup({ clock, random: () => 0, connectTimeoutMs: 3000 });
  try {
    const conn = await srv.nextConn();
    await conn.next('connect');
    const ev = nextEvent(c, 'disconnected');
    clock.advance(3000);
    assert.equal((await ev).reason, 'connect timeout');
    clock.advance(0);
    await srv.nextConn();
  } finally {
    await done();
  }
});

test('client: ready() resolves when connected; room() is cached; one socket serves many rooms', async () => {
  const { srv, c, done } = await setup();
  try {
    const conn = await srv.nextConn();
    await conn.accept();
    await c.ready(1000);
    assert.equal(c.room('a'), c.room('a'));
    c.room('a').watch();
    c.room('b').watch(['x/', 'y/']);
    const s1 = await conn.next('sub');
    const s2 = await conn.next('sub');
    assert.deepEqual([s1.room, s1.prefixes, s2.room, s2.prefixes], ['a', [], 'b', ['x/', 'y/']], 'no prefixes: [], the whole room');
    assert.notEqual(s1.id, s2.id);
    assert.equal(srv.conns.length, 1);
  } finally {
    await done();
  }
});

test('client: reconnect() while connected probes the socket: no answer within probeTimeoutMs drops it', async () => {
  const clock = new FakeClock();
  const { srv, c, done } = await setup({ clock, random: () => 0, probeTimeoutMs: 2000 });
  try {
    const conn = await srv.nextConn();
    await conn.accept({ ping_ms: 60_000 });
    await until(() => c.status === 'connected');
    c.reconnect();
    await conn.next('ping');
    conn.send({ t: 'pong' });
    await sleep(20);
    clock.advance(2000);
    assert.equal(c.status, 'connected', 'answered');
    c.reconnect();
    await conn.next('ping');
    const ev = nextEvent(c, 'disconnected');
    clock.advance(2000);
    assert.equal((await ev).code, 4001);
    clock.advance(0);
    await srv.nextConn();
  } finally {
    await done();
  }
});
