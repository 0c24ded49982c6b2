package redisstore

import (
	"context"
	"sync"
)

// Head's reads of one room are coalesced, as etcd batches its ReadIndex
// requests: while a read is on its way, the calls that arrive wait for
// the next one, sent when it returns, which answers all of them. A call
// never shares a read sent before it began: that read may miss a write
// acknowledged before the call, or a loss of Redis's last writes that a
// resume's check must see (Head). A burst of linearizable reads, or of
// resumes into one room after a node's loss, then costs Redis a read per
// round trip instead of one per client.
type headReads struct {
	mu    sync.Mutex
	rooms map[string]*headRoom
}

// headRoom is one room's reads: sent is on its way (nil: none), next is
// what the calls that arrived since wait for.
type headRoom struct {
	sent, next *headRead
}

// headRead is one read and its answer, set before done is closed.
type headRead struct {
	done   chan struct{}
	joined int // calls waiting for it (under headReads.mu)
	epoch  string
	rev    uint64
	err    error
}

// readFunc reads a room's head; spawnFunc runs a read on a goroutine of
// the store's.
type (
	readFunc  func(ctx context.Context, room string) (string, uint64, error)
	spawnFunc func(func(ctx context.Context))
)

// read answers a Head call of room. With no read on its way the caller
// sends one itself, with its own context; otherwise it waits for the next
// read, which the caller whose read returns starts on a goroutine (it
// serves callers whose contexts differ: it is bounded by the store's).
func (h *headReads) read(ctx context.Context, room string, do readFunc, spawn spawnFunc) (string, uint64, error) {
	if err := ctx.Err(); err != nil {
		return "", 0, err // no read for nobody
	}
	h.mu.Lock()
	if h.rooms == nil {
		h.rooms = make(map[string]*headRoom)
	}
	hr := h.rooms[room]
	if hr == nil {
		hr = &headRoom{}
		h.rooms[room] = hr
	}
	if hr.sent == nil {
		r := &headRead{done: make(chan struct{})}
		hr.sent = r
		h.mu.Unlock()
		h.run(ctx, room, hr, r, do, spawn)
		return r.epoch, r.rev, r.err
	}
	if hr.next == nil {
		hr.next = &headRead{done: make(chan struct{})}
	}
	r := hr.next
	r.joined++
	h.mu.Unlock()
	select {
	case <-r.done:
		return r.epoch, r.rev, r.err
	case <-ctx.Done():
		return "", 0, ctx.Err()
	}
}

// run sends r, then hands the room to the next read, if calls wait for
// one, or forgets the room.
func (h *headReads) run(ctx context.Context, room string, hr *headRoom, r *headRead, do readFunc, spawn spawnFunc) {
	r.epoch, r.rev, r.err = do(ctx, room)
	h.mu.Lock()
	next := hr.next
	hr.sent, hr.next = next, nil
	if next == nil {
		delete(h.rooms, room)
	}
	h.mu.Unlock()
	close(r.done)
	if next != nil {
		spawn(func(ctx context.Context) { h.run(ctx, room, hr, next, do, spawn) })
	}
}
