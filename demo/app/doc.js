// The shared document: doc/title and doc/cards/<id> are keys; every edit is
// a write conditional on the key's mod revision when the edit began, so an
// edit made meanwhile by someone else is shown next to yours, never lost.
// Edits made offline wait in this tab, shown as unsaved, until they are written.
import { ConflictError, NotConnectedError, OutcomeUnknownError } from '/sdk/statecast.js';
import { avatar, connect, h, me, mountBadge, mountWho, newId, notify, plural, roomName, until } from './common.js';

const TITLE = 'doc/title';
const CARDS = 'doc/cards/';
const $ = (id) => document.getElementById(id);

const client = connect();
const room = client.room(roomName('doc:demo'));
const watch = room.watch('doc/');
const presence = room.presence();
const bases = new Map(); // key → { modRev, value } when this user began editing it
const conflicts = new Map(); // key → { field, mine }
const items = new Map(); // card key → its <li>
const outbox = new Map(); // `key field` → { key, field, value, write }: edits not written yet (see save)
let editing = null;
let lastOrder = 0;

const present = () => presence.set({ name: me.name, color: me.color, editing }).catch(() => {});
present();
mountWho($('who'), () => (present(), renderEditors()));
mountBadge($('badge'), client, watch);
const notice = (text, kind) => notify($('notice'), text, kind);

/** The cards as this user sees them: the room's with this user's unsaved edits over them, and unsaved new cards (no modRev). */
function cards() {
  const shown = new Map(watch.entries().filter((e) => e.key.startsWith(CARDS)).map((e) => [e.key, e]));
  for (const op of outbox.values()) {
    const e = shown.get(op.key);
    if (op.field === 'delete') shown.delete(op.key);
    else if (op.field === 'add') {
      if (!e) shown.set(op.key, { key: op.key, value: op.value, unsaved: true });
    } else if (e) shown.set(op.key, { ...e, value: { ...e.value, [op.field]: op.value }, unsaved: true });
  }
  return [...shown.values()].sort((a, b) => (a.value.order ?? 0) - (b.value.order ?? 0) || (a.key < b.key ? -1 : 1));
}

/**
 * Queues an edit of key's field (`add`: a new card, `delete`), shown at once as
 * unsaved, and sends what waits. Edits are written in the order they were
 * made, while connected; one that could not be sent (offline) or whose
 * reply was lost with the socket waits for the next connection. Every write
 * is conditional, so sending one again never applies it twice. A later
 * edit of the same field replaces a waiting one.
 */
function save(key, field, value, write) {
  const id = `${key} ${field}`;
  outbox.delete(id);
  outbox.set(id, { key, field, value, write });
  render();
  flush();
}

let flushing = false;
/** Sends the waiting edits one at a time, in the order made, while connected. */
async function flush() {
  if (flushing) return;
  flushing = true;
  try {
    for (const [id, op] of outbox) {
      if (client.status !== 'connected') break;
      try {
        await op.write();
      } catch (e) {
        if (e instanceof NotConnectedError || e instanceof OutcomeUnknownError) break;
        notice(op.field === 'add' ? `Not added: “${op.value.text}”: ${e.message}` : `Not saved: ${e.message}`, 'error');
      }
      if (outbox.get(id) === op) outbox.delete(id); // else edited again meanwhile: that edit is still to send
      render();
    }
  } finally {
    flushing = false;
  }
}

/** How an unsaved edit is labelled: sending, or waiting for the connection. */
const unsaved = () => (client.status === 'connected' ? 'saving…' : 'not saved yet');

function beginEdit(key) {
  const e = watch.entry(key);
  bases.set(key, { modRev: e?.modRev ?? 0, value: e?.value });
  editing = key;
  present();
  renderEditors(); // this user's own line: presence reports only the others
}

function endEdit() {
  editing = null;
  present();
  renderEditors();
}

