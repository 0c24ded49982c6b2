package etcd_test

// What one client may make the etcd API hold: the bytes of a reply, of
// the events its watches have not sent, its idle connections, its
// compactions.

import (
	"context"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/statecast/statecast/server/etcd"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/store"
)

// fillRoom writes n keys /room/k000… of size-byte values through the
// engine (no write rate) and returns the values' total.
func fillRoom(t *testing.T, n *servertest.Node, room string, keys, size int) int {
	t.Helper()
	value := []byte(`"` + strings.Repeat("v", size-2) + `"`)
	for i := range keys {
		if _, err := n.Engine.Apply(context.Background(), room, store.Put(fmt.Sprintf("k%03d", i), value)); err != nil {
			t.Fatal(err)
		}
	}
	return keys * size
}

// fillBatched writes keys k00000… of room through the engine, 200 a
// write (one revision each), with the values value gives.
func fillBatched(t *testing.T, n *servertest.Node, room string, keys int, value func(int) string) {
	t.Helper()
	for i := 0; i < keys; i += 200 {
		var w store.Write
		for k := i; k < min(i+200, keys); k++ {
			w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: fmt.Sprintf("k%05d", k), Value: []byte(value(k))})
		}
		if _, err := n.Engine.Apply(context.Background(), room, w); err != nil {
			t.Fatal(err)
		}
	}
}

// bigRoom starts a node whose room "big" holds keys k00000…k19999 (20,000,
// value "v", written 200 a revision) and returns its client, the test's
// context and the head's etcd revision.
func bigRoom(t *testing.T) (*clientv3.Client, context.Context, int64) {
	t.Helper()
	n, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	fillBatched(t, n, "big", 20_000, func(int) string { return `"v"` })
	head, err := cli.Get(ctx, "/big/k00000")
	if err != nil {
		t.Fatal(err)
	}
	return cli, ctx, head.Header.Revision
}

// TestReplyBytes: a reply past MaxReplyBytes is refused with
// ResourceExhausted, before anything is written; a Range with a limit
// pages by bytes instead, with more.
func TestReplyBytes(t *testing.T) {
	n, _, cli := startWith(t, servertest.Options{}, etcd.Config{MaxReplyBytes: 256 << 10})
	ctx := ctxOf(t)
	fillRoom(t, n, "big", 16, 32<<10) // 512 KiB

	_, err := cli.Get(ctx, "/big/", clientv3.WithPrefix())
	if codeOf(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "more than the 262144 a reply may hold") {
		t.Fatalf("a range of 512 KiB past a 256 KiB bound: %v, want ResourceExhausted saying so", err)
	}
	if get, err := cli.Get(ctx, "/big/", clientv3.WithPrefix(), clientv3.WithKeysOnly()); err != nil || len(get.Kvs) != 16 {
		t.Fatalf("its keys only: %v, %v", get, err)
	}

	// Paging with a limit of 100: each page is what fits, more until the
	// last; every key once, in order.
	var keys []string
	from := "/big/"
	for page := 0; ; page++ {
		get, err := cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd("/big/")), clientv3.WithLimit(100))
		if err != nil || page > 16 {
			t.Fatalf("page %d: %v (%d pages)", page, err, page)
		}
		if get.Count != int64(16-len(keys)) || len(get.Kvs) > 7 {
			t.Fatalf("page %d: count %d, %d keys: want the keys left counted, at most 7 of 32 KiB in 256 KiB", page, get.Count, len(get.Kvs))
		}
		for _, kv := range get.Kvs {
			keys = append(keys, string(kv.Key))
		}
		if !get.More {
			break
		}
		from = string(get.Kvs[len(get.Kvs)-1].Key) + "\x00"
	}
	if len(keys) != 16 || keys[0] != "/big/k000" || keys[15] != "/big/k015" {
		t.Fatalf("paged keys %v", keys)
	}

	// A txn: its ranges count together, and a refused one writes nothing.
	var ops []clientv3.Op
	for range 8 {
		ops = append(ops, clientv3.OpGet("/big/k00", clientv3.WithPrefix())) // 10 × 32 KiB each
	}
	_, err = cli.Txn(ctx).Then(append(ops, clientv3.OpPut("/big/written", "x"))...).Commit()
	if codeOf(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "this txn would reply") {
		t.Fatalf("a txn of 8 ranges of 320 KiB: %v, want ResourceExhausted", err)
	}
	if get, err := cli.Get(ctx, "/big/written"); err != nil || len(get.Kvs) != 0 {
		t.Fatalf("the refused txn's put: %v, %v; want nothing written", get, err)
	}
	if resp, err := cli.Txn(ctx).Then(clientv3.OpGet("/big/k00", clientv3.WithPrefix(), clientv3.WithLimit(4))).Commit(); err != nil || len(resp.Responses[0].GetResponseRange().Kvs) != 4 {
		t.Fatalf("a txn range with a limit that fits: %v, %v", resp, err)
	}

	// A delete whose prev_kv would not fit deletes nothing.
	if _, err := cli.Delete(ctx, "/big/", clientv3.WithPrefix(), clientv3.WithPrevKV()); codeOf(err) != codes.ResourceExhausted {
		t.Fatalf("delete with prev_kv of 512 KiB: %v", err)
	}
	if get, err := cli.Get(ctx, "/big/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || get.Count != 16 {
		t.Fatalf("after the refused delete: %v, %v; want the 16 keys", get, err)
	}
}

