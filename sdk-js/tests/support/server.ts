// The real statecast server for integration tests: STATECAST_BIN, or built
// once per process with `go build`, started on a free loopback port.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before } from 'node:test';
import WebSocket from 'ws';
import { createClient, type Client, type ClientOptions } from '../../dist/index.js';

const repo = resolve(fileURLToPath(new URL('../..', import.meta.url)), '..');
let built: string | undefined;

function binary(): string {
  if (process.env.STATECAST_BIN) return process.env.STATECAST_BIN;
  if (!built) {
    const dir = mkdtempSync(join(tmpdir(), 'statecast-sdk-'));
    process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
    const bin = join(dir, 'statecast');
    const r = spawnSync('go', ['build', '-o', bin, './cmd/statecast'], { cwd: repo, stdio: 'inherit' });
    if (r.error || r.status !== 0) throw new Error(`go build failed: ${r.error?.message ?? r.status}`);
    built = bin;
  }
  return built;
}

export interface Server {
  /** http://127.0.0.1:PORT */
  http: string;
  /** ws://127.0.0.1:PORT/v1/ws */
  ws: string;
  proc: ChildProcess;
  /** Kills the server (SIGKILL, or e.g. SIGTERM for a graceful shutdown) and waits for it to exit. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

/**
 * A loopback port that was free a moment ago: for a server that must come back
 * on the same address after a restart (`--addr 127.0.0.1:PORT`).
 */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const l = createServer();
    l.on('error', reject);
    l.listen(0, '127.0.0.1', () => {
      const { port } = l.address() as { port: number };
      l.close(() => resolve(port));
    });
  });
}

/**
 * Starts a server with `args` on a port that was free a moment ago, and on
 * another when that one was taken meanwhile (an outgoing socket of this
 * process may be given it): for a server that must come back on the same
 * address after a restart. Returns it and the args that start it again.
 */
export async function startServerOnFreePort(args: string[]): Promise<{ server: Server; args: string[] }> {
  for (let attempt = 1; ; attempt++) {
    const all = [...args, '--addr', `127.0.0.1:${await freePort()}`];
    try {
      return { server: await startServer(all), args: all };
    } catch (e) {
      if (attempt >= 5) throw e;
    }
  }
}

/** A temporary directory for `--store file --data DIR`, removed when the process exits. */
export function tempDataDir(): string {
  const dir = mkdtempSync(join(tmpdir(), 'statecast-data-'));
  process.on('exit', () => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/**
 * Starts `statecast serve --store memory --addr 127.0.0.1:0 ...args` (a later
 * flag wins: e.g. `--store file --data DIR --addr 127.0.0.1:PORT`). To restart
 * a server, stop it and start again with the same args.
 */
export function startServer(args: string[] = []): Promise<Server> {
  const proc = spawn(binary(), ['serve', '--store', 'memory', '--addr', '127.0.0.1:0', '--log-level', 'warn', ...args], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('the server did not print its address within 10 s')), 10_000);
    proc.on('error', reject);
    proc.on('exit', (code) => reject(new Error(`the server exited early (${code})`)));
    let out = '';
    proc.stdout!.on('data', (d) => {
      out += String(d);
      const m = /statecast listening on (http:\/\/\S+)/.exec(out);
      if (!m) return;
      clearTimeout(timer);
      proc.removeAllListeners('exit');
      const http = m[1]!;
      resolve({
        http,
        ws: http.replace('http://', 'ws://') + '/v1/ws',
        proc,
        stop: (signal = 'SIGKILL') =>
          new Promise<void>((r) => {
            if (proc.exitCode !== null || proc.signalCode !== null) return r();
            proc.on('exit', () => r());
            proc.kill(signal);
          }),
      });
    });
  });
}

/** The URL with loopback port 1: connection refused, like a network that is down. */
const unreachable = (url: string) => url.replace(/127\.0\.0\.1:\d+/, '127.0.0.1:1');

/**
 * A WebSocket constructor to inject into a client, which lets a test drop
 * the client's socket (`drop()`, as a network failure: no close frame) and
 * refuse its reconnects for a while (`block(true)`).
 */
export function controlledWebSocket() {
  const sockets: WebSocket[] = [];
  let blocked = false;
  class ControlledWS extends WebSocket {
    constructor(url: string, protocols: string[]) {
      super(blocked ? unreachable(url) : url, protocols);
      sockets.push(this);
    }
  }
  return {
    WebSocket: ControlledWS,
    sockets,
    block(b: boolean) {
      blocked = b;
    },
    /** Kills the current socket without a close handshake. */
    drop() {
      sockets.at(-1)!.terminate();
    },
  };
}

/**
 * A WebSocket constructor (JSON codecs, v1 or v2) whose socket, after `loseReplyTo(t)`,
 * is cut (no close frame) by the first frame the server sends about the next
 * request of type `t`, its reply or an event carrying its wid: the write
 * committed, and the client heard nothing of it. `sent` holds every message
 * the client sent; `block(true)` refuses reconnects, as controlledWebSocket.
 */
export function replyLosingWebSocket() {
  const sent: Record<string, any>[] = [];
  let armed: string | undefined;
  let target: { id: number; wid: string } | undefined;
  let blocked = false;
  const onmessage = Object.getOwnPropertyDescriptor(WebSocket.prototype, 'onmessage')!;
  class ReplyLosingWS extends WebSocket {
    constructor(url: string, protocols: string[]) {
      super(blocked ? unreachable(url) : url, protocols);
      let fn: ((ev: { data: unknown }) => void) | null = null;
      let cut = false;
      Object.defineProperty(this, 'onmessage', {
        get: () => fn,
        set: (f: typeof fn) => {
          fn = f;
          onmessage.set!.call(this, f && ((ev: { data: unknown }) => {
            // Frames the library had already read when the socket was cut
            // (the reply and the event may come in two) are lost with it.
            if (cut) return;
            const text = String(ev.data);
            // The wid of an event: "wid" in v1, "w" in v2's extras.
            if (target && (text.includes(`"wid":"${target.wid}"`) || text.includes(`"w":"${target.wid}"`) || text.includes(`"id":${target.id},`))) {
              target = undefined;
              cut = true;
              return this.terminate();
            }
            f(ev);
          }));
        },
      });
    }
    override send(data: any, ...rest: any[]): void {
      for (const line of String(data).split('\n')) {
        const m = JSON.parse(line);
        sent.push(m);
        if (m.t === armed) [target, armed] = [{ id: m.id, wid: m.wid }, undefined];
      }
      super.send(data, ...rest);
    }
  }
  return {
    WebSocket: ReplyLosingWS,
    sent,
    loseReplyTo(t: string) {
      armed = t;
    },
    block(b: boolean) {
      blocked = b;
    },
  };
}

/**
 * A server for the tests of one file (started before them, stopped after,
 * with the clients made by `client`, which reconnect quickly and keep no
 * session across "reloads"), and unique room names.
 */
export function useServer(args: string[] = []) {
  const t = {
    srv: undefined as unknown as Server,
    clients: [] as Client[],
    seq: 0,
    roomName: (prefix: string) => `${prefix}${process.pid}-${t.seq++}`,
    client(opts: Partial<ClientOptions> = {}): Client {
      const c = createClient({ url: t.srv.http, WebSocket, sessionStore: false, reconnect: { minDelayMs: 20, maxDelayMs: 100 }, ...opts });
      t.clients.push(c);
      return c;
    },
  };
  before(async () => {
    t.srv = await startServer(args);
  });
  after(async () => {
    t.clients.forEach((c) => c.close());
    await t.srv.stop();
  });
  return t;
}
