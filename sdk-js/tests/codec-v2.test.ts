// Protocol v2 (statecast.v2.json, PROTOCOL.md §11): json2Codec reads the
// dense events and snapshot items into exactly v1's messages, refuses what
// is not v2 instead of guessing, and the client offers v2 then v1 and speaks
// the version the server answered, against scripted fake servers.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import WebSocket from 'ws';
import { ClosedError, createClient, json2Codec, jsonCodec, type ChangeEvent } from '../dist/index.js';
import { FakeServer } from './support/fake-server.js';
import { nextEvent, record, until } from './support/util.js';

const V2 = 'statecast.v2.json';
const V1 = 'statecast.v1.json';
const decode1 = (line: string) => json2Codec.decode(line)[0];

/** PROTOCOL.md with wrapped lines joined, to find its examples in. */
const spec = readFileSync(new URL('../../server/PROTOCOL.md', import.meta.url), 'utf8').replace(/\n\s*/g, '');

test('codec v2: the examples of PROTOCOL.md §11 read as the v1 messages they stand for', () => {
  const examples: [v2: string, v1: object][] = [
    [
      '{"t":"events","s":1,"r":58,"e":[["games/7",{"name":"Dune","players":3,"max":4},12,6],["games/9"]]}',
      {
        t: 'events', s: 1, rev: 58,
        events: [
          { type: 'put', key: 'games/7', value: { name: 'Dune', players: 3, max: 4 }, create_rev: 12, mod_rev: 58, version: 6 },
          { type: 'delete', key: 'games/9', mod_rev: 58 },
        ],
      },
    ],
    [
      '{"t":"snapshot","s":1,"epoch":"9f2c41d07a3b11e8","rev":57,"reason":"initial","items":[["games/7",{"name":"Dune","players":2,"max":4},12,57,5]]}',
      JSON.parse('{"t":"snapshot","s":1,"epoch":"9f2c41d07a3b11e8","rev":57,"reason":"initial","items":[{"key":"games/7","value":{"name":"Dune","players":2,"max":4},"create_rev":12,"mod_rev":57,"version":5}]}'),
    ],
    // §10's exchange in v2: the lines that differ.
    ['{"t":"connected","v":2,"session":"s_1","resume":"r_1","resumed":false,"ping_ms":25000,"lease_grace_ms":5000}', { t: 'connected', v: 2, session: 's_1', resume: 'r_1', resumed: false, ping_ms: 25000, lease_grace_ms: 5000 }],
    [
      '{"t":"snapshot","s":1,"epoch":"e1","rev":3,"reason":"initial","items":[["title","Plan",1,3,2]]}',
      JSON.parse('{"t":"snapshot","s":1,"epoch":"e1","rev":3,"reason":"initial","items":[{"key":"title","value":"Plan","create_rev":1,"mod_rev":3,"version":2}]}'),
    ],
    [
      '{"t":"events","s":1,"r":4,"e":[["title","Plan B",1,3]]}',
      JSON.parse('{"t":"events","s":1,"rev":4,"events":[{"type":"put","key":"title","value":"Plan B","create_rev":1,"mod_rev":4,"version":3}]}'),
    ],
  ];
  for (const [v2, v1] of examples) {
    assert.ok(spec.includes(v2), `PROTOCOL.md no longer has ${v2}`);
    assert.deepStrictEqual(decode1(v2), v1, v2);
  }
  // The two events §11 spells out in prose, in a coalesced message at 72 and an events message at 9.
  assert.ok(spec.includes('`["k",{"m":70}]`') && spec.includes('`["p/ann",1,3,2,{"l":1,"w":"w1"}]`'));
  assert.deepStrictEqual(decode1('{"t":"coalesced","s":2,"r":72,"e":[["k",{"m":70}]]}'), { t: 'coalesced', s: 2, rev: 72, events: [{ type: 'delete', key: 'k', mod_rev: 70 }] });
  assert.deepStrictEqual(decode1('{"t":"events","s":2,"r":9,"e":[["p/ann",1,3,2,{"l":1,"w":"w1"}]]}'), {
    t: 'events', s: 2, rev: 9,
    events: [{ type: 'put', key: 'p/ann', value: 1, create_rev: 3, mod_rev: 9, version: 2, lease: true, wid: 'w1' }],
  });
});