// heapDuring returns the most heap in use sampled over d while the
// caller's load runs: the server, its clients and the test share it.
func heapDuring(d time.Duration) uint64 {
	var peak uint64
	var ms runtime.MemStats
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapAlloc)
	}
	return peak
}

// TestTxnRangesAllocation: a txn of 128 ranges of a room, each the whole
// room, is refused from the keys' sizes: the server does not gather the
// 128 copies of the room's keys it would reply, nor build the reply.
func TestTxnRangesAllocation(t *testing.T) {
	for _, c := range []struct {
		name       string
		keys, size int
	}{
		{"1 MiB of values", 16, 64 << 10},
		{"20,000 small keys", 20_000, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			n, _, cli := start(t, servertest.Options{})
			ctx := ctxOf(t)
			value := []byte(`"` + strings.Repeat("v", c.size-2) + `"`)
			for i := 0; i < c.keys; i += 200 {
				var w store.Write
				for k := i; k < min(i+200, c.keys); k++ {
					w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: fmt.Sprintf("k%05d", k), Value: value})
				}
				if _, err := n.Engine.Apply(ctx, "big", w); err != nil {
					t.Fatal(err)
				}
			}
			var ops []clientv3.Op
			for range 128 {
				ops = append(ops, clientv3.OpGet("/big/", clientv3.WithPrefix()))
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := cli.Txn(ctx).Then(ops...).Commit()
			runtime.ReadMemStats(&after)
			if codeOf(err) != codes.ResourceExhausted {
				t.Fatalf("a txn replying 128 times the room: %v, want ResourceExhausted", err)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 48<<20 {
				t.Fatalf("the refused txn allocated %d MiB", alloc>>20)
			}
		})
	}
}

// TestTxnRepeatedRangesReadOnce: a txn that ranges over one room 128
// times at a past revision, or 127 after a write of its own, counting only,
// reads the room once for each, not 128 times (each a copy of its keys,
// held until the reply).
func TestTxnRepeatedRangesReadOnce(t *testing.T) {
	cli, ctx, head := bigRoom(t)
	const keys = 20_000
	for name, first := range map[string][]clientv3.Op{"at a past revision": nil, "after a write": {clientv3.OpPut("/big/new", "v")}} {
		ops := first
		for len(ops) < 128 {
			opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}
			if first == nil {
				opts = append(opts, clientv3.WithRev(head-1))
			}
			ops = append(ops, clientv3.OpGet("/big/", opts...))
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		// The revision before the last write of 200 keys; or the room
		// and the txn's own key.
		want := int64(keys - 200)
		if first != nil {
			want = keys + 1
		}
		if got := resp.Responses[len(resp.Responses)-1].GetResponseRange().Count; got != want {
			t.Fatalf("%s: count %d, want %d", name, got, want)
		}
		// A copy of the room's keys is about 20,000 × 100 bytes, 128 of
		// them hundreds of MiB.
		if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 32<<20 {
			t.Errorf("%s: 128 count-only ranges allocated %d MiB", name, alloc>>20)
		}
	}
}

