package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// TestRoomQuotaOnEverySurface: a write past its room's quota is refused
// with quota_exceeded (HTTP 507) over WebSocket, HTTP puts and
// transactions, and nothing is written; deletes still work on a full room.
func TestRoomQuotaOnEverySurface(t *testing.T) {
	n := servertest.Start(t, servertest.Options{Memory: store.MemoryConfig{Limits: store.Limits{MaxRoomKeys: 2}}})
	ctx := servertest.Context(t)
	c := dial(t, n, nil)
	if _, err := c.Put(ctx, "r", "a", 1); err != nil {
		t.Fatal(err)
	}
	if _, err := n.HTTP.Put(ctx, "r", "b", json.RawMessage(`1`), nil, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, "r", "c", 1); codeOf(err) != wire.CodeQuotaExceeded {
		t.Errorf("WebSocket put: %v, want quota_exceeded", err)
	}
	var e *client.Error
	_, err := n.HTTP.Put(ctx, "r", "c", json.RawMessage(`1`), nil, "")
	if !errors.As(err, &e) || e.Code != wire.CodeQuotaExceeded || e.Status != http.StatusInsufficientStorage ||
		!strings.Contains(e.Message, "quota of 2 keys") {
		t.Errorf("HTTP put: %v, want 507 quota_exceeded naming the quota", err)
	}
	ops := []wire.TxnOp{{Type: "delete", Key: "a"}, {Type: "put", Key: "c", Value: wire.Value(`1`)}, {Type: "put", Key: "d", Value: wire.Value(`1`)}}
	if _, err := n.HTTP.Txn(ctx, "r", nil, ops); !errors.As(err, &e) || e.Status != http.StatusInsufficientStorage {
		t.Errorf("HTTP txn: %v, want 507", err)
	}
	if l, err := n.HTTP.List(ctx, "r", ""); err != nil || l.Rev != 2 {
		t.Fatalf("room at %+v, %v: want nothing written past revision 2", l, err)
	}
	if _, err := c.Delete(ctx, "r", "a"); err != nil {
		t.Fatalf("a delete in a full room: %v", err)
	}
	if _, err := c.Put(ctx, "r", "c", 1); err != nil {
		t.Fatal(err)
	}
}

// TestWriteRateChargesOps: a write costs the write rate one unit per op,
// or per 64 KiB of keys and values when that is more: a transaction of a
// burst's worth of puts, or a value of that many 64 KiB, is let in on a
// full bucket, and the writer's next write (over any surface) waits. A
// write the store refused for the quota costs as much (it was planned).
func TestWriteRateChargesOps(t *testing.T) {
	start := func(t *testing.T, burst int) *servertest.Node {
		return servertest.Start(t, servertest.Options{Server: server.Config{WriteRate: 0.1, WriteBurst: burst}})
	}
	wantLimited := func(t *testing.T, n *servertest.Node) {
		t.Helper()
		_, err := n.HTTP.Put(servertest.Context(t), "r", "next", json.RawMessage(`1`), nil, "")
		var e *client.Error
		if !errors.As(err, &e) || e.Code != wire.CodeRateLimited || e.Status != http.StatusTooManyRequests {
			t.Errorf("the next write: %v, want 429 rate_limited", err)
		}
	}
	t.Run("ops", func(t *testing.T) {
		const burst = 10
		n := start(t, burst)
		ops := make([]wire.TxnOp, burst)
		for i := range ops {
			ops[i] = wire.TxnOp{Type: "put", Key: string(rune('a' + i)), Value: wire.Value(`1`)}
		}
		if _, err := dial(t, n, nil).Txn(servertest.Context(t), "r", nil, ops); err != nil {
			t.Fatalf("a txn of %d puts on a full bucket: %v", burst, err)
		}
		wantLimited(t, n)
	})
	t.Run("refused for the quota", func(t *testing.T) {
		const burst = 10
		n := servertest.Start(t, servertest.Options{Server: server.Config{WriteRate: 0.1, WriteBurst: burst},
			Memory: store.MemoryConfig{Limits: store.Limits{MaxRoomKeys: 1}}})
		ops := make([]wire.TxnOp, burst)
		for i := range ops {
			ops[i] = wire.TxnOp{Type: "put", Key: string(rune('a' + i)), Value: wire.Value(`1`)}
		}
		if _, err := dial(t, n, nil).Txn(servertest.Context(t), "r", nil, ops); codeOf(err) != wire.CodeQuotaExceeded {
			t.Fatalf("a txn of %d puts in a room of 1 key: %v, want quota_exceeded", burst, err)
		}
		wantLimited(t, n)
	})
	t.Run("bytes", func(t *testing.T) {
		n := start(t, 3)
		value := json.RawMessage(`"` + strings.Repeat("v", 3<<16-10) + `"`) // 3 units
		if _, err := n.HTTP.Put(servertest.Context(t), "r", "big", value, nil, ""); err != nil {
			t.Fatalf("a %d-byte value on a full bucket: %v", len(value), err)
		}
		wantLimited(t, n)
	})
}

// TestValidateHookWaitsBounded: one writer (here an address, over HTTP;
// a WebSocket connection sends its writes one at a time) has at most 16
// writes waiting on the validation hook; the next is refused at once
// (rate_limited), and once the hook answers, the writer writes again.
func TestValidateHookWaitsBounded(t *testing.T) {
	const bound = 16
	release := make(chan struct{})
	arrived := make(chan struct{}, bound+1)
	b := newHookBackend(t, func(hooks.ValidateRequest) (int, string) {
		arrived <- struct{}{}
		<-release
		return 200, allow
	})
	n := startValidated(t, b.srv.URL, 30*time.Second)
	ctx := servertest.Context(t)
	var wg sync.WaitGroup
	errs := make([]error, bound)
	for i := range bound {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.HTTP.Put(ctx, "game:1", string(rune('a'+i)), json.RawMessage(`1`), nil, "")
		}()
	}
	for range bound {
		select {
		case <-arrived:
		case <-ctx.Done():
			close(release)
			t.Fatal("the hook did not get the writes")
		}
	}
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err := n.HTTP.Put(tctx, "game:1", "over", json.RawMessage(`1`), nil, "")
	cancel()
	var e *client.Error
	if !errors.As(err, &e) || e.Code != wire.CodeRateLimited {
		t.Errorf("a write past %d waiting: %v, want rate_limited at once", bound, err)
	}
	close(release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	if _, err := n.HTTP.Put(ctx, "game:1", "after", json.RawMessage(`1`), nil, ""); err != nil {
		t.Errorf("a write once the hook answered: %v", err)
	}
}
