// Type tests of typed rooms and the typed React hooks: compiled by the test
// build (`tsc -p tsconfig.test.json`), never run. Each `@ts-expect-error`
// line must fail to compile; if one compiles (a wrong value type accepted),
// tsc reports the directive as unused and the test build fails.
import { createClient, type Entry } from '../dist/index.js';
import { createRoomHooks } from '../dist/react.js';
import { defineRoom, type StandardSchema, type TypedWatch } from '../dist/typed.js';
import type { Cursor, Meta, Todo } from './support/schemas.js';

declare const todo: Todo;
declare const cursor: Cursor;
declare const meta: Meta;
declare const id: string;
declare const anyKey: string;

export function typedRoomTypes() {
  const Board = defineRoom<{ 'todo/': Todo; 'todo/meta': Meta; 'cursor/': Cursor }>();
  const board = Board.of(createClient({ url: '/v1/ws', autoConnect: false }).room('board:1'));

  void board.put('todo/1', todo);
  void board.put(`todo/${id}`, todo);
  void board.put('cursor/ann', cursor);
  // @ts-expect-error a Cursor is not a Todo
  void board.put('todo/1', cursor);
  // @ts-expect-error a missing field
  void board.put('todo/1', { text: 'milk' });
  // @ts-expect-error the longest prefix wins: todo/meta holds a Meta
  void board.put('todo/meta', todo);
  void board.put('todo/meta', meta);
  // @ts-expect-error no prefix declares this key
  void board.put('other/1', todo);
  // A key only known as a string may hold any of the room's value types.
  void board.put(anyKey, cursor);

  void board.txn({ ops: [{ type: 'put', key: 'todo/1', value: todo }, { type: 'delete', key: 'cursor/ann' }] });
  // @ts-expect-error a txn put is checked too
  void board.txn({ ops: [{ type: 'put', key: 'cursor/ann', value: todo }] });

  const cursors: TypedWatch<Cursor> = board.watch('cursor/');
  const near: TypedWatch<Cursor> = board.watch('cursor/', { where: 'value.x < 100.0' });
  const x: number | undefined = cursors.get('cursor/ann')?.x;
  // @ts-expect-error a cursor watch holds Cursors, not Todos
  const t: Todo | undefined = board.watch('cursor/').get('cursor/ann');
  // Under todo/ are Todos and the Meta of todo/meta.
  const items: readonly Entry<Todo | Meta>[] = board.watch('todo/').entries();
  // @ts-expect-error not only Todos under todo/
  const onlyTodos: readonly Entry<Todo>[] = board.watch('todo/').entries();
  return [x, t, items, onlyTodos, near];
}

export function schemaTypes() {
  const todoSchema = {} as StandardSchema<Todo>;
  const dates = {} as StandardSchema<string, Date>; // a schema whose output differs from its input
  const Board = defineRoom({ 'todo/': todoSchema, 'due/': dates });
  const board = Board.of(createClient({ url: '/v1/ws', autoConnect: false }).room('board:1'));
  void board.put('due/1', '2030-01-01'); // writes take the schema's input
  // @ts-expect-error not a Date: the stored value is the input
  void board.put('due/1', new Date());
  // @ts-expect-error the schema's type
  void board.put('todo/1', cursor);
  const due: Date | undefined = board.watch('due/').get('due/1'); // reads are the schema's output
  return due;
}

export function hookTypes() {
  const { useWatch, useEntry, useRoom } = createRoomHooks(defineRoom<{ 'todo/': Todo; 'cursor/': Cursor }>());
  const todos: readonly Entry<Todo>[] | undefined = useWatch('todo/');
  const done: number | undefined = useWatch('todo/', (es) => es.filter((e) => e.value.done).length);
  // @ts-expect-error the entries under cursor/ are Cursors
  const wrong: readonly Entry<Todo>[] | undefined = useWatch('cursor/');
  const one: Entry<Cursor> | null | undefined = useEntry('cursor/ann');
  // @ts-expect-error the room is typed
  void useRoom().put('cursor/ann', todo);
  // Filtered: the options form, with or without a selection; the old forms stay.
  const open: readonly Entry<Todo>[] | undefined = useWatch('todo/', { where: '!value.done' });
  const openCount: number | undefined = useWatch('todo/', { where: '!value.done', select: (es) => es.length, isEqual: (a, b) => a === b });
  // @ts-expect-error a selection's type is what select returns
  const notEntries: readonly Entry<Todo>[] | undefined = useWatch('todo/', { where: '!value.done', select: (es) => es.length });
  // @ts-expect-error where is a string
  useWatch('todo/', { where: 1 });
  return [todos, done, wrong, one, open, openCount, notEntries];
}

export function suspenseAndPresenceTypes() {
  type Me = { x: number; y: number; name: string };
  const { useSuspenseWatch, useMyPresence, useOthers } = createRoomHooks(defineRoom<{ 'todo/': Todo; 'presence/': Me }>());
  const todos: readonly Entry<Todo>[] = useSuspenseWatch('todo/'); // never undefined
  const count: number = useSuspenseWatch('todo/', (es) => es.length);
  const [me, update] = useMyPresence();
  const x: number | undefined = me?.x;
  update({ x: 1 }); // partial
  // @ts-expect-error the presence value is typed
  update({ x: 'left' });
  const others: ReadonlyMap<string, Me> | undefined = useOthers();
  return [todos, count, x, others];
}
