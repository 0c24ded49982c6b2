/**
 * Wire codecs. JSON is built in, in both protocol versions; MessagePack
 * lives in the separate entry `@statecast/sdk/msgpack`, so that
 * applications that do not import it do not bundle it.
 * @packageDocumentation
 */
import type { WireEvent, WireItem } from './protocol.js';

/**
 * How messages are framed on the socket. A codec is chosen by WebSocket
 * subprotocol (PROTOCOL.md §2); a frame carries one or more messages.
 */
export interface Codec {
  /** The WebSocket subprotocol that selects this codec on the server. */
  readonly subprotocol: string;
  /** Encodes one message as one frame (a string is sent as a text frame). */
  encode(message: object): string | Uint8Array;
  /** Decodes one received frame into its messages. */
  decode(frame: string | ArrayBuffer | Uint8Array): unknown[];
}

/** @internal The JSON messages of a frame: one a line. */
function lines(frame: string | ArrayBuffer | Uint8Array): any[] {
  return (typeof frame === 'string' ? frame : new TextDecoder().decode(frame))
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => JSON.parse(line));
}

/**
 * The JSON codec of protocol v1 (`statecast.v1.json`, text frames,
 * messages separated by `\n`). Pass it to speak v1 only.
 */
export const jsonCodec: Codec = {
  subprotocol: 'statecast.v1.json',
  encode: (message) => JSON.stringify(message),
  decode: lines,
};

/**
 * The JSON codec of protocol v2 (`statecast.v2.json`): v1 with the events
 * and snapshot items written as arrays (PROTOCOL.md §11), read back into
 * v1's messages. Offered first by default, with {@link jsonCodec} after it
 * for a server that predates v2; pass it to speak v2 only.
 */
export const json2Codec: Codec = {
  subprotocol: 'statecast.v2.json',
  encode: jsonCodec.encode,
  decode: (frame) => lines(frame).map(fromV2),
};

/** What a v2 event or item may carry beyond its array (§11); other fields are ignored. */
interface Extras {
  m?: unknown;
  l?: unknown;
  w?: unknown;
  p?: unknown;
  x?: unknown;
}

// Checks of what v2 messages hold: anything else is refused, never guessed.
const bad = (): never => {
  throw new Error('malformed statecast.v2.json message');
};
const list = (a: unknown): any[] => (Array.isArray(a) ? a : bad());
const str = (s: unknown): string => (typeof s === 'string' ? s : bad());
const uint = (n: unknown): number => (Number.isInteger(n) && (n as number) >= 0 ? (n as number) : bad());
const extras = (o: unknown): Extras => (o !== null && typeof o === 'object' && !Array.isArray(o) ? o : bad());

/** @internal A v2 message as v1 has it: events, coalesced and snapshot rewritten, the others as they are. */
function fromV2(m: any): unknown {
  const t = m?.t;
  if (t === 'events' || t === 'coalesced') {
    const r = uint(m.r);
    return { t, s: m.s, rev: r, events: list(m.e).map((e) => event(e, r)) };
  }
  if (t === 'snapshot') m.items = list(m.items).map(item);
  return m;
}

/** A put `[key, value, create_rev, version, extras?]`, or a delete or leave `[key, extras?]`, of an events message at `r`. */
function event(a: unknown, r: number): WireEvent {
  const v = list(a);
  const n = v.length;
  const x = n === 2 || n === 5 ? extras(v[n - 1]) : n === 1 || n === 4 ? {} : bad();
  const e: WireEvent =
    n > 2
      ? { type: 'put', key: str(v[0]), value: v[1], create_rev: uint(v[2]), mod_rev: r, version: uint(v[3]) }
      : { type: x.x === 1 ? 'leave' : 'delete', key: str(v[0]), mod_rev: r };
  if (x.m !== undefined) e.mod_rev = uint(x.m);
  if (x.l === 1) e.lease = true;
  if (x.p !== undefined) {
    const p = list(x.p);
    if (p.length !== 4 && (p.length !== 5 || p[4] !== 1)) bad();
    e.prev = { value: p[0], create_rev: uint(p[1]), mod_rev: uint(p[2]), version: uint(p[3]) };
    if (p.length === 5) e.prev.lease = true;
  }
  if (x.w !== undefined) e.wid = str(x.w);
  return e;
}

/** A snapshot item `[key, value, create_rev, mod_rev, version, {"l":1}?]`. */
function item(a: unknown): WireItem {
  const v = list(a);
  if (v.length !== 5 && v.length !== 6) bad();
  const it: WireItem = { key: str(v[0]), value: v[1], create_rev: uint(v[2]), mod_rev: uint(v[3]), version: uint(v[4]) };
  if (v.length === 6 && extras(v[5]).l === 1) it.lease = true;
  return it;
}

/** @internal The size of an encoded frame in bytes (UTF-8 for text, as it goes on the wire). */
export function frameBytes(frame: string | Uint8Array): number {
  return typeof frame === 'string' ? new TextEncoder().encode(frame).byteLength : frame.byteLength;
}
