// Protocol v2 against the real server: a client without a codec option
// negotiates statecast.v2.json, and what it reads is what a v1 client reads —
// raw frames of both versions decode to the same messages, and watches of
// both versions see the same changes and the same state (puts, deletes,
// txns, leased keys in snapshots, filtered watches' leaves, a coalesced
// catch-up after the socket stalled).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { createClient, json2Codec, jsonCodec, type ChangeEvent, type Client, type ClientOptions, type Watch } from '../dist/index.js';
import { controlledWebSocket, startServer, type Server } from './support/server.js';
import { record, until } from './support/util.js';

const V1 = 'statecast.v1.json';
const V2 = 'statecast.v2.json';
let srv: Server;
const clients: Client[] = [];

before(async () => {
  // A small watch queue, so that a socket that stops reading is parked, and caught up by a coalesced message, soon.
  srv = await startServer(['--watch-queue-bytes', '65536']);
});
after(async () => {
  clients.forEach((c) => c.close());
  await srv.stop();
});

let seq = 0;
const roomName = (prefix: string) => `${prefix}${process.pid}-${seq++}`;
function client(opts: Partial<ClientOptions> = {}): Client {
  const c = createClient({ url: srv.http, WebSocket, sessionStore: false, reconnect: { minDelayMs: 20, maxDelayMs: 100 }, ...opts });
  clients.push(c);
  return c;
}
const brief = (cs: ChangeEvent[]) => cs.map((c) => `${c.type} ${c.key}=${JSON.stringify(c.value)} lease=${c.entry?.lease ?? '-'} v${c.entry?.version ?? '-'} @${c.rev} ${c.cause}`);

interface Inspected {
  clients: { session: string; codec: string; watches: { room: string; state: string }[] }[];
}
const inspect = async () => (await (await fetch(`${srv.http}/v1/admin/inspect`)).json()) as Inspected;
const sessionOf = async (c: Client) => (await inspect()).clients.find((x) => x.session === c.session?.session);

test('integration-v2: a client without a codec option negotiates v2 (connected.v is 2); jsonCodec still gets v1', { timeout: 20_000 }, async () => {
  const frames: string[] = [];
  const sockets: WebSocket[] = [];
  class Recording extends WebSocket {
    constructor(url: string, protocols: string[]) {
      super(url, protocols);
      sockets.push(this);
      this.on('message', (d) => frames.push(String(d)));
    }
  }
  const a = client({ WebSocket: Recording });
  const b = client({ codec: jsonCodec });
  await Promise.all([a.ready(), b.ready()]);
  assert.equal(sockets[0]!.protocol, V2);
  assert.equal(JSON.parse(frames[0]!).v, 2);
  assert.equal((await sessionOf(a))?.codec, V2);
  assert.equal((await sessionOf(b))?.codec, V1);
  // And it speaks it: events arrive dense on the wire.
  const room = roomName('v2:');
  const w = a.room(room).watch();
  await w.ready();
  const { rev } = await b.room(room).put('k', { n: 1 });
  await until(() => w.rev === rev, 'the event');
  assert.ok(frames.some((f) => f.includes(`"r":${rev},"e":[["k",{"n":1},${rev},1]]`)), frames.join('\n')); // another client's write: no wid
  assert.deepEqual(w.entry('k'), { key: 'k', value: { n: 1 }, createRev: rev, modRev: rev, version: 1, lease: false });
});

/** A raw socket speaking `protocol`: `send`, and the subscription messages (snapshot, events, coalesced) it received per sub id, decoded. */
async function raw(protocol: string) {
  const ws = new WebSocket(srv.ws, [protocol]);
  const codec = protocol === V2 ? json2Codec : jsonCodec;
  const subs = new Map<number, unknown[]>();
  const replies = new Map<number, { t: string; rev?: number }>();
  ws.on('message', (d) => {
    for (const m of codec.decode(String(d)) as { t: string; s?: number; id?: number; rev?: number }[]) {
      if (m.t === 'ok' || m.t === 'err') replies.set(m.id!, m);
      if (m.s !== undefined && ['snapshot', 'events', 'coalesced'].includes(m.t)) subs.set(m.s, [...(subs.get(m.s) ?? []), m]);
    }
  });
  await new Promise((r, j) => (ws.once('open', r), ws.once('error', j)));
  let id = 100;
  const send = async (m: object) => {
    const mine = ++id;
    ws.send(codec.encode({ ...m, id: mine }));
    await until(() => replies.has(mine), `the reply to ${JSON.stringify(m)}`);
    assert.equal(replies.get(mine)!.t, 'ok', JSON.stringify(m));
    return replies.get(mine)!;
  };
  ws.send(codec.encode({ t: 'connect' }));
  return { ws, subs, send };
}

