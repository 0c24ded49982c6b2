// The board: cards in three columns, each card one key (board/cards/<id>).
// Every change is an optimistic write: it shows at once, marked "saving…",
// also offline (the SDK queues it), and it is conditional on the card's
// revision the user saw, so one that lost a race is rolled back by the SDK;
// the page then says whose change won.
import { useEffect, useState, type FormEvent, type KeyboardEvent } from 'react';
import type { Entry, RollbackEvent, StatecastError } from '../../sdk-js/src/index.js';
import { createRoomHooks, useClient, usePresence, useStatus } from '../../sdk-js/src/react.js';
import { defineRoom } from '../../sdk-js/src/typed.js';
import { me, newId } from '../app/common.js';

const COLUMNS = [
  { id: 'todo', name: 'To do' },
  { id: 'doing', name: 'Doing' },
  { id: 'done', name: 'Done' },
] as const;
type Column = (typeof COLUMNS)[number]['id'];

/** A card; `by` is who wrote it last, `order` sorts a column (a card moved or added goes last). */
interface Card {
  title: string;
  column: Column;
  order: number;
  by: string;
}
interface Here {
  name: string;
  color: string;
}

const CARDS = 'board/cards/';
const BoardRoom = defineRoom<{ 'board/cards/': Card }>();
const { useRoom, useWatch } = createRoomHooks(BoardRoom);

/** Errors the rollback notice already tells of (the write's promise rejects with the same error after the event). */
const rolledBack = new WeakSet<StatecastError>();

/** The room's writes as the UI makes them: a failure not told by a rollback (refused before showing) becomes a notice. */
function useWrites(onRefused: (e: Error) => void) {
  const room = useRoom();
  const settle = (p: Promise<unknown>) => p.catch((e: StatecastError) => rolledBack.has(e) || onRefused(e));
  return {
    put: (key: `${typeof CARDS}${string}`, card: Card, ifModRev: number) => settle(room.put(key, card, { ifModRev })),
    remove: (e: Entry<Card>) => settle(room.delete(e.key, { ifModRev: e.modRev })),
  };
}
type Writes = ReturnType<typeof useWrites>;

/** Changes some fields of a card, conditional on the revision shown (a pending entry carries its confirmed one: the SDK chains). */
function update(w: Writes, e: Entry<Card>, change: Partial<Card>) {
  w.put(e.key as `${typeof CARDS}${string}`, { ...e.value, ...change, by: me.name }, e.modRev);
}

export function Board() {
  const cards = useWatch(CARDS);
  const client = useClient();
  const room = useRoom();
  const [rollback, setRollback] = useState<RollbackEvent | null>(null);
  const [refused, setRefused] = useState('');
  const writes = useWrites((e) => setRefused(`Not saved: ${e.message}`));
  useEffect(
    () =>
      client.on('rollback', (e) => {
        if (e.room !== room.room.name) return;
        rolledBack.add(e.error);
        setRollback(e);
      }),
    [client, room],
  );
  if (!cards) return <p className="empty">loading…</p>;
  return (
    <div className="grid">
      <section className="stack">
        {rollback && <RollbackNotice event={rollback} cards={cards} onDismiss={() => setRollback(null)} />}
        <div className="notice" role="status" data-kind="error" data-testid="notice">{refused}</div>
        <div className="board">
          {COLUMNS.map((c) => (
            <Lane key={c.id} column={c.id} name={c.name} cards={cards.filter((e) => e.value.column === c.id)} writes={writes} />
          ))}
        </div>
      </section>
      <aside className="stack">
        <HereNow />
        <section className="panel small muted">
          <h2>Under the hood</h2>
          React on <code>@statecast/sdk/react</code>, under StrictMode. A card is a key (<code>board/cards/&lt;id&gt;</code>) written
          only if nobody changed it since you saw it (<code>ifModRev</code>). A write shows at once as <i>saving…</i>, offline
          too, until the server confirms it; one that lost a race is undone, and you are told.
        </section>
      </aside>
    </div>
  );
}

