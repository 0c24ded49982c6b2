package etcd_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"

	statecast "github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/etcd"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/store"
)

// TestBinaryValues: bytes that are not UTF-8 go through the etcd API
// byte-exact (get, watch, compare, prev_kv), and JSON clients see them
// as {"$bytes":"<base64>"}; etcd text that looks like that form stays
// text, and a JSON client's tagged object reads as its bytes.
func TestBinaryValues(t *testing.T) {
	n, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	bin := []byte{0xff, 0x00, 0xfe, 'a', 0x80, '"', '\\'}
	wch := cli.Watch(ctx, "/bin/", clientv3.WithPrefix(), clientv3.WithPrevKV())
	if _, err := cli.Put(ctx, "/bin/k", string(bin)); err != nil {
		t.Fatalf("a put of bytes that are not UTF-8: %v", err)
	}
	get, err := cli.Get(ctx, "/bin/k")
	if err != nil || len(get.Kvs) != 1 || !bytes.Equal(get.Kvs[0].Value, bin) {
		t.Fatalf("get of the bytes: %v, %v", get, err)
	}
	if ev := events(t, wch, 1)[0]; !bytes.Equal(ev.Kv.Value, bin) {
		t.Fatalf("watched: %q, want %q", ev.Kv.Value, bin)
	}
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("/bin/k"), "=", string(bin))).Then(clientv3.OpPut("/bin/k", "text", clientv3.WithPrevKV())).Commit()
	if err != nil || !txn.Succeeded || !bytes.Equal(txn.Responses[0].GetResponsePut().PrevKv.Value, bin) {
		t.Fatalf("a compare of the bytes and their prev_kv: %v, %v", txn, err)
	}
	h := &statecast.HTTP{URL: n.HTTP.URL}
	if _, err := cli.Put(ctx, "/bin/k", string(bin)); err != nil {
		t.Fatal(err)
	}
	it, _, err := h.Get(ctx, "bin", "k")
	if want := `{"$bytes":"` + base64.StdEncoding.EncodeToString(bin) + `"}`; err != nil || string(it.Value) != want {
		t.Fatalf("an HTTP client reads %s, %v; want %s", it.Value, err, want)
	}
	// An etcd client's text in the tagged form is text, not bytes.
	tagged := `{"$bytes":"AAEC"}`
	if _, err := cli.Put(ctx, "/bin/t", tagged); err != nil {
		t.Fatal(err)
	}
	if get, err := cli.Get(ctx, "/bin/t"); err != nil || string(get.Kvs[0].Value) != tagged {
		t.Fatalf("etcd text in the tagged form read back as %q, %v", get.Kvs[0].Value, err)
	}
	if it, _, err := h.Get(ctx, "bin", "t"); err != nil || string(it.Value) != strconv.Quote(tagged) {
		t.Fatalf("an HTTP client reads etcd text in the tagged form as %s, %v; want a string", it.Value, err)
	}
	// A JSON client's tagged object is bytes to etcd clients.
	if _, err := h.Put(ctx, "bin", "j", json.RawMessage(`{"$bytes":"AAEC"}`), nil, ""); err != nil {
		t.Fatal(err)
	}
	if get, err := cli.Get(ctx, "/bin/j"); err != nil || !bytes.Equal(get.Kvs[0].Value, []byte{0, 1, 2}) {
		t.Fatalf("a JSON client's tagged object read by etcd: %q, %v", get.Kvs[0].Value, err)
	}
}