// allocated runs fn once (loading what it reads), then n more times, and
// returns the bytes the process allocated during those n.
func allocated(n int, fn func(i int)) uint64 {
	fn(0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for i := 1; i <= n; i++ {
		fn(i)
	}
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestDeleteRangeRefusedEarly: a DeleteRange of more keys than a write
// may hold is refused once the walk has passed the limit, without reading
// the range (every key of a large room) first; one within the limit
// deletes exactly the range's keys.
func TestDeleteRangeRefusedEarly(t *testing.T) {
	cli, ctx, _ := bigRoom(t)
	const keys = 20_000
	alloc := allocated(20, func(int) {
		if _, err := cli.Delete(ctx, "/big/", clientv3.WithPrefix()); codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--max-ops") {
			t.Fatalf("a delete of %d keys: %v, want InvalidArgument naming --max-ops", keys, err)
		}
	})
	// A read of the room's keys is about 20,000 × 100 bytes: 20 of them,
	// tens of MiB.
	if alloc > 4<<20 {
		t.Errorf("20 refused deletes allocated %d MiB", alloc>>20)
	}
	del, err := cli.Delete(ctx, "/big/k00100", clientv3.WithRange("/big/k00356"))
	if err != nil || del.Deleted != 256 {
		t.Fatalf("a delete of 256 keys: %+v, %v; want 256 deleted", del, err)
	}
	for _, c := range []struct {
		key  string
		want int64
	}{{"/big/k00099", 1}, {"/big/k00100", 0}, {"/big/k00355", 0}, {"/big/k00356", 1}} {
		if get, err := cli.Get(ctx, c.key, clientv3.WithCountOnly()); err != nil || get.Count != c.want {
			t.Errorf("%s after the delete: %+v, %v; want count %d", c.key, get, err, c.want)
		}
	}
}

// TestTxnReadsItsKeysOnly: a txn reads the keys it names, not the keys
// between them: two keys far apart in a large room share no prefix, and
// each attempt read the whole room.
func TestTxnReadsItsKeysOnly(t *testing.T) {
	cli, ctx, _ := bigRoom(t)
	alloc := allocated(20, func(i int) {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.Version("/big/k00000"), ">", 0), clientv3.Compare(clientv3.Version("/big/k19999"), ">", 0)).
			Then(clientv3.OpPut("/big/k19999", strconv.Itoa(i)), clientv3.OpGet("/big/k00000"), clientv3.OpGet("/big/k100", clientv3.WithPrefix(), clientv3.WithCountOnly())).
			Commit()
		if err != nil || !resp.Succeeded {
			t.Fatalf("txn %d: %+v, %v", i, resp, err)
		}
		if got := resp.Responses[2].GetResponseRange().Count; got != 100 {
			t.Fatalf("txn %d: /big/k100 holds %d keys, want 100", i, got)
		}
	})
	if alloc > 4<<20 {
		t.Errorf("20 txns of three keys and a prefix allocated %d MiB", alloc>>20)
	}
}

// TestRangeReadsItsRange: a range that is not walked (sorted, or at a
// past revision) reads its own keys, not every key under the prefix its
// ends share: [k0, k00005) shares "k0" with 10,000 keys.
func TestRangeReadsItsRange(t *testing.T) {
	cli, ctx, head := bigRoom(t)
	for _, rev := range []int64{0, head - 1} {
		alloc := allocated(20, func(int) {
			get, err := cli.Get(ctx, "/big/k0", clientv3.WithRange("/big/k00005"), clientv3.WithRev(rev),
				clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend))
			if err != nil || len(get.Kvs) != 5 || string(get.Kvs[0].Key) != "/big/k00000" && string(get.Kvs[4].Key) != "/big/k00000" {
				t.Fatalf("a sorted range of 5 keys at %d: %+v, %v", rev, get, err)
			}
		})
		// 10,000 keys of about 100 bytes: 20 reads of them, tens of MiB.
		if alloc > 4<<20 {
			t.Errorf("20 sorted ranges of 5 keys at revision %d allocated %d MiB", rev, alloc>>20)
		}
	}
}

