// The lobby: games are session-leased keys games/<id> written by their
// host; a seat is a key seats/<game>/<n> created only if absent and bound
// to its player's session, so the last seat goes to exactly one player and
// a player who leaves frees their seat by themselves.
//
// The list is filtered on the server: each choice of mode and "free seats
// only" is a watch of games/ with a `where` (a CEL expression over the
// game's value), replaced when the choice changes, so a game the user does
// not want is never sent to this page. "Free seats" must be in the game's
// own value for that: the host's tab keeps `players` (1 + its seats) up to
// date in its game, as only the host may write it (the lobby's backend,
// demo/hooks.go) and a seat ends with its player's session, not by a write
// a joiner could pair with it. The games this user hosts or sits in are a
// second filtered watch ("Your games"), by hostId and by the keys of this
// user's seats, so they stay known (and shown) whatever the list's filter.
import { ConflictError } from '/sdk/statecast.js';
import { avatar, connect, h, me, mountBadge, mountWho, newId, notify, roomName, until } from './common.js';

const MODES = { duel: 'Duel', ffa: 'Free-for-all', coop: 'Co-op' };
const $ = (id) => document.getElementById(id);

const client = connect();
const room = client.room(roomName('lobby:demo'));
const seats = room.watch('seats/'); // every seat: the seats of a listed game, a free one to take, the host's count, this user's own
const presence = room.presence();
const busy = new Set(); // games with a join or leave in flight
const quitting = new Set(); // games this tab is leaving or closing
let held = new Map(); // game id → { name, role: 'host' | 'seat' }: what this tab had at the last change
let mode = 'all';
let freeOnly = false;

/**
 * The games of one `where` at a time; a new `where` opens a new watch and
 * the old one shows until the new one has its view, so the list never
 * blinks empty while the server answers.
 */
class Games {
  w; // the watch shown
  next; // the watch replacing it, until it has its view
  #keys = new WeakMap(); // watch → the keys its `where` names
  /** The games the server selects now with `where` (undefined: all), which names `keys`. */
  set(where, keys = []) {
    const cur = this.next ?? this.w;
    if (cur && cur.where === where) return;
    this.next?.close();
    this.next = undefined;
    if (this.w && this.w.where === where) return; // back to the one shown
    const n = room.watch('games/', { where });
    this.#keys.set(n, keys);
    n.on('changes', () => n === this.w && update());
    n.on('error', (e) => notice(`The server refused the filter: ${e.message}`, 'error'));
    if (!this.w) return void (this.w = n);
    this.next = n;
    n.ready().then(() => {
      if (this.next !== n) return;
      this.w.close();
      [this.w, this.next] = [n, undefined];
      update();
    }, () => {});
  }
  /** Has a view of the `where` last set. */
  get loaded() {
    return !!this.w && this.w.epoch !== undefined && !this.next;
  }
  /** The keys the `where` of the watch shown names. */
  get keys() {
    return this.w ? this.#keys.get(this.w) : [];
  }
  has(key) {
    return !!this.w?.has(key);
  }
  entries() {
    return this.w?.entries() ?? [];
  }
}
const list = new Games(); // the open games the filter chips select
const mine = new Games(); // the games this user hosts or sits in

presence.set({ name: me.name, color: me.color }).catch(() => {});
mountWho($('who'), (name) => {
  presence.set({ name, color: me.color }).catch(() => {});
  renderOnline(); // this user's own line: presence reports only the others
});
mountBadge($('badge'), client, seats);
let losses = []; // told by tellLosses since the last other notice: a replay tells them one revision at a time
const notice = (text, kind) => ((losses = []), notify($('notice'), text, kind));

/** The seats of every game: game id → (n → seat). */
function seatsByGame() {
  const byId = new Map();
  for (const e of seats.entries()) {
    const [, id, n] = e.key.split('/');
    if (!byId.has(id)) byId.set(id, new Map());
    byId.get(id).set(Number(n), { ...e.value, key: e.key, modRev: e.modRev });
  }
  return byId;
}

