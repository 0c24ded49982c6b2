/**
 * Tabs of one origin sharing one connection (`persist({ tabs: true })`).
 *
 * The leader is the tab holding the Web Lock `statecast:tabs:<url>\0<subject>`
 * (held for the tab's life; the next waiter takes over when it closes). It
 * runs the hub: the one real WebSocket, multiplexed. Every tab's client,
 * the leader's own included, talks to the hub through a socket-like object
 * over a BroadcastChannel: the hub renumbers request and subscription ids
 * and routes replies and subscription messages back. So a tab's client is
 * unchanged: when the leader goes, its socket closes (1012) and it
 * reconnects to the new hub as after any lost connection, resuming its
 * watches from their revisions and re-sending lost writes with their ids.
 * Tabs also post their pending writes, so each shows the others' at once.
 * @internal
 * @packageDocumentation
 */
import type { Client } from './client.js';
import type { Write, WriteOp } from './pending.js';
import type { WebSocketConstructor, WebSocketLike } from './types.js';

/** The part of BroadcastChannel the tabs use. */
export interface TabChannel {
  postMessage(m: unknown): void;
  onmessage: ((ev: { data: any }) => void) | null;
  close(): void;
}

/** The part of the Web Locks API (`navigator.locks`) the SDK uses. */
export interface TabLocks {
  request(name: string, opts: { ifAvailable?: boolean; mode?: 'exclusive' | 'shared' }, fn: (lock: unknown) => unknown): Promise<unknown>;
}

/** Options of `persist({ tabs })`: where the browser's APIs are missing, or for tests. */
export interface TabsOptions {
  /** Default `navigator.locks`. */
  locks?: TabLocks;
  /** Default `new BroadcastChannel(name)`. */
  channel?: (name: string) => TabChannel;
  /** The leader's real socket; default `globalThis.WebSocket`. */
  WebSocket?: WebSocketConstructor;
}

/** What a tab's pending writes look like to the others: per `room \0 key`, the last op. */
type Shown = Map<string, WriteOp>;

/** One tab's client socket as the hub sees it. */
interface Peer {
  tab: string;
  url: string;
  /** The subprotocols it offered. */
  p: string[];
  /** Hub ids of its subscriptions. */
  subs: Set<number>;
  /** 1: it sent `connect`; 2: it was answered `connected`. */
  state: 0 | 1 | 2;
}

const noop = () => {};
const SWITCH = 1012; // the leader changed: reconnect at once (closeAction 'now')
const JSONS = ['statecast.v2.json', 'statecast.v1.json'];

/**
 * Starts the tab machinery of `client` for (url, subject); returns the
 * socket constructor its client uses and the other tabs' pending writes.
 */