// TestRangeCountAndPageWalk: a count or a page in key order walks the
// room's keys without copying them, and answers what the full read
// answers (the same request with a revision filter that keeps every key
// takes the full read), at the head and at past revisions, compacted
// ones included.
func TestRangeCountAndPageWalk(t *testing.T) {
	n, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	const keys = 20_000
	fillBatched(t, n, "walk", keys, func(k int) string { return fmt.Sprintf(`"%d"`, k) })
	for _, c := range []struct {
		key  string
		opts []clientv3.OpOption
	}{
		{"/walk/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}},
		{"/walk/k1", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithCountOnly()}},
		{"/walk/k00100", []clientv3.OpOption{clientv3.WithRange("/walk/k00200"), clientv3.WithLimit(10)}},
		{"/walk/k19995", []clientv3.OpOption{clientv3.WithRange("/walk/l"), clientv3.WithLimit(10), clientv3.WithKeysOnly()}},
		{"/walk/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithSerializable()}},
		{"/walk/k2", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithLimit(5)}},
		{"/walk/", []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithLimit(keys + 1), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend)}},
	} {
		got, err := cli.Get(ctx, c.key, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		want, err := cli.Get(ctx, c.key, append(c.opts, clientv3.WithMinModRev(1))...)
		if err != nil {
			t.Fatal(err)
		}
		if got.Count != want.Count || got.More != want.More || len(got.Kvs) != len(want.Kvs) {
			t.Fatalf("%s %d opts: count %d more %v %d keys, want %d %v %d", c.key, len(c.opts), got.Count, got.More, len(got.Kvs), want.Count, want.More, len(want.Kvs))
		}
		for i := range got.Kvs {
			if got.Kvs[i].String() != want.Kvs[i].String() {
				t.Fatalf("%s: key %d: %v, want %v", c.key, i, got.Kvs[i], want.Kvs[i])
			}
		}
	}
	// At past revisions: the same answers, the same compaction bound.
	rooms := servertest.Options{}
	rooms.Memory.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: 10}}
	pn, _, pcli := start(t, rooms)
	fillBatched(t, pn, "past", 30*200, func(k int) string { return fmt.Sprintf(`"%d"`, k) })
	for i := range 8 { // revisions of one event, which the history keeps
		if _, err := pcli.Put(ctx, fmt.Sprintf("/past/k%05d", i*7), "x"); err != nil {
			t.Fatal(err)
		}
	}
	head, err := pcli.Get(ctx, "/past/k00000")
	if err != nil {
		t.Fatal(err)
	}
	read, compacted := 0, 0
	revs := []int64{1} // the empty room: to a walk, room revision 0 is the head
	for rev := head.Header.Revision - 12; rev <= head.Header.Revision; rev++ {
		revs = append(revs, rev)
	}
	for _, rev := range revs {
		for _, opts := range [][]clientv3.OpOption{{clientv3.WithCountOnly()}, {clientv3.WithLimit(3)}} {
			opts = append(opts, clientv3.WithPrefix(), clientv3.WithRev(rev))
			got, gerr := pcli.Get(ctx, "/past/", opts...)
			want, werr := pcli.Get(ctx, "/past/", append(opts, clientv3.WithMinModRev(1))...)
			if (gerr == nil) != (werr == nil) || gerr != nil && gerr.Error() != werr.Error() {
				t.Fatalf("rev %d: %v, want %v", rev, gerr, werr)
			}
			if gerr != nil {
				compacted++
			} else {
				read++
			}
			if gerr == nil && (got.Count != want.Count || got.More != want.More || len(got.Kvs) != len(want.Kvs) || got.Header.Revision != want.Header.Revision) {
				t.Fatalf("rev %d: count %d more %v %d keys at %d, want %d %v %d at %d", rev, got.Count, got.More, len(got.Kvs), got.Header.Revision,
					want.Count, want.More, len(want.Kvs), want.Header.Revision)
			}
		}
	}

	if read < 6 || compacted == 0 {
		t.Fatalf("%d revisions read, %d compacted: want some of each", read, compacted)
	}

	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		if _, err := cli.Get(ctx, "/walk/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Get(ctx, "/walk/", clientv3.WithPrefix(), clientv3.WithLimit(1)); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	// A copy of the 20,000 keys is about 2 MiB: 20 of them 40.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 8<<20 {
		t.Errorf("10 counts and 10 pages of one key allocated %d MiB", alloc>>20)
	}
}

