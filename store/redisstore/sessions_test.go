package redisstore

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// TestReleaseSessionsBounded: the release of dead nodes owning 20,100 of
// 45,100 sessions runs in scripts of at most releaseBatch sessions each
// (one script over them all held Redis past its busy threshold at
// 100,000 sessions), and starts the grace of every session of the dead
// nodes and of no other. A session a dead node owned but a live node
// took since, or released twice, is left alone.
func TestReleaseSessionsBounded(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	keys := s.sessionKeys()
	owners := map[string]int{"dead.1": 20_000, "dead.2": 100, "live.1": 25_000}
	var recs, owned []any
	for node, n := range owners {
		for i := range n {
			id := fmt.Sprintf("s_%s_%d", node, i)
			v, err := json.Marshal(store.SessionRecord{ID: id, Subject: "u", ResumeHash: []byte("h"), Lease: "session:" + id, Owner: node, Listed: true})
			if err != nil {
				t.Fatal(err)
			}
			recs, owned = append(recs, id, v), append(owned, id, node)
			if len(recs) == 2000 {
				raw.HSet(bg, keys[0], recs...)
				raw.HSet(bg, keys[2], owned...)
				recs, owned = recs[:0], owned[:0]
			}
		}
	}
	raw.HSet(bg, keys[0], recs...)
	raw.HSet(bg, keys[2], owned...)
	var mu sync.Mutex
	var batches []int
	// Before the first script, live.1 takes 10 sessions of dead.1: each
	// is in that batch, in one read but not yet released, or not read.
	taken := map[string]bool{}
	hook := func(ids int) {
		mu.Lock()
		defer mu.Unlock()
		if len(batches) == 0 {
			for i := range 10 {
				id := fmt.Sprint("s_dead.1_", i)
				if _, _, ok, err := s.TakeSession(bg, id, "u", []byte("h"), []byte("h2"), "live.1", time.Now()); !ok || err != nil {
					t.Errorf("TakeSession: %v %v", ok, err)
				}
				taken[id] = true
			}
		}
		batches = append(batches, ids)
	}
	s.hookRelease.Store(&hook)
	defer s.hookRelease.Store(nil)
	scripts := func() int {
		info := raw.Info(bg, "commandstats").Val()
		n := 0
		for _, cmd := range []string{"evalsha", "eval"} {
			if _, rest, ok := strings.Cut(info, "cmdstat_"+cmd+":calls="); ok {
				c, _ := strconv.Atoi(rest[:strings.IndexByte(rest, ',')])
				n += c
			}
		}
		return n
	}
	const grace = time.Hour
	before, calls := time.Now(), scripts()
	n, err := s.ReleaseSessions(bg, []string{"dead.1", "dead.2", "gone.3"}, grace)
	after := time.Now()
	if want := 20_000 - 10 + 100; n != want || err != nil {
		t.Fatalf("ReleaseSessions: %d, %v; want %d", n, err, want)
	}
	calls = scripts() - calls
	mu.Lock()
	total := 0
	for _, b := range batches {
		total += b
		if b > releaseBatch {
			t.Errorf("a release script over %d sessions, want at most %d", b, releaseBatch)
		}
	}
	mu.Unlock()
	if want := (n + releaseBatch - 1) / releaseBatch; calls < want || len(batches) < want || total < n {
		t.Errorf("%d release scripts of %d sessions in all (Redis counted %d scripts), want at least %d scripts", len(batches), total, calls, want)
	}

	recAll := raw.HGetAll(bg, keys[0]).Val()
	ownedAll := raw.HGetAll(bg, keys[2]).Val()
	dueAll := make(map[string]bool)
	for _, id := range raw.ZRange(bg, keys[1], 0, -1).Val() {
		dueAll[id] = true
	}
	for id, v := range recAll {
		rec, err := decodeSession(v)
		if err != nil {
			t.Fatal(err)
		}
		due := dueAll[id]
		switch {
		case rec.Owner != "live.1" && (rec.Deadline < before.Add(grace).UnixMilli()-1000 || rec.Deadline > after.Add(grace).UnixMilli()+1000 || ownedAll[id] != "" || !due):
			t.Fatalf("session %s of a dead node after the release: %+v, owned by %q, due %v; want its grace started", id, rec, ownedAll[id], due)
		case rec.Owner == "live.1" && (rec.Deadline != 0 || ownedAll[id] != "live.1" || due):
			t.Fatalf("session %s of a live node after the release: %+v, owned by %q, due %v; want it left attached", id, rec, ownedAll[id], due)
		case taken[id] && rec.Owner != "live.1":
			t.Fatalf("session %s, taken by a live node during the release: %+v", id, rec)
		}
	}
	if len(recAll) != 45_100 {
		t.Fatalf("%d records, want 45,100", len(recAll))
	}
	if got, err := s.SessionOwners(bg); err != nil || len(got) != 1 || got[0] != "live.1" {
		t.Errorf("SessionOwners after the release: %v, %v; want live.1 only", got, err)
	}
	if n, err := s.ReleaseSessions(bg, []string{"dead.1", "dead.2"}, grace); n != 0 || err != nil {
		t.Errorf("released again: %d, %v; want 0", n, err)
	}
}

