// Persistence (`@statecast/sdk/persist`) against the real server, with
// memoryStorage() standing for IndexedDB and a new client for each "page":
// a reload renders the kept view before its socket opens and resumes it by
// replay; pending writes kept by a page are sent by the next one, once, with
// their write ids; records are per subject.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import type { ChangeEvent, ClientOptions, RollbackEvent, SyncEvent } from '../dist/index.js';
import { PersistError, memoryStorage, persist, type PersistStorage } from '../dist/persist.js';
import { controlledWebSocket, replyLosingWebSocket, useServer } from './support/server.js';
import { record, until } from './support/util.js';

const t = useServer();
const { client, roomName } = t;
/** A page's client keeping its records in `storage`. */
const page = (storage: PersistStorage, opts: Partial<ClientOptions> = {}) => client({ persist: persist({ storage, saveDelayMs: 5 }), ...opts });
const brief = (cs: ChangeEvent[]) => cs.map((c) => `${c.type} ${c.key}=${JSON.stringify(c.value)} ${c.cause}`);

test('persist: a reload shows the kept view before its socket opens, then resumes it by replay (no snapshot)', async () => {
  const storage = memoryStorage();
  const room = roomName('persist-view:');
  const w = client();
  for (let i = 0; i < 5; i++) await w.room(room).put(`k${i}`, i);

  const first = page(storage);
  const v1 = first.room(room).watch();
  await v1.ready();
  await until(() => [...storage.m.values()].some((v: any) => v?.rev === v1.rev && v.items?.length === 5), 'the view kept');
  first.close();

  await w.room(room).put('k1', 'missed');
  await w.room(room).delete('k2');

  // The next page: its first socket is counted, to see what the view held before it.
  let atDial: number | undefined;
  class Counting extends WebSocket {
    constructor(url: string, p: string[]) {
      super(url, p);
      atDial ??= v2.size;
    }
  }
  const second = page(storage, { WebSocket: Counting });
  const v2 = second.room(room).watch();
  const syncs = record(v2, 'sync');
  const changes = record(v2, 'change');
  await until(() => syncs.some((s) => s.kind === 'resumed'), 'resumed');
  assert.equal(atDial, 5, 'the kept view was shown before the socket opened');
  assert.deepEqual(syncs.map((s: SyncEvent) => [s.kind, s.reason]), [['initial', 'cache'], ['resumed', undefined]]);
  assert.deepEqual(brief(changes.filter((c) => c.cause !== 'initial')), ['put k1="missed" replay', 'delete k2=undefined replay']);
  assert.deepEqual(v2.entries().map((e) => [e.key, e.value]), [['k0', 0], ['k1', 'missed'], ['k3', 3], ['k4', 4]]);
});

test('persist: writes queued offline survive the page and are sent by the next one, once; a conflict rolls back visibly', async () => {
  const storage = memoryStorage();
  const room = roomName('persist-writes:');
  const other = client();
  await other.room(room).put('taken', 'theirs');
  const ctl = controlledWebSocket();
  ctl.block(true); // offline from the start
  const first = page(storage, { WebSocket: ctl.WebSocket });
  const r1 = first.room(room);
  const ok = r1.put('a', 1);
  ok.catch(() => {});
  r1.put('taken', 'mine', { ifModRev: 0 }).catch(() => {}); // conflicts once sent
  await until(() => [...storage.m.entries()].some(([k, v]) => k.includes('\0w\0') && (v as unknown[]).length === 2), 'the queue kept');
  const wids = (storage.m.get([...storage.m.keys()].find((k) => k.includes('\0w\0'))!) as { msg: { wid: string } }[]).map((w) => w.msg.wid);
  // The page goes without closing its client (close() would reject the queue): its records stay.
  ctl.block(true);

  const lose = replyLosingWebSocket();
  lose.block(true); // until the kept write was seen pending: sent at once, it could settle between two looks
  const second = page(storage, { WebSocket: lose.WebSocket });
  const v = second.room(room).watch();
  const rollbacks = record(second, 'rollback');
  await until(() => v.entry('a')?.pending === true, 'the kept write shown as pending');
  lose.block(false);
  await until(() => second.pendingWrites === 0 && rollbacks.length === 1, 'settled');
  assert.deepEqual([v.get('a'), v.get('taken')], [1, 'theirs']);
  assert.equal((rollbacks[0] as RollbackEvent).error.code, 'conflict');
  assert.deepEqual(lose.sent.filter((m) => m.wid).map((m) => m.wid), wids, 'sent with their original write ids');
  assert.ok(lose.sent.filter((m) => m.wid).every((m) => m.lease === 'keep'), 'a kept put keeps the key\'s lease, as when it was made');
  // Exactly once: the put of `a` made one revision.
  assert.equal(v.entry('a')!.version, 1);
  await until(() => ![...storage.m.keys()].some((k) => k.includes('\0w\0')), 'nothing left to send');
});

