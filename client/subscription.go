package client

import (
	"context"
	"errors"
	"sync"

	"github.com/statecast/statecast/server/wire"
)

// Subscription receives one subscription's messages, in order. Its queue
// is unbounded so that the connection's reader never waits for a slow
// consumer (the server bounds what it sends; see
// docs/DESIGN.md#slow-consumers).
type Subscription struct {
	c    *Conn
	id   uint64
	wake chan struct{} // capacity 1: "the queue or err changed"

	mu   sync.Mutex
	q    []wire.Message
	head int   // q[head:] are the messages not yet returned
	err  error // once set, Next returns it after the queue is drained
}

// ID returns the subscription id, the "s" of its messages.
func (s *Subscription) ID() uint64 { return s.id }

// push queues a message; an unsubscribed message also ends the
// subscription.
func (s *Subscription) push(m *wire.Message) {
	s.mu.Lock()
	if s.head > 0 && len(s.q) == cap(s.q) && s.head >= len(s.q)/2 {
		// Reuse the consumed front instead of growing.
		n := copy(s.q, s.q[s.head:])
		clear(s.q[n:])
		s.q, s.head = s.q[:n], 0
	}
	s.q = append(s.q, *m)
	if m.T == wire.TUnsubscribed && s.err == nil {
		s.err = errorFromMessage(m)
	}
	s.mu.Unlock()
	s.signal()
}

// end makes Next return err once the queue is drained.
func (s *Subscription) end(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.signal()
}

func (s *Subscription) signal() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Next returns the next message of the subscription: snapshot, events,
// coalesced, synced, progress or unsubscribed. Once the subscription has
// ended and its queue is drained, it returns why: ErrUnsubscribed, the
// *Error of the server's unsubscribed message, or the connection's error.
func (s *Subscription) Next(ctx context.Context) (wire.Message, error) {
	for {
		s.mu.Lock()
		if s.head < len(s.q) {
			m := s.q[s.head]
			s.q[s.head] = wire.Message{} // let its items and events be collected
			if s.head++; s.head == len(s.q) {
				s.q, s.head = s.q[:0], 0
			}
			s.mu.Unlock()
			return m, nil
		}
		err := s.err
		s.mu.Unlock()
		if err != nil {
			return wire.Message{}, err
		}
		select {
		case <-s.wake:
		case <-ctx.Done():
			return wire.Message{}, ctx.Err()
		}
	}
}

// Unsubscribe ends the subscription and waits for the server's ok; the
// messages queued before it are still returned by Next, then
// ErrUnsubscribed. A subscription the server had already ended is not an
// error.
func (s *Subscription) Unsubscribe(ctx context.Context) error {
	_, err := s.c.roundTrip(ctx, &wire.Request{T: wire.TUnsub, Sub: s.id}, false)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	// Everything of the subscription came before the ok: the reader has
	// queued it already.
	s.c.dropSub(s)
	s.end(ErrUnsubscribed)
	return nil
}
