package redisstore

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// TestBatchWithoutWidUnchanged: a stream entry written before write
// ids existed (B1) decodes without one; B2 carries it to every event.
func TestBatchWithoutWidUnchanged(t *testing.T) {
	const body = "2;P1:k7,3,2,1:l2:v2p3,3,1,0:2:v1D4:gone7;p1,1,1,0:1:x"
	b1, err := decodeBatch("B11:e7;1700000000000;3:tag0:" + body)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := decodeBatch("B21:e7;1700000000000;3:tag0:11:client-1.42" + body)
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

// widsOfLog returns a room's wids ZSET and the w fields of its stream,
// each as id -> revision.
func widsOfLog(t testing.TB, raw *redis.Client, k roomKeys) (zset, log map[string]uint64) {
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

// TestWidsGoWithTheStream: a room's wids ZSET holds the ids of the
// entries its stream holds, whether the write script, the read-time trim
// or a new epoch trims the stream.
func TestWidsGoWithTheStream(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	now := time.Unix(1700000000, 0)
	clock := func() time.Time { return now }
	s := openStore(t, srv.URL(), func(c *Config) {
		c.Clock = clock
		c.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: 3, MaxAge: time.Minute}}
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
		w := store.Put("k", []byte("v"))
		if i%2 == 0 {
			w.Wid = fmt.Sprint("w", i)
		}
		mustApply(t, s, room, w)
	}
	check("count retention", map[string]uint64{"w8": 9}) // revisions 8..10

	now = now.Add(2 * time.Minute)
	mustSnapshot(t, s, room) // expired: trimmed on read, the newest entry stays
	check("age retention on read", map[string]uint64{})
	mustApply(t, s, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("v")}}, Wid: "w11"})
	check("after the trim", map[string]uint64{"w11": 11})

	m := parseMeta(raw.HMGet(bg, k.meta, metaFields...).Val())
	if err := reepochScript.Run(bg, raw, []string{k.meta, k.log, k.wids}, m.epoch, fmt.Sprint(m.rev), m.tag, store.NewEpoch()).Err(); err != nil {
		t.Fatal(err)
	}
	check("new epoch", map[string]uint64{})

	mustApply(t, s, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("v")}}, Wid: "w12"})
	raw.Del(bg, k.meta) // the state is lost (evicted, say): the next write starts over
	mustApply(t, s, room, store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("v")}}, Wid: "w13"})
	check("state lost", map[string]uint64{"w13": 1})
}

// TestCountRetention: count retention without an age limit, where a room
// whose entries are each of one event is trimmed without reading them
// (apply.lua) and one with bigger entries is read (retain.lua): either way
// whole revisions from the oldest, the write ids with them.
func TestCountRetention(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	s := openStore(t, srv.URL(), func(c *Config) {
		c.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: 3}}
	})
	const room = "count"
	k := s.keys(room)
	put := func(rev uint64, keys ...string) {
		t.Helper()
		w := store.Write{Wid: fmt.Sprint("w", rev)}
		for _, key := range keys {
			w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: key, Value: []byte("v")})
		}
		if res := mustApply(t, s, room, w); res.Rev != rev {
			t.Fatalf("write committed at %d, want %d", res.Rev, rev)
		}
	}
	check := func(what string, from, to uint64, events string) {
		t.Helper()
		es, err := raw.XRange(bg, k.log, "-", "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		var revs []uint64
		want := map[string]uint64{}
		for _, e := range es {
			revs = append(revs, entryRev(e.ID))
		}
		var wantRevs []uint64
		for r := from; r <= to; r++ {
			wantRevs = append(wantRevs, r)
			want[fmt.Sprint("w", r)] = r
		}
		zset, log := widsOfLog(t, raw, k)
		if !reflect.DeepEqual(revs, wantRevs) || !reflect.DeepEqual(zset, want) || !reflect.DeepEqual(log, want) {
			t.Errorf("%s: log %v, wids %v, want revisions %d..%d and their ids", what, revs, zset, from, to)
		}
		if got := raw.HGet(bg, k.meta, "events").Val(); got != events {
			t.Errorf("%s: meta events %s, want %s", what, got, events)
		}
		if snap := mustSnapshot(t, s, room); snap.Oldest != from {
			t.Errorf("%s: Oldest %d, want %d", what, snap.Oldest, from)
		}
	}
	for rev := uint64(1); rev <= 10; rev++ {
		put(rev, "a")
	}
	check("one event each", 8, 10, "3")
	put(11, "a", "b") // 5 events in 4 entries: read
	check("an entry of two events", 10, 11, "3")
	put(12, "a")
	put(13, "a")
	check("the entry of two events dropped", 12, 13, "2")
	put(14, "a")
	put(15, "a")
	check("one event each again", 13, 15, "3")
}
