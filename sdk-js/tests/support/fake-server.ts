// An in-process scripted statecast server (a `ws` WebSocketServer) for unit
// tests: the test accepts connections, reads what the client sent and
// answers exactly what it wants, when it wants.
import WebSocketClient, { WebSocketServer, type WebSocket } from 'ws';
import { decodeMulti, encode } from '@msgpack/msgpack';
import { createClient } from '../../dist/index.js';
import { until } from './util.js';

export type Msg = Record<string, any>;

export class FakeConn {
  readonly received: Msg[] = [];
  /** The subprotocol the server chose ('' for none). */
  readonly protocol: string;
  private consumed = new Set<Msg>();
  private waiters: (() => void)[] = [];
  closed = false;

  constructor(readonly ws: WebSocket) {
    this.protocol = ws.protocol;
    ws.on('message', (data, isBinary) => {
      const msgs: Msg[] = isBinary
        ? (Array.from(decodeMulti(data as Buffer)) as Msg[])
        : String(data).split('\n').filter(Boolean).map((l) => JSON.parse(l));
      this.received.push(...msgs);
      this.waiters.splice(0).forEach((w) => w());
    });
    ws.on('close', () => {
      this.closed = true;
      this.waiters.splice(0).forEach((w) => w());
    });
  }

  /** The next not yet consumed message of type `t` (and matching `pred`), waiting for it. */
  async next(t: string, pred: (m: Msg) => boolean = () => true, timeoutMs = 3000): Promise<Msg> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const m = this.received.find((x) => !this.consumed.has(x) && x.t === t && pred(x));
      if (m) {
        this.consumed.add(m);
        return m;
      }
      if (this.closed) throw new Error(`connection closed while waiting for ${t}`);
      const left = deadline - Date.now();
      if (left <= 0) throw new Error(`no ${t} message within ${timeoutMs} ms; got ${JSON.stringify(this.received)}`);
      await new Promise<void>((r) => {
        const timer = setTimeout(r, left);
        this.waiters.push(() => (clearTimeout(timer), r()));
      });
    }
  }

  /** All received messages of type t. */
  all(t: string): Msg[] {
    return this.received.filter((m) => m.t === t);
  }

  /** Sends messages in one frame, in the connection's codec. */
  send(...msgs: Msg[]): void {
    if (this.protocol === 'statecast.v1.msgpack') {
      const parts = msgs.map((m) => encode(m));
      const buf = Buffer.concat(parts.map((p) => Buffer.from(p)));
      this.ws.send(buf, { binary: true });
    } else {
      this.ws.send(msgs.map((m) => JSON.stringify(m)).join('\n'));
    }
  }

  /** Waits for connect and answers connected (`v`: the protocol version of the subprotocol chosen). Returns the connect message. */
  async accept(fields: Msg = {}): Promise<Msg> {
    const c = await this.next('connect');
    const v = this.protocol === 'statecast.v2.json' ? 2 : 1;
    this.send({ t: 'connected', v, session: 's_1', resume: 'r_1', resumed: false, ping_ms: 60_000, lease_grace_ms: 5000, ...fields });
    return c;
  }

  /** Answers the next `sub` (ok + the messages given, with s filled in). */
  async sub(...msgs: Msg[]): Promise<Msg> {
    const s = await this.next('sub');
    this.send({ t: 'ok', id: s.id }, ...msgs.map((m) => ({ s: s.id, ...m })));
    return s;
  }

  /**
   * Commits the write `m` (put, del or txn) at `rev` as the server does: its
   * events, carrying its wid, on subscription `s` (if given), then `ok`.
   */
  commit(m: Msg, rev: number, s?: number): void {
    const ops: Msg[] = m.t === 'txn' ? m.ops : [{ ...m, type: m.t === 'del' ? 'delete' : 'put' }];
    const events = ops.map((o) =>
      o.type === 'delete'
        ? { type: 'delete', key: o.key, mod_rev: rev, wid: m.wid }
        : { type: 'put', key: o.key, value: o.value, create_rev: rev, mod_rev: rev, version: 1, lease: !!o.lease, wid: m.wid },
    );
    this.send(...(s ? [{ t: 'events', s, rev, events }] : []), { t: 'ok', id: m.id, rev });
  }

  close(code: number, reason = ''): void {
    this.ws.close(code, reason);
  }

  terminate(): void {
    this.ws.terminate();
  }
}

export class FakeServer {
  readonly conns: FakeConn[] = [];
  /** The subprotocols each connection's upgrade request offered (Sec-WebSocket-Protocol), in order. */
  readonly offers: string[][] = [];
  private waiters: (() => void)[] = [];
  private taken = 0;

  private constructor(
    readonly wss: WebSocketServer,
    readonly url: string,
    /** The subprotocols the server speaks; a test may change them between connections (a rolling deploy). */
    public protocols: string[],
  ) {
    wss.on('connection', (ws, req) => {
      this.offers.push((req.headers['sec-websocket-protocol'] ?? '').split(',').map((p) => p.trim()).filter(Boolean));
      this.conns.push(new FakeConn(ws));
      this.waiters.splice(0).forEach((w) => w());
    });
  }

  /**
   * Starts a server speaking `protocols`: as the real one, it chooses the
   * first of the client's subprotocols it knows (none: no subprotocol). By
   * default a server from before protocol v2, so that tests write v1
   * messages; a test of one that chose v2 writes v2 messages (FakeConn.send
   * sends what it is given).
   */
  static start({ protocols = ['statecast.v1.json', 'statecast.v1.msgpack'] }: { protocols?: string[] } = {}): Promise<FakeServer> {
    return new Promise((resolve) => {
      let srv: FakeServer;
      const wss = new WebSocketServer({
        host: '127.0.0.1',
        port: 0,
        handleProtocols: (offered) => [...offered].find((p) => srv.protocols.includes(p)) ?? false,
      });
      wss.on('listening', () => {
        const addr = wss.address() as { port: number };
        resolve((srv = new FakeServer(wss, `ws://127.0.0.1:${addr.port}/v1/ws`, protocols)));
      });
    });
  }

  /** The next connection not yet taken by a test, waiting for it. */
  async nextConn(timeoutMs = 3000): Promise<FakeConn> {
    const deadline = Date.now() + timeoutMs;
    while (this.conns.length <= this.taken) {
      const left = deadline - Date.now();
      if (left <= 0) throw new Error('no connection in time');
      await new Promise<void>((r) => {
        const timer = setTimeout(r, left);
        this.waiters.push(() => (clearTimeout(timer), r()));
      });
    }
    return this.conns[this.taken++]!;
  }

  async close(): Promise<void> {
    for (const c of this.conns) c.ws.terminate();
    await new Promise((r) => this.wss.close(r));
  }
}

/** A fake server and a client connected to it (its connection accepted); `done()` closes both. */
export async function connectedClient() {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket: WebSocketClient, sessionStore: false });
  const conn = await srv.nextConn();
  await conn.accept();
  await until(() => c.status === 'connected');
  return { c, conn, done: async () => (c.close(), await srv.close()) };
}