/** The games of `g` (a Games), each with its seats (host first), oldest first. */
function gamesOf(g, bySeat = seatsByGame()) {
  return g.entries().map((e) => {
    const id = e.key.slice('games/'.length);
    return { id, key: e.key, ...e.value, seats: bySeat.get(id) ?? new Map() };
  }).sort((a, b) => (a.created ?? 0) - (b.created ?? 0) || a.id.localeCompare(b.id));
}

/** The game `id`, if this page knows it (in the list or among this user's). */
const findGame = (id) => [...gamesOf(mine), ...gamesOf(list)].find((g) => g.id === id);

/** The filter of the list: the chosen mode, and free seats (a game without a count, written by hand, counts as free). */
function listWhere() {
  const parts = [];
  if (mode !== 'all') parts.push(`value.mode == ${JSON.stringify(mode)}`);
  if (freeOnly) parts.push('(!has(value.players) || value.players < value.max)');
  return parts.length ? parts.join(' && ') : undefined;
}

/**
 * The keys of the games this user has a confirmed seat in. Not a pending one:
 * a new watch holds this client's writes back until it has its view, and the
 * seat's own write would wait for it.
 */
const seatedKeys = () => [...new Set(seats.entries().filter((e) => !e.pending && e.value?.id === client.clientId).map((e) => `games/${e.key.split('/')[1]}`))].sort();

/** The filter of this user's games: the ones they host, and the ones they sit in (`keys`). */
const mineWhere = (keys) => `value.hostId == ${JSON.stringify(client.clientId)} || key in ${JSON.stringify(keys)}`;

const players = (g) => 1 + g.seats.size;
const freeSeat = (g) => {
  for (let n = 1; n < g.max; n++) if (!g.seats.has(n)) return n;
  return undefined;
};
const mySeat = (g) => [...g.seats.values()].find((s) => s.id === client.clientId);

/** Says at once when a write waits for the connection (the SDK sends it then, or fails it after its request timeout). */
function waitsForConnection(what) {
  if (client.status !== 'connected') notice(`Offline: ${what} when the connection is back.`);
}

async function create(form) {
  const data = new FormData(form);
  const name = String(data.get('name')).trim();
  if (!name) return;
  // Cleared at once, not after the write: what is typed meanwhile is the
  // next game and must not be wiped when this one is acknowledged.
  form.reset();
  const id = newId();
  // hostSession names this tab's session: the lobby's backend (a validation
  // hook, demo/hooks.go) lets only that session close or change the game.
  const game = { name, mode: data.get('mode'), max: Number(data.get('max')), host: me.name, hostId: client.clientId,
    hostSession: client.session?.session, created: Date.now() };
  waitsForConnection(`“${name}” is created`);
  try {
    await room.put(`games/${id}`, { ...game, players: 1 }, { ifModRev: 0, lease: 'session', waitFor: mine.w });
    notice(`“${name}” is open. It stays listed while this tab is connected.`, 'ok');
  } catch (e) {
    const field = form.elements.namedItem('name');
    if (field && !field.value) field.value = name; // give it back to retry
    notice(`Could not create the game: ${e.message}`, 'error');
  }
}

/** Takes the lowest free seat; on a conflict looks again, and says who was faster when none is left. */
async function join(id) {
  busy.add(id);
  render();
  waitsForConnection('you join the game');
  try {
    for (let attempt = 0; attempt < 3; attempt++) {
      const g = findGame(id);
      if (!g) return notice('That game is gone: its host left.', 'error');
      const n = freeSeat(g);
      if (n === undefined) return notice(`“${g.name}” is full.`, 'error');
      const key = `seats/${id}/${n}`;
      try {
        await room.put(key, { id: client.clientId, name: me.name }, { ifModRev: 0, lease: 'session', waitFor: seats });
        return notice(`You joined “${g.name}” (seat ${n + 1} of ${g.max}).`, 'ok');
      } catch (e) {
        if (!(e instanceof ConflictError)) return notice(`Could not join: ${e.message}`, 'error');
        await until(seats, key, e.modRev);
        const now = findGame(id);
        if (now && freeSeat(now) === undefined) {
          const winner = seats.get(key)?.name ?? 'someone';
          return notice(`The last seat in “${g.name}” was taken by ${winner} just before you.`, 'error');
        }
      }
    }
    notice('The game kept changing while you tried to join; try again.', 'error');
  } finally {
    busy.delete(id);
    render();
  }
}

