package etcd_test

// The etcd API tested with etcd's own Go client (go.etcd.io/etcd/client/v3)
// against an in-process node (servertest) serving it on loopback. The
// real etcdctl is tested against the real binary in cmd/statecast.

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	statecast "github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/auth"
	"github.com/statecast/statecast/server/etcd"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
)

// The node, the etcd server and every client end with the test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs a node with the etcd API and returns it, the API's address
// and a client of it.
func start(t testing.TB, o servertest.Options) (*servertest.Node, string, *clientv3.Client) {
	t.Helper()
	return startWith(t, o, etcd.Config{})
}

// startWith is start with the etcd server's configuration.
func startWith(t testing.TB, o servertest.Options, cfg etcd.Config) (*servertest.Node, string, *clientv3.Client) {
	t.Helper()
	n := servertest.Start(t, o)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Node, cfg.Name = n.Server, "test"
	es := etcd.New(cfg)
	served := make(chan error, 1)
	go func() { served <- es.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		es.Stop(ctx)
		<-served
	})
	return n, ln.Addr().String(), client(t, ln.Addr().String(), "")
}

// client returns an etcd client of addr, sending token as a bearer token.
func client(t testing.TB, addr, token string) *clientv3.Client {
	t.Helper()
	cfg := clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()}
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

func ctxOf(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func codeOf(err error) codes.Code { return status.Code(err) }

func TestPutGetDelete(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	put, err := cli.Put(ctx, "/r/a", "hello")
	if err != nil || put.Header.Revision != 2 {
		t.Fatalf("put: %v, %v", put, err)
	}
	put, err = cli.Put(ctx, "/r/a", "world", clientv3.WithPrevKV())
	if err != nil || put.PrevKv == nil || string(put.PrevKv.Value) != "hello" || put.PrevKv.ModRevision != 2 {
		t.Fatalf("put with prev_kv: %+v, %v", put, err)
	}
	for i, v := range []string{`{"n":1}`, `"quoted"`, ``, `{ "spaced": 1 }`, `42`} {
		if _, err := cli.Put(ctx, "/r/v"+strconv.Itoa(i), v); err != nil {
			t.Fatal(err)
		}
	}
	get, err := cli.Get(ctx, "/r/a")
	if err != nil || len(get.Kvs) != 1 {
		t.Fatalf("get: %v, %v", get, err)
	}
	if kv := get.Kvs[0]; string(kv.Key) != "/r/a" || string(kv.Value) != "world" || kv.Version != 2 || kv.CreateRevision != 2 || kv.ModRevision != 3 || get.Header.Revision != 8 {
		t.Fatalf("get /r/a: %+v at %d", kv, get.Header.Revision)
	}
	// Every value reads back as the bytes written.
	get, err = cli.Get(ctx, "/r/v", clientv3.WithPrefix())
	if err != nil || len(get.Kvs) != 5 || get.Count != 5 {
		t.Fatalf("get prefix: %v, %v", get, err)
	}
	for i, v := range []string{`{"n":1}`, `"quoted"`, ``, `{ "spaced": 1 }`, `42`} {
		if got := string(get.Kvs[i].Value); got != v {
			t.Errorf("value %d: got %q, want %q", i, got, v)
		}
	}
	// limit, count_only, keys_only, sort.
	get, err = cli.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithLimit(2))
	if err != nil || len(get.Kvs) != 2 || !get.More || get.Count != 6 {
		t.Fatalf("limit 2: %d kvs, more %v, count %d, %v", len(get.Kvs), get.More, get.Count, err)
	}
	get, err = cli.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || len(get.Kvs) != 0 || get.Count != 6 {
		t.Fatalf("count only: %v, %v", get, err)
	}
	get, err = cli.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend))
	if err != nil || len(get.Kvs) != 6 || string(get.Kvs[0].Key) != "/r/v4" || get.Kvs[0].Value != nil {
		t.Fatalf("keys only, newest first: %v, %v", get, err)
	}
	// A past revision: the room's state then; etcd's revision 1 is the
	// empty room, its first write revision 2.
	get, err = cli.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithRev(2))
	if err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Value) != "hello" || get.Header.Revision != 8 {
		t.Fatalf("at revision 2: %v, %v", get, err)
	}
	get, err = cli.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithRev(1))
	if err != nil || len(get.Kvs) != 0 || get.Header.Revision != 8 {
		t.Fatalf("at revision 1: %v, %v", get, err)
	}
	if _, err := cli.Get(ctx, "/r/a", clientv3.WithRev(99)); !errors.Is(err, rpctypes.ErrFutureRev) {
		t.Fatalf("future revision: %v", err)
	}
	del, err := cli.Delete(ctx, "/r/v", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if err != nil || del.Deleted != 5 || len(del.PrevKvs) != 5 || del.Header.Revision != 9 {
		t.Fatalf("delete prefix: %v, %v", del, err)
	}
	del, err = cli.Delete(ctx, "/r/missing")
	if err != nil || del.Deleted != 0 || del.Header.Revision != 9 {
		t.Fatalf("delete of a missing key: %v, %v", del, err)
	}
	// Rooms are apart: another room has its own revisions.
	if put, err := cli.Put(ctx, "/other/a", "x"); err != nil || put.Header.Revision != 2 {
		t.Fatalf("put in another room: %v, %v", put, err)
	}
	// A key that names no room is in none (etcdctl endpoint health reads one).
	if get, err := cli.Get(ctx, "health"); err != nil || len(get.Kvs) != 0 {
		t.Fatalf("get of a key outside every room: %v, %v", get, err)
	}
	for _, bad := range []func() error{
		func() error { _, err := cli.Get(ctx, "/r", clientv3.WithPrefix()); return err },
		func() error { _, err := cli.Get(ctx, "/r/a", clientv3.WithRange("/s/")); return err },
		func() error { _, err := cli.Get(ctx, "", clientv3.WithPrefix()); return err },
		func() error { _, err := cli.Put(ctx, "nokey", "x"); return err },
		func() error { _, err := cli.Put(ctx, "/bad room/k", "x"); return err },
	} {
		if err := bad(); codeOf(err) != codes.InvalidArgument {
			t.Errorf("a request outside one room: %v, want InvalidArgument", err)
		}
	}
}