// TestBinaryKeys: a key with a NUL byte or bytes that are not UTF-8 goes
// through byte-exact, as etcdctl check perf writes them.
func TestBinaryKeys(t *testing.T) {
	n, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	keys := []string{"/bk/a\x00\x00", "/bk/a\xff\x01", "/bk/\x80", "/bk/plain", "/bk/x\U0010FFFFy"}
	wch := cli.Watch(ctx, "/bk/a\x00", clientv3.WithPrefix())
	for i, k := range keys {
		if _, err := cli.Put(ctx, k, strconv.Itoa(i)); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
	}
	for i, k := range keys {
		get, err := cli.Get(ctx, k)
		if err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Key) != k || string(get.Kvs[0].Value) != strconv.Itoa(i) {
			t.Fatalf("get %q: %v, %v", k, get, err)
		}
	}
	get, err := cli.Get(ctx, "/bk/", clientv3.WithPrefix())
	if err != nil || len(get.Kvs) != len(keys) {
		t.Fatalf("get --prefix /bk/: %v, %v", get, err)
	}
	got := map[string]bool{}
	for _, kv := range get.Kvs {
		got[string(kv.Key)] = true
	}
	for _, k := range keys {
		if !got[k] {
			t.Fatalf("get --prefix /bk/ misses %q: %v", k, get.Kvs)
		}
	}
	if get, err := cli.Get(ctx, "/bk/a\x00", clientv3.WithPrefix()); err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Key) != keys[0] {
		t.Fatalf("get --prefix of a binary prefix: %v, %v", get, err)
	}
	// JSON clients see the text up to the first byte that is not, then
	// U+10FFFF and the rest in hex.
	list, err := (&statecast.HTTP{URL: n.HTTP.URL}).List(ctx, "bk", "a")
	if err != nil || len(list.Items) != 2 || list.Items[0].Key != "a\U0010FFFF0000" || list.Items[1].Key != "a\U0010FFFFff01" {
		t.Fatalf("an HTTP client lists %+v, %v", list, err)
	}
	del, err := cli.Delete(ctx, "/bk/", clientv3.WithPrefix())
	if err != nil || del.Deleted != int64(len(keys)) {
		t.Fatalf("delete --prefix /bk/: %v, %v", del, err)
	}
	if evs := events(t, wch, 2); string(evs[0].Kv.Key) != keys[0] || evs[0].Type != clientv3.EventTypePut || string(evs[1].Kv.Key) != keys[0] || evs[1].Type != clientv3.EventTypeDelete {
		t.Fatalf("a watch of a binary prefix: %v", evs)
	}
}

// TestDefaultRoom: with a default room, a key that names no room is a key
// of it, as etcd's keyspace: etcd's quickstart, ranges over all its keys,
// txns over several top-level names and plain compaction work, with the
// room's revision as the header's; /<room>/<key> still names a room.
func TestDefaultRoom(t *testing.T) {
	n, _, cli := startWith(t, servertest.Options{}, etcd.Config{DefaultRoom: "etcd"})
	ctx := ctxOf(t)
	wch := cli.Watch(ctx, "", clientv3.WithPrefix())
	for _, kv := range [][2]string{{"foo", "bar"}, {"zoo", "1"}, {"/a", "2"}, {"/etcd/x", "3"}} {
		if _, err := cli.Put(ctx, kv[0], kv[1]); err != nil {
			t.Fatalf("put %s: %v", kv[0], err)
		}
	}
	if _, err := cli.Put(ctx, "/lobby/k", "in a room"); err != nil {
		t.Fatal(err)
	}
	if evs := events(t, wch, 4); string(evs[0].Kv.Key) != "foo" || string(evs[3].Kv.Key) != "/etcd/x" || evs[3].Kv.ModRevision != 5 {
		t.Fatalf("a watch of every key of the default room: %v", evs)
	}
	get, err := cli.Get(ctx, "foo")
	if err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Key) != "foo" || string(get.Kvs[0].Value) != "bar" || get.Header.Revision != 5 {
		t.Fatalf("get foo: %v, %v", get, err)
	}
	keys := func(resp *clientv3.GetResponse) string {
		var ks []string
		for _, kv := range resp.Kvs {
			ks = append(ks, string(kv.Key))
		}
		return strings.Join(ks, " ")
	}
	if get, err := cli.Get(ctx, "", clientv3.WithPrefix()); err != nil || keys(get) != "/a /etcd/x foo zoo" || get.Header.Revision != 5 {
		t.Fatalf("get --prefix \"\": %v, %v", get, err)
	}
	if get, err := cli.Get(ctx, "g", clientv3.WithFromKey()); err != nil || keys(get) != "zoo" {
		t.Fatalf("get --from-key g: %v, %v", get, err)
	}
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Value("foo"), "=", "bar")).Then(clientv3.OpPut("zoo", "2"), clientv3.OpGet("/a")).Commit()
	if err != nil || !txn.Succeeded || txn.Header.Revision != 6 {
		t.Fatalf("a txn over two top-level names: %v, %v", txn, err)
	}
	it, _, err := (&statecast.HTTP{URL: n.HTTP.URL}).Get(ctx, "etcd", "foo")
	if err != nil || string(it.Value) != `"bar"` {
		t.Fatalf("an HTTP client reads room etcd key foo: %+v, %v", it, err)
	}
	if get, err := cli.Get(ctx, "/lobby/k"); err != nil || string(get.Kvs[0].Value) != "in a room" || get.Header.Revision != 2 {
		t.Fatalf("get /lobby/k: %v, %v", get, err)
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "leased\x00", "v", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if ttl, err := cli.TimeToLive(ctx, lease.ID, clientv3.WithAttachedKeys()); err != nil || len(ttl.Keys) != 1 || string(ttl.Keys[0]) != "leased\x00" {
		t.Fatalf("a lease's keys in the default room: %v, %v", ttl, err)
	}
	if _, err := cli.Compact(ctx, 5); err != nil {
		t.Fatalf("a compaction that names no room: %v", err)
	}
	if _, err := cli.Get(ctx, "foo", clientv3.WithRev(4)); err == nil || !strings.Contains(err.Error(), "compacted") {
		t.Fatalf("get foo at 4 after compacting the default room to 5: %v", err)
	}
	// Without a default room, such a key is still refused.
	_, _, plain := start(t, servertest.Options{})
	if _, err := plain.Put(ctx, "foo", "bar"); codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--etcd-default-room") {
		t.Fatalf("put foo with no default room: %v, want InvalidArgument naming --etcd-default-room", err)
	}
}