async function leave(g) {
  const seat = mySeat(g);
  if (!seat) return;
  busy.add(g.id);
  quitting.add(g.id);
  render();
  waitsForConnection(`you leave “${g.name}”`);
  try {
    await room.delete(seat.key, { ifModRev: seat.modRev, waitFor: seats });
    notice(`You left “${g.name}”.`);
  } catch (e) {
    notice(`Could not leave: ${e.message}`, 'error');
  } finally {
    busy.delete(g.id);
    quitting.delete(g.id);
    render();
  }
}

async function close(g) {
  quitting.add(g.id);
  waitsForConnection(`“${g.name}” is closed`);
  try {
    await room.delete(g.key, { waitFor: mine.has(g.key) ? mine.w : list.w });
    notice(`You closed “${g.name}”.`);
  } catch (e) {
    notice(`Could not close the game: ${e.message}`, 'error');
  } finally {
    quitting.delete(g.id);
  }
}

function gameItem(g) {
  const full = players(g) >= g.max;
  const hosting = g.hostId === client.clientId;
  const seated = !!mySeat(g);
  const seats = [];
  for (let i = 0; i < g.max; i++) seats.push(h('span', { class: i === 0 || g.seats.has(i) ? 'seat taken' : 'seat' }));
  const who = [g.host, ...[...g.seats.values()].map((s) => s.name)].join(', ');
  let action;
  if (hosting) action = h('button', { type: 'button', class: 'danger', onclick: () => close(g) }, 'Close');
  else if (seated) action = h('button', { type: 'button', disabled: busy.has(g.id), onclick: () => leave(g) }, 'Leave');
  else action = h('button', { type: 'button', class: 'primary', disabled: full || busy.has(g.id), onclick: () => join(g.id) }, busy.has(g.id) ? 'Joining…' : full ? 'Full' : 'Join');
  // Offered to everyone: the server asks the lobby's backend, which
  // refuses anyone but the host, and the page shows its message.
  const closeOther = hosting ? null
    : h('button', { type: 'button', class: 'quiet', title: 'Only the host may close a game: the server asks the app’s backend', onclick: () => close(g) }, 'Close');
  return h('li', { class: full ? 'game full' : 'game', 'data-testid': 'game', 'data-game': g.id },
    h('div', { class: 'name' }, g.name, ' ', hosting ? h('span', { class: 'tag you' }, 'your game') : seated ? h('span', { class: 'tag you' }, 'joined') : null),
    h('div', { class: 'actions' }, action, closeOther),
    h('div', { class: 'meta' },
      h('span', { class: 'mode', 'data-mode': g.mode }, MODES[g.mode] ?? g.mode),
      h('span', { class: 'seats', title: who }, seats),
      h('span', { 'data-testid': 'players' }, `${players(g)}/${g.max} players`),
      h('span', {}, `host ${g.host}`)),
  );
}

function render() {
  const bySeat = seatsByGame();
  const own = gamesOf(mine, bySeat);
  // What the server selects, but this user's own games: those are listed above.
  const open = gamesOf(list, bySeat).filter((g) => !mine.has(g.key));
  $('mine').hidden = !own.length;
  $('my-games').replaceChildren(...own.map(gameItem));
  $('game-count').textContent = String(open.length);
  $('filters').replaceChildren(
    ...['all', ...Object.keys(MODES)].map((m) =>
      h('button', { type: 'button', class: 'chip', 'aria-pressed': String(mode === m), onclick: () => ((mode = m), filterChanged()) }, m === 'all' ? 'All' : MODES[m])),
    h('button', { type: 'button', class: 'chip', 'aria-pressed': String(freeOnly), onclick: () => ((freeOnly = !freeOnly), filterChanged()) }, 'Free seats only'),
  );
  const where = list.w?.where;
  $('where').replaceChildren(where ? h('code', { 'data-testid': 'where' }, where) : 'none: every game');
  $('games').replaceChildren(...(open.length ? open.map(gameItem)
    : [h('li', { class: 'empty' }, !list.loaded ? 'Loading…' : where ? 'No open games match.' : own.length ? 'No other open games.' : 'No open games yet: create one.')]));
  renderOnline();
}

