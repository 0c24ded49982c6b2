package rooms_test

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// newEngine returns an engine on a fresh memory store; both close with t.
func newEngine(t testing.TB, ret store.RetentionPolicy, cfg rooms.Config) (*rooms.Engine, *store.Memory) {
	t.Helper()
	st := store.NewMemory(store.MemoryConfig{Retention: ret})
	cfg.Retention = ret
	e := rooms.New(st, cfg)
	t.Cleanup(func() { e.Close(); st.Close() })
	return e, st
}

func put(t testing.TB, e *rooms.Engine, room, key, val string) uint64 {
	t.Helper()
	res, err := e.Apply(context.Background(), room, store.Put(key, []byte(val)))
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return res.Rev
}

func del(t testing.TB, e *rooms.Engine, room, key string) uint64 {
	t.Helper()
	res, err := e.Apply(context.Background(), room, store.Delete(key))
	if err != nil {
		t.Fatalf("delete %s: %v", key, err)
	}
	return res.Rev
}

// client is what a client SDK keeps: a view and a resume point. apply
// checks the message stream against the revision contract.
type client struct {
	epoch string
	rev   uint64 // last revision of any message
	data  uint64 // last revision of a data message (events, coalesced, snapshot)
	items map[string]string
	seen  map[uint64]bool // revisions of event messages received
	log   []rooms.Message
}

func newClient() *client {
	return &client{items: map[string]string{}, seen: map[uint64]bool{}}
}

func (c *client) apply(m rooms.Message) error {
	c.log = append(c.log, m)
	if m.Rev < c.rev {
		return fmt.Errorf("%s at rev %d after rev %d: revision went back", m.Kind, m.Rev, c.rev)
	}
	switch m.Kind {
	case rooms.KindSnapshot:
		c.epoch = m.Epoch
		c.items = map[string]string{}
		for _, kv := range m.Items {
			c.items[kv.Key] = string(kv.Value)
		}
		c.data = m.Rev
	case rooms.KindEvents, rooms.KindCoalesced:
		if m.Rev <= c.data {
			return fmt.Errorf("%s at rev %d not after data at %d: duplicate", m.Kind, m.Rev, c.data)
		}
		if m.Kind == rooms.KindEvents {
			if c.seen[m.Rev] {
				return fmt.Errorf("rev %d delivered twice", m.Rev)
			}
			c.seen[m.Rev] = true
		}
		for _, ev := range m.Change.Events {
			if m.Kind == rooms.KindEvents && ev.KV.ModRev != m.Rev {
				return fmt.Errorf("event %q at mod_rev %d in message of rev %d", ev.KV.Key, ev.KV.ModRev, m.Rev)
			}
			if ev.Type == store.OpPut {
				c.items[ev.KV.Key] = string(ev.KV.Value)
			} else {
				delete(c.items, ev.KV.Key)
			}
		}
		c.data = m.Rev
	}
	c.rev = m.Rev
	return nil
}

// drain applies every message available now.
func (c *client) drain(t testing.TB, w *rooms.Watcher) {
	t.Helper()
	msgs, err := w.Drain(nil)
	if err != nil {
		t.Fatalf("drain: %v", err)
	}
	for _, m := range msgs {
		if err := c.apply(m); err != nil {
			t.Fatal(err)
		}
	}
}

// until applies messages until one of kind k arrives (or fails after 5s).
func (c *client) until(t testing.TB, w *rooms.Watcher, k rooms.Kind) rooms.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		m, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("waiting for %s: %v", k, err)
		}
		if err := c.apply(m); err != nil {
			t.Fatal(err)
		}
		if m.Kind == k {
			return m
		}
	}
}

func (c *client) position() *rooms.Position {
	return &rooms.Position{Epoch: c.epoch, Rev: c.rev + 1}
}

func itemsOf(s store.Snapshot) map[string]string {
	m := map[string]string{}
	for _, kv := range s.Items {
		m[kv.Key] = string(kv.Value)
	}
	return m
}

func sameItems(a, b map[string]string) bool { return maps.Equal(a, b) }

// noMessage fails if w has anything to deliver right now.
func noMessage(t testing.TB, w *rooms.Watcher) {
	t.Helper()
	msgs, err := w.Drain(nil)
	if err != nil || len(msgs) > 0 {
		t.Fatalf("expected nothing, got %v (err %v)", msgs, err)
	}
}
