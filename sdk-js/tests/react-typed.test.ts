// The typed React hooks and a refused subscription, against a scripted fake
// server: an entry its schema refuses is left out (null for useEntry), never
// thrown during render; the server refusing a watch before it had a view is
// thrown to the nearest error boundary.
import { mount } from './support/react.js';
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Component, createElement as h, type ReactNode } from 'react';
import { ForbiddenError, type Client, type Entry } from '../dist/index.js';
import { createRoomHooks, RoomProvider, StatecastProvider, useWatch } from '../dist/react.js';
import { defineRoom } from '../dist/typed.js';
import { connectedClient } from './support/fake-server.js';
import { isTodo, schema, type Todo } from './support/schemas.js';
import { until } from './support/util.js';

const item = (key: string, value: unknown, mod: number) => ({ key, value, create_rev: mod, mod_rev: mod, version: 1 });
const last = <T>(xs: T[]) => xs[xs.length - 1];

const tree = (c: Client, child: ReactNode) => h(StatecastProvider, { client: c }, h(RoomProvider, { id: 'board:1' }, child));

test('react typed: useWatch and useEntry of a typed room leave out what the schema refuses, without throwing', async () => {
  const { c, conn, done } = await connectedClient();
  try {
    const { useWatch: useTodos, useEntry: useTodo } = createRoomHooks(defineRoom({ 'todo/': schema<Todo>(isTodo) }));
    const lists: (readonly Entry<Todo>[] | undefined)[] = [];
    const bad: (Entry<Todo> | null | undefined)[] = [];
    function Todos() {
      lists.push(useTodos('todo/'));
      return null;
    }
    function Bad() {
      bad.push(useTodo('todo/2'));
      return null;
    }
    const m = mount(tree(c, [h(Todos, { key: 'a' }), h(Bad, { key: 'b' })]));
    const snapshot = async (prefix: string, items: unknown[]) => {
      const sub = await conn.next('sub', (m) => (m.prefixes ?? m.keys)?.[0] === prefix); // useEntry's is of keys
      conn.send({ t: 'ok', id: sub.id }, { t: 'snapshot', s: sub.id, epoch: 'e1', rev: 2, reason: 'initial', items });
    };
    await snapshot('todo/', [item('todo/1', { text: 'milk', done: false }, 1), item('todo/2', { text: 2 }, 2)]);
    await snapshot('todo/2', [item('todo/2', { text: 2 }, 2)]);
    await until(() => last(lists) !== undefined && last(bad) !== undefined, 'loaded');
    assert.deepEqual(last(lists)!.map((e) => e.key), ['todo/1']);
    assert.equal(last(bad), null, 'an invalid entry reads as absent');
    m.unmount();
  } finally {
    await done();
  }
});

class Boundary extends Component<{ children?: ReactNode; caught: unknown[] }, { error?: unknown }> {
  override state: { error?: unknown } = {};
  static getDerivedStateFromError(error: unknown) {
    return { error };
  }
  override componentDidCatch(error: unknown) {
    this.props.caught.push(error);
  }
  override render() {
    return this.state.error ? null : this.props.children;
  }
}

test('react: a subscription the server refuses before any view is thrown to the nearest error boundary', async () => {
  const { c, conn, done } = await connectedClient();
  const logged = console.error;
  console.error = () => {}; // React logs what a boundary caught
  try {
    const caught: unknown[] = [];
    function Todos() {
      useWatch('todo/');
      return null;
    }
    const m = mount(tree(c, h(Boundary, { caught }, h(Todos))));
    const sub = await conn.next('sub');
    conn.send({ t: 'err', id: sub.id, code: 'forbidden', message: 'no grant for todo/' });
    await until(() => caught.length > 0, 'the boundary caught it');
    assert.ok(caught[0] instanceof ForbiddenError);
    m.unmount();
  } finally {
    console.error = logged;
    await done();
  }
});
