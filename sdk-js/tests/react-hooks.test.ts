// The React hooks for Suspense, pending writes, rollbacks and a watch's sync,
// against a scripted fake server.
import { mount } from './support/react.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Suspense, createElement as h, type ReactNode } from 'react';
import type { Client, Entry, RollbackEvent, SyncEvent } from '../dist/index.js';
import { RoomProvider, StatecastProvider, useMyPresence, usePendingWrites, useRollback, useSuspenseWatch, useSync } from '../dist/react.js';
import { connectedClient } from './support/fake-server.js';
import { sleep, until } from './support/util.js';

const item = (key: string, value: unknown, mod: number) => ({ key, value, create_rev: mod, mod_rev: mod, version: 1 });
const last = <T>(xs: T[]) => xs[xs.length - 1];
const tree = (c: Client, child: ReactNode) => h(StatecastProvider, { client: c }, h(RoomProvider, { id: 'board:1' }, child));

test('react: useSuspenseWatch suspends until the watch has a view, then never returns undefined; useSync tells its kind', async () => {
  const { c, conn, done } = await connectedClient();
  try {
    const lists: (readonly Entry[])[] = [];
    const syncs: (SyncEvent | undefined)[] = [];
    let fallbacks = 0;
    function Todos() {
      lists.push(useSuspenseWatch('todo/'));
      return null;
    }
    function Sync() {
      syncs.push(useSync('todo/'));
      return null;
    }
    function Fallback() {
      fallbacks++;
      return null;
    }
    const m = mount(tree(c, [h(Suspense, { key: 'a', fallback: h(Fallback) }, h(Todos)), h(Sync, { key: 'b' })]));
    const sub = await conn.next('sub');
    await until(() => fallbacks > 0, 'suspended');
    assert.equal(lists.length, 0, 'nothing rendered without a view');
    conn.send({ t: 'ok', id: sub.id }, { t: 'snapshot', s: sub.id, epoch: 'e1', rev: 1, reason: 'initial', items: [item('todo/1', 'milk', 1)] });
    await until(() => lists.length > 0 && last(syncs) !== undefined, 'rendered');
    assert.deepEqual(last(lists)!.map((e) => e.key), ['todo/1']);
    assert.ok(lists.every((l) => l !== undefined));
    assert.equal(last(syncs)!.kind, 'initial');
    m.unmount();
  } finally {
    await done();
  }
});

test('react: usePendingWrites counts the writes not settled; useRollback hears a failed one', async () => {
  const { c, conn, done } = await connectedClient();
  try {
    const counts: number[] = [];
    const rollbacks: RollbackEvent[] = [];
    function Badge() {
      counts.push(usePendingWrites());
      useRollback((ev) => rollbacks.push(ev));
      return null;
    }
    const m = mount(tree(c, h(Badge)));
    await until(() => counts.length > 0, 'mounted');
    assert.equal(last(counts), 0);
    const p = c.room('board:1').put('title', 'x', { ifModRev: 0 });
    p.catch(() => {});
    await until(() => last(counts) === 1, 'one pending');
    const put = await conn.next('put');
    conn.send({ t: 'err', id: put.id, code: 'conflict', message: 'title exists', key: 'title', mod_rev: 3, rev: 3 });
    await until(() => last(counts) === 0 && rollbacks.length === 1, 'rolled back');
    assert.equal(rollbacks[0]!.error.code, 'conflict');
    assert.deepEqual(rollbacks[0]!.keys, ['title']);
    m.unmount();
  } finally {
    await done();
  }
});

test('react: useMyPresence merges partial updates into self at once and writes the latest, throttled', async () => {
  const { c, conn, done } = await connectedClient();
  try {
    type Cursor = { x: number; y: number; name: string };
    const selves: (Cursor | undefined)[] = [];
    let update!: (patch: Partial<Cursor>) => void;
    function Me() {
      const [self, set] = useMyPresence<Cursor>({ throttleMs: 200 });
      selves.push(self);
      update = set;
      return null;
    }
    const m = mount(tree(c, h(Me)));
    await until(() => selves.length > 0, 'mounted');
    assert.equal(last(selves), undefined);
    update({ name: 'ann', x: 0, y: 0 });
    for (let i = 1; i <= 5; i++) update({ x: i });
    await until(() => last(selves)?.x === 5, 'self re-rendered');
    assert.deepEqual(last(selves), { name: 'ann', x: 5, y: 0 });
    const first = await conn.next('put', (p) => p.key.startsWith('presence/'));
    conn.send({ t: 'ok', id: first.id, rev: 1 });
    await sleep(350); // past the throttle
    const puts = conn.all('put').filter((p) => p.key.startsWith('presence/'));
    assert.ok(puts.length <= 2, `${puts.length} writes for 6 updates`);
    assert.deepEqual(last(puts)!.value, { name: 'ann', x: 5, y: 0 }, 'the latest value is written');
    m.unmount();
  } finally {
    await done();
  }
});
