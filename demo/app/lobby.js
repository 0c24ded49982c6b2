// The lobby: games are session-leased keys games/<id> written by their
// host; a seat is a key seats/<game>/<n> created only if absent and bound
// to its player's session, so the last seat goes to exactly one player and
// a player who leaves frees their seat by themselves.
import { ConflictError } from '/sdk/statecast.js';
import { avatar, connect, h, me, mountBadge, mountWho, newId, notify, roomName, until } from './common.js';

const MODES = { duel: 'Duel', ffa: 'Free-for-all', coop: 'Co-op' };
const $ = (id) => document.getElementById(id);

const client = connect();
const room = client.room(roomName('lobby:demo'));
const watch = room.watch(['games/', 'seats/']);
const presence = room.presence();
const busy = new Set(); // games with a join or leave in flight
const quitting = new Set(); // games this tab is leaving or closing
let held = new Map(); // game id → { name, role: 'host' | 'seat' }: what this tab had at the last change
let filter = 'all';

presence.set({ name: me.name, color: me.color }).catch(() => {});
mountWho($('who'), (name) => {
  presence.set({ name, color: me.color }).catch(() => {});
  renderOnline(); // this user's own line: presence reports only the others
});
mountBadge($('badge'), client, watch);
let losses = []; // told by tellLosses since the last other notice: a replay tells them one revision at a time
const notice = (text, kind) => ((losses = []), notify($('notice'), text, kind));

/** The games in the view, each with its seats (host first). */
function games() {
  const byId = new Map();
  for (const e of watch.entries()) {
    const [kind, id] = e.key.split('/');
    if (kind === 'games') byId.set(id, { id, key: e.key, ...e.value, seats: new Map() });
  }
  for (const e of watch.entries()) {
    const [kind, id, n] = e.key.split('/');
    if (kind === 'seats' && byId.has(id)) byId.get(id).seats.set(Number(n), { ...e.value, key: e.key, modRev: e.modRev });
  }
  return [...byId.values()].sort((a, b) => (a.created ?? 0) - (b.created ?? 0) || a.id.localeCompare(b.id));
}

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
    await room.put(`games/${id}`, game, { ifModRev: 0, lease: 'session', waitFor: watch });
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
      const g = games().find((x) => x.id === id);
      if (!g) return notice('That game is gone: its host left.', 'error');
      const n = freeSeat(g);
      if (n === undefined) return notice(`“${g.name}” is full.`, 'error');
      const key = `seats/${id}/${n}`;
      try {
        await room.put(key, { id: client.clientId, name: me.name }, { ifModRev: 0, lease: 'session', waitFor: watch });
        return notice(`You joined “${g.name}” (seat ${n + 1} of ${g.max}).`, 'ok');
      } catch (e) {
        if (!(e instanceof ConflictError)) return notice(`Could not join: ${e.message}`, 'error');
        await until(watch, key, e.modRev);
        const now = games().find((x) => x.id === id);
        if (now && freeSeat(now) === undefined) {
          const winner = watch.get(key)?.name ?? 'someone';
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
    await room.delete(seat.key, { ifModRev: seat.modRev, waitFor: watch });
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
    await room.delete(g.key, { waitFor: watch });
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
  const all = games();
  const shown = all.filter((g) => filter === 'all' || g.mode === filter);
  $('game-count').textContent = String(shown.length);
  $('filters').replaceChildren(...['all', ...Object.keys(MODES)].map((m) => {
    const n = m === 'all' ? all.length : all.filter((g) => g.mode === m).length;
    return h('button', { type: 'button', class: 'chip', 'aria-pressed': String(filter === m), onclick: () => ((filter = m), render()) },
      `${m === 'all' ? 'All' : MODES[m]} ${n}`);
  }));
  $('games').replaceChildren(...(shown.length ? shown.map(gameItem)
    : [h('li', { class: 'empty' }, all.length ? 'No open games in this mode.' : 'No open games yet: create one.')]));
  renderOnline();
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
function tellLosses(all) {
  const now = new Map();
  for (const g of all) {
    if (g.hostId === client.clientId) now.set(g.id, { name: g.name, role: 'host' });
    else if (mySeat(g)) now.set(g.id, { name: g.name, role: 'seat' });
  }
  const told = losses.length;
  for (const [id, was] of held) {
    if (now.has(id) || quitting.has(id)) continue;
    if (was.role === 'host') losses.push(`Your game “${was.name}” has ended: this tab was offline longer than the lease grace.`);
    else if (all.some((g) => g.id === id)) losses.push(`You lost your seat in “${was.name}”: this tab was offline longer than the lease grace.`);
    else losses.push(`“${was.name}” has ended: its host left or closed it. Your seat is free.`);
  }
  held = now;
  if (losses.length > told) notify($('notice'), losses.join(' '), 'error');
}

/** Seats of games that are gone (their host left) are ours to free. */
function sweepOrphanSeats() {
  const live = new Set(games().map((g) => g.id));
  for (const e of watch.entries()) {
    const [kind, id] = e.key.split('/');
    if (kind === 'seats' && !live.has(id) && e.value?.id === client.clientId) room.delete(e.key, { ifModRev: e.modRev }).catch(() => {});
  }
}

$('create').addEventListener('submit', (ev) => {
  ev.preventDefault();
  create(ev.target);
});
watch.on('changes', () => {
  sweepOrphanSeats();
  tellLosses(games());
  render();
});
presence.on('change', renderOnline);
render();
