// Server rendering with the React bindings: renderToString of a tree with
// the providers and every hook renders the loading state and touches no
// network (no WebSocket is constructed, the client stays disconnected).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createElement as h, Fragment } from 'react';
import { renderToString } from 'react-dom/server';
import { createClient } from '../dist/index.js';
import { RoomProvider, StatecastProvider, useEntry, usePresence, useStatus, useWatch } from '../dist/react.js';
import { sleep } from './support/util.js';

function Page() {
  const status = useStatus();
  const todos = useWatch('todo/');
  const first = useEntry('todo/1');
  const others = usePresence({ name: 'ann' });
  return h(
    Fragment,
    null,
    h('p', null, `status: ${status}`),
    h('p', null, todos ? `${todos.length} todos` : 'todos loading'),
    h('p', null, first === undefined ? 'entry loading' : 'entry loaded'),
    h('p', null, others ? `${others.size} others` : 'presence loading'),
  );
}

test('react ssr: renderToString renders the loading state and constructs no WebSocket', async () => {
  let sockets = 0;
  class CountingWebSocket {
    constructor() {
      sockets++;
      throw new Error('no socket may be opened during server rendering');
    }
  }
  const g = globalThis as { WebSocket?: unknown };
  const saved = g.WebSocket;
  g.WebSocket = CountingWebSocket;
  try {
    const client = createClient({ url: '/v1/ws', autoConnect: false });
    const html = renderToString(h(StatecastProvider, { client }, h(RoomProvider, { id: 'board:1' }, h(Page))));
    assert.equal(html, '<p>status: connecting</p><p>todos loading</p><p>entry loading</p><p>presence loading</p>');
    await sleep(20); // anything started during render would have tried to open a socket by now
    assert.equal(sockets, 0);
    assert.equal(client.status, 'disconnected');
  } finally {
    g.WebSocket = saved;
  }
});