/** What a rolled-back write was to do, and why it was undone, told with the card as it is now. */
function RollbackNotice({ event, cards, onDismiss }: { event: RollbackEvent; cards: readonly Entry<Card>[]; onDismiss: () => void }) {
  const op = event.ops[0];
  const now = cards.find((e) => e.key === op?.key);
  const mine = op?.type === 'put' ? `your change to “${(op.value as Card).title}”` : 'your delete';
  const why =
    event.error.code !== 'conflict' ? event.error.message : now ? `${now.value.by} changed this card meanwhile; it shows their version` : 'someone deleted this card meanwhile';
  return (
    <div className="notice rollback" role="alert" data-kind="error" data-testid="rollback">
      <span>
        Undone: {mine}. {why}.
      </span>
      <button type="button" className="icon" aria-label="Dismiss" onClick={onDismiss}>
        ✕
      </button>
    </div>
  );
}

function Lane({ column, name, cards, writes }: { column: Column; name: string; cards: readonly Entry<Card>[]; writes: Writes }) {
  const sorted = [...cards].sort((a, b) => a.value.order - b.value.order || (a.key < b.key ? -1 : 1));
  return (
    <section className="panel lane" data-testid={`column-${column}`}>
      <h2>
        {name} <span className="count">{cards.length}</span>
      </h2>
      <ul className="cards">
        {sorted.map((e) => (
          <CardItem key={e.key} entry={e} writes={writes} />
        ))}
      </ul>
      <AddCard column={column} writes={writes} />
    </section>
  );
}

function CardItem({ entry, writes }: { entry: Entry<Card>; writes: Writes }) {
  const online = useStatus() === 'connected';
  const [draft, setDraft] = useState<string | null>(null);
  const { title, column } = entry.value;
  const i = COLUMNS.findIndex((c) => c.id === column);
  const move = (by: number) => update(writes, entry, { column: COLUMNS[i + by].id, order: Date.now() });
  const commit = () => {
    const t = draft?.trim();
    setDraft(null);
    if (t && t !== title) update(writes, entry, { title: t });
  };
  const enter = (ev: KeyboardEvent<HTMLInputElement>) => ev.key === 'Enter' && ev.currentTarget.blur();
  return (
    <li className={`card${entry.pending ? ' pending' : ''}`} data-testid="card" data-pending={entry.pending ? '' : undefined}>
      <input
        type="text"
        className="text"
        data-testid="card-title"
        aria-label="Card title"
        maxLength={200}
        value={draft ?? title}
        onFocus={() => setDraft(title)}
        onChange={(ev) => setDraft(ev.target.value)}
        onBlur={commit}
        onKeyDown={enter}
      />
      <span className="by">{entry.pending ? (online ? 'saving…' : 'saving when online…') : entry.value.by}</span>
      <span className="tools">
        <button type="button" className="icon" aria-label="Move left" disabled={i === 0} onClick={() => move(-1)}>
          ←
        </button>
        <button type="button" className="icon" aria-label="Move right" disabled={i === COLUMNS.length - 1} onClick={() => move(1)}>
          →
        </button>
        <button type="button" className="icon" aria-label="Delete" onClick={() => writes.remove(entry)}>
          ✕
        </button>
      </span>
    </li>
  );
}

function AddCard({ column, writes }: { column: Column; writes: Writes }) {
  const [title, setTitle] = useState('');
  const add = (ev: FormEvent) => {
    ev.preventDefault();
    const t = title.trim();
    if (!t) return;
    setTitle('');
    writes.put(`${CARDS}${newId()}`, { title: t, column, order: Date.now(), by: me.name }, 0);
  };
  return (
    <form className="add" autoComplete="off" onSubmit={add}>
      <input type="text" placeholder="Add a card" aria-label={`New card in ${column}`} data-testid={`new-card-${column}`} maxLength={200} value={title} onChange={(ev) => setTitle(ev.target.value)} />
    </form>
  );
}

/** Who is here: this user, then the others present in the room (a presence per tab). */
function HereNow() {
  const others = usePresence<Here>({ name: me.name, color: me.color });
  const people = [{ id: 'me', name: me.name, color: me.color, you: true }, ...[...(others ?? new Map<string, Here>())].map(([id, p]) => ({ id, ...p, you: false }))];
  return (
    <section className="panel">
      <h2>
        Here now <span className="count">{people.length}</span>
      </h2>
      <ul className="people" data-testid="here">
        {people.map((p) => (
          <li className="person" key={p.id} data-testid="person">
            <span className="avatar" style={{ background: p.color }}>
              {p.name.slice(0, 1).toUpperCase()}
            </span>
            {p.name}
            {p.you && <span className="tag you">you</span>}
          </li>
        ))}
      </ul>
    </section>
  );
}
