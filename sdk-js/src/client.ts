import { Tokens, refreshDelay } from './auth.js';
import { backoffDelay } from './backoff.js';
import { frameBytes, json2Codec, jsonCodec, type Codec } from './codec.js';
import { CloseCode, closeAction, type CloseAction } from './codes.js';
import { Emitter } from './emitter.js';
import {
  ClosedError,
  NotConnectedError,
  OutcomeUnknownError,
  StatecastError,
  TimeoutError,
  TooLargeError,
  UnauthorizedError,
  errorFromReply,
} from './errors.js';
import { Writes, type Op, type Write } from './pending.js';
import type { ServerMessage, SubMessage } from './protocol.js';
import { Room, type WatchOptions, type WriteOptions, type WriteResult } from './room.js';
import type {
  ClientEvents,
  ClientOptions,
  Clock,
  ConnectedEvent,
  SessionStore,
  ConnectionStatus,
  WebSocketConstructor,
  WebSocketLike,
} from './types.js';
import { Watch } from './watch.js';

/** A request sent on the socket, waiting for its reply. */
interface Pending {
  id: number;
  /** A subscription: on a lost socket it is simply sent again on the next one. */
  sub?: boolean;
  /** A write: on a lost socket it is sent again, with the same wid. */
  write?: Write;
  timer?: unknown;
  resolve(m: ServerMessage): void;
  reject(e: StatecastError): void;
}

const realClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fn, ms) => setTimeout(fn, ms),
  clearTimeout: (h) => clearTimeout(h as ReturnType<typeof setTimeout>),
};
const noop = () => {};
/** RFC 6455 1006: closed without a close frame (a network failure, or our own timeouts). */
const ABNORMAL = 1006;
const transient = ['unavailable', 'internal', 'outcome_unknown', 'rate_limited'];

/** Creates a client; it connects at once unless `autoConnect` is false. */
export function createClient(options: ClientOptions): Client {
  return new Client(options);
}

/**
 * A statecast client: one WebSocket, many rooms and watches.
 *
 * Writes show at once in the client's watches (pending), queue while
 * offline, and are sent in order once connected and caught up. Each carries
 * a write id, so one whose reply was lost with the socket is sent again and
 * the server answers it with its original outcome instead of applying it
 * twice. See README.md.
 */
export class Client extends Emitter<ClientEvents> {
  /** This client's presence id. */
  readonly clientId: string;
  /** The codec of the socket: without a codec option, the JSON version the server said in `connected`. */
  private codec: Codec;
  private readonly clock: Clock;
  private readonly random: () => number;
  private readonly minDelay: number;
  private readonly maxDelay: number;
  private readonly timeout: number;
  private st: ConnectionStatus = 'disconnected';
  private ws: WebSocketLike | undefined;
  private stopped = true;
  private everConnected = false;
  private attempt = 0;
  private seq = 0;
  private nextId = 1;
  private readonly pending = new Map<number, Pending>();
  private readonly writes: Writes;
  /** Write ids: a prefix random per client object (a reload's counter starts again), then a counter. */
  private readonly widPrefix = randomId() + '.';
  private wids = 0;
  private readonly subs = new Map<number, Watch<any>>();
  private readonly watches = new Set<Watch<any>>();
  private readonly rooms = new Map<string, Room>();
  private sess: ConnectedEvent | undefined;
  private resumeSecret: string | undefined;
  /** The session a reload of this tab left behind, to resume on the first connect. */
  private saved: { session: string; resume: string } | undefined;
  private readonly store: SessionStore | undefined;
  private readonly storeKey: string;
  private readonly tokens: Tokens;
  private refreshing = false;
  private restored = false;
  /** Token refreshes failed in a row. */
  private refreshes = 0;
  private pingMs = 25_000;
  private lastRecv = 0;
  private lastSent = 0;
  private readonly timers: { retry?: unknown; connect?: unknown; beat?: unknown; refresh?: unknown; probe?: unknown } = {};

