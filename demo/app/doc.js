// The shared document: doc/title and doc/cards/<id> are keys; every edit is
// a write conditional on the key's mod revision when the edit began, so an
// edit made meanwhile by someone else is shown next to yours, never lost.
import { ConflictError } from '/sdk/statecast.js';
import { avatar, connect, h, me, mountBadge, mountWho, newId, notify, roomName, until } from './common.js';

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
let editing = null;
let lastOrder = 0;

const present = () => presence.set({ name: me.name, color: me.color, editing }).catch(() => {});
present();
mountWho($('who'), present);
mountBadge($('badge'), client, watch);
const notice = (text, kind) => notify($('notice'), text, kind);

function cards() {
  return watch.entries().filter((e) => e.key.startsWith(CARDS))
    .sort((a, b) => (a.value.order ?? 0) - (b.value.order ?? 0) || (a.key < b.key ? -1 : 1));
}

function beginEdit(key) {
  const e = watch.entry(key);
  bases.set(key, { modRev: e?.modRev ?? 0, value: e?.value });
  editing = key;
  present();
}

function endEdit() {
  editing = null;
  present();
}

/**
 * Writes `field` of `key` as `mine`, on the version the edit began from.
 * When someone wrote the key meanwhile: if they changed another field, both
 * edits are kept (written again on their version); if they changed the same
 * field, the conflict is shown and the user picks.
 */
async function commit(key, field, mine, defaults = {}) {
  const base = bases.get(key) ?? { modRev: watch.entry(key)?.modRev ?? 0, value: watch.get(key) };
  bases.delete(key);
  if (base.value?.[field] === mine) return;
  try {
    await room.put(key, { ...defaults, ...base.value, [field]: mine, by: me.name }, { ifModRev: base.modRev });
  } catch (e) {
    if (!(e instanceof ConflictError)) return notice(`Not saved: ${e.message}`, 'error');
    await until(watch, key, e.modRev);
    const now = watch.entry(key);
    if (now && now.value?.[field] === base.value?.[field]) {
      bases.set(key, { modRev: now.modRev, value: now.value }); // they changed another field: keep both
      return commit(key, field, mine, defaults);
    }
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
    if (!now || now.value.done === done) return render();
    try {
      return void (await room.put(key, { ...now.value, done, by: me.name }, { ifModRev: now.modRev }));
    } catch (e) {
      if (!(e instanceof ConflictError)) return notice(`Not saved: ${e.message}`, 'error');
      await until(watch, key, e.modRev); // someone else wrote it: apply the toggle to their version
    }
  }
}

/** Swaps the card with its neighbour (dir -1: up, +1: down) in one transaction on both versions. */
async function move(key, dir) {
  const list = cards();
  const i = list.findIndex((e) => e.key === key);
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

async function remove(key) {
  const e = watch.entry(key);
  if (!e) return;
  try {
    await room.delete(key, { ifModRev: e.modRev });
  } catch (err) {
    notice(err instanceof ConflictError ? `${watch.get(key)?.by ?? 'Someone'} changed that card meanwhile; it was not deleted.` : `Not deleted: ${err.message}`, 'error');
  }
}

async function add(form) {
  const input = form.elements.text;
  const text = input.value.trim();
  if (!text) return;
  input.value = '';
  for (const e of cards()) lastOrder = Math.max(lastOrder, e.value.order ?? 0);
  lastOrder += 1;
  try {
    await room.put(CARDS + newId(), { text, done: false, order: lastOrder, by: me.name }, { ifModRev: 0 });
  } catch (e) {
    notice(`Not added: ${e.message}`, 'error');
  }
}

/** Wires a text input to a key's field: edits start on focus and commit on change (Enter or leaving the field). */
function editable(input, key, field, defaults) {
  input.addEventListener('focus', () => beginEdit(key));
  input.addEventListener('blur', endEdit);
  input.addEventListener('keydown', (ev) => ev.key === 'Enter' && input.blur());
  input.addEventListener('change', () => commit(key, field, input.value.trim(), defaults));
}

function cardItem(key) {
  const text = h('input', { type: 'text', class: 'text', 'data-testid': 'card-text', 'aria-label': 'Card text', maxlength: '200' });
  editable(text, key, 'text', { done: false, order: 0 });
  return h('li', { class: 'card', 'data-testid': 'card', 'data-key': key },
    h('input', { type: 'checkbox', 'data-testid': 'done', 'aria-label': 'Done', onchange: (ev) => toggle(key, ev.target.checked) }),
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
  if (document.activeElement !== title) title.value = t?.value?.text ?? '';
  $('title-by').textContent = t ? `Title edited by ${t.value.by} · rev ${t.modRev}` : 'Click the title to name this document.';
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
    box.checked = !!e.value.done;
    li.classList.toggle('done', !!e.value.done);
    if (document.activeElement !== text) text.value = e.value.text ?? '';
    by.textContent = e.value.by ?? '';
    tools.children[0].disabled = i === 0;
    tools.children[1].disabled = i === want.length - 1;
    mark(text, e.key);
  });
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
presence.on('change', renderEditors);
renderEditors();