test('persist: a write whose reply was lost before the reload is sent again with its id and applied once', async () => {
  const storage = memoryStorage();
  const room = roomName('persist-lost:');
  const lose = replyLosingWebSocket();
  const first = page(storage, { WebSocket: lose.WebSocket });
  const v1 = first.room(room).watch();
  await v1.ready();
  lose.block(true);
  lose.loseReplyTo('put');
  first.room(room).put('n', 1).catch(() => {});
  await until(() => first.status === 'reconnecting', 'the reply lost with the socket');
  await until(() => [...storage.m.entries()].some(([k, v]) => k.includes('\0w\0') && (v as { since: number | null }[])[0]?.since !== null), 'kept as sent');

  const second = page(storage);
  const v2 = second.room(room).watch();
  await until(() => second.pendingWrites === 0 && v2.get('n') === 1, 'confirmed');
  assert.equal(v2.entry('n')!.version, 1, 'applied once');
  assert.equal(v2.rev, 1);
});

test('persist: another subject never sees the records of the previous one', async () => {
  const storage = memoryStorage();
  const room = roomName('persist-who:');
  const jwt = (sub: string) => `e30.${Buffer.from(JSON.stringify({ sub })).toString('base64url')}.x`;
  const ctl = controlledWebSocket();
  ctl.block(true);
  const ann = page(storage, { WebSocket: ctl.WebSocket, token: jwt('ann') });
  ann.room(room).put('secret', 'ann').catch(() => {});
  await until(() => [...storage.m.keys()].some((k) => k.includes('\0ann\0w\0')), 'ann\'s queue kept');

  const ben = page(storage, { WebSocket: ctl.WebSocket, token: jwt('ben') });
  const v = ben.room(room).watch();
  await until(() => ctl.sockets.length >= 2, 'ben dialed');
  assert.equal(ben.pendingWrites, 0, 'ann\'s queue is not ben\'s');
  assert.equal(v.get('secret'), undefined);
  assert.ok([...storage.m.keys()].some((k) => k.includes('\0ann\0w\0')), 'ann\'s queue stays hers');
});

test('persist: pending writes the storage cannot keep are told (onError), once while it fails, and once again after it recovered; the writes are sent all the same', async () => {
  const mem = memoryStorage();
  let full = true;
  const durable: boolean[] = [];
  const storage: PersistStorage = {
    ...mem,
    set: async (k, v, o) => {
      if (k.includes('\0w\0')) durable.push(!!o?.durable);
      if (full && k.includes('\0w\0')) throw new DOMException('the quota is exceeded', 'QuotaExceededError');
      return mem.set(k, v);
    },
  };
  const room = roomName('persist-full:');
  const ctl = controlledWebSocket();
  ctl.block(true);
  const errors: PersistError[] = [];
  const c = client({ persist: persist({ storage, saveDelayMs: 5, onError: (e) => errors.push(e) }), WebSocket: ctl.WebSocket });
  const r = c.room(room);
  const writes = [r.put('a', 1), r.put('b', 2)];
  await until(() => errors.length === 1, 'the first failure');
  r.put('c', 3).catch(() => {});
  await new Promise((res) => setTimeout(res, 50)); // saves of the queue, failing again
  assert.equal(errors.length, 1, 'one error while it keeps failing');
  assert.ok(errors[0] instanceof PersistError);
  assert.equal((errors[0].cause as DOMException).name, 'QuotaExceededError');
  assert.ok(durable.length > 0 && durable.every(Boolean), 'the pending writes are saved as durable');

  full = false;
  r.put('d', 4).catch(() => {});
  await until(() => [...mem.m.keys()].some((k) => k.includes('\0w\0')), 'kept once there is room');
  full = true;
  r.put('e', 5).catch(() => {});
  await until(() => errors.length === 2, 'failing again is told again');

  ctl.block(false);
  await Promise.all(writes);
  await until(() => c.pendingWrites === 0, 'all sent');
});