  /** @internal Use {@link createClient}. */
  constructor(private readonly o: ClientOptions) {
    super();
    // Nothing here may throw or touch the network (server rendering): the
    // WebSocket and a relative URL are resolved when connecting.
    this.codec = o.codec ?? jsonCodec;
    this.clock = o.clock ?? realClock;
    this.random = o.random ?? Math.random;
    this.minDelay = o.reconnect?.minDelayMs ?? 250;
    this.maxDelay = o.reconnect?.maxDelayMs ?? 15_000;
    this.timeout = o.requestTimeoutMs ?? 10_000;
    this.store = o.sessionStore === false ? undefined : (o.sessionStore ?? browserSessionStorage());
    this.storeKey = o.sessionKey ?? 'statecast:' + this.url;
    this.clientId = o.clientId ?? this.takeSaved() ?? randomId();
    this.tokens = new Tokens(o.token, this.clock);
    this.writes = new Writes(this, o.queue?.maxWrites, o.queue?.maxBytes);
    if (o.autoConnect !== false) this.connect();
  }

  /** The WebSocket URL (as given while it cannot be resolved yet: a relative URL outside a page). */
  get url(): string {
    try {
      return wsURL(this.o.url);
    } catch {
      return this.o.url;
    }
  }

  /** The connection's status. */
  get status(): ConnectionStatus {
    return this.st;
  }

  /** The current (or last) session, from the server's `connected`. */
  get session(): ConnectedEvent | undefined {
    return this.sess;
  }

  /**
   * Writes not settled yet: queued, in flight, or acknowledged and not yet
   * shown by the watches of their keys. The `pending` event tells when it changes.
   */
  get pendingWrites(): number {
    return this.writes.list.length;
  }

  /** The room `name` (cached per name). */
  room(name: string): Room {
    let r = this.rooms.get(name);
    if (!r) this.rooms.set(name, (r = new Room(this, name)));
    return r;
  }

  /** Starts connecting (after `close()`, or with `autoConnect: false`). */
  connect(): void {
    if (!this.stopped) return;
    this.stopped = false;
    this.attempt = 0;
    this.listen(true);
    this.setStatus('connecting');
    void this.open();
  }

  /**
   * Closes the socket and stops reconnecting. Writes in flight reject with
   * OutcomeUnknownError, queued ones with NotConnectedError. Watches keep
   * their views and resume on the next `connect()`.
   */
  close(): void {
    if (this.stopped) return;
    this.stopped = true;
    this.seq++;
    this.listen(false);
    this.clock.clearTimeout(this.timers.retry);
    if (this.ws) this.drop(CloseCode.Normal, 'closed by the client', true);
    else this.halt();
  }

  /**
   * Skips the backoff wait: reconnects now if waiting. If connected, probes
   * the socket instead: a ping that must be answered within `probeTimeoutMs`.
   * Called by itself on the browser's `online` event.
   */
  reconnect(): void {
    if (this.stopped) return;
    if (this.timers.retry !== undefined) {
      this.clock.clearTimeout(this.timers.retry);
      this.timers.retry = undefined;
      void this.open();
    } else this.probe();
  }

  /** Resolves when connected; rejects when the client becomes `disconnected` or after `timeoutMs`. */
  ready(timeoutMs?: number): Promise<void> {
    if (this.st === 'connected') return Promise.resolve();
    if (this.stopped) return Promise.reject(new NotConnectedError('the client is disconnected'));
    return new Promise((resolve, reject) => {
      const timer = timeoutMs === undefined ? undefined : this.clock.setTimeout(() => done(new TimeoutError('not connected in time')), timeoutMs);
      const off = this.on('status', ({ status }) => {
        if (status === 'connected') done();
        else if (status === 'disconnected') done(new NotConnectedError('the client is disconnected'));
      });
      const done = (err?: Error) => {
        off();
        this.clock.clearTimeout(timer);
        err ? reject(err) : resolve();
      };
    });
  }

