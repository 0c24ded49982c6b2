// Typed rooms at run time, against a scripted fake server: writes are
// validated by the schema of the key's longest prefix before sending (a
// SchemaError rejection, nothing sent); reads are validated lazily, once per
// entry (key, mod_rev), an invalid entry left out with its issues readable,
// and the typed snapshot keeps its identity.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { defineRoom, SchemaError, type StandardSchema } from '../dist/typed.js';
import { connectedClient } from './support/fake-server.js';
import { isMeta, isTodo, schema, type Todo } from './support/schemas.js';
import { until } from './support/util.js';

const item = (key: string, value: unknown, mod: number) => ({ key, value, create_rev: mod, mod_rev: mod, version: 1 });

test('typed: a write its schema refuses rejects with SchemaError (with the issues) and is not sent; the longest prefix decides', async () => {
  const { c, conn, done } = await connectedClient();
  try {
    const Board = defineRoom({ 'todo/': schema<Todo>(isTodo), 'todo/meta': schema<{ title: string }>(isMeta) });
    const board = Board.of(c.room('board:1'));
    const bad = { text: 'milk' } as unknown as Todo; // what a cast or an untyped caller lets through
    await assert.rejects(board.put('todo/1', bad), (e: unknown) => e instanceof SchemaError && e.code === 'invalid_value' && e.key === 'todo/1' && /not a valid value/.test(e.issues[0]!.message));
    await assert.rejects(board.put('todo/meta', { title: 7 } as never), SchemaError);
    await assert.rejects(board.txn({ ops: [{ type: 'delete', key: 'todo/2' }, { type: 'put', key: 'todo/3', value: bad }] }), SchemaError);
    assert.deepEqual(conn.all('put').concat(conn.all('txn')), [], 'nothing was sent');

    const ok = board.put('todo/meta', { title: 'Plan' });
    const sent = await conn.next('put');
    assert.deepEqual(sent.value, { title: 'Plan' });
    conn.send({ t: 'ok', id: sent.id, rev: 4 });
    assert.deepEqual(await ok, { rev: 4 });
  } finally {
    await done();
  }
});

test('typed: an asynchronous schema is refused with SchemaError, never awaited (writes keep their order)', async () => {
  const { c, conn, done } = await connectedClient();
  try {
    const later: StandardSchema<number> = { '~standard': { version: 1, vendor: 'test', validate: async (v) => ({ value: v as number }) } };
    const board = defineRoom({ 'n/': later }).of(c.room('board:1'));
    await assert.rejects(board.put('n/1', 1), (e: unknown) => e instanceof SchemaError && /synchronous/.test(e.issues[0]!.message));
    assert.deepEqual(conn.all('put'), []);
  } finally {
    await done();
  }
});

test('typed: reads are validated once per entry; an invalid entry is left out with its issues; the snapshot keeps its identity', async () => {
  const { c, conn, done } = await connectedClient();
  try {
    const todo = schema<Todo, Todo & { checked: boolean }>(isTodo, (t) => ({ ...t, checked: t.done })); // an output that differs from the input
    const Board = defineRoom({ 'todo/': todo });
    const w = Board.of(c.room('board:1')).watch('todo/');
    await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 3, reason: 'initial', items: [item('todo/1', { text: 'milk', done: true }, 1), item('todo/2', { text: 2 }, 2), item('todo/3', { text: 'eggs', done: false }, 3)] });
    await w.watch.ready();

    const first = w.entries();
    assert.deepEqual(first.map((e) => [e.key, e.value.checked]), [['todo/1', true], ['todo/3', false]]);
    assert.equal(w.entry('todo/2'), undefined);
    assert.match(w.issues('todo/2')![0]!.message, /not a valid value/);
    assert.equal(w.issues('todo/1'), undefined);
    assert.deepEqual(w.watch.get('todo/1'), { text: 'milk', done: true }, 'the watch keeps the value as stored');
    assert.equal(w.entries(), first, 'the same array until the view changes');
    assert.equal(w.entry('todo/1'), first[0], 'the same entry object');
    assert.equal(todo.calls, 3, 'each entry validated once');

    conn.send({ t: 'events', s: 1, rev: 4, events: [{ type: 'put', ...item('todo/3', { text: 'eggs', done: true }, 4) }] });
    await until(() => w.watch.rev === 4);
    const second = w.entries();
    assert.notEqual(second, first);
    assert.equal(second[0], first[0], 'an unchanged entry keeps its identity');
    assert.equal(second[1]!.value.checked, true);
    assert.equal(todo.calls, 4, 'only the changed entry was validated again');
  } finally {
    await done();
  }
});

test('typed: a room typed without schemas is not validated and its views are the watch\'s own arrays', async () => {
  const { c, conn, done } = await connectedClient();
  try {
    const w = defineRoom<{ 'todo/': Todo }>().of(c.room('board:1')).watch('todo/');
    await conn.sub({ t: 'snapshot', epoch: 'e1', rev: 1, reason: 'initial', items: [item('todo/1', { text: 'milk', done: true }, 1)] });
    await w.watch.ready();
    assert.equal(w.entries(), w.watch.entries());
    assert.equal(w.entry('todo/1'), w.watch.entry('todo/1'));
  } finally {
    await done();
  }
});