func TestTxn(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	if _, err := cli.Put(ctx, "/t/k", "v1"); err != nil {
		t.Fatal(err)
	}
	// value, version, create and mod revision compares.
	resp, err := cli.Txn(ctx).If(
		clientv3.Compare(clientv3.Value("/t/k"), "=", "v1"),
		clientv3.Compare(clientv3.Version("/t/k"), "=", 1),
		clientv3.Compare(clientv3.CreateRevision("/t/k"), "=", 2),
		clientv3.Compare(clientv3.ModRevision("/t/k"), "<", 3),
		clientv3.Compare(clientv3.CreateRevision("/t/new"), "=", 0),
	).Then(
		clientv3.OpPut("/t/k", "v2", clientv3.WithPrevKV()),
		clientv3.OpPut("/t/new", "n"),
		clientv3.OpGet("/t/", clientv3.WithPrefix()),
	).Else(clientv3.OpPut("/t/else", "x")).Commit()
	if err != nil || !resp.Succeeded || resp.Header.Revision != 3 {
		t.Fatalf("txn: %+v, %v", resp, err)
	}
	if prev := resp.Responses[0].GetResponsePut().PrevKv; prev == nil || string(prev.Value) != "v1" {
		t.Errorf("put's prev_kv: %v", prev)
	}
	// The txn's own range sees its writes, at the commit's revision.
	kvs := resp.Responses[2].GetResponseRange().Kvs
	if len(kvs) != 2 || string(kvs[0].Value) != "v2" || kvs[0].ModRevision != 3 || kvs[0].Version != 2 || string(kvs[1].Key) != "/t/new" || kvs[1].CreateRevision != 3 {
		t.Errorf("range in the txn: %v", kvs)
	}
	// A failing compare runs the else branch.
	resp, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("/t/k"), "=", "v1")).
		Then(clientv3.OpPut("/t/then", "x")).
		Else(clientv3.OpDelete("/t/new", clientv3.WithPrevKV()), clientv3.OpGet("/t/k")).Commit()
	if err != nil || resp.Succeeded || resp.Header.Revision != 4 {
		t.Fatalf("else: %+v, %v", resp, err)
	}
	if d := resp.Responses[0].GetResponseDeleteRange(); d.Deleted != 1 || string(d.PrevKvs[0].Value) != "n" {
		t.Errorf("delete in the else branch: %v", d)
	}
	if get, _ := cli.Get(ctx, "/t/then"); len(get.Kvs) != 0 {
		t.Errorf("the then branch ran too: %v", get.Kvs)
	}
	// A compare on a missing key's value never holds.
	resp, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("/t/none"), "!=", "x")).Then(clientv3.OpPut("/t/then", "x")).Commit()
	if err != nil || resp.Succeeded {
		t.Fatalf("compare on a missing value: %+v, %v", resp, err)
	}
	// Compare-and-swap under contention: each of 20 increments lands once.
	done := make(chan error, 4)
	for w := 0; w < 4; w++ {
		go func() {
			for i := 0; i < 5; i++ {
				for {
					get, err := cli.Get(ctx, "/t/counter")
					if err != nil {
						done <- err
						return
					}
					n, rev := 0, int64(0)
					if len(get.Kvs) == 1 {
						n, _ = strconv.Atoi(string(get.Kvs[0].Value))
						rev = get.Kvs[0].ModRevision
					}
					resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision("/t/counter"), "=", rev)).
						Then(clientv3.OpPut("/t/counter", strconv.Itoa(n+1))).Commit()
					if err != nil {
						done <- err
						return
					}
					if resp.Succeeded {
						break
					}
				}
			}
			done <- nil
		}()
	}
	for w := 0; w < 4; w++ {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if get, err := cli.Get(ctx, "/t/counter"); err != nil || string(get.Kvs[0].Value) != "20" {
		t.Fatalf("counter: %v, %v", get, err)
	}
	if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("/t/k"), "=", "v1")).Then(clientv3.OpPut("/u/k", "x")).Commit(); codeOf(err) != codes.InvalidArgument {
		t.Fatalf("a txn over two rooms: %v", err)
	}
}

// next returns the next watch response, failing the test after 10 s.
func next(t *testing.T, wch clientv3.WatchChan) clientv3.WatchResponse {
	t.Helper()
	select {
	case resp, ok := <-wch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return resp
	case <-time.After(10 * time.Second):
		t.Fatal("no watch response in 10 s")
	}
	panic("unreachable")
}

// events reads watch responses until it has n events.
func events(t *testing.T, wch clientv3.WatchChan, n int) []*clientv3.Event {
	t.Helper()
	var evs []*clientv3.Event
	for len(evs) < n {
		resp := next(t, wch)
		if err := resp.Err(); err != nil {
			t.Fatal(err)
		}
		evs = append(evs, resp.Events...)
	}
	return evs
}