test('codec v2: every extras field, on puts, deletes and leaves; unknown ones ignored', () => {
  const events = (r: number, e: unknown[]) => (decode1(JSON.stringify({ t: 'events', s: 3, r, e })) as { events: unknown[] }).events;
  assert.deepStrictEqual(events(80, [
    ['a', null, 5, 2, { m: 79 }], // m: its own mod_rev
    ['b', [1], 6, 1, { l: 1 }], // l: leased
    ['c', 'x', 7, 3, { w: 'c1.4' }], // w: the write id
    ['d', { v: 2 }, 4, 2, { p: [{ v: 1 }, 4, 60, 1] }], // p: the previous state
    ['e', { m: 70, l: 1, w: 'c1.5', p: ['old', 1, 2, 3, 1] }], // a delete with all of them (its prev was leased)
    ['f', { x: 1 }], // x: a leave
    ['g', { x: 1, m: 75, w: 'c1.6', p: [true, 9, 9, 1] }],
    ['h', 1, 8, 1, { l: 0, x: 0, zz: [1, { deep: true }], m2: 'ignored' }], // l and x other than 1 and unknown fields: nothing
    ['i', 2, 9, 4, { x: 1 }], // x on a put: it stays a put (the length decides)
    ['j', {}], // an empty extras object
  ]), [
    { type: 'put', key: 'a', value: null, create_rev: 5, mod_rev: 79, version: 2 },
    { type: 'put', key: 'b', value: [1], create_rev: 6, mod_rev: 80, version: 1, lease: true },
    { type: 'put', key: 'c', value: 'x', create_rev: 7, mod_rev: 80, version: 3, wid: 'c1.4' },
    { type: 'put', key: 'd', value: { v: 2 }, create_rev: 4, mod_rev: 80, version: 2, prev: { value: { v: 1 }, create_rev: 4, mod_rev: 60, version: 1 } },
    { type: 'delete', key: 'e', mod_rev: 70, lease: true, prev: { value: 'old', create_rev: 1, mod_rev: 2, version: 3, lease: true }, wid: 'c1.5' },
    { type: 'leave', key: 'f', mod_rev: 80 },
    { type: 'leave', key: 'g', mod_rev: 75, prev: { value: true, create_rev: 9, mod_rev: 9, version: 1 }, wid: 'c1.6' },
    { type: 'put', key: 'h', value: 1, create_rev: 8, mod_rev: 80, version: 1 },
    { type: 'put', key: 'i', value: 2, create_rev: 9, mod_rev: 80, version: 4 },
    { type: 'delete', key: 'j', mod_rev: 80 },
  ]);
  // Snapshot items: {"l":1} is a lease; other extras are ignored.
  assert.deepStrictEqual((decode1('{"t":"snapshot","s":3,"epoch":"e","rev":9,"reason":"slow","items":[["a",1,1,2,3,{"l":1}],["b",null,4,5,6,{"q":1}],["c",{},7,8,9]]}') as { items: unknown }).items, [
    { key: 'a', value: 1, create_rev: 1, mod_rev: 2, version: 3, lease: true },
    { key: 'b', value: null, create_rev: 4, mod_rev: 5, version: 6 },
    { key: 'c', value: {}, create_rev: 7, mod_rev: 8, version: 9 },
  ]);
  // Empty lists stay empty.
  assert.deepStrictEqual(decode1('{"t":"coalesced","s":1,"r":5,"e":[]}'), { t: 'coalesced', s: 1, rev: 5, events: [] });
  assert.deepStrictEqual(decode1('{"t":"snapshot","s":1,"epoch":"e","rev":0,"reason":"initial","items":[]}'), { t: 'snapshot', s: 1, epoch: 'e', rev: 0, reason: 'initial', items: [] });
});

test('codec v2: a frame of several messages, as text or bytes; the other messages are v1 as they are', () => {
  const frame = [
    '{"t":"ok","id":2,"rev":58}',
    '{"t":"events","s":1,"r":58,"e":[["k","v\\nw",1,1]]}',
    '{"t":"synced","s":1,"rev":58}',
    '{"t":"progress","s":1,"rev":60}',
    '{"t":"err","id":3,"code":"conflict","message":"no","key":"k","mod_rev":58}',
    '{"t":"unsubscribed","s":1,"code":"unavailable","message":"room reset"}',
    '',
  ].join('\n');
  const want = [
    { t: 'ok', id: 2, rev: 58 },
    { t: 'events', s: 1, rev: 58, events: [{ type: 'put', key: 'k', value: 'v\nw', create_rev: 1, mod_rev: 58, version: 1 }] },
    { t: 'synced', s: 1, rev: 58 },
    { t: 'progress', s: 1, rev: 60 },
    { t: 'err', id: 3, code: 'conflict', message: 'no', key: 'k', mod_rev: 58 },
    { t: 'unsubscribed', s: 1, code: 'unavailable', message: 'room reset' },
  ];
  const bytes = new TextEncoder().encode(frame);
  assert.deepStrictEqual(json2Codec.decode(frame), want);
  assert.deepStrictEqual(json2Codec.decode(bytes), want);
  assert.deepStrictEqual(json2Codec.decode(bytes.buffer), want);
  // Requests are written as in v1.
  assert.equal(json2Codec.encode({ t: 'put', value: 'a\nb', x: undefined }), jsonCodec.encode({ t: 'put', value: 'a\nb', x: undefined }));
  assert.equal(json2Codec.subprotocol, V2);
});

