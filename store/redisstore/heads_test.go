package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeHeads counts the reads sent: each answers its own number as the
// revision, so a caller can tell which read answered it.
type fakeHeads struct {
	sent    atomic.Uint64
	release chan struct{} // each read waits for a value (nil: none)
	wg      sync.WaitGroup
}

func (f *fakeHeads) do(ctx context.Context, room string) (string, uint64, error) {
	n := f.sent.Add(1)
	if f.release != nil {
		select {
		case <-f.release:
		case <-ctx.Done():
			return "", 0, ctx.Err()
		}
	}
	return room, n, nil
}

func (f *fakeHeads) spawn(run func(ctx context.Context)) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		run(context.Background())
	}()
}

// TestHeadReadsCoalesce: calls that arrive while a read is on its way
// share the next read, and every call is answered by a read sent after it
// began (never one already on its way: it may predate a write the call
// must see).
func TestHeadReadsCoalesce(t *testing.T) {
	f := &fakeHeads{release: make(chan struct{})}
	var h headReads
	first := make(chan uint64)
	go func() {
		_, rev, _ := h.read(context.Background(), "r", f.do, f.spawn)
		first <- rev
	}()
	for f.sent.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	const callers = 50
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			before := f.sent.Load() // reads sent before the call
			epoch, rev, err := h.read(context.Background(), "r", f.do, f.spawn)
			if err != nil || epoch != "r" || rev <= before {
				t.Errorf("answered %q rev %d, %v; want a read sent after the %d sent before the call", epoch, rev, err, before)
			}
		}()
	}
	// Let them all join the next read before the first one returns.
	for joined := 0; joined < callers; {
		time.Sleep(time.Millisecond)
		h.mu.Lock()
		if next := h.rooms["r"].next; next != nil {
			joined = next.joined
		}
		h.mu.Unlock()
	}
	f.release <- struct{}{}
	if rev := <-first; rev != 1 {
		t.Errorf("the first call was answered by read %d, want 1", rev)
	}
	f.release <- struct{}{} // the one read of the 50
	wg.Wait()
	f.wg.Wait()
	if n := f.sent.Load(); n != 2 {
		t.Errorf("%d reads sent for 1 + %d calls, want 2", n, callers)
	}
	if len(h.rooms) != 0 {
		t.Errorf("%d rooms remembered after the reads, want none", len(h.rooms))
	}
}

// TestHeadReadsRooms: rooms do not share reads, and a call whose context
// ends while it waits returns at once, without holding up the others.
func TestHeadReadsRooms(t *testing.T) {
	f := &fakeHeads{release: make(chan struct{})}
	var h headReads
	answers := make(chan string, 2)
	for _, room := range []string{"a", "b"} {
		go func() {
			epoch, _, _ := h.read(context.Background(), room, f.do, f.spawn)
			answers <- epoch
		}()
	}
	for f.sent.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error)
	go func() {
		_, _, err := h.read(ctx, "a", f.do, f.spawn)
		gone <- err
	}()
	for joined := 0; joined < 1; {
		time.Sleep(time.Millisecond)
		h.mu.Lock()
		if next := h.rooms["a"].next; next != nil {
			joined = next.joined
		}
		h.mu.Unlock()
	}
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Errorf("a waiting call whose context ended: %v, want context.Canceled", err)
	}
	f.release <- struct{}{}
	f.release <- struct{}{}
	f.release <- struct{}{} // the read the cancelled call had asked for
	got := map[string]bool{<-answers: true, <-answers: true}
	if !got["a"] || !got["b"] {
		t.Errorf("answers %v, want one for each room", got)
	}
	f.wg.Wait()
	if n := f.sent.Load(); n != 3 {
		t.Errorf("%d reads, want 3 (a, b, and a's next, asked for before the cancel)", n)
	}
}

// TestHeadReadsEndedContext: a call whose context has already ended sends
// no read and asks for none.
func TestHeadReadsEndedContext(t *testing.T) {
	f := &fakeHeads{}
	var h headReads
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := h.read(ctx, "r", f.do, f.spawn); !errors.Is(err, context.Canceled) {
		t.Errorf("a call with an ended context: %v, want context.Canceled", err)
	}
	if n := f.sent.Load(); n != 0 || len(h.rooms) != 0 {
		t.Errorf("%d reads sent, %d rooms remembered; want none", n, len(h.rooms))
	}
}