func TestWatch(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	for i := 1; i <= 3; i++ {
		if _, err := cli.Put(ctx, "/w/k", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Put(ctx, "/w/other", "o"); err != nil {
		t.Fatal(err)
	}
	// From a past revision: the replay includes that revision.
	wch := cli.Watch(ctx, "/w/k", clientv3.WithRev(3), clientv3.WithPrevKV())
	evs := events(t, wch, 2)
	if evs[0].Kv.ModRevision != 3 || string(evs[0].Kv.Value) != "2" || string(evs[0].PrevKv.Value) != "1" || evs[1].Kv.ModRevision != 4 {
		t.Fatalf("replay from 3: %v", evs)
	}
	// Several watches on one stream: a prefix, one without puts, one
	// without deletes.
	all := cli.Watch(ctx, "/w/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	noPut := cli.Watch(ctx, "/w/", clientv3.WithPrefix(), clientv3.WithFilterPut())
	noDel := cli.Watch(ctx, "/w/", clientv3.WithPrefix(), clientv3.WithFilterDelete())
	if _, err := cli.Put(ctx, "/w/p", "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, "/w/k"); err != nil {
		t.Fatal(err)
	}
	evs = events(t, all, 2)
	if !evs[0].IsCreate() || string(evs[0].Kv.Key) != "/w/p" || evs[1].Type != mvccpb.DELETE || evs[1].Kv.ModRevision != 7 || string(evs[1].PrevKv.Value) != "3" {
		t.Fatalf("prefix watch: %v", evs)
	}
	if evs := events(t, noPut, 1); evs[0].Type != mvccpb.DELETE {
		t.Fatalf("NOPUT watch got %v", evs)
	}
	if evs := events(t, noDel, 1); evs[0].Type != mvccpb.PUT || evs[0].Kv.ModRevision != 6 {
		t.Fatalf("NODELETE watch got %v", evs)
	}
	// The watch on /w/k alone still runs and saw only its key.
	if evs := events(t, wch, 1); evs[0].Type != mvccpb.DELETE || string(evs[0].Kv.Key) != "/w/k" {
		t.Fatalf("key watch got %v", evs)
	}
}

func TestWatchCompacted(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	for i := 1; i <= 5; i++ {
		if _, err := cli.Put(ctx, "/c/k", strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Compact(ctx, 3); codeOf(err) != codes.InvalidArgument {
		t.Fatalf("compact without a room: %v", err)
	}
	room := metadata.AppendToOutgoingContext(ctx, "statecast-room", "c")
	if resp, err := cli.Compact(room, 4); err != nil || resp.Header.Revision != 6 {
		t.Fatalf("compact: %v, %v", resp, err)
	}
	resp := next(t, cli.Watch(ctx, "/c/k", clientv3.WithRev(3)))
	if !resp.Canceled || resp.CompactRevision != 4 || !errors.Is(resp.Err(), rpctypes.ErrCompacted) {
		t.Fatalf("watch from a compacted revision: %+v", resp)
	}
	// From the compact revision itself, as etcd's clients retry.
	if evs := events(t, cli.Watch(ctx, "/c/k", clientv3.WithRev(resp.CompactRevision)), 3); evs[0].Kv.ModRevision != 4 {
		t.Fatalf("watch from the compact revision: %v", evs)
	}
	for _, rev := range []int64{2, 3} { // 3: its state could be rebuilt from 4's previous values, but etcd refuses
		if _, err := cli.Get(ctx, "/c/k", clientv3.WithRev(rev)); !errors.Is(err, rpctypes.ErrCompacted) {
			t.Fatalf("get at compacted revision %d: %v", rev, err)
		}
	}
	if get, err := cli.Get(ctx, "/c/k", clientv3.WithRev(4)); err != nil || string(get.Kvs[0].Value) != "3" {
		t.Fatalf("get at the compact revision: %v, %v", get, err)
	}
}

func TestLeases(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	watch := cli.Watch(ctx, "/l/", clientv3.WithPrefix())
	kept, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	short, err := cli.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/l/kept", "k", clientv3.WithLease(kept.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/l/short", "s", clientv3.WithLease(short.ID)); err != nil {
		t.Fatal(err)
	}
	get, err := cli.Get(ctx, "/l/kept")
	if err != nil || get.Kvs[0].Lease != int64(kept.ID) {
		t.Fatalf("key's lease: %v, %v", get, err)
	}
	ttl, err := cli.TimeToLive(ctx, kept.ID, clientv3.WithAttachedKeys())
	if err != nil || ttl.GrantedTTL != 1 || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "/l/kept" {
		t.Fatalf("time to live: %+v, %v", ttl, err)
	}
	leases, err := cli.Leases(ctx)
	if err != nil || len(leases.Leases) != 2 {
		t.Fatalf("leases: %v, %v", leases, err)
	}
	kactx, stopKeepAlive := context.WithCancel(ctx)
	defer stopKeepAlive()
	ka, err := cli.KeepAlive(kactx, kept.ID)
	if err != nil {
		t.Fatal(err)
	}
	evs := events(t, watch, 3) // the two puts, then the short lease's delete
	if evs[2].Type != mvccpb.DELETE || string(evs[2].Kv.Key) != "/l/short" {
		t.Fatalf("expiry: %v", evs)
	}
	// Kept alive past its TTL: three keep-alives answered.
	for i := 0; i < 3; i++ {
		if r := <-ka; r == nil || r.TTL != 1 {
			t.Fatalf("keep-alive %d: %v", i, r)
		}
	}
	if get, err := cli.Get(ctx, "/l/kept"); err != nil || len(get.Kvs) != 1 {
		t.Fatalf("a kept lease's key: %v, %v", get, err)
	}
	stopKeepAlive()
	if evs := events(t, watch, 1); evs[0].Type != mvccpb.DELETE || string(evs[0].Kv.Key) != "/l/kept" {
		t.Fatalf("expiry once no longer kept alive: %v", evs)
	}
	if ttl, err := cli.TimeToLive(ctx, kept.ID); err != nil || ttl.TTL != -1 {
		t.Fatalf("an ended lease's time to live: %v, %v", ttl, err)
	}
	revoked, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/l/revoked", "r", clientv3.WithLease(revoked.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, revoked.ID); err != nil {
		t.Fatal(err)
	}
	if get, err := cli.Get(ctx, "/l/revoked"); err != nil || len(get.Kvs) != 0 {
		t.Fatalf("a revoked lease's key: %v, %v", get, err)
	}
	if _, err := cli.Put(ctx, "/l/x", "x", clientv3.WithLease(revoked.ID)); !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		t.Fatalf("put under a revoked lease: %v", err)
	}
}

func TestProgress(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	wch := cli.Watch(ctx, "/p/watched", clientv3.WithCreatedNotify())
	if resp := next(t, wch); !resp.Created {
		t.Fatalf("first response: %+v", resp)
	}
	if _, err := cli.Put(ctx, "/p/elsewhere", "x"); err != nil {
		t.Fatal(err)
	}
	// Asked for: a progress notification at the room's head.
	if err := cli.RequestProgress(ctx); err != nil {
		t.Fatal(err)
	}
	if resp := next(t, wch); !resp.IsProgressNotify() || resp.Header.Revision != 2 {
		t.Fatalf("requested progress: %+v", resp)
	}
}

func TestProgressNotify(t *testing.T) {
	o := servertest.Options{}
	o.Rooms.ProgressInterval = 50 * time.Millisecond
	_, _, cli := start(t, o)
	ctx := ctxOf(t)
	// Created before the put, so that the put is a revision it sees go by
	// (a watch created after it starts past it, with nothing to mark).
	wch := cli.Watch(ctx, "/p/watched", clientv3.WithProgressNotify(), clientv3.WithCreatedNotify())
	if resp := next(t, wch); !resp.Created {
		t.Fatalf("got %+v, want the watch created", resp)
	}
	if _, err := cli.Put(ctx, "/p/elsewhere", "x"); err != nil {
		t.Fatal(err)
	}
	for {
		resp := next(t, wch)
		if !resp.IsProgressNotify() {
			t.Fatalf("got %+v, want progress notifications only", resp)
		}
		if resp.Header.Revision == 2 {
			return
		}
	}
}

// TestProgressNotifyIdleRoom: a watch with progress notify on a room
// nobody writes is told its revision every interval, as etcd tells its
// watches every 10 minutes; a watch without it is told nothing.
func TestProgressNotifyIdleRoom(t *testing.T) {
	_, _, cli := startWith(t, servertest.Options{}, etcd.Config{ProgressInterval: 100 * time.Millisecond})
	ctx := ctxOf(t)
	put, err := cli.Put(ctx, "/idle/k", "v")
	if err != nil {
		t.Fatal(err)
	}
	notified := cli.Watch(ctx, "/idle/k", clientv3.WithProgressNotify(), clientv3.WithRev(put.Header.Revision+1))
	silent := cli.Watch(ctx, "/idle/k", clientv3.WithRev(put.Header.Revision+1))
	for i := range 3 {
		resp := next(t, notified)
		if !resp.IsProgressNotify() || resp.Header.Revision != put.Header.Revision {
			t.Fatalf("response %d on an idle room: %+v, want a progress notification at %d", i, resp, put.Header.Revision)
		}
	}
	select {
	case resp := <-silent:
		t.Fatalf("a watch without progress notify got %+v", resp)
	case <-time.After(300 * time.Millisecond):
	}
}

var hmacSecret = []byte("a secret of the etcd API's tests, 32+ bytes")

// tokenFor returns a token of sub with grants (room, access, prefix).
func tokenFor(t *testing.T, sub string, grants ...map[string]any) string {
	t.Helper()
	gs := make([]any, len(grants))
	for i, g := range grants {
		gs[i] = g
	}
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "exp": time.Now().Add(time.Hour).Unix(),
		"statecast": map[string]any{"grants": gs}}).SignedString(hmacSecret)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestAuth: a JWT as authorization metadata, or as the password of
// etcd's Authenticate, with the grants of every other surface.
func TestAuth(t *testing.T) {
	o := withAuth(t)
	_, addr, cli := start(t, o)
	ctx := ctxOf(t)
	if _, err := cli.Get(ctx, "/a/k"); codeOf(err) != codes.Unauthenticated {
		t.Fatalf("no token: %v", err)
	}
	reader := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tokenFor(t, "reader", map[string]any{"room": "a", "access": "r"}))
	if _, err := cli.Get(reader, "/a/k"); err != nil {
		t.Fatalf("read with a read grant: %v", err)
	}
	if _, err := cli.Put(reader, "/a/k", "x"); codeOf(err) != codes.PermissionDenied {
		t.Fatalf("write with a read grant: %v", err)
	}
	if _, err := cli.Get(reader, "/b/k"); codeOf(err) != codes.PermissionDenied {
		t.Fatalf("read of another room: %v", err)
	}
	if resp := next(t, cli.Watch(reader, "/b/", clientv3.WithPrefix())); !resp.Canceled || resp.Err() == nil {
		t.Fatalf("watch of another room: %+v", resp)
	}
	// etcdctl --user name:<JWT>: the password is the token.
	writer, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: "w", Password: tokenFor(t, "writer", map[string]any{"room": "a", "access": "rw", "prefix": "w/"})})
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close()
	if _, err := writer.Put(ctx, "/a/w/k", "x"); err != nil {
		t.Fatalf("write with a write grant: %v", err)
	}
	if _, err := writer.Put(ctx, "/a/k", "x"); codeOf(err) != codes.PermissionDenied {
		t.Fatalf("write outside the grant's prefix: %v", err)
	}
	// Write-only: previous values are a read.
	blind := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tokenFor(t, "blind", map[string]any{"room": "a", "access": "w"}))
	if _, err := cli.Put(blind, "/a/w/k", "y"); err != nil {
		t.Fatalf("write with a write-only grant: %v", err)
	}
	if _, err := cli.Put(blind, "/a/w/k", "z", clientv3.WithPrevKV()); codeOf(err) != codes.PermissionDenied {
		t.Fatalf("put with prev_kv and a write-only grant: %v", err)
	}
	if _, err := cli.Delete(blind, "/a/w/", clientv3.WithPrefix(), clientv3.WithPrevKV()); codeOf(err) != codes.PermissionDenied {
		t.Fatalf("delete with prev_kv and a write-only grant: %v", err)
	}
	if _, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		Username: "w", Password: "not a token"}); !errors.Is(err, rpctypes.ErrAuthFailed) {
		t.Fatalf("a password that is no token: %v", err)
	}
}