/**
 * Writes `field` of `key` as `mine`, on the version `base` the edit began
 * from. When someone wrote the key meanwhile: if they changed another
 * field, both edits are kept (written again on their version); if they
 * changed the same field, the conflict is shown and the user picks.
 */
async function commit(key, field, mine, defaults, base) {
  try {
    await room.put(key, { ...defaults, ...base.value, [field]: mine, by: me.name }, { ifModRev: base.modRev, waitFor: watch });
  } catch (e) {
    if (!(e instanceof ConflictError)) throw e;
    await until(watch, key, e.modRev);
    const now = watch.entry(key);
    if (now && now.value?.[field] === mine) return; // already so: ours, sent before the socket dropped
    if (now && now.value?.[field] === base.value?.[field]) return commit(key, field, mine, defaults, now); // they changed another field: keep both
    conflicts.set(key, { field, mine, defaults });
    renderConflicts();
  }
}

async function useMine(key) {
  const c = conflicts.get(key);
  const now = watch.entry(key);
  try {
    await room.put(key, { ...c.defaults, ...now?.value, [c.field]: c.mine, by: me.name }, { ifModRev: now?.modRev ?? 0, waitFor: watch });
    conflicts.delete(key);
  } catch (e) {
    if (!(e instanceof ConflictError)) notice(`Not saved: ${e.message}`, 'error');
  }
  renderConflicts();
  render();
}

function keepTheirs(key) {
  conflicts.delete(key);
  renderConflicts();
  render();
}

function renderConflicts() {
  $('conflicts').replaceChildren(...[...conflicts].map(([key, c]) => {
    const now = watch.entry(key);
    const what = key === TITLE ? 'the title' : c.field === 'text' ? 'this card' : `this card's ${c.field}`;
    const who = now?.value?.by ?? 'Someone';
    return h('section', { class: 'conflict', 'data-testid': 'conflict', role: 'alert' },
      h('h3', {}, now ? `${who} changed ${what} meanwhile` : `Someone deleted ${what} meanwhile`),
      h('div', { class: 'versions' },
        h('div', { class: 'version' }, h('div', { class: 'label' }, now ? `Theirs · ${who}` : 'Theirs'),
          h('div', { class: 'value', 'data-testid': 'theirs' }, now ? String(now.value?.[c.field] ?? '') : '(deleted)')),
        h('div', { class: 'version' }, h('div', { class: 'label' }, 'Yours'),
          h('div', { class: 'value', 'data-testid': 'mine' }, String(c.mine)))),
      h('div', { class: 'row' },
        h('button', { type: 'button', onclick: () => keepTheirs(key) }, now ? 'Keep theirs' : 'Discard mine'),
        h('button', { type: 'button', class: 'primary', onclick: () => useMine(key) }, now ? 'Use mine' : 'Restore mine')));
  }));
}

async function toggle(key, done) {
  for (let attempt = 0; attempt < 3; attempt++) {
    const now = watch.entry(key);
    if (!now || now.value.done === done) return;
    try {
      return void (await room.put(key, { ...now.value, done, by: me.name }, { ifModRev: now.modRev, waitFor: watch }));
    } catch (e) {
      if (!(e instanceof ConflictError)) throw e;
      await until(watch, key, e.modRev); // someone else wrote it: apply the toggle to their version
    }
  }
}

/** Swaps the card with its neighbour (dir -1: up, +1: down) in one transaction on both versions. */
async function move(key, dir) {
  if (client.status !== 'connected') return notice('Offline: cards can be moved again once the connection is back.', 'error');
  const list = cards().map((e) => watch.entry(e.key)); // as the room has them; a new card not written yet is undefined
  const i = list.findIndex((e) => e?.key === key);
  const a = list[i];
  const b = list[i + dir];
  if (!a || !b) return;
  let [oa, ob] = [b.value.order, a.value.order];
  if (oa === ob) oa = ob + dir;
  try {
    await room.txn({
      if: [{ key: a.key, modRev: a.modRev }, { key: b.key, modRev: b.modRev }],
      ops: [{ type: 'put', key: a.key, value: { ...a.value, order: oa, by: me.name } },
        { type: 'put', key: b.key, value: { ...b.value, order: ob, by: me.name } }],
    }, { waitFor: watch });
  } catch (e) {
    notice(e instanceof ConflictError ? 'Someone changed these cards meanwhile; look and try again.' : `Not moved: ${e.message}`, 'error');
  }
}