// TestSmallRefusals: what a room's limits refuse is said plainly, with
// the flag that raises them; a room's own prefix as a key is a key that
// is not there.
func TestSmallRefusals(t *testing.T) {
	_, _, cli := start(t, servertest.Options{})
	ctx := ctxOf(t)
	txn, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.Version("/r/"), "=", 0)).Then(clientv3.OpPut("/r/a", "1")).Commit()
	if err != nil || !txn.Succeeded {
		t.Fatalf("a txn comparing /r/: %v, %v; want it to hold, as for any missing key", txn, err)
	}
	if get, err := cli.Get(ctx, "/r/"); err != nil || len(get.Kvs) != 0 {
		t.Fatalf("get /r/: %v, %v", get, err)
	}
	if _, err := cli.Put(ctx, "/r/", "v"); codeOf(err) != codes.InvalidArgument || strings.Contains(err.Error(), "store:") {
		t.Fatalf("put /r/: %v, want InvalidArgument in statecast's words", err)
	}
	if _, err := cli.Put(ctx, "/r/big", strings.Repeat("x", 300_000)); codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--max-value") {
		t.Fatalf("a 300 KB value: %v, want InvalidArgument naming --max-value", err)
	}
	ops := make([]clientv3.Op, 100)
	for i := 0; i < 3; i++ {
		for j := range ops {
			ops[j] = clientv3.OpPut("/r/k"+strconv.Itoa(i*100+j), "v")
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Delete(ctx, "/r/", clientv3.WithPrefix()); codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "256") || !strings.Contains(err.Error(), "--max-ops") {
		t.Fatalf("a delete of 300 keys: %v, want InvalidArgument naming the limit and --max-ops", err)
	}
	if _, err := cli.Txn(ctx).Then(clientv3.OpDelete("/r/", clientv3.WithPrefix())).Commit(); codeOf(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "--max-ops") {
		t.Fatalf("a txn deleting 300 keys: %v, want InvalidArgument naming --max-ops", err)
	}
	if get, err := cli.Get(ctx, "/r/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || get.Count != 301 {
		t.Fatalf("after the refused deletes: %v, %v; want all 301 keys", get, err)
	}
	// The flags raise both.
	o := servertest.Options{}
	o.Memory.Limits = store.Limits{MaxValueBytes: 1 << 20, MaxOps: 1000}
	_, _, raised := start(t, o)
	if _, err := raised.Put(ctx, "/r/big", strings.Repeat("x", 300_000)); err != nil {
		t.Fatalf("a 300 KB value with a limit of 1 MiB: %v", err)
	}
	for i := 0; i < 3; i++ {
		for j := range ops {
			ops[j] = clientv3.OpPut("/r/k"+strconv.Itoa(i*100+j), "v")
		}
		if _, err := raised.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	if del, err := raised.Delete(ctx, "/r/", clientv3.WithPrefix()); err != nil || del.Deleted != 301 {
		t.Fatalf("a delete of 301 keys with a limit of 1000 ops: %v, %v", del, err)
	}
}