// TestWebSocketAndEtcd: the same rooms through both doors. A JSON string
// is its text to an etcd client, any other JSON value its JSON text.
func TestWebSocketAndEtcd(t *testing.T) {
	n, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	conn, err := statecast.Dial(ctx, n.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	wch := cli.Watch(ctx, "/x/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if _, err := conn.Put(ctx, "x", "k", "hello"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Put(ctx, "x", "k", map[string]any{"a": 1}); err != nil {
		t.Fatal(err)
	}
	evs := events(t, wch, 2)
	if string(evs[0].Kv.Value) != "hello" || string(evs[1].Kv.Value) != `{"a":1}` || string(evs[1].PrevKv.Value) != "hello" || evs[1].Kv.ModRevision != 3 {
		t.Fatalf("WebSocket writes seen by an etcd watch: %v", evs)
	}
	sub, err := conn.Subscribe(ctx, "x", statecast.SubscribeOptions{From: &wire.Position{Rev: 3}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/x/e", "from etcd"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, "/x/k"); err != nil {
		t.Fatal(err)
	}
	var got []wire.Event
	for len(got) < 2 {
		m, err := sub.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Events...)
	}
	if got[0].Type != "put" || got[0].Key != "e" || string(got[0].Value) != `"from etcd"` || got[0].ModRev != 3 || got[1].Type != "delete" || got[1].Key != "k" || got[1].ModRev != 4 {
		t.Fatalf("etcd writes seen by a WebSocket subscription: %+v", got)
	}
}

// rawWatch opens a Watch stream of /s/ to addr on a gRPC connection of
// its own whose flow-control windows are small (64 KiB, no growth), so
// that a client that does not read holds the server's sends up at once.
func rawWatch(t *testing.T, ctx context.Context, addr string) pb.Watch_WatchClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ws, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	create := &pb.WatchCreateRequest{Key: []byte("/s/"), RangeEnd: []byte("/s0")}
	if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: create}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := ws.Recv(); err != nil || !resp.Created {
		t.Fatalf("create: %v, %v", resp, err)
	}
	return ws
}