  /**
   * @internal The user part of this client's presence key: the subject of
   * its token, else (no token, or no `sub` in it) its clientId; undefined
   * while a token callback has not given the first token.
   */
  _presenceUser(): string | undefined {
    const sub = this.tokens.subject;
    return sub === null ? undefined : (sub ?? this.clientId);
  }

  /** @internal Waits until {@link _presenceUser} is known (a first token, by connecting). */
  async _presenceUserKnown(): Promise<void> {
    if (this._presenceUser() !== undefined) return;
    try {
      await this.ready(this.timeout);
    } catch {
      throw new NotConnectedError('not connected: the presence key (from the token) is not known yet; nothing was written');
    }
  }

  /** @internal Creates a watch (Room.watch). */
  _watch<V>(room: string, prefixes: string[], opts: WatchOptions): Watch<V> {
    const w = new Watch<V>(this, room, prefixes, opts);
    w._local(this.writes.keys(room), 'local');
    this.o.persist?.watch(w);
    this.watches.add(w);
    this.subscribe(w);
    return w;
  }

  /** @internal The pending writes, oldest first (what persistence keeps). */
  get _pending(): readonly Write[] {
    return this.writes.list;
  }

  /**
   * @internal A pending write kept by an earlier page: shown at once, and sent
   * with its own wid (and `since`) as a write whose reply was lost, so the
   * server applies it once. Nobody awaits it: a failure is a `rollback` event.
   */
  _restore(room: string, msg: Record<string, unknown>, since: number | null): void {
    this.writes.add({ room, msg, bytes: frameBytes(this.codec.encode(msg)), timeoutMs: this.timeout }, since).catch(noop);
  }

  /** @internal The open watches of `room`. */
  _watchesOf(room: string): Watch<any>[] {
    return [...this.watches].filter((w) => w.room === room);
  }

  /** @internal See {@link WatchOwner}. */
  _overlay(room: string, key: string): Op | undefined {
    return this.writes.overlay(room, key) ?? this.o.persist?.overlay?.(room, key);
  }

  /** @internal See {@link WatchOwner}. */
  _wid(wid: string, rev: number, room: string, keys: string[]): void {
    this.writes.wid(wid, rev, room, keys);
  }

  /** @internal See {@link WatchOwner}. */
  _flush(): void {
    this.writes.flush();
  }

  /** @internal Emits a client event (for Writes). */
  _emit<K extends keyof ClientEvents>(type: K, ev: ClientEvents[K]): void {
    this.emit(type, ev);
  }

  /** @internal Stops a watch (Watch.close). */
  _unwatch(w: Watch<any>): void {
    this.watches.delete(w);
    if (w._sub && this.st === 'connected') {
      this.subs.delete(w._sub);
      this.sendMsg({ t: 'unsub', id: this.nextId++, sub: w._sub });
    }
    w._sub = 0;
    this.writes.flush(); // it no longer holds writes back
  }

  /** @internal Queues a write (Room.put/delete/txn); it shows at once in the watches. */
  _write(room: string, msg: Record<string, unknown>, opts: WriteOptions): Promise<WriteResult> {
    const waitFor = opts.waitFor;
    if (waitFor && waitFor.room !== room) return Promise.reject(new TypeError('waitFor: the watch is of another room'));
    if (this.stopped) return Promise.reject(new NotConnectedError('the client is disconnected'));
    msg = { ...msg, wid: this.widPrefix + (++this.wids).toString(36) };
    let frame: string | Uint8Array;
    try {
      frame = this.codec.encode({ ...msg, room, id: this.nextId });
    } catch (e) {
      return Promise.reject(asError(e));
    }
    const limit = this.o.maxFrameBytes ?? 1 << 20;
    const bytes = frameBytes(frame);
    if (bytes > limit) return Promise.reject(new TooLargeError(`the message is larger than ${limit} bytes; not sent`));
    return this.writes.add({ room, msg, bytes, timeoutMs: opts.timeoutMs ?? this.timeout, waitFor });
  }