// watchBudgetNode starts a node whose connections may hold 256 KiB of
// watch events (rooms queue 4 messages a watcher) and dials it with
// gRPC's small windows, so that what its client does not read stays on
// the node.
func watchBudgetNode(t *testing.T) (*servertest.Node, *grpc.ClientConn) {
	t.Helper()
	o := servertest.Options{}
	o.Rooms.QueueLimit = 4
	n, addr, _ := startWith(t, o, etcd.Config{MaxWatchBytes: 256 << 10})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return n, conn
}

// TestWatchSmallResponsesReturnBudget: responses too small for gRPC to
// track give their budget back once queued: 2,000 small events through a
// 4 KiB budget all arrive (a budget kept would stop the watch after about
// a hundred).
func TestWatchSmallResponsesReturnBudget(t *testing.T) {
	n, _, cli := startWith(t, servertest.Options{}, etcd.Config{MaxWatchBytes: 4 << 10})
	ctx := ctxOf(t)
	wch := cli.Watch(ctx, "/small/", clientv3.WithPrefix())
	const writes = 2000
	go func() {
		for i := range writes {
			if _, err := n.Engine.Apply(context.Background(), "small", store.Put(fmt.Sprintf("k%d", i%10), []byte(strconv.Itoa(i)))); err != nil {
				return
			}
		}
	}()
	got := 0
	for got < writes {
		select {
		case resp := <-wch:
			if err := resp.Err(); err != nil {
				t.Fatal(err)
			}
			got += len(resp.Events)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of %d events, then none for 10 s", got, writes)
		}
	}
}

// TestWatchBytesPerConnection: 128 watches with prev_kv on one stream
// whose client reads nothing, while 6 writes of 32 KiB values go by
// (values with escapes, so each watch's events are its own bytes): the
// events the watches took and have not sent stay within the
// connection's MaxWatchBytes, not a batch per watch. When the client
// reads again, each watch gets every revision in order, caught up from
// the history.
func TestWatchBytesPerConnection(t *testing.T) {
	n, conn := watchBudgetNode(t)
	ctx := ctxOf(t)
	ws, err := pb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const watches, writes = 128, 6
	for range watches {
		create := &pb.WatchCreateRequest{Key: []byte("/s/"), RangeEnd: []byte("/s0"), PrevKv: true}
		if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: create}}); err != nil {
			t.Fatal(err)
		}
		if resp, err := ws.Recv(); err != nil || !resp.Created {
			t.Fatalf("create: %v, %v", resp, err)
		}
	}
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	value := []byte(`"` + strings.Repeat(`\n`, 16<<10) + `"`) // 32 KiB of JSON, 16 KiB of etcd bytes
	for range writes {
		if _, err := n.Engine.Apply(ctx, "s", store.Put("k", value)); err != nil {
			t.Fatal(err)
		}
	}
	// The history holds the values (192 KiB); each watch held a batch
	// of at least 64 KiB before the bound: the heap grew 21 MiB then,
	// 2.6 MiB with it.
	if grown := int64(heapDuring(time.Second)) - int64(base.HeapAlloc); grown > 8<<20 {
		t.Fatalf("the heap grew %d KiB with a client reading nothing; want the history and 256 KiB of events", grown>>10)
	}
	got := make(map[int64]int64) // watch → last revision received
	for done := 0; done < watches; {
		resp, err := ws.Recv()
		if err != nil {
			hist := map[int64]int{}
			for _, r := range got {
				hist[r]++
			}
			t.Fatal(err, done, hist, len(got))
		}
		if resp.Canceled {
			t.Fatalf("watch %d canceled: %+v", resp.WatchId, resp)
		}
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision != max(got[resp.WatchId], 1)+1 || ev.PrevKv == nil && ev.Kv.ModRevision > 2 { // etcd's first write is revision 2
				t.Fatalf("watch %d: revision %d after %d", resp.WatchId, ev.Kv.ModRevision, got[resp.WatchId])
			}
			got[resp.WatchId] = ev.Kv.ModRevision
			if ev.Kv.ModRevision == writes+1 {
				done++
			}
		}
	}
}

