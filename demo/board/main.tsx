// The board page: one client for the tab, the room of the page, and the
// React tree under StrictMode (its double mount must leave one subscription).
// The header's badge and "you are" chip are portals into the static header.
import { StrictMode, useLayoutEffect, useSyncExternalStore } from 'react';
import { createPortal } from 'react-dom';
import { createRoot } from 'react-dom/client';
import { RoomProvider, StatecastProvider, useClient, useStatus } from '../../sdk-js/src/react.js';
import { connect, me, plural, roomName } from '../app/common.js';
import { Board } from './board.js';

const STATES: Record<string, string> = { connecting: 'connecting…', connected: 'live', reconnecting: 'reconnecting…', disconnected: 'disconnected' };

/** The client's writes not settled yet (queued, in flight, or waiting for their revision). */
function usePendingWrites(): number {
  const client = useClient();
  return useSyncExternalStore((cb) => client.on('pending', cb), () => client.pendingWrites);
}

/** The connection badge: status, how many changes wait to be saved, and a retry button while reconnecting. */
function Badge() {
  const client = useClient();
  const status = useStatus();
  const pending = usePendingWrites();
  return (
    <>
      <span className="dot" />
      <span className="status" data-testid="status">{STATES[status]}</span>
      <span className="sep">·</span>
      <span data-testid="pending">{pending ? `${plural(pending, 'change')} saving…` : 'all saved'}</span>
      {status === 'reconnecting' && <button type="button" onClick={() => client.reconnect()}>Retry now</button>}
    </>
  );
}

/** The badge's element carries the status as an attribute (the style and the tests read it). */
function Header() {
  const status = useStatus();
  const badge = document.getElementById('badge')!;
  useLayoutEffect(() => void (badge.dataset.status = status), [badge, status]);
  return (
    <>
      {createPortal(<Badge />, badge)}
      {createPortal(<>You are <b>{me.name}</b></>, document.getElementById('who')!)}
    </>
  );
}

const client = connect();
createRoot(document.getElementById('board')!).render(
  <StrictMode>
    <StatecastProvider client={client}>
      <RoomProvider id={roomName('board:demo')}>
        <Header />
        <Board />
      </RoomProvider>
    </StatecastProvider>
  </StrictMode>,
);
