package etcd

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/store"
)

// serve serves cfg on loopback and returns the server and a client of
// it; stop closes both.
func serve(t *testing.T, cfg Config) (*Server, *clientv3.Client, func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(cfg)
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{ln.Addr().String()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return s, cli, func() {
		_ = cli.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Stop(ctx)
		<-served
	}
}

// TestFromValueShares: a value is the store's own bytes, not a copy per
// watch and range that reads it.
func TestFromValueShares(t *testing.T) {
	v := []byte(`"` + strings.Repeat("v", 1<<10) + `"`)
	if n := testing.AllocsPerRun(100, func() { fromValue(v) }); n != 0 {
		t.Fatalf("fromValue of a string allocates %v times", n)
	}
	if got := string(fromValue([]byte(`"a\nb"`))); got != "a\nb" {
		t.Fatalf("an escaped string: %q", got)
	}
}

// TestReplyBudgetReleased: every reply gives its bytes of the server's
// budget back once sent, refused or not, so replies never wait on bytes
// that no reply holds.
func TestReplyBudgetReleased(t *testing.T) {
	n := servertest.Start(t, servertest.Options{})
	value := []byte(`"` + strings.Repeat("v", 32<<10) + `"`)
	for _, k := range []string{"a", "b", "c"} {
		if _, err := n.Engine.Apply(context.Background(), "r", store.Put(k, value)); err != nil {
			t.Fatal(err)
		}
	}
	s, cli, stop := serve(t, Config{Node: n.Server, MaxReplyBytes: 80 << 10})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 40 { // 40 × 64 KiB: more than the budget of 16 × 80 KiB, were it kept
		if _, err := cli.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithLimit(10)); err != nil {
			t.Fatalf("get %d: %v", i, err)
		}
		if _, err := cli.Get(ctx, "/r/", clientv3.WithPrefix()); err == nil {
			t.Fatal("a reply of 96 KiB past 80 KiB was served")
		}
		if _, err := cli.Txn(ctx).Then(clientv3.OpGet("/r/a"), clientv3.OpPut("/r/d", "x")).Commit(); err != nil {
			t.Fatalf("txn %d: %v", i, err)
		}
	}
	stop() // the RPCs have ended: their End released what they held
	if !s.replies.TryAcquire(16 * s.maxReply) {
		t.Fatal("bytes of the reply budget are still held after every reply was sent")
	}
}

// TestReplyBudgetWait: while other replies hold the server's budget (their
// clients do not read them), a reply waits replyWait, then is refused.
func TestReplyBudgetWait(t *testing.T) {
	n := servertest.Start(t, servertest.Options{})
	if _, err := n.Engine.Apply(context.Background(), "r", store.Put("a", []byte(`"v"`))); err != nil {
		t.Fatal(err)
	}
	s, cli, stop := serve(t, Config{Node: n.Server, MaxReplyBytes: 1 << 10})
	defer stop()
	s.replyWait = 100 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if !s.replies.TryAcquire(16 << 10) { // as 16 replies not read
		t.Fatal("the budget is held before any reply")
	}
	_, err := cli.Get(ctx, "/r/a")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "retry later") {
		t.Fatalf("a reply with the budget held: %v, want ResourceExhausted", err)
	}
	s.replies.Release(16 << 10)
	if get, err := cli.Get(ctx, "/r/a"); err != nil || len(get.Kvs) != 1 {
		t.Fatalf("with the budget free: %v, %v", get, err)
	}
}
