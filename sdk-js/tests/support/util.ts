// Test helpers: a manual clock, waiting for conditions and events.
import type { Clock } from '../../dist/index.js';
import type { Emitter } from '../../dist/emitter.js';

/** A clock whose time moves only when the test says so. */
export class FakeClock implements Clock {
  t = 1_000_000;
  private id = 0;
  private timers = new Map<number, { at: number; fn: () => void; ms: number }>();
  now(): number {
    return this.t;
  }
  setTimeout(fn: () => void, ms: number): unknown {
    const id = ++this.id;
    this.timers.set(id, { at: this.t + ms, fn, ms });
    return id;
  }
  clearTimeout(h: unknown): void {
    this.timers.delete(h as number);
  }
  /** Delays of the pending timers. */
  pending(): number[] {
    return [...this.timers.values()].map((t) => t.ms);
  }
  /** Moves time forward by ms, running the timers that come due, in order. */
  advance(ms: number): void {
    const end = this.t + ms;
    for (;;) {
      let next: [number, { at: number; fn: () => void }] | undefined;
      for (const e of this.timers) if (e[1].at <= end && (!next || e[1].at < next[1].at)) next = e;
      if (!next) break;
      this.timers.delete(next[0]);
      this.t = next[1].at;
      next[1].fn();
    }
    this.t = end;
  }
}

/** Waits until cond() is (or resolves to) true, polling every 5 ms. */
export async function until(cond: () => boolean | Promise<boolean>, what = 'condition', timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(5);
  }
}

export const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** The next event of `type` matching pred. */
export function nextEvent<E extends object, K extends keyof E>(em: Emitter<E> & { eventMap?: E }, type: K, pred: (ev: E[K]) => boolean = () => true, timeoutMs = 5000): Promise<E[K]> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => (off(), reject(new Error(`no ${String(type)} event in time`))), timeoutMs);
    const off = em.on(type, (ev) => {
      if (!pred(ev)) return;
      off();
      clearTimeout(timer);
      resolve(ev);
    });
  });
}

/** Records every event of `type`. */
export function record<E extends object, K extends keyof E>(em: Emitter<E> & { eventMap?: E }, type: K): E[K][] {
  const out: E[K][] = [];
  em.on(type, (ev) => out.push(ev));
  return out;
}

/** A Storage-like map (sessionStorage of a fake page); `fail` makes every call throw. */
export class FakeStorage {
  readonly m = new Map<string, string>();
  fail = false;
  getItem(k: string): string | null {
    if (this.fail) throw new Error('storage denied');
    return this.m.get(k) ?? null;
  }
  setItem(k: string, v: string): void {
    if (this.fail) throw new Error('storage denied');
    this.m.set(k, String(v));
  }
  removeItem(k: string): void {
    if (this.fail) throw new Error('storage denied');
    this.m.delete(k);
  }
  /** A copy, as a browser gives a duplicated tab. */
  copy(): FakeStorage {
    const s = new FakeStorage();
    for (const [k, v] of this.m) s.m.set(k, v);
    return s;
  }
}

/**
 * Makes globalThis look like a browser window for page lifecycle events
 * (`addEventListener` etc.); `fire('pagehide')` dispatches one. `restore()`
 * puts globalThis back.
 */
export function fakeWindow() {
  const g = globalThis as any;
  const target = new EventTarget();
  const saved = { add: g.addEventListener, remove: g.removeEventListener };
  g.addEventListener = target.addEventListener.bind(target);
  g.removeEventListener = target.removeEventListener.bind(target);
  return {
    fire: (type: string) => target.dispatchEvent(new Event(type)),
    restore() {
      if (saved.add) [g.addEventListener, g.removeEventListener] = [saved.add, saved.remove];
      else delete g.addEventListener, delete g.removeEventListener;
    },
  };
}