// slowWatch starts a watch of /s/ on its own gRPC connection with small
// flow-control windows, writes n revisions of 16 KiB while it reads
// nothing, then reads; it returns the revisions of the events received
// and the last response.
func slowWatch(t *testing.T, o servertest.Options, n int) ([]int64, *pb.WatchResponse) {
	t.Helper()
	o.Rooms.QueueLimit = 4
	_, addr, cli := start(t, o)
	ctx := ctxOf(t)
	ws := rawWatch(t, ctx, addr)
	value := strings.Repeat("v", 16<<10)
	for i := 1; i <= n; i++ {
		if _, err := cli.Put(ctx, "/s/k", value+strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
	}
	var revs []int64
	for {
		resp, err := ws.Recv()
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range resp.Events {
			revs = append(revs, ev.Kv.ModRevision)
		}
		if resp.Canceled || len(revs) == n {
			return revs, resp
		}
	}
}

// TestSlowWatch: a watch whose client does not keep up falls behind the
// room's queue; it still gets every revision, replayed from the history,
// and when the history no longer holds them it is canceled with
// compact_revision, as etcd cancels a watch from a compacted revision.
func TestSlowWatch(t *testing.T) {
	t.Run("replayed", func(t *testing.T) {
		revs, _ := slowWatch(t, servertest.Options{}, 200)
		for i, rev := range revs {
			if rev != int64(i+2) {
				t.Fatalf("event %d is revision %d: every revision once, in order, expected", i, rev)
			}
		}
	})
	t.Run("compacted", func(t *testing.T) {
		o := servertest.Options{}
		o.Rooms.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: 20, MaxBytes: 64 << 20}}
		revs, last := slowWatch(t, o, 200)
		if !last.Canceled || last.CompactRevision != 182 {
			t.Fatalf("last response %+v, want canceled with compact_revision 182", last)
		}
		for i, rev := range revs {
			if rev != int64(i+2) {
				t.Fatalf("event %d is revision %d before the cancel", i, rev)
			}
		}
	})
}