  /**
   * @internal Whether writes to `room` may be sent: connected, and no watch
   * of the room resuming a view it had (a new one's first snapshot holds
   * nothing back). After a reconnect writes wait for the watches to resume, so that a write whose reply was lost is known by its event
   * instead of sent again, and the others go against the current state.
   */
  _canSend(room: string): boolean {
    return this.alive() && !this._watchesOf(room).some((w) => w._catchingUp);
  }

  /** @internal Sends a write (for Writes). */
  _send(w: Write, msg: Record<string, unknown>): void {
    // Sent again (its reply was lost): with the revision seen before the first send,
    // so that the server can tell whether it applied even if it forgot the wid.
    if (w.state === 'lost') {
      if (w.since !== undefined) msg.since = w.since; // undefined: restored, never sent before the reload
    }
    else w.since = Math.max(0, ...this._watchesOf(w.room).map((v) => v.rev));
    w.state = 'sent';
    const id = this.nextId++;
    const p: Pending = {
      id,
      write: w,
      resolve: (m) => this.writes.ack(w, m.rev ?? 0),
      reject: (e) => (e instanceof OutcomeUnknownError ? void this.writes.reread(w, e) : this.writes.fail(w, e)),
    };
    p.timer = this.clock.setTimeout(() => {
      this.pending.delete(id);
      if (w.state === 'sent') this.writes.fail(w, new TimeoutError(`no reply within ${w.timeoutMs} ms; the write may or may not have been applied`));
    }, w.timeoutMs);
    this.transmit(p, this.codec.encode({ ...msg, id, room: w.room }));
  }

  private request(msg: Record<string, unknown>, timeoutMs: number): Promise<ServerMessage> {
    return new Promise((resolve, reject) => {
      if (!this.alive()) return reject(new NotConnectedError('not connected'));
      const id = this.nextId++;
      const p: Pending = { id, resolve, reject };
      p.timer = this.clock.setTimeout(() => {
        this.pending.delete(id);
        reject(new TimeoutError(`no reply within ${timeoutMs} ms`));
      }, timeoutMs);
      this.transmit(p, this.codec.encode({ ...msg, id }));
    });
  }

  private transmit(p: Pending, frame: string | Uint8Array): void {
    this.pending.set(p.id, p);
    this.sendFrame(frame);
  }

  private sendMsg(msg: object): void {
    this.sendFrame(this.codec.encode(msg));
  }

  private sendFrame(frame: string | Uint8Array): void {
    try {
      this.ws!.send(frame);
      this.lastSent = this.clock.now();
    } catch {
      // The socket is closing; its close event follows.
    }
  }

  private subscribe(w: Watch<any>): void {
    if (this.st !== 'connected') return;
    const id = this.nextId++;
    const frame = this.codec.encode(w._req(id));
    this.subs.set(id, w);
    w._subscribed(id);
    const fail = (e: StatecastError) => {
      if (this.subs.get(id) === w) this.subs.delete(id);
      if (w._sub !== id) return;
      w._sub = 0;
      if (!transient.includes(e.code)) return w._fail(e);
      this.resubscribeLater(w);
      this.writes.flush(); // it no longer holds its room's writes back
    };
    this.transmit({ id, sub: true, resolve: noop, reject: fail }, frame);
  }

  private resubscribeLater(w: Watch<any>): void {
    this.clock.setTimeout(() => {
      if (this.st === 'connected' && this.watches.has(w) && !w._sub) this.subscribe(w);
    }, backoffDelay(w._retries++, this.minDelay, this.maxDelay, this.random));
  }

