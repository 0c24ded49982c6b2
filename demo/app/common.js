// What every demo page shares: who you are, the client, the header badge,
// notices and a tiny DOM helper. Only the SDK's public API is used.
import { createClient } from '/sdk/statecast.js';

export const params = new URLSearchParams(location.search);

const NAMES = ['Ada', 'Bo', 'Cleo', 'Dev', 'Eli', 'Fay', 'Gus', 'Hana', 'Ivo', 'Juno', 'Kai', 'Lea', 'Milo', 'Nia', 'Oto', 'Pia'];
const COLORS = ['#4f46e5', '#0891b2', '#c026d3', '#ea580c', '#16a34a', '#dc2626', '#7c3aed', '#0d9488'];

/** The user of this tab: ?name= wins, else the tab's stored name, else a random one. */
export const me = (() => {
  let name = params.get('name') || sessionStorage.getItem('statecast.name');
  if (!name) name = NAMES[Math.floor(Math.random() * NAMES.length)] + ' ' + (10 + Math.floor(Math.random() * 90));
  sessionStorage.setItem('statecast.name', name);
  let h = 0;
  for (const ch of name) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return { name, color: COLORS[h % COLORS.length] };
})();

/** The room of this page: ?room= wins (the tests use their own rooms). */
export function roomName(fallback) {
  return params.get('room') || fallback;
}

/**
 * A client on this server's WebSocket endpoint. A reload of the page resumes
 * its session (kept in sessionStorage by the SDK); the key is per page, so
 * going from the lobby to the document does not carry the lobby's presence
 * and games along (they end after the grace unless you come back in time).
 */
export function connect() {
  return createClient({ url: '/v1/ws', reconnect: { minDelayMs: 250, maxDelayMs: 5000 }, sessionKey: `statecast:${location.pathname}` });
}

/** h('div', {class: 'x', onclick}, 'text', child…): builds an element; text is never parsed as HTML. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'style' && typeof v === 'object') Object.assign(el.style, v);
    else if (k === 'value' || k === 'checked' || k === 'disabled') el[k] = v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) if (c !== undefined && c !== null && c !== false) el.append(c);
  return el;
}

export function avatar(name, color) {
  return h('span', { class: 'avatar', style: { background: color || '#9aa1b2' }, title: name }, (name || '?').slice(0, 1).toUpperCase());
}

/** Fills the header's "you are" chip; clicking it renames this tab's user. */
export function mountWho(el, onRename) {
  el.replaceChildren('You are ', h('button', { type: 'button', title: 'Change your name', onclick: () => {
    const n = prompt('Your name', me.name)?.trim();
    if (!n) return;
    me.name = n;
    sessionStorage.setItem('statecast.name', n);
    mountWho(el, onRename);
    onRename?.(n);
  } }, me.name));
}

/** Shows a message in el (kind: info, ok or error); it stays until the next one. */
export function notify(el, text, kind = 'info') {
  el.dataset.kind = kind;
  el.textContent = text;
}

export const plural = (n, one) => `${n} ${one}${n === 1 ? '' : 's'}`;

const STATES = { connecting: 'connecting…', reconnecting: 'reconnecting…', disconnected: 'disconnected' };

/**
 * The connection badge says what the page shows now, updated with every
 * event: `live · N keys · rev R` while `watch` is live, else connecting,
 * reconnecting (with a retry button), syncing or disconnected; and after a
 * reconnect how it caught up, from the watch's `sync` events: a resume
 * (with how many changes the replay carried) or a resync from a snapshot
 * (with the server's reason). The first load needs no such note.
 */
export function mountBadge(el, client, watch) {
  let caughtUp = '';
  const retry = h('button', { type: 'button', onclick: () => client.reconnect() }, 'Retry now');
  const sep = () => h('span', { class: 'sep' }, '·');
  const state = () => STATES[client.status] ?? (watch.status === 'live' ? 'live' : 'syncing…');
  const render = () => {
    el.dataset.status = client.status;
    el.replaceChildren(...[
      h('span', { class: 'dot' }),
      h('span', { class: 'status', 'data-testid': 'status' }, state()),
      sep(), h('span', { 'data-testid': 'keys' }, plural(watch.size, 'key')),
      sep(), h('span', { 'data-testid': 'rev' }, `rev ${watch.rev}`),
      caughtUp && sep(), caughtUp && h('span', { 'data-testid': 'last-sync' }, caughtUp),
      client.status === 'reconnecting' ? retry : null,
    ].filter(Boolean));
  };
  watch.on('sync', (s) => {
    if (s.kind === 'resumed') caughtUp = `resumed by replay of ${plural(s.changes, 'event')}`;
    else if (s.kind === 'resync') caughtUp = `resynced from snapshot (${s.reason === 'compacted' ? 'history compacted' : s.reason || 'reset'}, ${plural(s.changes, 'change')})`;
    render();
  });
  watch.on('changes', render);
  watch.on('status', render);
  client.on('status', () => {
    if (client.status !== 'connected') caughtUp = ''; // it told of the previous reconnect
    render();
  });
  render();
}

/** Resolves once `watch` shows `key` at `modRev` (0: absent), or after `ms`. */
export function until(watch, key, modRev, ms = 5000) {
  return new Promise((resolve) => {
    const check = () => (watch.entry(key)?.modRev ?? 0) === modRev;
    if (check()) return resolve(true);
    const timer = setTimeout(() => (off(), resolve(false)), ms);
    const off = watch.on('changes', () => {
      if (check()) clearTimeout(timer), off(), resolve(true);
    });
  });
}

/** A short random id for new keys. */
export function newId() {
  return Date.now().toString(36).slice(-5) + Math.random().toString(36).slice(2, 6);
}
