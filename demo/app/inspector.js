// The inspector polls GET /v1/admin/inspect every second. Loopback needs
// no token; elsewhere the server's --admin-token is asked for once and
// kept for this tab.
import { h } from './common.js';

const $ = (id) => document.getElementById(id);
const short = (s, n = 10) => (s && s.length > n ? s.slice(0, n) + '…' : s || '—');
let token = sessionStorage.getItem('statecast.admin') || '';

function setBadge(status, text) {
  $('badge').dataset.status = status;
  $('badge').replaceChildren(h('span', { class: 'dot' }), h('span', { class: 'status' }, text));
}

function roomRow(r) {
  const n = r.rev >= r.oldest ? r.rev - r.oldest + 1 : 0;
  const span = n ? `${r.oldest}..${r.rev}` : 'none yet';
  const share = r.rev ? Math.max(2, Math.round((100 * n) / r.rev)) : 0;
  return h('tr', { 'data-testid': 'room', 'data-room': r.name },
    h('td', { class: 'mono' }, r.name),
    h('td', { class: 'num', 'data-testid': 'room-rev' }, String(r.rev)),
    h('td', { class: 'mono', title: r.epoch }, short(r.epoch, 8)),
    h('td', { title: `${r.history_events} events retained` }, h('span', { class: 'mono' }, span),
      h('span', { class: 'history-bar' }, h('i', { style: { width: `${share}%` } }))),
    h('td', { class: 'num' }, String(r.keys)),
    h('td', { class: 'num' }, String(r.watchers)));
}

function clientRows(c) {
  const watches = c.watches.length ? c.watches : [null];
  return watches.map((w, i) => h('tr', { 'data-testid': 'watch' },
    h('td', { class: 'mono', title: c.session }, i ? '' : short(c.session, 12)),
    h('td', {}, i ? '' : c.subject || 'anonymous'),
    h('td', { class: 'muted' }, i ? '' : c.codec.replace('statecast.', '')),
    h('td', { class: 'mono' }, w ? w.room : 'no watches'),
    h('td', { class: 'mono' }, w ? [...w.prefixes.map((p) => p || '(all)'), ...(w.keys ?? []).map((k) => `=${k}`)].join(' ') : '', // =key: an exact key
      w?.filter ? h('div', { class: 'muted filter-text', 'data-testid': 'watch-filter' }, `where ${w.filter}`) : null),
    h('td', {}, w ? h('span', { class: 'state', 'data-state': w.state }, w.state) : ''),
    h('td', { class: 'num' }, w ? h('span', { class: w.lag ? 'lagN' : 'lag0' }, String(w.lag)) : ''),
    h('td', { class: 'num' }, w ? String(w.queued) : '')));
}

// A hook: which node delivers it and, on that node, its rooms most behind.
function hookRows(k) {
  const rooms = k.rooms.length ? k.rooms : [null];
  const by = k.claimed ? 'this node' : k.holder || '—';
  return rooms.map((r, i) => h('tr', { 'data-testid': 'hook' },
    h('td', { class: 'mono', title: `${k.pattern} → ${k.url}` }, i ? '' : `${k.pattern} → ${short(k.url, 32)}`),
    h('td', {}, i ? '' : by),
    h('td', { class: 'mono' }, r ? r.room : k.claimed ? 'no room yet' : ''),
    h('td', { class: 'num' }, r ? String(r.cursor) : ''),
    h('td', { class: 'num' }, r ? String(r.head) : ''),
    h('td', { class: 'num', title: r && r.lag ? `${r.lag_seconds.toFixed(1)} s behind` : '' },
      r ? h('span', { class: r.lag ? 'lagN' : 'lag0' }, String(r.lag)) : ''),
    h('td', { class: 'num' }, r ? String(r.attempts) : ''),
    h('td', { class: 'muted' }, r ? short(r.last_error, 60) : short(k.error, 60))));
}

async function poll() {
  let res;
  try {
    res = await fetch('/v1/admin/inspect', { headers: token ? { Authorization: `Bearer ${token}` } : {}, cache: 'no-store' });
  } catch {
    return setBadge('reconnecting', 'server unreachable; retrying');
  }
  if (res.status === 401 || res.status === 403) {
    const body = await res.json().catch(() => ({}));
    $('auth').hidden = false;
    $('auth-error').textContent = body.error?.message ?? `HTTP ${res.status}`;
    return setBadge('disconnected', 'admin token needed');
  }
  if (!res.ok) return setBadge('reconnecting', `HTTP ${res.status}; retrying`);
  const data = await res.json();
  $('auth').hidden = true;
  $('room-count').textContent = String(data.rooms.length);
  $('client-count').textContent = String(data.clients.length);
  $('rooms').replaceChildren(...(data.rooms.length ? data.rooms.map(roomRow)
    : [h('tr', {}, h('td', { colspan: '6', class: 'empty' }, 'No room is loaded: open the lobby or the document.'))]));
  $('clients').replaceChildren(...(data.clients.length ? data.clients.flatMap(clientRows)
    : [h('tr', {}, h('td', { colspan: '8', class: 'empty' }, 'No client is connected.'))]));
  const hooks = data.hooks ?? [];
  $('hooks-panel').hidden = !hooks.length;
  $('hook-count').textContent = String(hooks.length);
  $('hooks').replaceChildren(...hooks.flatMap(hookRows));
  setBadge('connected', `live · ${new Date(data.time_ms).toLocaleTimeString()}`);
}

$('auth').addEventListener('submit', (ev) => {
  ev.preventDefault();
  token = new FormData(ev.target).get('token').trim();
  sessionStorage.setItem('statecast.admin', token);
  poll();
});

// Poll once a second, never two at a time.
(async function loop() {
  await poll();
  setTimeout(loop, 1000);
})();