// TestLimits: the node's connection limit counts the etcd API's
// connections, and a connection holds at most MaxWatches watches over
// all its streams.
func TestLimits(t *testing.T) {
	o := servertest.Options{}
	o.Server.MaxConnections = 1
	_, addr, cli := startWith(t, o, etcd.Config{MaxWatches: 2})
	ctx := ctxOf(t)
	var resps []clientv3.WatchResponse
	for i := 0; i < 3; i++ {
		resps = append(resps, next(t, cli.Watch(ctx, "/lim/"+strconv.Itoa(i), clientv3.WithCreatedNotify())))
	}
	if !resps[0].Created || resps[0].Canceled || !resps[1].Created || resps[1].Canceled || !resps[2].Canceled || resps[2].Err() == nil || !strings.Contains(resps[2].Err().Error(), "at most 2 watches") {
		t.Fatalf("three watches on one stream of at most 2: %+v", resps)
	}
	// Another stream of the same connection (clientv3 opens one per
	// distinct metadata) counts against the same budget.
	other := metadata.AppendToOutgoingContext(ctx, "stream", "other")
	if resp := next(t, cli.Watch(other, "/lim/x", clientv3.WithCreatedNotify())); !resp.Canceled || !strings.Contains(resp.Err().Error(), "at most 2 watches per connection") {
		t.Fatalf("a third watch on a second stream of the connection: %+v", resp)
	}
	second := client(t, addr, "")
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := second.Get(short, "/lim/k"); err == nil {
		t.Fatal("a second connection was served past a limit of 1")
	}
}

