// The React bindings against the real server: StrictMode's double mount
// leaves one subscription (counted by the server's inspector and metrics),
// the provider connects in an effect, snapshots keep their identity so
// components re-render only for what they show, and presence comes and goes
// with the components that use it.
import { mount } from './support/react.js';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createElement as h, StrictMode, type ReactNode } from 'react';
import WebSocket from 'ws';
import { createClient, type Client, type Entry } from '../dist/index.js';
import { RoomProvider, StatecastProvider, useEntry, usePresence, useStatus, useWatch } from '../dist/react.js';
import { startServer, type Server } from './support/server.js';
import { until } from './support/util.js';

const LINGER_MS = 150;
let srv: Server;
const clients: Client[] = [];

before(async () => {
  srv = await startServer();
});
after(async () => {
  clients.forEach((c) => c.close());
  await srv.stop();
});

let seq = 0;
const roomName = () => `react:${process.pid}-${seq++}`;
function client(autoConnect = true): Client {
  const c = createClient({ url: srv.ws, WebSocket, autoConnect, sessionStore: false });
  clients.push(c);
  return c;
}

function tree(c: Client, room: string, ...children: ReactNode[]) {
  return h(StrictMode, null, h(StatecastProvider, { client: c, lingerMs: LINGER_MS }, h(RoomProvider, { id: room }, ...children)));
}

/** A component that renders nothing and reports its hook's value on every render. */
function probe<T>(hook: () => T, seen: T[]) {
  return function Probe() {
    seen.push(hook());
    return null;
  };
}
const last = <T>(xs: T[]) => xs[xs.length - 1];

/** The watches the server holds for this client's session in `room` (the inspector). */
async function watchesOf(c: Client, room: string): Promise<{ sub: number; prefixes: string[]; filter?: string }[]> {
  const r = (await (await fetch(`${srv.http}/v1/admin/inspect`)).json()) as { clients: { session: string; watches: { sub: number; room: string; prefixes: string[]; filter?: string }[] }[] };
  return (r.clients.find((cl) => cl.session === c.session?.session)?.watches ?? []).filter((w) => w.room === room);
}

/** Subscriptions the server has started without a resume position (its metrics). */
async function freshSubscriptions(): Promise<number> {
  const text = await (await fetch(`${srv.http}/metrics`)).text();
  return Number(/^statecast_subscribe_total\{mode="fresh"\} (\d+)$/m.exec(text)?.[1] ?? 0);
}

test('react: StrictMode double mount leaves exactly one subscription on the server; it ends a linger after the last unmount', async () => {
  const c = client();
  await c.ready(); // connected: a subscription that ended and started again would reach the server
  const room = roomName();
  await c.room(room).put('todo/1', 'milk');
  const startsBefore = await freshSubscriptions();
  const a: (readonly Entry[] | undefined)[] = [];
  const b: (readonly Entry[] | undefined)[] = [];
  const m = mount(tree(c, room, h(probe(() => useWatch('todo/'), a)), h(probe(() => useWatch('todo/'), b))));
  await until(() => last(a)?.length === 1 && last(b)?.length === 1, 'both components show the list');
  assert.equal(a[0], undefined, 'the first render is the loading state');
  assert.deepEqual((await watchesOf(c, room)).map((w) => w.prefixes), [['todo/']], 'the inspector shows one watch');
  assert.equal((await freshSubscriptions()) - startsBefore, 1, 'one subscription started: no unsubscribe and subscribe again');

  await c.room(room).put('todo/2', 'eggs');
  await until(() => last(a)?.length === 2 && last(b)?.length === 2, 'both components follow the change');
  assert.equal(last(a), last(b), 'one shared view: the same frozen array');

  m.unmount();
  await until(async () => (await watchesOf(c, room)).length === 0, 'the subscription ends after the linger');
  assert.equal((await freshSubscriptions()) - startsBefore, 1);
});

test('react: useWatch with where shows what the server selects; the same prefix and where share one subscription, another where has its own', async () => {
  const c = client();
  await c.ready();
  const room = roomName();
  await c.room(room).put('todo/1', { text: 'milk', done: false });
  await c.room(room).put('todo/2', { text: 'eggs', done: true });
  const open: (readonly Entry[] | undefined)[] = [];
  const open2: (number | undefined)[] = [];
  const done: (readonly Entry[] | undefined)[] = [];
  const all: (readonly Entry[] | undefined)[] = [];
  const count = (es: readonly Entry[]) => es.length;
  const m = mount(
    tree(
      c,
      room,
      h(probe(() => useWatch('todo/', { where: '!value.done' }), open)),
      h(probe(() => useWatch('todo/', { where: '!value.done', select: count }), open2)),
      h(probe(() => useWatch('todo/', { where: 'value.done' }), done)),
      h(probe(() => useWatch('todo/'), all)),
    ),
  );
  await until(() => last(open)?.length === 1 && last(open2) === 1 && last(done)?.length === 1 && last(all)?.length === 2, 'the views');
  assert.deepEqual([last(open)![0]!.key, last(done)![0]!.key], ['todo/1', 'todo/2']);
  const ws = await watchesOf(c, room);
  assert.deepEqual(ws.map((w) => w.filter ?? '').sort(), ['', '!value.done', 'value.done'], 'one subscription per (prefix, where)');

  await c.room(room).put('todo/1', { text: 'milk', done: true });
  await until(() => last(open)?.length === 0 && last(open2) === 0 && last(done)?.length === 2, 'todo/1 left one view and entered the other');
  m.unmount();
  await until(async () => (await watchesOf(c, room)).length === 0, 'the subscriptions end after the linger');
});