/** v1's `prev` has the Go Item's empty `key`, which v2's `p` does not carry (PROTOCOL.md §5 does not name it); both carry its lease. */
function withoutPrevExtras(msgs: unknown[]): unknown[] {
  return JSON.parse(JSON.stringify(msgs), (k, v) =>
    k === 'prev' ? { value: v.value, create_rev: v.create_rev, mod_rev: v.mod_rev, version: v.version, ...(v.lease ? { lease: true } : {}) } : v);
}

test('integration-v2: the server\'s v2 frames decode to its v1 messages (snapshot with a lease, put, delete, txn, wid, prev, filtered leave)', { timeout: 20_000 }, async () => {
  const room = roomName('raw:');
  const [one, two] = await Promise.all([raw(V1), raw(V2)]);
  try {
    // The writer's leased key is in both snapshots.
    await one.send({ t: 'put', room, key: 'seat/ann', value: { on: true }, lease: 'session' });
    await one.send({ t: 'put', room, key: 'a', value: 1 });
    for (const c of [one, two]) {
      await c.send({ t: 'sub', room, prev: true }); // sub ids differ per socket: compared in order
      await c.send({ t: 'sub', room, filter: 'has(value.n) && value.n > 1' });
    }
    await one.send({ t: 'put', room, key: 'a', value: { n: 2 }, wid: 'w.1' });
    await one.send({ t: 'put', room, key: 'b', value: 'x', lease: 'session' });
    await one.send({ t: 'del', room, key: 'seat/ann' });
    await one.send({ t: 'txn', room, ops: [{ type: 'put', key: 'c', value: [1, 2.5] }, { type: 'delete', key: 'b' }, { type: 'put', key: 'a', value: { n: 1 } }] });
    const { rev: head } = await one.send({ t: 'put', room, key: 'd', value: { n: 5 }, wid: 'w.2' }); // both subscriptions end at head
    const last = (c: typeof one) => [...c.subs.values()].every((ms) => (ms.at(-1) as { rev: number }).rev === head);
    await until(() => one.subs.size === 2 && two.subs.size === 2 && last(one) && last(two), 'every message in both versions');
    const bySub = (c: typeof one) => [...c.subs.entries()].sort(([x], [y]) => x - y).map(([, ms]) => ms.map((m) => ({ ...(m as object), s: 0 })));
    const [v1, v2] = [bySub(one), bySub(two)];
    assert.deepStrictEqual(v2, withoutPrevExtras(v1));
    // What was compared holds every case.
    const text = JSON.stringify(v2);
    for (const s of ['"lease":true', '"type":"delete"', '"type":"leave"', '"prev":{', '"reason":"initial"']) assert.ok(text.includes(s), `${s} in ${text}`);
    assert.ok(JSON.stringify(v1).includes('"prev":{"key":"","value":{"on":true},"create_rev":1,"mod_rev":1,"version":1,"lease":true}'), 'v1 prev as the Go server sends it');
  } finally {
    one.ws.close();
    two.ws.close();
  }
});

/** Records a watch's changes, and waits for it to reach `rev`. */
function follow(w: Watch) {
  const seen = record(w, 'change');
  return { seen, at: (rev: number) => until(() => w.rev === rev, `rev ${rev}`) };
}