export async function tabs(client: Client, subject: string | undefined, locks: TabLocks, o: TabsOptions) {
  const g = globalThis as any;
  const chan = o.channel ?? ((n: string) => new g.BroadcastChannel(n) as TabChannel);
  const RealWS: WebSocketConstructor = o.WebSocket ?? g.WebSocket;
  const name = `statecast:tabs:${client.url}\0${subject ?? ''}`;
  /** This tab: the lock `statecast:tab:<me>`, held for its life, tells the others when it is gone. */
  const me = Math.random().toString(36).slice(2);
  await new Promise((held) => void locks.request('statecast:tab:' + me, {}, () => (held(0), new Promise(noop))).catch(noop));
  /** Calls `fn` once the tab `tab` is gone. */
  const whenGone = (tab: string, fn: () => void) => void locks.request('statecast:tab:' + tab, { mode: 'shared' }, fn).catch(noop);

  // ---- this tab: its client's sockets, and the other tabs' pending writes
  const ch = chan(name);
  const mine = new Map<string, VSocket>();
  let n = 0;
  const others = new Map<string, Shown>();
  let shown: Shown = new Map();
  /** Ops of the others' writes done at a revision this tab's watches may not show yet: shown until they do. */
  const settling = new Map<string, [WriteOp, number]>();
  const behind = (k: string, rev: number) => {
    const [room, key] = k.split('\0') as [string, string];
    return client._watchesOf(room).some((v) => v._covers(key) && v.rev < rev);
  };
  const post = (m: object) => ch.postMessage(m);

  class VSocket implements WebSocketLike {
    binaryType = '';
    onopen: ((ev: any) => void) | null = null;
    onmessage: ((ev: any) => void) | null = null;
    onclose: ((ev: any) => void) | null = null;
    onerror: ((ev: any) => void) | null = null;
    readonly id = me + '.' + n++;
    hub: string | undefined;
    constructor(
      readonly url: string,
      readonly protocols: string[],
    ) {
      mine.set(this.id, this);
      this.ask();
    }
    ask() {
      post({ k: 'open', id: this.id, tab: me, url: this.url, p: this.protocols });
    }
    send(data: string | Uint8Array) {
      post({ k: 'up', id: this.id, m: data });
    }
    close() {
      if (mine.delete(this.id)) post({ k: 'bye', id: this.id });
    }
    end(code: number, reason: string) {
      if (mine.delete(this.id)) this.onclose?.({ code, reason });
    }
  }

  /** Shows what another tab's pending writes changed in this tab's watches. */
  const refresh = (before: Shown, cause: 'local' | 'live' | 'rollback') => {
    const next: Shown = new Map();
    for (const s of others.values()) for (const [k, op] of s) next.set(k, op);
    for (const [k, [op, rev]] of settling) if (next.has(k) || !behind(k, rev)) settling.delete(k);
    else next.set(k, op);
    shown = next;
    const byRoom = new Map<string, string[]>();
    for (const k of new Set([...before.keys(), ...next.keys()])) {
      if (before.get(k) === next.get(k)) continue;
      const [room, key] = k.split('\0') as [string, string];
      byRoom.set(room, [...(byRoom.get(room) ?? []), key]);
    }
    for (const [room, keys] of byRoom) for (const w of client._watchesOf(room)) w._local(keys, cause);
  };
  const forget = (tab: string) => {
    const before = shown;
    if (others.delete(tab)) refresh(before, 'rollback');
  };

  // This tab's pending writes, for the others; one that went without being done was rolled back.
  let last: readonly Write[] = [];
  const publish = () => {
    const list = client._pending;
    const ops = list.flatMap((w) => w.ops.map((op) => [w.room + '\0' + op.key, op]));
    const done = last.filter((w) => w.state === 'done' && !list.includes(w)).flatMap((w) => w.ops.map((op) => [w.room + '\0' + op.key, w.rev]));
    post({ k: 'ops', tab: me, ops, done, cause: last.some((w) => w.state !== 'done' && !list.includes(w)) ? 'rollback' : 'live' });
    last = list;
  };
  client.on('pending', publish);

  ch.onmessage = ({ data: m }) => {
    const v = mine.get(m.id);
    switch (m.k) {
      case 'hub': // a new leader: sockets of the old one reconnect to it, waiting ones ask it
        for (const s of [...mine.values()]) s.hub ? s.hub !== m.hub && s.end(SWITCH, 'the leader tab changed') : s.ask();
        return;
      case 'open': // a tab's client (re)connects: it may have missed our pending writes
        if (m.tab !== me && client._pending.length) publish();
        return;
      case 'accept':
        if (v && !v.hub) {
          v.hub = m.hub;
          v.onopen?.({});
        }
        return;
      case 'down':
        return v?.onmessage?.({ data: m.m });
      case 'end':
        return v?.end(m.code, m.reason);
      case 'ops': {
        if (m.tab === me) return;
        if (!others.has(m.tab)) whenGone(m.tab, () => forget(m.tab));
        const before = shown;
        for (const [k, rev] of m.done ?? []) if (shown.has(k)) settling.set(k, [shown.get(k)!, rev]);
        others.set(m.tab, new Map(m.ops));
        return refresh(before, m.ops.length ? 'local' : m.cause);
      }
    }
  };

  // ---- the leader: the hub, once this tab holds the leader lock
  void locks
    .request(name, {}, () => {
      hub();
      return new Promise(noop);
    })
    .catch(noop);

  function hub() {
    const hc = chan(name);
    const id = me + ':' + Date.now();
    const peers = new Map<string, Peer>();
    /** Hub id → the peer's own id of a request (`sub`: a subscription, kept until it ends). */
    const routes = new Map<number, { peer: string; id: number; sub: boolean }>();
    let ws: WebSocketLike | undefined;
    let connected: Record<string, unknown> | undefined;
    let next = 1;
    const watched = new Set<string>();
    const down = (peer: string, msgs: object[]) => hc.postMessage({ k: 'down', id: peer, m: msgs.map((x) => JSON.stringify(x)).join('\n') });
    const send = (m: object) => {
      try {
        ws!.send(JSON.stringify(m));
      } catch {
        // closing: its close event follows
      }
    };

    /** A peer's socket is gone: its subscriptions end; the real socket closes with the last. */
    const drop = (pid: string) => {
      const p = peers.get(pid);
      if (!p) return;
      peers.delete(pid);
      for (const [hid, r] of routes) if (r.peer === pid) routes.delete(hid);
      if (connected) for (const s of p.subs) send({ t: 'unsub', id: next++, sub: s });
      if (!peers.size) close(1000, 'no tab uses it');
    };
    const close = (code: number, reason: string) => {
      const w = ws;
      ws = connected = undefined;
      routes.clear();
      if (w) {
        w.onopen = w.onmessage = w.onclose = null;
        try {
          w.close(code, reason);
        } catch {
          // already closed
        }
      }
    };

    const open = (p: Peer, token: unknown) => {
      const offer = p.p.filter((x) => JSONS.includes(x));
      if (!offer.length) return end(1003, 'tabs share a JSON connection: the msgpack codec cannot be used with tabs');
      const w = (ws = new RealWS(p.url, offer));
      w.onerror = noop;
      w.onopen = () => send({ t: 'connect', token });
      w.onclose = (ev: { code?: number; reason?: string }) => ws === w && end(ev.code ?? 1006, ev.reason ?? '');
      w.onmessage = (ev: { data: string }) => {
        const out = new Map<string, object[]>();
        const to = (pid: string, m: object) => out.set(pid, [...(out.get(pid) ?? []), m]);
        for (const line of String(ev.data).split('\n')) {
          if (!line) continue;
          const m = JSON.parse(line);
          if (m.t === 'connected') {
            const c = (connected = { ...m, resume: undefined }); // the session is the hub's: no tab resumes it
            for (const [pid, q] of peers) if (q.state === 1) (q.state = 2), to(pid, c);
          } else if (m.id !== undefined || m.s !== undefined) {
            const hid = m.id ?? m.s;
            const r = routes.get(hid);
            if (!r) continue;
            if (m.id !== undefined) m.id = r.id;
            else m.s = r.id;
            if (!r.sub || m.t === 'err' || m.t === 'unsubscribed') {
              routes.delete(hid);
              peers.get(r.peer)?.subs.delete(hid);
            }
            to(r.peer, m);
          } else for (const [pid, q] of peers) if (q.state === 2) to(pid, m); // pong, refresh
        }
        for (const [pid, ms] of out) down(pid, ms);
      };
    };
    /** The real socket closed: every tab's client sees the close as its own and reconnects as it would. */
    const end = (code: number, reason: string) => {
      ws = connected = undefined;
      routes.clear();
      for (const pid of peers.keys()) hc.postMessage({ k: 'end', id: pid, code, reason });
      peers.clear();
    };

    hc.onmessage = ({ data: m }) => {
      const p = peers.get(m.id);
      switch (m.k) {
        case 'open':
          if (p) return;
          peers.set(m.id, { tab: m.tab, url: m.url, p: m.p, subs: new Set(), state: 0 });
          if (!watched.has(m.tab)) {
            watched.add(m.tab);
            whenGone(m.tab, () => {
              watched.delete(m.tab);
              for (const [pid, q] of peers) if (q.tab === m.tab) drop(pid);
            });
          }
          return hc.postMessage({ k: 'accept', id: m.id, hub: id });
        case 'bye':
          return drop(m.id);
        case 'up': {
          if (!p) return;
          const msg = JSON.parse(String(m.m));
          if (msg.t === 'connect') {
            p.state = 1;
            if (connected) {
              p.state = 2;
              down(m.id, [connected]);
            } else if (!ws) open(p, msg.token);
            return;
          }
          if (!connected) return;
          if (msg.id) {
            const hid = next++;
            if (msg.t === 'unsub')
              for (const [h, r] of routes)
                if (r.peer === m.id && r.sub && r.id === msg.sub) {
                  msg.sub = h;
                  routes.delete(h);
                  p.subs.delete(h);
                }
            routes.set(hid, { peer: m.id, id: msg.id, sub: msg.t === 'sub' });
            if (msg.t === 'sub') p.subs.add(hid);
            msg.id = hid;
          }
          return send(msg);
        }
      }
    };
    hc.postMessage({ k: 'hub', hub: id });
  }

  return {
    WebSocket: VSocket as unknown as WebSocketConstructor,
    // A done write of another tab shows until this tab's watches reach its revision (as this tab's own do).
    overlay: (room: string, key: string) => {
      const k = room + '\0' + key;
      const s = settling.get(k);
      if (s && !behind(k, s[1])) {
        settling.delete(k);
        if (shown.get(k) === s[0]) shown.delete(k);
      }
      return shown.get(k);
    },
  };
}