/** Deletes the card as this user sees it (not if someone changed it meanwhile); a new card not written yet is dropped. */
function remove(key) {
  for (const [id, op] of outbox) if (op.key === key) outbox.delete(id); // its unsaved edits go with it
  const seen = watch.entry(key)?.modRev;
  if (seen === undefined) return render();
  save(key, 'delete', null, () => del(key, seen));
}

async function del(key, seen) {
  try {
    await room.delete(key, { ifModRev: seen, waitFor: watch });
  } catch (e) {
    if (!(e instanceof ConflictError)) throw e;
    await until(watch, key, e.modRev);
    if (watch.entry(key)) notice(`${watch.get(key).by ?? 'Someone'} changed that card meanwhile; it was not deleted.`, 'error');
  }
}

function add(form) {
  const input = form.elements.text;
  const text = input.value.trim();
  if (!text) return;
  input.value = ''; // the card is in the list now, saved or waiting to be
  for (const e of cards()) lastOrder = Math.max(lastOrder, e.value.order ?? 0);
  lastOrder += 1;
  const key = CARDS + newId();
  const value = { text, done: false, order: lastOrder, by: me.name };
  save(key, 'add', value, () => create(key, value));
}

/** Writes a new card; a conflict means it exists: ours, sent before the socket dropped (its id is new). */
async function create(key, value) {
  try {
    await room.put(key, value, { ifModRev: 0, waitFor: watch });
  } catch (e) {
    if (!(e instanceof ConflictError)) throw e;
  }
}

/** Wires a text input to a key's field: edits start on focus and are saved on change (Enter or leaving the field). */
function editable(input, key, field, defaults) {
  input.addEventListener('focus', () => beginEdit(key));
  input.addEventListener('blur', endEdit);
  input.addEventListener('keydown', (ev) => ev.key === 'Enter' && input.blur());
  input.addEventListener('change', () => {
    const mine = input.value.trim();
    const base = bases.get(key) ?? watch.entry(key) ?? { modRev: 0 };
    bases.delete(key);
    if (base.value?.[field] !== mine) return save(key, field, mine, () => commit(key, field, mine, defaults, base));
    outbox.delete(`${key} ${field}`); // back to what the room has: nothing to save
    render();
  });
}

function cardItem(key) {
  const text = h('input', { type: 'text', class: 'text', 'data-testid': 'card-text', 'aria-label': 'Card text', maxlength: '200' });
  editable(text, key, 'text', { done: false, order: 0 });
  return h('li', { class: 'card', 'data-testid': 'card', 'data-key': key },
    h('input', { type: 'checkbox', 'data-testid': 'done', 'aria-label': 'Done', onchange: (ev) => {
      const done = ev.target.checked;
      save(key, 'done', done, () => toggle(key, done));
    } }),
    text,
    h('span', { class: 'by' }),
    h('span', { class: 'tools' },
      h('button', { type: 'button', class: 'icon', 'aria-label': 'Move up', onclick: () => move(key, -1) }, '↑'),
      h('button', { type: 'button', class: 'icon', 'aria-label': 'Move down', onclick: () => move(key, 1) }, '↓'),
      h('button', { type: 'button', class: 'icon', 'aria-label': 'Delete', onclick: () => remove(key) }, '✕')));
}

/** Whoever else is editing key, for an outline in their colour. */
function editorOf(key) {
  for (const p of presence.others.values()) if (p?.editing === key) return p;
  return undefined;
}

