package redisstore

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// loseTail puts room's keys back as dumped: Redis at an earlier revision
// of the same epoch, as after a crash that lost the AOF's last second or
// a failover to a replica that had not received the last writes.
func loseTail(t *testing.T, raw *redis.Client, k roomKeys, dump map[string]string) {
	t.Helper()
	for key, d := range dump {
		if err := raw.RestoreReplace(bg, key, 0, d).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// dumpRoom dumps room's keys that exist.
func dumpRoom(t *testing.T, raw *redis.Client, k roomKeys) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, key := range []string{k.meta, k.kv, k.log, k.wids} {
		d, err := raw.Dump(bg, key).Result()
		if err == redis.Nil {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out[key] = d
	}
	return out
}

// lostTailStore opens a store on a Redis of its own (no periodic check:
// only what is asked of the store can notice the loss) and follows room
// "lost"; it applies kept, then puts of k up to revision 5, and makes
// Redis lose what came after kept. It returns the lost epoch.
func lostTailStore(t *testing.T, kept []store.Write) (*Store, *redis.Client, *batchLog, string) {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	s := openStore(t, srv.URL(), func(c *Config) { c.CheckInterval = time.Hour })
	const room = "lost"
	k := s.keys(room)
	fl := followLog(t, s, room)
	for _, w := range kept {
		mustApply(t, s, room, w)
	}
	dump := dumpRoom(t, raw, k)
	for i := len(kept) + 1; i <= 5; i++ {
		mustApply(t, s, room, store.Put("k", []byte(fmt.Sprint(i))))
	}
	bs, _ := fl.wait(t, "revision 5", 5*time.Second, func(bs []store.Batch) bool { return len(bs) > 0 && bs[len(bs)-1].Rev == 5 })
	loseTail(t, raw, k, dump)
	return s, raw, fl, bs[len(bs)-1].Epoch
}

// TestLostTailNeverServed: Redis comes back behind what this node
// delivered, in the same epoch. Head, which a linearizable read waits for,
// answers a new epoch, never the lost one's shorter head, and the
// followers hear of the new epoch before Head returns; a write that Redis
// then commits at a revision the node had delivered for another write is
// answered in the new epoch, never at that revision.
func TestLostTailNeverServed(t *testing.T) {
	kept := []store.Write{store.Put("k", []byte("1")), store.Put("k", []byte("2")), store.Put("k", []byte("3"))}
	s, raw, fl, epoch := lostTailStore(t, kept)
	const room = "lost"
	k := s.keys(room)
	e, rev, err := s.Head(bg, room)
	if err != nil {
		t.Fatal(err)
	}
	if e == epoch {
		t.Fatalf("Head after Redis lost revisions 4 and 5: %s/%d, the lost epoch's shorter head", e, rev)
	}
	if got := fl.get(); got[len(got)-1].Epoch != e {
		t.Errorf("when Head returned, the follower's last batch was %s/%d, want the new epoch %s's notice", got[len(got)-1].Epoch, got[len(got)-1].Rev, e)
	}

	// Again, now with a write: Redis commits it at revision 4 of the lost
	// epoch, which this node delivered for another write.
	var head uint64
	for i := 0; i < 2; i++ {
		head = mustApply(t, s, room, store.Put("k", []byte(fmt.Sprint("e2-", i)))).Rev
	}
	fl.wait(t, "the new epoch's writes", 5*time.Second, func(bs []store.Batch) bool { return bs[len(bs)-1].Rev == head })
	dump := dumpRoom(t, raw, k)
	mustApply(t, s, room, store.Put("k", []byte("lost")))
	fl.wait(t, "the write to lose", 5*time.Second, func(bs []store.Batch) bool { return bs[len(bs)-1].Rev == head+1 })
	loseTail(t, raw, k, dump)
	res := mustApply(t, s, room, store.Put("other", []byte("x")))
	if res.Epoch == e {
		t.Fatalf("a write Redis committed at %s/%d, a revision this node had delivered for another write, was answered in that epoch", res.Epoch, res.Rev)
	}
}

// TestLostTailRefusalsInNewEpoch: a conditional write refused, a delete
// of a missing key (a no-op) and a resent write id, each checked against a
// room Redis holds below what this node delivered, are not answered at a
// position of the lost epoch: the conflict and the no-op name the new
// epoch, the resent id is of unknown outcome (its revision is of the lost
// log).
func TestLostTailRefusalsInNewEpoch(t *testing.T) {
	for _, c := range []struct {
		name  string
		write store.Write
	}{
		{"conflict", store.Write{Conds: []store.Cond{{Key: "k", ModRev: 5}}, Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("x")}}}},
		{"no-op", store.Write{Ops: []store.Op{{Type: store.OpDelete, Key: "missing"}}}},
		{"dup", store.Write{Wid: "w2", Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("2")}}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, _, fl, lost := lostTailStore(t, []store.Write{store.Put("k", []byte("1")),
				{Wid: "w2", Ops: []store.Op{{Type: store.OpPut, Key: "k", Value: []byte("2")}}}})
			const room = "lost"

			res, err := s.Apply(bg, room, c.write)
			var ce *store.ConflictError
			switch {
			case c.name == "conflict" && (!errors.As(err, &ce) || ce.Epoch == lost || ce.Epoch == "" || ce.Rev != 2 || ce.ModRev != 2):
				t.Errorf("conflict after the loss: %+v, %v; want one at mod_rev 2, rev 2 of a new epoch (not %s)", ce, err, lost)
			case c.name == "no-op" && (err != nil || res.Epoch == lost || res.Rev != 2):
				t.Errorf("no-op after the loss: %+v, %v; want rev 2 of a new epoch (not %s)", res, err, lost)
			case c.name == "dup" && (err == nil || errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "outcome unknown")):
				t.Errorf("resent write id after the loss: %+v, %v; want an unknown outcome", res, err)
			}
			if got := fl.get(); got[len(got)-1].Epoch == lost {
				t.Errorf("after the reply the follower's last batch is %s/%d, want the new epoch's notice", got[len(got)-1].Epoch, got[len(got)-1].Rev)
			}
		})
	}
}
