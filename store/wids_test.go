package store

import (
	"encoding/hex"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"

	"github.com/statecast/statecast/store/redistest"
)

// widBatch is a put (with its previous value) and a delete at revision 7.
func widBatch(wid string) Batch {
	return Batch{Time: time.Unix(1700000000, 5), Events: []Event{
		{Type: OpPut, KV: KV{Key: "k", Value: []byte("v2"), CreateRev: 3, ModRev: 7, Version: 2, Lease: "l"},
			Prev: &KV{Key: "k", Value: []byte("v1"), CreateRev: 3, ModRev: 3, Version: 1}, Wid: wid},
		{Type: OpDelete, KV: KV{Key: "gone", ModRev: 7},
			Prev: &KV{Key: "gone", Value: []byte("x"), CreateRev: 1, ModRev: 1, Version: 1}, Wid: wid},
	}}
}

// TestFileBatchRecordWithoutWidUnchanged: a log record written before
// write ids existed decodes as a batch without one, and a batch without
// one is still written byte for byte as then (older binaries read it); a
// batch with one round-trips it on every event.
func TestFileBatchRecordWithoutWidUnchanged(t *testing.T) {
	// widBatch("") as the file store encoded it before write ids.
	old, _ := hex.DecodeString("b180c49fd50c050201016b030702037632026c01030301037631000204676f6e65000700000001010101027800")
	want := widBatch("")
	want.Epoch, want.Rev = "e", 7
	got, err := decodeBatch("e", 7, old)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("record from before write ids: %v\n got %+v\nwant %+v", err, got, want)
	}
	if enc := encodeBatch(&want); !reflect.DeepEqual(enc, old) {
		t.Errorf("a batch without a wid encodes as %x, want the old record %x", enc, old)
	}

	with := widBatch("client-1.42")
	with.Epoch, with.Rev = "e", 7
	rec := encodeBatch(&with)
	if rec[0] != tagBatchWid {
		t.Errorf("record of a batch with a wid starts with %#x, want %#x", rec[0], tagBatchWid)
	}
	got, err = decodeBatch("e", 7, rec)
	if err != nil || !reflect.DeepEqual(got, with) {
		t.Fatalf("record with a wid: %v\n got %+v\nwant %+v", err, got, with)
	}
	if wid, err := decodeBatchWid(rec); err != nil || wid != "client-1.42" {
		t.Errorf("decodeBatchWid = %q, %v", wid, err)
	}
	if at, n, err := decodeBatchHeader(rec); err != nil || n != 2 || !at.Equal(with.Time) {
		t.Errorf("decodeBatchHeader = %v, %d, %v; want %v, 2", at, n, err, with.Time)
	}
}

// TestRedisBatchWithoutWidUnchanged: a stream entry written before write
// ids existed (B1) decodes without one; B2 carries it to every event.
func TestRedisBatchWithoutWidUnchanged(t *testing.T) {
	const body = "2;P1:k7,3,2,1:l2:v2p3,3,1,0:2:v1D4:gone7;p1,1,1,0:1:x"
	b1, err := decodeRedisBatch("B11:e7;1700000000000;3:tag0:" + body)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := decodeRedisBatch("B21:e7;1700000000000;3:tag0:11:client-1.42" + body)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range b1.Events {
		if ev.Wid != "" || b2.Events[i].Wid != "client-1.42" {
			t.Errorf("event %d: wid %q in B1, %q in B2; want none and client-1.42", i, ev.Wid, b2.Events[i].Wid)
		}
		ev.Wid = "client-1.42"
		if !reflect.DeepEqual(ev, b2.Events[i]) {
			t.Errorf("event %d differs between B1 and B2 beyond the wid:\n%+v\n%+v", i, ev, b2.Events[i])
		}
	}
	if len(b1.Events) != 2 || b1.Rev != 7 || b1.tag != "tag" {
		t.Errorf("B1 batch %+v", b1)
	}
}

