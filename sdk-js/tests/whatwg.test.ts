// The SDK on the WHATWG WebSocket API that browsers have (Node's global
// WebSocket, from undici: scripts/test.mjs enables it on Node 20 with
// --experimental-websocket), against the real server, every codec and the
// default (JSON v2, offered with v1).
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { createClient, jsonCodec, json2Codec, type Client, type Codec, type WebSocketConstructor } from '../dist/index.js';
import { msgpackCodec } from '../dist/msgpack.js';
import { startServer, type Server } from './support/server.js';
import { record, until } from './support/util.js';

const Global = (globalThis as { WebSocket?: WebSocketConstructor }).WebSocket;
const skip = Global ? false : 'no global WebSocket (run with --experimental-websocket on Node 20)';
let srv: Server | undefined;
const clients: Client[] = [];

before(async () => {
  if (!skip) srv = await startServer();
});
after(async () => {
  clients.forEach((c) => c.close());
  await srv?.stop();
});

for (const [name, codec] of [['default', undefined], ['json', jsonCodec], ['json2', json2Codec], ['msgpack', msgpackCodec]] as [string, Codec | undefined][]) {
  test(`whatwg (${name}): the default global WebSocket connects, watches, writes, and resumes after a close`, { skip }, async () => {
    const sockets: { close(code?: number, reason?: string): void; protocol: string }[] = [];
    const Tracked = class extends (Global as any) {
      constructor(url: string, protocols: string[]) {
        super(url, protocols);
        sockets.push(this as any);
      }
    } as unknown as WebSocketConstructor;
    const plain = createClient({ url: srv!.http, codec }); // no WebSocket option: the global one
    const a = createClient({ url: srv!.http, codec, WebSocket: Tracked, reconnect: { minDelayMs: 10, maxDelayMs: 50 } });
    clients.push(plain, a);
    const room = `whatwg:${name}`;
    const w = a.room(room).watch();
    const syncs = record(w, 'sync');
    await w.ready();
    assert.equal(sockets[0]!.protocol, codec?.subprotocol ?? 'statecast.v2.json', 'the subprotocol the server chose');
    await plain.room(room).put('k', { v: [1, 2.5, 'é'] }, { waitFor: plain.room(room).watch() });
    await until(() => w.has('k'));
    // Recorded, not polled: with a 10 ms backoff the client may be
    // connected again before a poll sees it reconnecting.
    const statuses = record(a, 'status');
    sockets[0]!.close(4000, 'test');
    await until(() => statuses.some((s) => s.status === 'reconnecting'), 'reconnecting');
    await plain.room(room).put('k2', 2);
    await until(() => syncs.some((s) => s.kind === 'resumed'), 'resumed');
    // k2 came by the replay, or live just after it when the client had
    // already resumed before the put: either way the view gets it.
    await until(() => w.get('k2') === 2, 'k2');
    assert.deepEqual(w.get('k'), { v: [1, 2.5, 'é'] });
    assert.equal(sockets.length, 2);
  });
}