function mark(el, key) {
  const p = editorOf(key);
  el.classList.toggle('editing-by', !!p);
  el.style.setProperty('--who', p?.color ?? 'transparent');
  el.title = p ? `${p.name} is editing` : '';
}

/** Updates the DOM in place: a focused input keeps its text and caret. */
function render() {
  const title = $('title');
  const t = watch.entry(TITLE);
  const mine = outbox.get(`${TITLE} text`);
  if (document.activeElement !== title) title.value = mine?.value ?? t?.value?.text ?? '';
  title.classList.toggle('unsaved', !!mine);
  $('title-by').textContent = mine ? `Title ${unsaved()}` : t ? `Title edited by ${t.value.by} · rev ${t.modRev}` : 'Click the title to name this document.';
  mark(title, TITLE);

  const list = $('cards');
  const want = cards();
  const keys = new Set(want.map((e) => e.key));
  for (const [key, li] of items) if (!keys.has(key)) (li.remove(), items.delete(key));
  if (want.length) list.querySelector('.empty')?.remove();
  else if (!list.querySelector('.empty')) list.append(h('li', { class: 'empty' }, 'No cards yet: add the first one below.'));
  want.forEach((e, i) => {
    let li = items.get(e.key);
    if (!li) items.set(e.key, (li = cardItem(e.key)));
    if (list.children[i] !== li) list.insertBefore(li, list.children[i] ?? null);
    const [box, text, by, tools] = li.children;
    const isNew = e.modRev === undefined; // not written yet: it can be deleted (dropped), nothing else
    box.checked = !!e.value.done;
    box.disabled = text.readOnly = isNew;
    li.classList.toggle('done', !!e.value.done);
    li.classList.toggle('unsaved', !!e.unsaved);
    if (document.activeElement !== text) text.value = e.value.text ?? '';
    by.textContent = e.unsaved ? unsaved() : e.value.by ?? '';
    tools.children[0].disabled = isNew || want[i - 1]?.modRev === undefined;
    tools.children[1].disabled = isNew || want[i + 1]?.modRev === undefined;
    mark(text, e.key);
  });
  $('unsaved').textContent = outbox.size && client.status !== 'connected'
    ? `Offline: ${plural(outbox.size, 'change')} not saved yet. They are kept here and saved when the connection is back; keep this tab open.` : '';
}

function renderEditors() {
  const people = [{ name: me.name, color: me.color, editing, you: true }, ...presence.others.values()];
  $('editor-count').textContent = String(people.length);
  $('editors').replaceChildren(...people.map((p) => {
    const what = !p.editing ? 'viewing' : p.editing === TITLE ? 'editing the title' : `editing “${watch.get(p.editing)?.text ?? 'a card'}”`;
    return h('li', { class: 'person', 'data-testid': 'editor' }, avatar(p.name, p.color),
      h('span', {}, h('div', {}, p.name ?? 'anonymous', p.you ? ' ' : null, p.you ? h('span', { class: 'tag you' }, 'you') : null),
        h('div', { class: 'what' }, what)));
  }));
  render();
}

editable($('title'), TITLE, 'text', {});
$('add').addEventListener('submit', (ev) => {
  ev.preventDefault();
  add(ev.target);
});
watch.on('change', (c) => {
  const li = items.get(c.key);
  if (li && c.type === 'put' && c.cause !== 'initial' && c.value?.by !== me.name) {
    li.classList.add('flash');
    setTimeout(() => li.classList.remove('flash'), 700);
  }
});
watch.on('changes', () => {
  render();
  if (conflicts.size) renderConflicts();
});
client.on('status', () => {
  flush();
  render();
});
// Unsaved edits live only in this tab: the browser asks before closing or reloading it.
addEventListener('beforeunload', (ev) => outbox.size && ev.preventDefault());
presence.on('change', renderEditors);
renderEditors();