// TestFileWidsGoWithTheLog: the file store remembers the write ids of the
// revisions its log retains, and forgets each with its revision; a room
// whose writes never had one has no wids bucket.
func TestFileWidsGoWithTheLog(t *testing.T) {
	f := openFile(t, t.TempDir(), FileConfig{Retention: RetentionPolicy{Default: Retention{MaxEvents: 3}}})
	for i := range 10 {
		w := Put("k", []byte("v"))
		if i%2 == 0 {
			w.Wid = fmt.Sprint("w", i)
		}
		mustApply(t, f, "ids", w)
		mustApply(t, f, "plain", Put("k", []byte("v")))
	}
	// Revision i+1 had id wi for even i; 9..11 are retained after this.
	mustApply(t, f, "ids", Write{Ops: []Op{{Type: OpPut, Key: "k", Value: []byte("v")}}, Wid: "w10"})
	var got []string
	err := f.view(func(tx *bolt.Tx) error {
		if roomBucket(tx, "plain").Bucket(bucketWids) != nil {
			t.Error("a room never written with a wid has a wids bucket")
		}
		return roomBucket(tx, "ids").Bucket(bucketWids).ForEach(func(k, v []byte) error {
			got = append(got, string(k))
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"w10", "w8"}; !reflect.DeepEqual(got, want) {
		t.Errorf("wids remembered %v, want those of the retained revisions %v", got, want)
	}
}

// widsOfLog returns a room's wids ZSET and the w fields of its stream,
// each as id -> revision.
func widsOfLog(t testing.TB, raw *redis.Client, k redisKeys) (zset, log map[string]uint64) {
	t.Helper()
	zset, log = map[string]uint64{}, map[string]uint64{}
	zs, err := raw.ZRangeWithScores(bg, k.wids, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, z := range zs {
		zset[z.Member.(string)] = uint64(z.Score)
	}
	es, err := raw.XRange(bg, k.log, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		if w := entryField(e, "w"); w != "" {
			log[w] = entryRev(e.ID)
		}
	}
	return zset, log
}

// TestRedisWidsGoWithTheStream: a room's wids ZSET holds the ids of the
// entries its stream holds, whether the write script, the read-time trim
// or a new epoch trims the stream.
func TestRedisWidsGoWithTheStream(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	now := time.Unix(1700000000, 0)
	clock := func() time.Time { return now }
	s := openTestRedis(t, srv.URL(), func(c *RedisConfig) {
		c.Clock = clock
		c.Retention = RetentionPolicy{Default: Retention{MaxEvents: 3, MaxAge: time.Minute}}
	})
	const room = "wids"
	k := s.keys(room)
	check := func(what string, want map[string]uint64) {
		t.Helper()
		zset, log := widsOfLog(t, raw, k)
		if !reflect.DeepEqual(zset, log) || !reflect.DeepEqual(zset, want) {
			t.Errorf("%s: wids %v, stream's w fields %v, want both %v", what, zset, log, want)
		}
	}
	for i := range 10 {
		w := Put("k", []byte("v"))
		if i%2 == 0 {
			w.Wid = fmt.Sprint("w", i)
		}
		mustApply(t, s, room, w)
	}
	check("count retention", map[string]uint64{"w8": 9}) // revisions 8..10

	now = now.Add(2 * time.Minute)
	mustSnapshot(t, s, room) // expired: trimmed on read, the newest entry stays
	check("age retention on read", map[string]uint64{})
	mustApply(t, s, room, Write{Ops: []Op{{Type: OpPut, Key: "k", Value: []byte("v")}}, Wid: "w11"})
	check("after the trim", map[string]uint64{"w11": 11})

	m := parseMeta(raw.HMGet(bg, k.meta, metaFields...).Val())
	if err := reepochScript.Run(bg, raw, []string{k.meta, k.log, k.wids}, m.epoch, fmt.Sprint(m.rev), m.tag, NewEpoch()).Err(); err != nil {
		t.Fatal(err)
	}
	check("new epoch", map[string]uint64{})

	mustApply(t, s, room, Write{Ops: []Op{{Type: OpPut, Key: "k", Value: []byte("v")}}, Wid: "w12"})
	raw.Del(bg, k.meta) // the state is lost (evicted, say): the next write starts over
	mustApply(t, s, room, Write{Ops: []Op{{Type: OpPut, Key: "k", Value: []byte("v")}}, Wid: "w13"})
	check("state lost", map[string]uint64{"w13": 1})
}
