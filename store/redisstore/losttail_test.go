package redisstore

import (
	"fmt"
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

// TestLostTailNeverServed: Redis comes back behind what this node
// delivered, in the same epoch. Head, which a linearizable read waits for,
// answers a new epoch, never the lost one's shorter head, and the
// followers hear of the new epoch before Head returns; a write that Redis
// then commits at a revision the node had delivered for another write is
// answered in the new epoch, never at that revision.
func TestLostTailNeverServed(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	// No periodic check: only Head and Apply can notice the loss here.
	s := openStore(t, srv.URL(), func(c *Config) { c.CheckInterval = time.Hour })
	const room = "lost"
	k := s.keys(room)
	fl := followLog(t, s, room)
	for i := 1; i <= 3; i++ {
		mustApply(t, s, room, store.Put("k", []byte(fmt.Sprint(i))))
	}
	dump := dumpRoom(t, raw, k)
	for i := 4; i <= 5; i++ {
		mustApply(t, s, room, store.Put("k", []byte(fmt.Sprint(i))))
	}
	bs, _ := fl.wait(t, "revision 5", 5*time.Second, func(bs []store.Batch) bool { return len(bs) > 0 && bs[len(bs)-1].Rev == 5 })
	epoch := bs[len(bs)-1].Epoch

	loseTail(t, raw, k, dump)
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
	dump = dumpRoom(t, raw, k)
	mustApply(t, s, room, store.Put("k", []byte("lost")))
	fl.wait(t, "the write to lose", 5*time.Second, func(bs []store.Batch) bool { return bs[len(bs)-1].Rev == head+1 })
	loseTail(t, raw, k, dump)
	res := mustApply(t, s, room, store.Put("other", []byte("x")))
	if res.Epoch == e {
		t.Fatalf("a write Redis committed at %s/%d, a revision this node had delivered for another write, was answered in that epoch", res.Epoch, res.Rev)
	}
}