test('codec v2: what is not v2 is refused, never guessed (a v1 message included)', () => {
  const ev = (e: string, r = '9') => `{"t":"events","s":1,"r":${r},"e":[${e}]}`;
  const items = (it: string) => `{"t":"snapshot","s":1,"epoch":"e","rev":9,"reason":"initial","items":[${it}]}`;
  const bad = [
    // the envelope
    '{"t":"events","s":1,"r":9}',
    '{"t":"events","s":1,"r":9,"e":{}}',
    '{"t":"events","s":1,"e":[]}',
    ev('', '-1'),
    ev('', '1.5'),
    ev('', '"9"'),
    '{"t":"coalesced","s":1,"r":9,"e":null}',
    '{"t":"snapshot","s":1,"epoch":"e","rev":9,"reason":"initial"}',
    '{"t":"snapshot","s":1,"epoch":"e","rev":9,"reason":"initial","items":{}}',
    // v1's forms
    '{"t":"events","s":1,"rev":9,"events":[{"type":"put","key":"k","value":1,"create_rev":1,"mod_rev":9,"version":1}]}',
    ev('{"type":"delete","key":"k","mod_rev":9}'),
    items('{"key":"k","value":1,"create_rev":1,"mod_rev":9,"version":1}'),
    // events of another length
    ev('[]'),
    ev('["k",1,2]'),
    ev('["k",1,2,3,{},{}]'),
    ev('"k"'),
    ev('null'),
    // extras that are not an object
    ev('["k",null]'),
    ev('["k",[]]'),
    ev('["k",1]'),
    ev('["k","x"]'),
    ev('["k",1,2,3,null]'),
    ev('["k",1,2,3,[1]]'),
    ev('["k",1,2,3,true]'),
    // fields of the wrong type
    ev('[1]'),
    ev('[null,{}]'),
    ev('[["k"]]'),
    ev('["k",1,"2",3]'),
    ev('["k",1,2,-3]'),
    ev('["k",1,2.5,3]'),
    ev('["k",{"m":-1}]'),
    ev('["k",{"m":"70"}]'),
    ev('["k",{"m":null}]'),
    ev('["k",{"w":5}]'),
    ev('["k",1,2,3,{"p":{"value":1}}]'),
    ev('["k",1,2,3,{"p":[1,2,3]}]'),
    ev('["k",1,2,3,{"p":[1,2,3,4,5]}]'),
    ev('["k",1,2,3,{"p":[1,"2",3,4]}]'),
    // items
    items('["k",1,2,3]'),
    items('["k",1,2,3,4,{},5]'),
    items('["k",1,2,3,4,null]'),
    items('["k",1,2,3,4,[]]'),
    items('[7,1,2,3,4]'),
    items('["k",1,2,-3,4]'),
    items('["k",1,2,3,"4"]'),
  ];
  for (const line of bad) assert.throws(() => json2Codec.decode(line), /malformed statecast\.v2\.json message/, line);
  // One bad message makes the frame bad, whatever surrounds it.
  assert.throws(() => json2Codec.decode('{"t":"ok","id":1}\n' + ev('["k",1,2]') + '\n{"t":"ok","id":2}'));
  // Not JSON at all.
  assert.throws(() => json2Codec.decode('{"t":"events",'), SyntaxError);
});

const put = (key: string, value: unknown, create: number, version: number, extras?: object) => [key, value, create, version, ...(extras ? [extras] : [])];
const brief = (cs: ChangeEvent[]) => cs.map((c) => `${c.type} ${c.key}=${JSON.stringify(c.value)} lease=${c.entry?.lease ?? '-'}${c.entry?.pending ? ' pending' : ''} @${c.rev} ${c.cause}`);