// TestWatchBytesPerConnectionStreams: the connection's MaxWatchBytes
// holds over all its Watch streams: a response counts in it until gRPC
// has written it, not until gRPC took it, with the response still
// queued behind the client's flow control (each stream kept one batch
// outside the bound). Then, read again, every watch gets every revision.
func TestWatchBytesPerConnectionStreams(t *testing.T) {
	n, conn := watchBudgetNode(t)
	ctx := ctxOf(t)
	const streams, writes = 64, 6
	var wss []pb.Watch_WatchClient
	for range streams {
		ws, err := pb.NewWatchClient(conn).Watch(ctx)
		if err != nil {
			t.Fatal(err)
		}
		create := &pb.WatchCreateRequest{Key: []byte("/s/k"), PrevKv: true}
		if err := ws.Send(&pb.WatchRequest{RequestUnion: &pb.WatchRequest_CreateRequest{CreateRequest: create}}); err != nil {
			t.Fatal(err)
		}
		if resp, err := ws.Recv(); err != nil || !resp.Created {
			t.Fatalf("create: %v, %v", resp, err)
		}
		wss = append(wss, ws)
	}
	runtime.GC()
	var base runtime.MemStats
	runtime.ReadMemStats(&base)
	value := []byte(`"` + strings.Repeat(`\n`, 64<<10) + `"`) // 64 KiB of etcd bytes: 128 KiB a change with its previous value
	for range writes {
		if _, err := n.Engine.Apply(ctx, "s", store.Put("k", value)); err != nil {
			t.Fatal(err)
		}
	}
	grown := int64(heapDuring(time.Second)) - int64(base.HeapAlloc)
	t.Logf("the heap grew %d KiB with %d streams reading nothing", grown>>10, streams)
	if grown > 4<<20 { // 10 MiB before: a batch of each stream outside the bound
		t.Fatalf("the heap grew %d KiB with a client reading nothing; want the history and 256 KiB of events", grown>>10)
	}
	// Read again, as etcd's client reads each of its streams.
	errs := make(chan error, streams)
	for i, ws := range wss {
		go func() {
			for last := int64(1); last < writes+1; {
				resp, err := ws.Recv()
				if err != nil {
					errs <- fmt.Errorf("stream %d: %w", i, err)
					return
				}
				for _, ev := range resp.Events {
					if ev.Kv.ModRevision != last+1 {
						errs <- fmt.Errorf("stream %d: revision %d after %d", i, ev.Kv.ModRevision, last)
						return
					}
					last = ev.Kv.ModRevision
				}
			}
			errs <- nil
		}()
	}
	for range streams {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

// TestWatchBudgetFilteredAndCanceled: a watch that filters out puts is
// not charged for them (it held budget for batches it never sent, and
// waited for that budget itself: its delete never came); and streams
// canceled while their responses are being sent leave the connection's
// budget to its next watch. (The gRPC race that leaked a canceled
// stream's budget is rare here; TestBudgetHoldsReleasedOnce covers the
// release itself.)
func TestWatchBudgetFilteredAndCanceled(t *testing.T) {
	n, _, cli := startWith(t, servertest.Options{}, etcd.Config{MaxWatchBytes: 256 << 10})
	ctx := ctxOf(t)
	big := strings.Repeat("v", 100<<10)
	wch := cli.Watch(ctx, "/f/k", clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	if resp := next(t, wch); !resp.Created {
		t.Fatalf("%+v", resp)
	}
	for range 20 {
		if _, err := n.Engine.Apply(ctx, "f", store.Put("k", []byte(`"`+big+`"`))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Delete(ctx, "/f/k"); err != nil {
		t.Fatal(err)
	}
	if resp := next(t, wch); len(resp.Events) != 1 || resp.Events[0].Type != clientv3.EventTypeDelete {
		t.Fatalf("the put-filtered watch: %+v, want the delete", resp)
	}

	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() { // large events while the streams come and go
		defer close(wrote)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := n.Engine.Apply(ctx, "c", store.Put("k", []byte(`"`+big+`"`))); err != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 40 {
				sctx, cancel := context.WithCancel(ctx)
				w := cli.Watch(sctx, "/c/k", clientv3.WithPrevKV())
				select {
				case <-w:
				case <-time.After(time.Second):
				}
				cancel()
			}
		}()
	}
	wg.Wait()
	close(stop)
	<-wrote
	// 256 KiB of budget holds about one event: a leak of one would stall this.
	w := cli.Watch(ctx, "/c/k", clientv3.WithPrevKV(), clientv3.WithCreatedNotify())
	if resp := next(t, w); !resp.Created {
		t.Fatalf("%+v", resp)
	}
	if _, err := n.Engine.Apply(ctx, "c", store.Put("k", []byte(`"after"`))); err != nil {
		t.Fatal(err)
	}
	for {
		resp := next(t, w)
		if l := len(resp.Events); l > 0 && string(resp.Events[l-1].Kv.Value) == "after" {
			return
		}
	}
}

// TestIdleConnections: a connection that sends nothing is closed; a
// watch held open with nothing to say is not idle.
func TestIdleConnections(t *testing.T) {
	_, addr, cli := startWith(t, servertest.Options{}, etcd.Config{IdleTimeout: 300 * time.Millisecond})
	ctx := ctxOf(t)
	wch := cli.Watch(ctx, "/idle/k", clientv3.WithCreatedNotify())
	if resp := next(t, wch); !resp.Created {
		t.Fatalf("watch: %+v", resp)
	}
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	_ = silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := io.Copy(io.Discard, silent); err != nil {
		t.Fatalf("a connection that sent nothing was still open after %v: %v", time.Since(start), err)
	}
	// The silent one was closed after 300 ms; the watch's connection has
	// been open as long, with no request but the watch.
	if _, err := cli.Put(ctx, "/idle/k", "v"); err != nil {
		t.Fatal(err)
	}
	if resp := next(t, wch); len(resp.Events) != 1 || string(resp.Events[0].Kv.Value) != "v" {
		t.Fatalf("the idle watch: %+v", resp)
	}
}

// TestLeaseKeysReplyBytes: the keys of a lease (LeaseTimeToLive with
// keys) are a reply bounded as a range's: past MaxReplyBytes,
// ResourceExhausted; without keys, its time to live still.
func TestLeaseKeysReplyBytes(t *testing.T) {
	_, _, cli := startWith(t, servertest.Options{}, etcd.Config{MaxReplyBytes: 4 << 10})
	ctx := ctxOf(t)
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 100 { // 100 keys of about 60 bytes in a reply
		if _, err := cli.Put(ctx, fmt.Sprintf("/leased/%s%03d", strings.Repeat("k", 40), i), "v", clientv3.WithLease(lease.ID)); err != nil {
			t.Fatal(err)
		}
	}
	_, err = cli.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys())
	if codeOf(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "this lease's keys") {
		t.Fatalf("the keys of a lease past a 4 KiB reply bound: %v, want ResourceExhausted", err)
	}
	if ttl, err := cli.TimeToLive(ctx, lease.ID); err != nil || ttl.TTL <= 0 {
		t.Fatalf("its time to live without keys: %+v %v", ttl, err)
	}
}

// TestHeaderBytes: a request whose metadata is past 64 KiB is refused
// (gRPC's default let 16 MiB a stream be held), and the connection serves
// the next request.
func TestHeaderBytes(t *testing.T) {
	_, _, cli := startWith(t, servertest.Options{}, etcd.Config{})
	ctx := ctxOf(t)
	big := metadata.AppendToOutgoingContext(ctx, "padding", strings.Repeat("x", 100<<10))
	if _, err := cli.Put(big, "/h/k", "v"); err == nil {
		t.Fatal("a put with 100 KiB of metadata was taken")
	}
	small := metadata.AppendToOutgoingContext(ctx, "padding", strings.Repeat("x", 1<<10))
	if _, err := cli.Put(small, "/h/k", "v"); err != nil {
		t.Fatalf("a put with 1 KiB of metadata: %v", err)
	}
}

// TestCompactRate: compactions count as writes of their subject.
func TestCompactRate(t *testing.T) {
	o := servertest.Options{}
	o.Server.WriteRate, o.Server.WriteBurst = 1, 5
	n, _, cli := start(t, o)
	fillRoom(t, n, "c", 1, 8)
	room := metadata.AppendToOutgoingContext(ctxOf(t), "statecast-room", "c")
	var limited int
	for i := range 20 {
		// A compaction over the rate waits its turn up to the request's
		// deadline (TestWritesWaitTheirTurn): this client gives it none.
		ctx, cancel := context.WithTimeout(room, 200*time.Millisecond)
		_, err := cli.Compact(ctx, 2)
		cancel()
		switch {
		case codeOf(err) == codes.ResourceExhausted && strings.Contains(err.Error(), "writes per second"):
			limited++
		case err != nil:
			t.Fatalf("compact %d: %v", i, err)
		}
	}
	if limited < 14 {
		t.Fatalf("%d of 20 compactions rate-limited at 1/s with a burst of 5", limited)
	}
}

// TestTxnRangesShareTheRead: a txn's ranges read the keys in place; one
// that sorts or filters them does not reorder them for the next, and
// the txn's own writes show in the ranges after them.
func TestTxnRangesShareTheRead(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	for _, kv := range [][2]string{{"a", "3"}, {"b", "1"}, {"c", "2"}} {
		if _, err := cli.Put(ctx, "/sh/"+kv[0], kv[1]); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(r *pb.RangeResponse) string {
		var b strings.Builder
		for _, kv := range r.Kvs {
			b.WriteString(strings.TrimPrefix(string(kv.Key), "/sh/") + "=" + string(kv.Value) + " ")
		}
		return b.String()
	}
	resp, err := cli.Txn(ctx).Then(
		clientv3.OpGet("/sh/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByValue, clientv3.SortDescend)),
		clientv3.OpGet("/sh/", clientv3.WithPrefix(), clientv3.WithMinModRev(3)),
		clientv3.OpGet("/sh/", clientv3.WithPrefix()),
		clientv3.OpPut("/sh/b", "9"),
		clientv3.OpDelete("/sh/c"),
		clientv3.OpPut("/sh/d", "4"),
		clientv3.OpGet("/sh/", clientv3.WithPrefix()),
		clientv3.OpGet("/sh/", clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		t.Fatal(err)
	}
	r := resp.Responses
	for i, want := range map[int]string{0: "a=3 c=2 b=1 ", 1: "b=1 c=2 ", 2: "a=3 b=1 c=2 ", 6: "a=3 b=9 d=4 "} {
		if got := keys(r[i].GetResponseRange()); got != want {
			t.Errorf("range %d: %q, want %q", i, got, want)
		}
	}
	if n := r[7].GetResponseRange().Count; n != 3 {
		t.Errorf("count after the txn's writes: %d", n)
	}
}
