import { test } from 'node:test';
import assert from 'node:assert/strict';
import WebSocket from 'ws';
import { encode } from '@msgpack/msgpack';
import { createClient, jsonCodec } from '../dist/index.js';
import { msgpackCodec } from '../dist/msgpack.js';
import { FakeServer } from './support/fake-server.js';
import { until } from './support/util.js';

test('codec: JSON frames carry several messages separated by newlines', () => {
  assert.deepEqual(jsonCodec.decode('{"t":"pong"}\n{"t":"ok","id":2,"rev":5}\n'), [{ t: 'pong' }, { t: 'ok', id: 2, rev: 5 }]);
  assert.equal(jsonCodec.encode({ t: 'put', value: 'a\nb', x: undefined }), '{"t":"put","value":"a\\nb"}');
});

test('codec: MessagePack frames carry concatenated maps', () => {
  const frame = new Uint8Array([...encode({ t: 'pong' }), ...encode({ t: 'ok', id: 2, rev: 5 })]);
  assert.deepEqual(msgpackCodec.decode(frame.buffer), [{ t: 'pong' }, { t: 'ok', id: 2, rev: 5 }]);
  assert.deepEqual(msgpackCodec.decode(msgpackCodec.encode({ t: 'put', v: [1, 1.5, null], x: undefined }) as Uint8Array), [{ t: 'put', v: [1, 1.5, null] }]);
});

test('codec: the msgpack client offers statecast.v1.msgpack and speaks binary frames', async () => {
  const srv = await FakeServer.start();
  const c = createClient({ url: srv.url, WebSocket, codec: msgpackCodec });
  try {
    const conn = await srv.nextConn();
    assert.equal(conn.protocol, 'statecast.v1.msgpack');
    await conn.accept();
    await until(() => c.status === 'connected');
    const p = c.room('r').put('k', { a: [1, 2.5] });
    const m = await conn.next('put');
    assert.deepEqual(m.value, { a: [1, 2.5] });
    conn.send({ t: 'ok', id: m.id, rev: 1 });
    assert.deepEqual(await p, { rev: 1 });
  } finally {
    c.close();
    await srv.close();
  }
});