test('client: offers v2 then v1; a server that speaks v2 is read in v2 (snapshot with a lease, events, a write confirmed by its wid, coalesced, leave)', { timeout: 20_000 }, async () => {
  const srv = await FakeServer.start({ protocols: [V1, V2] }); // the client's order decides
  const c = createClient({ url: srv.url, WebSocket, sessionStore: false });
  try {
    const conn = await srv.nextConn();
    assert.deepEqual(srv.offers[0], [V2, V1]);
    assert.equal(conn.protocol, V2);
    await conn.accept();
    await until(() => c.status === 'connected');
    const w = c.room('r').watch('', { where: 'true' });
    const changes = record(w, 'change');
    const sub = await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 7, reason: 'initial', items: [['a', 1, 1, 1, 1], ['p/me', { on: true }, 7, 7, 1, { l: 1 }]] });
    await w.ready();
    assert.deepEqual(w.entry('p/me'), { key: 'p/me', value: { on: true }, createRev: 7, modRev: 7, version: 1, lease: true });

    const write = c.room('r').put('b', 'mine');
    const m = await conn.next('put');
    conn.send({ t: 'events', s: sub.id, r: 8, e: [put('b', 'mine', 8, 1, { w: m.wid }), ['a', { x: 1 }]] }, { t: 'ok', id: m.id, rev: 8 });
    assert.deepEqual(await write, { rev: 8 });
    conn.send({ t: 'coalesced', s: sub.id, r: 12, e: [put('c', [3], 9, 1, { m: 10 }), ['b', { m: 11, x: 1 }], put('p/me', { on: false }, 7, 2, { l: 1 })] });
    await until(() => w.rev === 12, 'the coalesced message');
    assert.deepEqual(brief(changes), [
      'put a=1 lease=false @7 initial',
      'put p/me={"on":true} lease=true @7 initial',
      'put b="mine" lease=false pending @8 live', // in the view: the write shows over it until its wid confirms it
      'leave a=undefined lease=- @8 live',
      'put b="mine" lease=false @8 live',
      'put c=[3] lease=false @12 coalesced',
      'leave b=undefined lease=- @12 coalesced',
      'put p/me={"on":false} lease=true @12 coalesced',
    ]);
    assert.deepEqual(w.entry('c'), { key: 'c', value: [3], createRev: 9, modRev: 10, version: 1, lease: false });

    // A frame that is not v2 (here v1's events) closes the socket: the client stops, as for any undecodable frame.
    const err = nextEvent(c, 'error');
    conn.send({ t: 'events', s: sub.id, rev: 13, events: [{ type: 'delete', key: 'c', mod_rev: 13 }] });
    const e = await err;
    assert.ok(e instanceof ClosedError && e.closeCode === 1007, String(e));
    await until(() => c.status === 'disconnected');
    assert.equal(w.has('c'), true, 'nothing guessed from the bad frame');
  } finally {
    c.close();
    await srv.close();
  }
});

test('client: across a rolling deploy it speaks each server\'s version — v1 from an older one, v2 again after', { timeout: 20_000 }, async () => {
  const srv = await FakeServer.start({ protocols: [V1] });
  const c = createClient({ url: srv.url, WebSocket, sessionStore: false, reconnect: { minDelayMs: 5, maxDelayMs: 20 } });
  try {
    const w = c.room('r').watch();
    const conns = [];
    for (const [protocols, v] of [[[V1], 1], [[V2, V1], 2], [[V1], 1]] as const) {
      srv.protocols = [...protocols];
      const conn = await srv.nextConn();
      conns.push(conn);
      assert.deepEqual(srv.offers.at(-1), [V2, V1]);
      assert.equal(conn.protocol, protocols[0]);
      await conn.accept();
      assert.equal(conn.all('connect').length, 1);
      const rev = w.rev + 1;
      // The first subscription gets a snapshot, the resumed ones are in sync at once; then one write each.
      const start = w.rev ? { t: 'synced', rev: w.rev } : { t: 'snapshot', epoch: 'e1', rev: 0, reason: 'initial', items: [] };
      const events = v === 1
        ? { t: 'events', rev, events: [{ type: 'put', key: `k${rev}`, value: v, create_rev: rev, mod_rev: rev, version: 1 }] }
        : { t: 'events', r: rev, e: [put(`k${rev}`, v, rev, 1)] };
      await conn.sub(start, events);
      await until(() => w.rev === rev, `the events of v${v}`);
      assert.equal(w.get(`k${rev}`), v);
      conn.close(1012, 'restart');
    }
    assert.deepEqual(conns.map((x) => x.protocol), [V1, V2, V1]);
  } finally {
    c.close();
    await srv.close();
  }
});

test('client: a codec option is the only one offered (jsonCodec: v1 only; json2Codec: v2 only)', { timeout: 20_000 }, async () => {
  const srv = await FakeServer.start({ protocols: [V1, V2] });
  try {
    for (const [codec, offered] of [[jsonCodec, V1], [json2Codec, V2]] as const) {
      const c = createClient({ url: srv.url, WebSocket, sessionStore: false, codec });
      try {
        const conn = await srv.nextConn();
        assert.deepEqual(srv.offers.at(-1), [offered]);
        assert.equal(conn.protocol, offered);
        await conn.accept();
        await until(() => c.status === 'connected');
        const w = c.room('r').watch();
        await conn.sub({ t: 'snapshot', epoch: 'e', rev: 1, reason: 'initial', items: [codec === jsonCodec ? { key: 'k', value: 1, create_rev: 1, mod_rev: 1, version: 1 } : ['k', 1, 1, 1, 1]] });
        await w.ready();
        assert.equal(w.get('k'), 1);
      } finally {
        c.close();
      }
    }
  } finally {
    await srv.close();
  }
});
