/**
 * Wire messages of statecast protocol v1 (server/PROTOCOL.md), as the SDK
 * reads and writes them; v2's events and snapshots are decoded into these
 * (codec.ts). Types only: nothing here exists at run time.
 * @internal
 * @packageDocumentation
 */

/** A key with its value and revisions, as in snapshots (§5). */
export interface WireItem {
  key: string;
  value: unknown;
  create_rev: number;
  mod_rev: number;
  version: number;
  lease?: boolean;
}

/** One key's change in an `events` or `coalesced` message (§5); `leave` only on a filtered subscription. */
export interface WireEvent {
  type: 'put' | 'delete' | 'leave';
  key: string;
  value?: unknown;
  create_rev?: number;
  mod_rev: number;
  version?: number;
  lease?: boolean;
  /** The key's previous state, on a subscription with `prev` (the SDK does not ask for it). */
  prev?: { value: unknown; create_rev: number; mod_rev: number; version: number; lease?: true };
  /** The write id of the write that made this change, if it had one (§6). */
  wid?: string;
}

/** Any server → client message; `t` says which fields apply. */
export interface ServerMessage {
  t: string;
  /** `connected`: the protocol version the server speaks on this socket (1 or 2). */
  v?: number;
  id?: number;
  s?: number;
  rev?: number;
  code?: string;
  message?: string;
  key?: string;
  mod_rev?: number;
  epoch?: string;
  reason?: string;
  items?: WireItem[];
  events?: WireEvent[];
  session?: string;
  resume?: string;
  resumed?: boolean;
  ping_ms?: number;
  lease_grace_ms?: number;
  expires_ms?: number;
  /** An `ok` to a write whose `wid` had already committed: `rev` is the original's. */
  dup?: boolean;
  /** `err` `invalid_filter`: where in the expression (from 1), when known. */
  line?: number;
  column?: number;
}

/** A subscription message: snapshot, events, coalesced, synced or progress. */
export type SubMessage = ServerMessage & { s: number; rev: number };
