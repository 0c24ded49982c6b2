import { ListenerError } from './errors.js';

/** A listener of one event type. */
export type Listener<T> = (event: T) => void;

/**
 * A small typed event emitter (no dependency on Node's `events`).
 *
 * Listeners run synchronously, in the order they were added, and in the wire
 * order of the messages that caused them. A listener that throws does not
 * stop the others or the SDK: its error is emitted as a {@link ListenerError}
 * on this emitter's `error` event, or logged with console.error when nothing
 * listens to `error` (never rethrown: an uncaught exception would end a Node
 * process).
 */
export class Emitter<Events extends object> {
  /**
   * Type-only: the event map of this emitter, for typing generic helpers
   * (`NonNullable<T['eventMap']>`). Never set at run time.
   */
  declare readonly eventMap?: Events;
  private readonly listeners: { [K in keyof Events]?: Listener<Events[K]>[] } = {};

  /** Adds a listener; returns a function that removes it. */
  on<K extends keyof Events>(type: K, fn: Listener<Events[K]>): () => void {
    (this.listeners[type] ??= []).push(fn);
    return () => this.off(type, fn);
  }

  /** Adds a listener that runs once; returns a function that removes it. */
  once<K extends keyof Events>(type: K, fn: Listener<Events[K]>): () => void {
    const off = this.on(type, (ev) => {
      off();
      fn(ev);
    });
    return off;
  }

  /** Removes a listener added with `on`. */
  off<K extends keyof Events>(type: K, fn: Listener<Events[K]>): void {
    const list = this.listeners[type];
    const i = list ? list.indexOf(fn) : -1;
    if (i >= 0) list!.splice(i, 1);
  }

  /** The number of listeners of `type` (to check that cleanup removed them). */
  listenerCount<K extends keyof Events>(type: K): number {
    return this.listeners[type]?.length ?? 0;
  }

  /** @internal Calls the listeners of `type` with `event`. */
  protected emit<K extends keyof Events>(type: K, event: Events[K]): void {
    const list = this.listeners[type];
    if (!list) return;
    for (const fn of list.slice()) {
      try {
        fn(event);
      } catch (err) {
        const onError = this.listeners['error' as K];
        if (type !== 'error' && onError?.length) this.emit('error' as K, new ListenerError(String(type), err) as Events[K]);
        else console.error(`statecast: a "${String(type)}" listener threw`, err);
      }
    }
  }
}