// TestReleaseNodeSessionsLeavesOlderBuildsToTheScan: a node's sessions
// are released from its set; one a build before the sets attached (in
// the owned hash only) is left to ReleaseSessions' scan, which also
// empties the sets of the nodes it releases.
func TestReleaseNodeSessionsLeavesOlderBuildsToTheScan(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	keys := s.sessionKeys()
	rec := func(id, node string) store.SessionRecord {
		return store.SessionRecord{ID: id, Subject: "u", ResumeHash: []byte("h"), Lease: "session:" + id, Owner: node, Listed: true}
	}
	for _, id := range []string{"s_new", "s_x"} {
		if err := s.SaveSession(bg, rec(id, map[string]string{"s_new": "n1", "s_x": "n2"}[id])); err != nil {
			t.Fatal(err)
		}
	}
	old, err := json.Marshal(rec("s_old", "n1"))
	if err != nil {
		t.Fatal(err)
	}
	raw.HSet(bg, keys[0], "s_old", old)
	raw.HSet(bg, keys[2], "s_old", "n1")

	if n, err := s.ReleaseNodeSessions(bg, "n1", time.Hour); n != 1 || err != nil {
		t.Fatalf("ReleaseNodeSessions(n1): %d %v, want the one in its set", n, err)
	}
	if got, _, _ := s.Session(bg, "s_old"); got.Deadline != 0 {
		t.Fatalf("the older build's session: %+v, want it left attached", got)
	}
	if n, err := s.ReleaseSessions(bg, []string{"n1", "n2"}, time.Hour); n != 2 || err != nil {
		t.Fatalf("ReleaseSessions: %d %v, want s_old and s_x", n, err)
	}
	for _, node := range []string{"n1", "n2"} {
		if c := raw.SCard(bg, s.sessionsOn()+node).Val(); c != 0 {
			t.Errorf("the set of %s after its release holds %d", node, c)
		}
	}
}