test('integration-v2: watches in v2 and v1 see the same changes and state: put, delete, txn, leased keys, snapshots, filtered leaves', { timeout: 20_000 }, async () => {
  const room = roomName('same:');
  const writer = client();
  const [c2, c1] = [client(), client({ codec: jsonCodec })];
  const r = writer.room(room);
  await r.put('seat/ann', { on: true }, { lease: 'session' });
  await r.put('g/1', { open: true });
  const where = 'value.open == true';
  const watches = [c2, c1].flatMap((c) => [c.room(room).watch(), c.room(room).watch('g/', { where })]);
  const follows = watches.map(follow);
  await Promise.all(watches.map((w) => w.ready()));
  await r.put('g/2', { open: true });
  await r.put('g/1', { open: false }); // leaves the filtered view
  await r.delete('seat/ann');
  await r.txn({ ops: [{ type: 'put', key: 'g/3', value: { open: true } }, { type: 'delete', key: 'g/2' }, { type: 'put', key: 'seat/bo', value: 1, lease: 'session' }] });
  const { rev } = await r.put('g/3', { open: true, n: 2 });
  await Promise.all(follows.map((f) => f.at(rev)));
  const [all2, where2, all1, where1] = follows.map((f) => brief(f.seen));
  assert.deepEqual(all2, all1);
  assert.deepEqual(where2, where1);
  assert.deepEqual(watches[0]!.entries(), watches[2]!.entries());
  assert.deepEqual(watches[1]!.entries(), watches[3]!.entries());
  assert.deepEqual(all2, [
    `put g/1={"open":true} lease=false v1 @2 initial`,
    `put seat/ann={"on":true} lease=true v1 @2 initial`,
    `put g/2={"open":true} lease=false v1 @3 live`,
    `put g/1={"open":false} lease=false v2 @4 live`,
    `delete seat/ann=undefined lease=- v- @5 live`,
    `put g/3={"open":true} lease=false v1 @6 live`,
    `delete g/2=undefined lease=- v- @6 live`,
    `put seat/bo=1 lease=true v1 @6 live`,
    `put g/3={"open":true,"n":2} lease=false v2 @7 live`,
  ]);
  assert.deepEqual(where2, [
    `put g/1={"open":true} lease=false v1 @2 initial`,
    `put g/2={"open":true} lease=false v1 @3 live`,
    `leave g/1=undefined lease=- v- @4 live`,
    `put g/3={"open":true} lease=false v1 @6 live`,
    `leave g/2=undefined lease=- v- @6 live`,
    `put g/3={"open":true,"n":2} lease=false v2 @7 live`,
  ]);
  // Fresh snapshots, with the leased key, read the same in both versions.
  const fresh = [c2, c1].map((c) => c.room(room).watch());
  await Promise.all(fresh.map((w) => w.ready()));
  assert.deepEqual(fresh[0]!.entries(), fresh[1]!.entries());
  assert.deepEqual(fresh[0]!.entry('seat/bo'), { key: 'seat/bo', value: 1, createRev: 6, modRev: 6, version: 1, lease: true });
  assert.deepEqual(fresh[0]!.entries(), watches[0]!.entries());
});

test('integration-v2: a v2 watch whose socket stalled is caught up by a coalesced message to the room\'s state', { timeout: 20_000 }, async (t) => {
  const room = roomName('slow:');
  const ctl = controlledWebSocket();
  const slow = client({ WebSocket: ctl.WebSocket });
  const writer = client();
  const r = writer.room(room);
  await r.put('gone', 0);
  // Keys the catch-up leaves alone: a catch-up of most of a room past the queue's bytes comes as a
  // snapshot, which costs the server no more.
  for (let i = 0; i < 8; i++) await r.put(`pad${i}`, i);
  const w = slow.room(room).watch();
  const seen = follow(w).seen;
  await w.ready();
  assert.equal(ctl.sockets[0]!.protocol, V2);

  // The slow socket stops reading; 20 KB values over 4 keys until the server parks its watch.
  ctl.sockets[0]!.pause();
  const big = (i: number) => `${i}`.padEnd(20 << 10, 'v');
  let writes = 0;
  const parked = async () => (await sessionOf(slow))?.watches.some((x) => x.room === room && x.state === 'parked');
  while (!(await parked())) {
    assert.ok(writes < 1000, '20 MB written and the watch was never parked');
    for (let i = 0; i < 10; i++, writes++) await r.put(`k${writes % 4}`, big(writes));
  }
  t.diagnostic(`parked after ${writes} writes of 20 KB`);
  const { rev } = await r.delete('gone');
  ctl.sockets[0]!.resume();

  await until(() => w.rev === rev, 'the catch-up', 10_000);
  const causes = new Set(seen.map((c) => c.cause)); // initial, live until the socket's buffers filled, then the catch-up
  assert.ok(causes.has('coalesced'), `caught up by ${[...causes]}`);
  assert.ok(!causes.has('resync'), 'not by a snapshot');
  const deleted = seen.filter((c) => c.key === 'gone' && c.type === 'delete');
  assert.equal(deleted.length, 1);
  const fresh = client({ codec: jsonCodec }).room(room).watch();
  await fresh.ready();
  assert.equal(fresh.rev, rev);
  assert.deepEqual(w.entries(), fresh.entries());
  assert.deepEqual(w.entries().map((e) => e.key).filter((k) => k.startsWith('k')), ['k0', 'k1', 'k2', 'k3']);
});
