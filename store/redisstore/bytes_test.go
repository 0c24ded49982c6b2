package redisstore

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// streamBytes is what the byte retention counts for the entries of a
// room's log that carry their c (those written before it had none), and
// the revisions of all of them, oldest first.
func streamBytes(t testing.TB, raw *redis.Client, k roomKeys) (bytes int64, revs []uint64) {
	t.Helper()
	es, err := raw.XRange(bg, k.log, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		rev, _ := strconv.ParseUint(strings.TrimSuffix(e.ID, "-0"), 10, 64)
		revs = append(revs, rev)
		if _, ok := e.Values["c"]; ok {
			bytes += int64(len(entryField(e, "d")) + len(entryField(e, "w")) + 64)
		}
	}
	return bytes, revs
}

// metaBytes reads the byte count of a room's meta: cum - base.
func metaBytes(t testing.TB, raw *redis.Client, k roomKeys) (cum, base int64) {
	t.Helper()
	v, err := raw.HMGet(bg, k.meta, "cum", "base").Result()
	if err != nil {
		t.Fatal(err)
	}
	num := func(x any) int64 { s, _ := x.(string); n, _ := strconv.ParseInt(s, 10, 64); return n }
	return num(v[0]), num(v[1])
}

// TestByteRetentionModel: for random writes (values of random sizes,
// transactions, deletes, write ids) under random event and byte bounds,
// the stream holds exactly the longest run of newest revisions within
// both bounds (a revision alone over a bound leaves nothing), and meta's
// count is the bytes of what it holds — also when the bounds change
// between writes, as they do when a room class is reconfigured.
func TestByteRetentionModel(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	run := 0
	rapid.Check(t, func(rt *rapid.T) {
		run++
		room := fmt.Sprint("bytes", run)
		maxEv := rapid.IntRange(1, 12).Draw(rt, "maxEvents")
		maxBytes := rapid.Int64Range(200, 6000).Draw(rt, "maxBytes")
		open := func() *Store {
			return openStore(t, srv.URL(), func(c *Config) {
				c.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: maxEv, MaxBytes: maxBytes}}
			})
		}
		s := open()
		k := s.keys(room)
		type entry struct {
			rev    uint64
			events int
			bytes  int64
		}
		var log []entry // every revision committed, oldest first
		kept := 0       // log[kept:] may still be retained
		present := map[string]bool{}
		var cum int64
		for i := range rapid.IntRange(1, 40).Draw(rt, "writes") {
			if rapid.IntRange(0, 9).Draw(rt, "reconfigure") == 0 {
				maxEv = rapid.IntRange(1, 12).Draw(rt, "maxEvents")
				maxBytes = rapid.Int64Range(200, 6000).Draw(rt, "maxBytes")
				s.Close()
				s = open()
			}
			var w store.Write
			events := 0
			used := map[string]bool{}
			for range rapid.IntRange(1, 3).Draw(rt, "ops") {
				key := fmt.Sprint("k", rapid.IntRange(0, 4).Draw(rt, "key"))
				if used[key] {
					continue // a write names a key once
				}
				used[key] = true
				if rapid.IntRange(0, 3).Draw(rt, "delete") == 0 {
					w.Ops = append(w.Ops, store.Op{Type: store.OpDelete, Key: key})
					continue
				}
				n := rapid.IntRange(0, 2500).Draw(rt, "size")
				w.Ops = append(w.Ops, store.Op{Type: store.OpPut, Key: key, Value: []byte(strconv.Quote(strings.Repeat("v", n)))})
			}
			if rapid.Bool().Draw(rt, "wid") {
				w.Wid = fmt.Sprint("w", i)
			}
			for _, op := range w.Ops { // the events it makes: puts, deletes of present keys
				if op.Type == store.OpPut || present[op.Key] {
					events++
				}
				present[op.Key] = op.Type == store.OpPut
			}
			res := mustApply(t, s, room, w)
			before := cum
			var base int64
			cum, base = metaBytes(t, raw, k)
			if events == 0 {
				continue // no revision: retention waits for the next one
			}
			log = append(log, entry{res.Rev, events, cum - before})
			// The model: the longest run of newest revisions within both
			// bounds, of those not dropped before (under other bounds).
			var wantRevs []uint64
			var nev int
			var nb int64
			j := len(log) - 1
			for ; j >= kept; j-- {
				nev += log[j].events
				nb += log[j].bytes
				if nev > maxEv || nb > maxBytes {
					break
				}
				wantRevs = append([]uint64{log[j].rev}, wantRevs...)
			}
			kept = j + 1
			got, revs := streamBytes(t, raw, k)
			if len(wantRevs) == 0 && len(revs) == 1 && revs[0] == log[len(log)-1].rev {
				// The head revision stays in the stream below floor (a
				// node that missed it still reads it), counted as gone.
				revs, got = nil, 0
			}
			if fmt.Sprint(revs) != fmt.Sprint(wantRevs) {
				rt.Fatalf("after write %d (maxEvents %d, maxBytes %d): stream holds %v, want %v (log %+v)", i, maxEv, maxBytes, revs, wantRevs, log)
			}
			if got != cum-base {
				rt.Fatalf("after write %d: meta counts %d bytes (cum %d, base %d), the stream holds %d", i, cum-base, cum, base, got)
			}
		}
		s.Close()
	})
}