// TestCorruptSessionRecordIsGone: a record that is not JSON (written by
// hand, or by a bug) is as good as gone to every script that reads it: a
// take of it is refused and removes it, its detach and its keys' listing
// do nothing, a release skips it, and its end removes it while the other
// due sessions end. Before, each of these scripts failed on it, and the
// end failed for every session due in the same batch.
func TestCorruptSessionRecordIsGone(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	keys := s.sessionKeys()
	corrupt := func(id string, due bool) {
		t.Helper()
		raw.HSet(bg, keys[0], id, "not json")
		raw.HSet(bg, keys[2], id, "n1")
		raw.SAdd(bg, s.sessionsOn()+"n1", id)
		if due {
			raw.ZAdd(bg, keys[1], redis.Z{Score: 1, Member: id})
		}
	}
	exists := func(id string) bool { return raw.HExists(bg, keys[0], id).Val() }

	corrupt("s_bad", true)
	if err := s.SaveSession(bg, store.SessionRecord{ID: "s_ok", Subject: "u", ResumeHash: []byte("h"), Lease: "session:s_ok", Deadline: 1}); err != nil {
		t.Fatal(err)
	}
	ended, err := s.EndDueSessions(bg, 100)
	if err != nil || len(ended) != 1 || ended[0].ID != "s_ok" {
		t.Fatalf("EndDueSessions: %+v %v, want s_ok ended", ended, err)
	}
	if exists("s_bad") || raw.HExists(bg, keys[2], "s_bad").Val() {
		t.Error("the corrupt due record was not removed")
	}

	corrupt("s_take", false)
	if _, _, ok, err := s.TakeSession(bg, "s_take", "u", []byte("h"), []byte("h2"), "n2", time.Time{}); ok || err != nil {
		t.Fatalf("take of a corrupt record: ok %v err %v, want refused", ok, err)
	}
	if exists("s_take") || raw.SIsMember(bg, s.sessionsOn()+"n1", "s_take").Val() {
		t.Error("the take left the corrupt record")
	}

	corrupt("s_idle", false)
	if ok, err := s.DetachSession(bg, "s_idle", 1, time.Second); ok || err != nil {
		t.Errorf("detach of a corrupt record: %v %v", ok, err)
	}
	if _, err := s.ListSessionKey(bg, "s_idle", "r", "k"); err != nil {
		t.Errorf("listing a key under a corrupt record: %v", err)
	}
	if n, err := s.ReleaseSessions(bg, []string{"n1"}, time.Second); n != 0 || err != nil {
		t.Errorf("release of a dead node's corrupt record: %d %v", n, err)
	}
	corrupt("s_node", false)
	if n, err := s.ReleaseNodeSessions(bg, "n1", time.Second); n != 0 || err != nil {
		t.Errorf("release of a dead node's corrupt record from its set: %d %v", n, err)
	}
}

// TestTakeAfterAClockWentBack: a failover to a replica whose clock is
// behind the old master's leaves records whose last take is stamped in
// the new clock's future. A retry of that take (its reply was lost, so
// the client presents the old secret again), read now, is the client's
// latest connect and must be taken, not refused as older than the take
// it retries: a stamp is compared only with reads on its own clock, the
// Redis process the nodes map onto. The record is made as the old master
// left it: the take's read 3 s ahead, on another process's clock.
func TestTakeAfterAClockWentBack(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	keys := s.sessionKeys()
	if _, err := s.Beat(bg, "n1"); err != nil { // the node maps its clock onto Redis's by its beats
		t.Fatal(err)
	}
	if _, id, _ := s.clock.mapped(time.Now()); id == "" {
		t.Fatal("the beat did not name Redis's clock")
	}
	if err := s.SaveSession(bg, store.SessionRecord{ID: "s", Subject: "u", ResumeHash: []byte("h"), Lease: "session:s", Owner: "n1"}); err != nil {
		t.Fatal(err)
	}
	take := func(old, new string, read time.Time) (bool, error) {
		_, _, ok, err := s.TakeSession(bg, "s", "u", []byte(old), []byte(new), "n1", read)
		return ok, err
	}
	if ok, err := take("h", "h2", time.Now()); !ok || err != nil {
		t.Fatalf("first take: %v %v", ok, err)
	}
	// Under one clock, a connect read before the last take, retried with
	// the secret that take replaced, is refused.
	if ok, err := take("h", "h2b", time.Now().Add(-time.Second)); ok || !errors.Is(err, store.ErrStaleTake) {
		t.Fatalf("a connect read before the last take: ok %v err %v, want ErrStaleTake", ok, err)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(raw.HGet(bg, keys[0], "s").Val()), &rec); err != nil {
		t.Fatal(err)
	}
	rec["took"], rec["took_clock"] = raw.Time(bg).Val().UnixMilli()+3000, "0123456789abcdef"
	b, _ := json.Marshal(rec)
	raw.HSet(bg, keys[0], "s", b)

	if ok, err := take("h", "h3", time.Now()); !ok || err != nil {
		t.Fatalf("the retry after the clock went back: ok %v err %v, want taken", ok, err)
	}
	// The stale-take check holds again on this clock.
	if ok, err := take("h", "h4", time.Now().Add(-time.Second)); ok || !errors.Is(err, store.ErrStaleTake) {
		t.Fatalf("a connect read before the last take: ok %v err %v, want ErrStaleTake", ok, err)
	}
}