// TestAcrossNodesOnRedis: two nodes on one redis-server, each serving the
// etcd API: an etcd watch on one sees the writes made through the other,
// by etcd or by WebSocket, and a lease granted through one is kept alive,
// listed and written under through the other, and its expiry deletes the
// key for every watcher.
func TestAcrossNodesOnRedis(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	ctx := ctxOf(t)
	node := func(id string) (*servertest.Node, *clientv3.Client) {
		st, err := redisstore.New(ctx, redisstore.Config{URL: rs.URL(), Prefix: "etcd"})
		if err != nil {
			t.Fatal(err)
		}
		n, _, cli := start(t, servertest.Options{Store: st, Server: server.Config{NodeID: id, NodeTimeout: time.Second}})
		return n, cli
	}
	a, ca := node("a")
	_, cb := node("b")
	wch := cb.Watch(ctx, "/m/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if resp := next(t, wch); !resp.Created {
		t.Fatalf("watch on b: %+v", resp)
	}
	if _, err := ca.Put(ctx, "/m/etcd", "via a"); err != nil {
		t.Fatal(err)
	}
	conn, err := statecast.Dial(ctx, a.WS, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Put(ctx, "m", "ws", "via a's WebSocket"); err != nil {
		t.Fatal(err)
	}
	evs := events(t, wch, 2)
	if string(evs[0].Kv.Value) != "via a" || string(evs[1].Kv.Key) != "/m/ws" || string(evs[1].Kv.Value) != "via a's WebSocket" {
		t.Fatalf("b's watch: %v", evs)
	}

	lease, err := ca.Grant(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Put(ctx, "/m/leased", "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatalf("put on b under a's lease: %v", err)
	}
	if leases, err := cb.Leases(ctx); err != nil || len(leases.Leases) != 1 || leases.Leases[0].ID != lease.ID {
		t.Fatalf("leases on b: %v, %v", leases, err)
	}
	kactx, stop := context.WithCancel(ctx)
	defer stop()
	ka, err := cb.KeepAlive(kactx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // past its TTL
		if r := <-ka; r == nil || r.TTL != 1 {
			t.Fatalf("keep-alive %d on b: %v", i, r)
		}
	}
	if evs := events(t, wch, 1); string(evs[0].Kv.Key) != "/m/leased" || evs[0].Type != mvccpb.PUT {
		t.Fatalf("b's watch: %v", evs)
	}
	stop()
	if evs := events(t, wch, 1); string(evs[0].Kv.Key) != "/m/leased" || evs[0].Type != mvccpb.DELETE {
		t.Fatalf("the expired lease's key: %v", evs)
	}
}

// TestStopWithAClientThatDoesNotRead: Stop returns by its deadline while
// a watch's sends wait on a client that reads nothing.
func TestStopWithAClientThatDoesNotRead(t *testing.T) {
	n := servertest.Start(t, servertest.Options{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	es := etcd.New(etcd.Config{Node: n.Server})
	served := make(chan error, 1)
	go func() { served <- es.Serve(ln) }()
	ctx := ctxOf(t)
	rawWatch(t, ctx, ln.Addr().String())
	value := []byte(`"` + strings.Repeat("v", 64<<10) + `"`)
	for i := 0; i < 40; i++ { // 2.5 MiB in 1 MiB responses: far past the client's window
		if _, err := n.Engine.Apply(ctx, "s", store.Put("k", value)); err != nil {
			t.Fatal(err)
		}
	}
	stopCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	es.Stop(stopCtx)
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Stop took %v with a deadline of 500ms", took)
	}
	<-served
}

// TestTokenExpiryEndsStreams: a watch stream ends when its token does
// (exp plus the leeway), as a WebSocket session and an SSE stream do.
func TestTokenExpiryEndsStreams(t *testing.T) {
	authn, err := auth.New(auth.Config{HMACSecret: hmacSecret, Leeway: -1})
	if err != nil {
		t.Fatal(err)
	}
	o := servertest.Options{}
	o.Server.Auth = authn
	_, _, cli := start(t, o)
	exp := time.Unix(time.Now().Unix()+2, 0) // JWT times are whole seconds
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "s", "exp": exp.Unix(),
		"statecast": map[string]any{"grants": []any{map[string]any{"room": "*", "access": "rw"}}}}).SignedString(hmacSecret)
	if err != nil {
		t.Fatal(err)
	}
	ctx := metadata.AppendToOutgoingContext(ctxOf(t), "authorization", "Bearer "+token)
	wch := cli.Watch(ctx, "/e/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if resp := next(t, wch); !resp.Created {
		t.Fatalf("watch: %+v", resp)
	}
	resp := next(t, wch)
	if !resp.Canceled || resp.Err() == nil || !strings.Contains(resp.Err().Error(), "token expired") {
		t.Fatalf("at the token's expiry: %+v (%v)", resp, resp.Err())
	}
	if late := time.Since(exp); late < 0 || late > 2*time.Second {
		t.Fatalf("the stream ended %v after the token's exp", late)
	}
}

// TestWatchCancel: a canceled watch is answered canceled and sends
// nothing more; the other watches of its stream go on.
func TestWatchCancel(t *testing.T) {
	_, addr, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	ws := rawWatch(t, ctx, addr) // watch 0, on /s/
	create := &pb.WatchCreateRequest{Key: []byte("/s/k")}
	if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: create}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := ws.Recv(); err != nil || !resp.Created || resp.WatchId != 1 {
		t.Fatalf("second watch: %v, %v", resp, err)
	}
	if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CancelRequest{CancelRequest: &pb.WatchCancelRequest{WatchId: 0}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err := ws.Recv(); err != nil || !resp.Canceled || resp.WatchId != 0 {
		t.Fatalf("cancel: %v, %v", resp, err)
	}
	if _, err := cli.Put(ctx, "/s/k", "v"); err != nil {
		t.Fatal(err)
	}
	if resp, err := ws.Recv(); err != nil || resp.WatchId != 1 || len(resp.Events) != 1 {
		t.Fatalf("after the cancel: %v, %v (only watch 1 was left)", resp, err)
	}
	// Revision 3 only watch 0 would see; then revision 4 for watch 1.
	for _, key := range []string{"/s/other", "/s/k"} {
		if _, err := cli.Put(ctx, key, "v"); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := ws.Recv(); err != nil || resp.WatchId != 1 || resp.Events[0].Kv.ModRevision != 4 {
		t.Fatalf("after the cancel: %v, %v (only watch 1 was left)", resp, err)
	}
}

// TestRefusals: what the etcd API refuses so that a request cannot learn
// of a room it may not read, commit on a range compare it cannot guard,
// run away with a txn, or overflow a lease's TTL.
func TestRefusals(t *testing.T) {
	o := withAuth(t)
	n, _, cli := start(t, o)
	ctx := ctxOf(t)
	admin := &statecast.HTTP{URL: n.HTTP.URL, Token: tokenFor(t, "admin", map[string]any{"room": "secret", "access": "rw"})}
	if _, err := admin.Put(ctx, "secret", "alpha", json.RawMessage(`1`), nil, ""); err != nil {
		t.Fatal(err)
	}
	mine := metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tokenFor(t, "u", map[string]any{"room": "mine", "access": "rw"}))
	if _, err := cli.Delete(mine, "/secret/", clientv3.WithPrefix()); codeOf(err) != codes.PermissionDenied || strings.Contains(err.Error(), "alpha") {
		t.Fatalf("a range delete in a room the token cannot read: %v, want PermissionDenied naming no key", err)
	}
	if _, err := cli.Txn(mine).If(clientv3.Compare(clientv3.Version("/mine/locks/").WithPrefix(), "=", 0)).Then(clientv3.OpPut("/mine/locks/me", "1")).Commit(); codeOf(err) != codes.InvalidArgument {
		t.Fatalf("a compare over a range: %v, want InvalidArgument", err)
	}
	ops := make([]clientv3.Op, 129)
	for i := range ops {
		ops[i] = clientv3.OpGet("/mine/k")
	}
	if _, err := cli.Txn(mine).Then(ops...).Commit(); !errors.Is(err, rpctypes.ErrTooManyOps) {
		t.Fatalf("a txn of 129 ops: %v, want too many operations", err)
	}
	if _, err := cli.Grant(mine, 1<<55+10); !errors.Is(err, rpctypes.ErrLeaseTTLTooLarge) {
		t.Fatalf("a TTL of 2^55 s: %v, want too large", err)
	}
}

// withAuth is a node's options with JWT auth (HS256, hmacSecret).
func withAuth(t testing.TB) servertest.Options {
	t.Helper()
	authn, err := auth.New(auth.Config{HMACSecret: hmacSecret})
	if err != nil {
		t.Fatal(err)
	}
	var o servertest.Options
	o.Server.Auth = authn
	return o
}

// TestEtcdDetails: answers where etcd's own semantics are easy to miss: a
// revision ≤ 0 reads the head, Count is taken before the revision
// filters, and an empty txn succeeds.
func TestEtcdDetails(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	for _, k := range []string{"/d/a", "/d/b"} {
		if _, err := cli.Put(ctx, k, "v"); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := cli.Get(ctx, "/d/", clientv3.WithPrefix(), clientv3.WithRev(-1)); err != nil || len(resp.Kvs) != 2 {
		t.Fatalf("a negative revision: %+v, %v; want the head's 2 keys", resp, err)
	}
	resp, err := cli.Get(ctx, "/d/", clientv3.WithPrefix(), clientv3.WithMinModRev(3))
	if err != nil || resp.Count != 2 || len(resp.Kvs) != 1 || string(resp.Kvs[0].Key) != "/d/b" {
		t.Fatalf("min mod revision 3: %+v, %v; want count 2 and /d/b", resp, err)
	}
	if tr, err := cli.Txn(ctx).Commit(); err != nil || !tr.Succeeded {
		t.Fatalf("an empty txn: %+v, %v; want it to succeed", tr, err)
	}
}

// TestRoomQuotaIsNoSpace: a put past its room's quota fails as etcd's
// does past its database quota (ErrGRPCNoSpace), and nothing is written;
// a delete still works.
func TestRoomQuotaIsNoSpace(t *testing.T) {
	_, _, cli := start(t, servertest.Options{Memory: store.MemoryConfig{Limits: store.Limits{MaxRoomKeys: 2}}})
	ctx := ctxOf(t)
	for _, k := range []string{"/r/a", "/r/b"} {
		if _, err := cli.Put(ctx, k, "1"); err != nil {
			t.Fatal(err)
		}
	}
	_, err := cli.Put(ctx, "/r/c", "1")
	if !errors.Is(err, rpctypes.ErrNoSpace) {
		t.Fatalf("a third key: %v, want %v", err, rpctypes.ErrGRPCNoSpace)
	}
	if r, err := cli.Get(ctx, "/r/c"); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("Get /r/c: %v, %v; want nothing written", r, err)
	}
	if _, err := cli.Delete(ctx, "/r/a"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/r/c", "1"); err != nil {
		t.Fatal(err)
	}
}

// TestIgnoreLeaseAndValue: etcd's ignore_lease rewrites a key and keeps
// its lease, ignore_value changes the lease and keeps the value; either
// on a missing key is "key not found", with a lease or a value given it
// is refused, and a txn with such a put writes nothing.
func TestIgnoreLeaseAndValue(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/i/k", "v1", clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/i/k", "v2", clientv3.WithIgnoreLease()); err != nil {
		t.Fatal(err)
	}
	if get, err := cli.Get(ctx, "/i/k"); err != nil || string(get.Kvs[0].Value) != "v2" || get.Kvs[0].Lease != int64(l.ID) || get.Kvs[0].Version != 2 {
		t.Fatalf("after a put with ignore_lease: %v, %v; want v2 under lease %x", get, err, l.ID)
	}
	if _, err := cli.Put(ctx, "/i/plain", "p"); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/i/plain", "", clientv3.WithIgnoreValue(), clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	if get, err := cli.Get(ctx, "/i/plain"); err != nil || string(get.Kvs[0].Value) != "p" || get.Kvs[0].Lease != int64(l.ID) {
		t.Fatalf("after a put with ignore_value: %v, %v; want p under lease %x", get, err, l.ID)
	}
	for name, err := range map[string]error{
		"ignore_lease": func() error { _, err := cli.Put(ctx, "/i/missing", "x", clientv3.WithIgnoreLease()); return err }(),
		"ignore_value": func() error { _, err := cli.Put(ctx, "/i/missing", "", clientv3.WithIgnoreValue()); return err }(),
		"txn": func() error {
			_, err := cli.Txn(ctx).Then(clientv3.OpPut("/i/other", "x"), clientv3.OpPut("/i/missing", "x", clientv3.WithIgnoreLease())).Commit()
			return err
		}(),
	} {
		if !errors.Is(err, rpctypes.ErrKeyNotFound) {
			t.Errorf("%s on a missing key: %v, want key not found", name, err)
		}
	}
	if _, err := cli.Put(ctx, "/i/k", "x", clientv3.WithIgnoreLease(), clientv3.WithLease(l.ID)); !errors.Is(err, rpctypes.ErrLeaseProvided) {
		t.Errorf("ignore_lease with a lease: %v, want lease is provided", err)
	}
	if _, err := cli.Put(ctx, "/i/k", "x", clientv3.WithIgnoreValue()); !errors.Is(err, rpctypes.ErrValueProvided) {
		t.Errorf("ignore_value with a value: %v, want value is provided", err)
	}
	if get, err := cli.Get(ctx, "/i/", clientv3.WithPrefix()); err != nil || len(get.Kvs) != 2 {
		t.Fatalf("after refused puts: %v, %v; want /i/k and /i/plain", get, err)
	}
	// Both keys end with the lease, written under it or kept.
	if _, err := cli.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if get, err := cli.Get(ctx, "/i/", clientv3.WithPrefix()); err != nil || len(get.Kvs) != 0 {
		t.Fatalf("after the lease's revoke: %v, %v; want no key", get, err)
	}
}

