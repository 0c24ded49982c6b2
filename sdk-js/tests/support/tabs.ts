// Fakes of the browser APIs tabs use: a BroadcastChannel bus and Web Locks,
// shared by the "tabs" of one test (clients in one process). `kill()` ends a
// tab as closing it would: its locks are released, its channels stop
// delivering, its real sockets close.
import type { TabChannel, TabLocks } from '../../dist/persist.js';
import type { WebSocketConstructor, WebSocketLike } from '../../dist/index.js';

type Held = { tab: Tab; mode: 'exclusive' | 'shared' };
type Waiter = Held & { fn: (l: unknown) => unknown; resolve: (v: unknown) => void };

/** One browser (origin): channels by name, locks by name. */
export class Browser {
  private chans = new Set<{ name: string; tab: Tab; ch: TabChannel }>();
  private held = new Map<string, Held[]>();
  private waiting = new Map<string, Waiter[]>();

  tab(RealWS: WebSocketConstructor): Tab {
    return new Tab(this, RealWS);
  }

  /** @internal */
  channel(tab: Tab, name: string): TabChannel {
    const entry = {
      name,
      tab,
      ch: {
        onmessage: null as TabChannel['onmessage'],
        postMessage: (m: unknown) => {
          if (!tab.alive) return;
          const data = structuredClone(m);
          for (const o of this.chans)
            if (o !== entry && o.name === name) setTimeout(() => o.tab.alive && this.chans.has(o) && o.ch.onmessage?.({ data }), 0);
        },
        close: () => void this.chans.delete(entry),
      },
    };
    this.chans.add(entry);
    return entry.ch;
  }

  /** @internal */
  locks(tab: Tab): TabLocks {
    return {
      request: (name, opts, fn) =>
        new Promise((resolve) => {
          const w: Waiter = { tab, mode: opts.mode ?? 'exclusive', fn, resolve };
          if (this.free(name, w.mode) && !(this.waiting.get(name)?.length)) return this.grant(name, w);
          if (opts.ifAvailable) return resolve(fn(null));
          this.waiting.set(name, [...(this.waiting.get(name) ?? []), w]);
        }),
    };
  }

  private free(name: string, mode: string): boolean {
    const h = this.held.get(name) ?? [];
    return !h.length || (mode === 'shared' && h.every((x) => x.mode === 'shared'));
  }

  private grant(name: string, w: Waiter): void {
    const h: Held = { tab: w.tab, mode: w.mode };
    this.held.set(name, [...(this.held.get(name) ?? []), h]);
    void Promise.resolve(w.fn({ name }))
      .finally(() => this.release(name, h))
      .then(w.resolve, () => {});
  }

  private release(name: string, h: Held): void {
    this.held.set(name, (this.held.get(name) ?? []).filter((x) => x !== h));
    const q = this.waiting.get(name) ?? [];
    while (q.length && this.free(name, q[0]!.mode)) this.grant(name, q.shift()!);
  }

  /** @internal Releases the locks of a closed tab and drops its requests. */
  end(tab: Tab): void {
    for (const [name, q] of this.waiting) this.waiting.set(name, q.filter((w) => w.tab !== tab));
    for (const [name, hs] of this.held) for (const h of hs) if (h.tab === tab) this.release(name, h);
    for (const c of this.chans) if (c.tab === tab) this.chans.delete(c);
  }
}

/**
 * One tab: its options for `persist({ tabs })`, and the real sockets it
 * opened (as leader). While `hold` is set, what the server sends them is
 * not delivered (replies lost when the tab closes).
 */
export class Tab {
  alive = true;
  hold = false;
  readonly sockets: WebSocketLike[] = [];
  readonly tabs;
  constructor(private readonly browser: Browser, RealWS: WebSocketConstructor) {
    const tab = this;
    this.tabs = {
      locks: browser.locks(this),
      channel: (name: string) => browser.channel(this, name),
      WebSocket: class extends (RealWS as any) {
        constructor(url: string, p: string[]) {
          super(url, p);
          tab.sockets.push(this as unknown as WebSocketLike);
        }
        set onmessage(fn: ((ev: unknown) => void) | null) {
          super.onmessage = fn && ((ev: unknown) => tab.hold || fn(ev));
        }
        get onmessage() {
          return super.onmessage;
        }
      } as unknown as WebSocketConstructor,
    };
  }
  /** Closes the tab: no more messages, locks released, its sockets closed. */
  kill(): void {
    this.alive = false;
    this.browser.end(this);
    for (const s of this.sockets) s.close();
  }
}