test('react: the provider connects the client in an effect, not during render', async () => {
  const c = client(false);
  const room = roomName();
  const statuses: string[] = [];
  const lists: (readonly Entry[] | undefined)[] = [];
  const m = mount(tree(c, room, h(probe(useStatus, statuses)), h(probe(() => useWatch('todo/'), lists))));
  await until(() => last(statuses) === 'connected' && last(lists) !== undefined, 'connected, with a view');
  assert.equal(statuses[0], 'disconnected', 'rendered before connecting');
  assert.deepEqual(last(lists), []);
  m.unmount();
  assert.equal(c.status, 'connected', 'the client is the application\'s to close');
});

test('react: snapshots keep their identity — a component re-renders only when what it shows changed', async () => {
  const c = client();
  const room = roomName();
  await c.room(room).put('todo/1', 'milk');
  const entries: (Entry | null | undefined)[] = [];
  const under1: (readonly Entry[] | undefined)[] = [];
  const keys: (string[] | undefined)[] = [];
  const all: (readonly Entry[] | undefined)[] = [];
  const keysOf = (es: readonly Entry[]) => es.map((e) => e.key);
  const sameKeys = (x: string[], y: string[]) => x.length === y.length && x.every((k, i) => k === y[i]);
  const m = mount(
    tree(
      c,
      room,
      h(probe(() => useEntry('todo/1'), entries)),
      h(probe(() => useWatch('todo/1'), under1)), // a prefix: todo/1 and todo/10
      h(probe(() => useWatch('todo/', keysOf, sameKeys), keys)),
      h(probe(() => useWatch('todo/'), all)), // the same watch as the keys
    ),
  );
  await until(() => !!last(entries) && !!last(keys) && last(under1)?.length === 1 && last(all)?.length === 1, 'loaded');
  const entry = last(entries)!;
  const listed = last(all)![0];
  assert.equal(entry.value, 'milk');

  // todo/10 is under the prefix todo/1, not the entry's key: the entry does not re-render.
  const entryRenders = entries.length;
  await c.room(room).put('todo/10', 'a');
  await until(() => last(under1)?.length === 2 && last(all)?.length === 2, 'todo/10 shown');
  assert.equal(entries.length, entryRenders, 'useEntry(todo/1) did not re-render');
  assert.deepEqual(last(keys), ['todo/1', 'todo/10']);

  // A new value of todo/10 leaves the keys as they were: the selection is unchanged, no re-render.
  const keyRenders = keys.length;
  await c.room(room).put('todo/10', 'b');
  await until(() => last(all)?.find((e) => e.key === 'todo/10')?.value === 'b', 'the new value shown');
  assert.equal(keys.length, keyRenders, 'the keys did not re-render');
  assert.equal(last(all)![0], listed, 'the unchanged entry is the same object in the new list');
  assert.equal(last(entries), entry);
  m.unmount();
});

test('react: useEntry watches its key alone — never games/70 — and two components share one exact-key subscription (StrictMode)', async () => {
  const frames: string[] = [];
  class Recording extends WebSocket {
    constructor(url: string, protocols?: string | string[]) {
      super(url, protocols);
      this.on('message', (d) => frames.push(String(d)));
    }
  }
  const c = createClient({ url: srv.ws, WebSocket: Recording as unknown as typeof WebSocket, sessionStore: false });
  clients.push(c);
  const room = roomName();
  await c.room(room).put('games/70', 'other');
  await c.room(room).put('games/7', 'mine');
  const a: (Entry | null | undefined)[] = [];
  const b: (Entry | null | undefined)[] = [];
  const m = mount(tree(c, room, h(probe(() => useEntry('games/7'), a)), h(probe(() => useEntry('games/7'), b))));
  await until(() => last(a)?.value === 'mine' && last(b)?.value === 'mine', 'loaded');
  const watches = await watchesOf(c, room);
  assert.deepEqual(
    watches.map((w) => [w.prefixes, (w as { keys?: string[] }).keys]),
    [[[], ['games/7']]],
    'one subscription, of the key games/7',
  );
  await c.room(room).put('games/70', 'other 2');
  await c.room(room).put('games/7/x', 'under');
  await c.room(room).put('games/7', 'mine 2');
  await until(() => last(a)?.value === 'mine 2', 'the new value');
  const sent = frames.filter((f) => /"s":/.test(f)); // the subscription's messages
  assert.ok(sent.length > 0 && sent.every((f) => !f.includes('games/70') && !f.includes('games/7/x')), `the server sent only games/7: ${sent.join(' | ')}`);
  m.unmount();
});

test('react: usePresence shows the others; this client leaves a linger after its last component unmounts', async () => {
  const [a, b] = [client(), client()];
  await Promise.all([a.ready(), b.ready()]);
  const room = roomName();
  const seenByA: (ReadonlyMap<string, unknown> | undefined)[] = [];
  const seenByB: (ReadonlyMap<string, unknown> | undefined)[] = [];
  const ma = mount(tree(a, room, h(probe(() => usePresence({ name: 'ann' }), seenByA))));
  const mb = mount(tree(b, room, h(probe(() => usePresence({ name: 'bob' }), seenByB))));
  await until(() => last(seenByA)?.size === 1 && last(seenByB)?.size === 1, 'each sees the other');
  assert.deepEqual([...last(seenByA)!.values()], [{ name: 'bob' }]);
  assert.deepEqual([...last(seenByB)!.values()], [{ name: 'ann' }]);
  assert.deepEqual((await watchesOf(b, room)).map((w) => w.prefixes), [['presence/']], 'StrictMode: one presence watch');

  mb.unmount();
  await until(() => last(seenByA)?.size === 0, 'bob left');
  await until(async () => (await watchesOf(b, room)).length === 0, "bob's presence watch ended");
  ma.unmount();
});