// Two watches of one key on one connection, one with prev_kv, share the
// connection's marshaled events for a small change and marshal a change
// too large to keep for themselves: both ways, each gets etcd's events.
func TestWatchesOfOneKeySmallAndLargeValues(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := servertest.Context(t)
	plain := cli.Watch(ctx, "/m/k", clientv3.WithCreatedNotify())
	prev := cli.Watch(ctx, "/m/k", clientv3.WithCreatedNotify(), clientv3.WithPrevKV())
	next(t, plain)
	next(t, prev)
	values := []string{"small", strings.Repeat("L", 40<<10), "small again"}
	for _, v := range values {
		if _, err := cli.Put(ctx, "/m/k", v); err != nil {
			t.Fatal(err)
		}
	}
	for name, wch := range map[string]clientv3.WatchChan{"plain": plain, "prev_kv": prev} {
		for i, ev := range events(t, wch, len(values)) {
			if string(ev.Kv.Key) != "/m/k" || string(ev.Kv.Value) != values[i] || ev.Kv.Version != int64(i+1) {
				t.Errorf("%s watch, event %d: %q = %d bytes, version %d; want %d bytes, version %d", name, i, ev.Kv.Key, len(ev.Kv.Value), ev.Kv.Version, len(values[i]), i+1)
			}
			switch {
			case name == "plain" && ev.PrevKv != nil:
				t.Errorf("plain watch, event %d: a previous value it did not ask for", i)
			case name == "prev_kv" && i > 0 && (ev.PrevKv == nil || string(ev.PrevKv.Value) != values[i-1]):
				t.Errorf("prev_kv watch, event %d: previous value %v, want %d bytes", i, ev.PrevKv, len(values[i-1]))
			}
		}
	}
}