  private async open(): Promise<void> {
    const seq = ++this.seq;
    await this.restore(); // offline too: a reload while offline shows what was kept
    if (seq !== this.seq) return;
    // The browser says there is no network: dialing would only fail (and log). Wait for `online`,
    // which calls reconnect(); the placeholder timer tells it there is a dial to make.
    if (this.o.networkEvents !== false && (globalThis as { navigator?: { onLine?: boolean } }).navigator?.onLine === false) {
      this.timers.retry = 0;
      return;
    }
    const WS = this.o.WebSocket ?? (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
    let url = '';
    let bad = WS ? '' : 'no WebSocket available; pass the WebSocket option (e.g. from the "ws" package)';
    try {
      url = wsURL(this.o.url);
    } catch {
      bad ||= `cannot resolve the URL "${this.o.url}": a relative URL needs a page to resolve against; pass an absolute one`;
    }
    if (bad) {
      await 0; // after the constructor returned (autoConnect), so that its error listeners hear it
      if (seq === this.seq) this.stop(new StatecastError('invalid_option', bad));
      return;
    }
    let token: string | undefined;
    try {
      token = await this.tokens.forConnect();
    } catch (e) {
      if (seq !== this.seq) return;
      if (e instanceof UnauthorizedError) return this.stop(e);
      this.emit('error', asError(e));
      return this.retry(ABNORMAL, 'the token callback failed', 'backoff');
    }
    await this.restore();
    if (seq !== this.seq) return;
    let ws: WebSocketLike;
    try {
      // Without a codec option: v2, and v1 for a server that predates it (PROTOCOL.md §2).
      ws = new (this.o.persist?.WebSocket ?? WS!)(url, this.o.codec ? [this.codec.subprotocol] : [json2Codec.subprotocol, jsonCodec.subprotocol]);
    } catch (e) {
      return this.stop(asError(e));
    }
    ws.binaryType = 'arraybuffer';
    this.ws = ws;
    this.timers.connect = this.clock.setTimeout(() => this.drop(ABNORMAL, 'connect timeout', true), this.o.connectTimeoutMs ?? 10_000);
    ws.onerror = noop;
    ws.onopen = () => {
      if (this.ws !== ws) return;
      const s = this.sess ? { session: this.sess.session, resume: this.resumeSecret } : this.saved;
      this.sendMsg({ t: 'connect', token, ...s });
    };
    ws.onclose = (ev: { code?: number; reason?: string }) => {
      if (this.ws === ws) this.drop(ev.code ?? ABNORMAL, ev.reason ?? '', false);
    };
    ws.onmessage = (ev: { data: string | ArrayBuffer | Uint8Array }) => {
      if (this.ws !== ws) return;
      this.lastRecv = this.clock.now();
      let msgs: unknown[];
      try {
        msgs = this.codec.decode(ev.data);
      } catch {
        return this.drop(CloseCode.InvalidPayload, 'cannot decode a message from the server', true);
      }
      for (const m of msgs) {
        if (this.ws !== ws) break;
        if (m && typeof m === 'object') this.handle(m as ServerMessage);
      }
    };
  }

  /**
   * Once, before the first socket, as soon as the token's subject is known
   * (at once with a string token, else from the callback's first token): the
   * kept views render at once and resume by replay; the kept writes queue.
   */
  private async restore(): Promise<void> {
    if (this.restored || !this.o.persist || this.tokens.subject === null) return;
    this.restored = true;
    await this.o.persist.open(this, this.tokens.subject);
  }

  private handle(m: ServerMessage): void {
    switch (m.t) {
      case 'connected':
        return this.onConnected(m);
      case 'ok':
      case 'err': {
        const p = this.pending.get(m.id!);
        if (!p) return; // a reply to a request given up on, or to an unsub
        this.pending.delete(p.id);
        this.clock.clearTimeout(p.timer);
        return m.t === 'ok' ? p.resolve(m) : p.reject(errorFromReply(m));
      }
      case 'refresh':
        this.tokens.accepted(m.expires_ms);
        return void this.refresh();
      case 'unsubscribed': {
        const w = this.subs.get(m.s!);
        if (!w) return;
        this.subs.delete(m.s!);
        w._sub = 0;
        return this.resubscribeLater(w);
      }
      default: // a subscription's (snapshot, events, coalesced, synced, progress): Watch._apply ignores another type
        return this.subs.get(m.s!)?._apply(m as SubMessage);
    }
  }

  private onConnected(m: ServerMessage): void {
    if (this.st === 'connected') return;
    const ws = this.ws;
    // Both JSON versions read `connected` alike; what follows is in the version it names.
    if (!this.o.codec) this.codec = m.v === 2 ? json2Codec : jsonCodec;
    this.clock.clearTimeout(this.timers.connect);
    this.sess = { session: m.session!, resumed: !!m.resumed, pingMs: m.ping_ms!, leaseGraceMs: m.lease_grace_ms!, expiresMs: m.expires_ms };
    this.resumeSecret = m.resume;
    this.tokens.accepted(m.expires_ms);
    this.attempt = 0;
    this.refreshes = 0;
    this.everConnected = true;
    this.pingMs = this.o.pingIntervalMs ?? (m.ping_ms || 25_000);
    this.lastSent = this.clock.now();
    if (m.expires_ms) this.scheduleRefresh(refreshDelay(m.expires_ms));
    this.beat();
    // Resubscribed before the listeners run: a write made in one waits for the watches to catch up.
    const prev = this.st;
    this.st = 'connected';
    for (const w of this.watches) this.subscribe(w);
    this.emit('status', { status: 'connected', prev });
    this.emit('connected', this.sess);
    if (this.ws !== ws) return; // a listener closed it
    this.writes.flush();
  }

  /** Heartbeat: ping when idle; a socket silent for 2 × ping_ms is dead (checked on wall-clock time). */
  private beat(): void {
    this.timers.beat = this.clock.setTimeout(() => {
      if (!this.alive()) return;
      if (this.clock.now() - this.lastSent >= this.pingMs / 2) this.sendMsg({ t: 'ping' });
      this.beat();
    }, Math.max(10, Math.floor(this.pingMs / 4)));
  }

  /** Whether the socket is connected and has heard from the server within 2 × ping_ms; drops it otherwise. */
  private alive(): boolean {
    if (this.st !== 'connected') return false;
    if (this.clock.now() - this.lastRecv <= 2 * this.pingMs) return true;
    this.drop(CloseCode.HeartbeatTimeout, 'heartbeat timeout: nothing received for two ping intervals', true);
    return false;
  }

  /** Sends a ping; drops the socket if nothing at all comes back in time (a network that died silently). */
  private probe(): void {
    if (!this.alive() || this.timers.probe !== undefined) return;
    const ws = this.ws;
    const sentAt = this.clock.now();
    this.sendMsg({ t: 'ping' });
    this.timers.probe = this.clock.setTimeout(() => {
      this.timers.probe = undefined;
      if (this.ws === ws && this.lastRecv < sentAt) this.drop(CloseCode.HeartbeatTimeout, 'no answer to a liveness probe', true);
    }, Math.min(this.o.probeTimeoutMs ?? 5000, 2 * this.pingMs));
  }

  private scheduleRefresh(delayMs: number): void {
    this.clock.clearTimeout(this.timers.refresh);
    this.timers.refresh = this.clock.setTimeout(() => void this.refresh(), delayMs);
  }

  /**
   * Gets a new token and sends it over the open socket (`auth`), without
   * reconnecting. A failure is retried with backoff while the token has time
   * left (unless the callback threw UnauthorizedError); then the server
   * closes with 4002 and the client reconnects with a new token.
   */
  private async refresh(): Promise<void> {
    if (!this.tokens.renewable || this.refreshing || this.st !== 'connected') return;
    this.refreshing = true;
    const ws = this.ws;
    let again = true;
    try {
      const token = await this.tokens.renew().catch((e) => {
        again = !(e instanceof UnauthorizedError);
        throw e;
      });
      if (this.ws !== ws) return;
      await this.request({ t: 'auth', token }, this.timeout);
      this.refreshes = 0;
      const left = this.tokens.use(token);
      if (left !== undefined) this.scheduleRefresh(refreshDelay(left));
    } catch (e) {
      if (this.ws !== ws) return;
      this.emit('error', asError(e));
      const delay = backoffDelay(this.refreshes++, this.minDelay, this.maxDelay, this.random);
      const end = this.tokens.expiresAt;
      if (again && (end === undefined || this.clock.now() + delay < end)) this.scheduleRefresh(delay);
    } finally {
      this.refreshing = false;
    }
  }

  /** Forgets the socket, fails what was in flight on it, and decides what comes next. */
  private drop(code: number, reason: string, closeSocket: boolean): void {
    const ws = this.ws;
    if (!ws) return;
    this.ws = undefined;
    ws.onopen = ws.onmessage = ws.onclose = null;
    if (closeSocket) {
      try {
        ws.close(code === 1000 || (code >= 3000 && code < 5000) ? code : 1000, reason);
      } catch {
        // already closed
      }
    }
    for (const k of ['connect', 'beat', 'refresh', 'probe'] as const) {
      this.clock.clearTimeout(this.timers[k]);
      this.timers[k] = undefined;
    }
    const lost = [...this.pending.values()];
    this.pending.clear();
    this.subs.clear();
    for (const p of lost) {
      this.clock.clearTimeout(p.timer);
      if (p.write) {
        if (p.write.state === 'sent') p.write.state = 'lost';
      } else if (!p.sub) p.reject(new NotConnectedError('connection lost'));
    }
    for (const w of this.watches) w._offline();
    const action = this.stopped ? 'closed' : closeAction(code);
    if (action === 'closed') {
      this.emit('disconnected', { code, reason, action });
      return this.halt();
    }
    if (action === 'stop' || (action === 'reauth' && !this.tokens.renewable)) {
      this.emit('disconnected', { code, reason, action: 'stop' });
      const err = code === CloseCode.TokenExpired || code === CloseCode.Unauthorized ? new UnauthorizedError(`${reason || 'unauthorized'} (${code})`) : new ClosedError(code, reason);
      return this.stop(err);
    }
    if (action === 'reauth') this.tokens.refuse();
    this.retry(code, reason, action);
  }

  private retry(code: number, reason: string, action: CloseAction): void {
    const delay = action === 'now' ? Math.floor(this.random() * this.minDelay) : backoffDelay(this.attempt++, this.minDelay, this.maxDelay, this.random);
    this.setStatus(this.everConnected ? 'reconnecting' : 'connecting');
    this.emit('disconnected', { code, reason, action, retryInMs: delay });
    this.clock.clearTimeout(this.timers.retry);
    this.timers.retry = this.clock.setTimeout(() => {
      this.timers.retry = undefined;
      if (!this.stopped) void this.open();
    }, delay);
  }

  private stop(err: StatecastError): void {
    this.stopped = true;
    this.seq++;
    this.listen(false);
    this.halt();
    this.emit('error', err);
  }

  /** Becomes `disconnected` and fails the writes not acknowledged. */
  private halt(): void {
    this.clock.clearTimeout(this.timers.retry);
    this.timers.retry = undefined;
    for (const w of this.watches) w._offline(true);
    this.setStatus('disconnected');
    this.writes.stop();
  }

  private setStatus(status: ConnectionStatus): void {
    const prev = this.st;
    if (prev === status) return;
    this.st = status;
    this.emit('status', { status, prev });
  }

  /**
   * Takes what a reload of this tab left in the store and removes it at once,
   * so the store of a running page never holds it: a duplicated tab (which
   * gets a copy of sessionStorage) then starts a session of its own instead
   * of taking this one over (the server would close this tab with 4503).
   * Returns the kept client id.
   */
  private takeSaved(): string | undefined {
    try {
      const raw = this.store?.getItem(this.storeKey);
      if (raw == null) return undefined;
      this.store!.removeItem(this.storeKey);
      const v = JSON.parse(raw) as { clientId?: unknown; session?: unknown; resume?: unknown };
      if (typeof v.session === 'string' && typeof v.resume === 'string') this.saved = { session: v.session, resume: v.resume };
      return typeof v.clientId === 'string' ? v.clientId : undefined;
    } catch {
      return undefined; // storage denied, or not our JSON: start afresh
    }
  }

  /** Leaves this client's id and session for the page that replaces this one (a reload). */
  private readonly onHide = (ev: { type?: string }) => {
    const s = this.sess ? { session: this.sess.session, resume: this.resumeSecret } : this.saved;
    try {
      this.store!.setItem(this.storeKey, JSON.stringify({ clientId: this.clientId, ...s }));
    } catch {
      return; // quota or denied: the reload starts a new session
    }
    // beforeunload is a fallback for browsers without pagehide; when the unload is
    // cancelled the page runs on, and a running page's store must not hold the entry.
    if (ev.type === 'beforeunload') this.clock.setTimeout(this.onShow, 0);
  };
  /** The page runs (again: back from the back/forward cache): the entry is no one's to take. */
  private readonly onShow = () => {
    try {
      this.store!.removeItem(this.storeKey);
    } catch {
      // denied
    }
  };

  private readonly onOnline = () => this.reconnect();
  /** The browser lost the network: the socket is dead, no need to wait for a probe to time out. */
  private readonly onOffline = () => this.drop(ABNORMAL, 'the browser is offline', true);
  private readonly onWake = () => {
    if ((globalThis as { document?: { visibilityState?: string } }).document?.visibilityState !== 'hidden') this.probe();
  };

  /** Adds or removes the browser's page lifecycle, network and visibility listeners. */
  private listen(on: boolean): void {
    const g = globalThis as unknown as { addEventListener?: Function; removeEventListener?: Function; document?: EventTarget };
    if (typeof g.addEventListener !== 'function') return;
    const f = on ? 'addEventListener' : 'removeEventListener';
    if (this.store) {
      g[f]!('pagehide', this.onHide);
      g[f]!('beforeunload', this.onHide);
      g[f]!('pageshow', this.onShow);
    }
    if (this.o.networkEvents === false) return;
    g[f]!('online', this.onOnline);
    g[f]!('offline', this.onOffline);
    g.document?.[f]('visibilitychange', this.onWake);
  }
}

function asError(e: unknown): StatecastError {
  return e instanceof StatecastError ? e : new StatecastError('internal', e instanceof Error ? e.message : String(e));
}

/** The WebSocket URL for a user-given URL. */
function wsURL(url: string): string {
  const u = new URL(url, (globalThis as { location?: { href: string } }).location?.href);
  if (u.protocol === 'http:') u.protocol = 'ws:';
  else if (u.protocol === 'https:') u.protocol = 'wss:';
  if (u.pathname === '/' || u.pathname === '') u.pathname = '/v1/ws';
  return u.href;
}

/** The page's sessionStorage in browsers; none elsewhere (Node, SSR) or where access is denied. */
function browserSessionStorage(): SessionStore | undefined {
  const g = globalThis as { document?: unknown; sessionStorage?: SessionStore };
  try {
    return g.document ? g.sessionStorage : undefined;
  } catch {
    return undefined; // e.g. a sandboxed iframe, or storage disabled
  }
}

/** A random id for presence. */
function randomId(): string {
  const c = (globalThis as { crypto?: { getRandomValues?(a: Uint8Array): Uint8Array } }).crypto;
  const b = new Uint8Array(9);
  if (c?.getRandomValues) c.getRandomValues(b);
  else for (let i = 0; i < b.length; i++) b[i] = (Math.random() * 256) | 0;
  return 'c' + Array.from(b, (x) => x.toString(36).padStart(2, '0')).join('');
}