function filterChanged() {
  list.set(listWhere());
  render();
}

function renderOnline() {
  const people = [{ name: me.name, color: me.color, you: true }, ...presence.others.values()];
  $('online-count').textContent = String(people.length);
  $('online').replaceChildren(...people.map((p) =>
    h('li', { class: 'person', 'data-testid': 'person' }, avatar(p.name, p.color), h('span', {}, p.name ?? 'anonymous'),
      p.you ? h('span', { class: 'tag you' }, 'you') : null)));
}

/**
 * Tells this user when a game they host or sit in is gone without their
 * leaving or closing it: its host left (the game ended with the host's
 * session) or closed it, or this tab was away longer than the lease grace,
 * so its session and the keys bound to it ended.
 */
function tellLosses() {
  const own = gamesOf(mine);
  const now = new Map();
  for (const g of own) {
    if (g.hostId === client.clientId) now.set(g.id, { name: g.name, role: 'host' });
    else if (mySeat(g)) now.set(g.id, { name: g.name, role: 'seat' });
  }
  // A seat confirmed before this user's games follow it (their view of it
  // not in yet) is held all the same: the open games name its game.
  for (const key of seatedKeys()) {
    const id = key.slice('games/'.length);
    const name = findGame(id)?.name ?? held.get(id)?.name;
    if (!mine.keys.includes(key) && name !== undefined) now.set(id, { name, role: 'seat', unseen: true });
  }
  const told = losses.length;
  for (const [id, was] of held) {
    if (now.has(id) || quitting.has(id)) continue;
    if (was.role === 'host') losses.push(`Your game “${was.name}” has ended: this tab was offline longer than the lease grace.`);
    else if (own.some((g) => g.id === id) || (was.unseen && findGame(id))) losses.push(`You lost your seat in “${was.name}”: this tab was offline longer than the lease grace.`);
    else losses.push(`“${was.name}” has ended: its host left or closed it. Your seat is free.`);
  }
  held = now;
  if (losses.length > told) notify($('notice'), losses.join(' '), 'error');
}

/**
 * Seats of this user's in games that are gone (their host left) are theirs
 * to free: the games watch of this user's seats, once it has its view, lacks
 * them.
 */
function sweepOrphanSeats() {
  for (const e of seats.entries()) {
    const key = `games/${e.key.split('/')[1]}`;
    if (e.value?.id === client.clientId && !e.pending && !mine.has(key)) room.delete(e.key, { ifModRev: e.modRev }).catch(() => {});
  }
}

/**
 * The host keeps each of its games' `players` equal to 1 + its seats, so
 * that the server's "free seats" filter sees it. One write at a time per
 * game: a pending one shows the count it writes.
 */
function countPlayers() {
  const bySeat = seatsByGame();
  for (const e of mine.entries()) {
    const players = 1 + (bySeat.get(e.key.slice('games/'.length))?.size ?? 0);
    if (e.value?.hostId !== client.clientId || e.pending || e.value.players === players) continue;
    room.put(e.key, { ...e.value, players }, { ifModRev: e.modRev, lease: 'session' }).catch(() => {}); // a conflict: the next change counts again
  }
}

/**
 * After any change. Losses are told from this user's games as they were
 * (a seat gone from a game still there is a lost seat); then their watch
 * follows their seats, and what needs it to be current waits for its view.
 */
function update() {
  const told = mine.loaded;
  if (told) tellLosses();
  if (seats.epoch !== undefined) {
    const keys = seatedKeys();
    mine.set(mineWhere(keys), keys);
  }
  if (mine.loaded) {
    if (!told) tellLosses(); // back to the view shown, which changed meanwhile
    sweepOrphanSeats();
    countPlayers();
  }
  render();
}

$('create').addEventListener('submit', (ev) => {
  ev.preventDefault();
  create(ev.target);
});
seats.on('changes', update);
seats.on('sync', update); // the first view, even of no seats
presence.on('change', renderOnline);
list.set(listWhere());
render();
