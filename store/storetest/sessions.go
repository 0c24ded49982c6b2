package storetest

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
)

// testSessions: a store that implements store.Sessions saves, replaces,
// reads, lists and deletes session records; a durable one keeps them
// across a reopen, an ephemeral one loses them with its epoch. Stores
// without the capability skip it.
func testSessions(t *testing.T, s *suite) {
	if _, ok := s.open(t, Config{}).(store.Sessions); !ok {
		t.Skip("the store does not implement store.Sessions")
	}
	rec := func(id, sub, hash string) store.SessionRecord {
		return store.SessionRecord{ID: id, Subject: sub, ResumeHash: []byte(hash), Lease: "session:" + id}
	}
	list := func(t *testing.T, ss store.Sessions) []store.SessionRecord {
		t.Helper()
		l, err := ss.ListSessions(bg)
		if err != nil {
			t.Fatalf("ListSessions: %v", err)
		}
		sort.Slice(l, func(i, j int) bool { return l[i].ID < l[j].ID })
		return l
	}
	parallel(t,
		namedTest{"SaveReplaceGetDelete", func(t *testing.T) {
			ss := s.open(t, Config{}).(store.Sessions)
			if _, ok, err := ss.Session(bg, "s_a"); ok || err != nil {
				t.Fatalf("Session of an empty store: ok %v err %v", ok, err)
			}
			for _, r := range []store.SessionRecord{rec("s_a", "alice", "h1"), rec("s_b", "bob", "h2"), rec("s_a", "alice", "h3")} {
				if err := ss.SaveSession(bg, r); err != nil {
					t.Fatalf("SaveSession: %v", err)
				}
			}
			got, ok, err := ss.Session(bg, "s_a")
			if !ok || err != nil {
				t.Fatalf("Session: ok %v err %v", ok, err)
			}
			diff(t, "the replaced record", rec("s_a", "alice", "h3"), got)
			diff(t, "ListSessions", []store.SessionRecord{rec("s_a", "alice", "h3"), rec("s_b", "bob", "h2")}, list(t, ss))
			if err := ss.DeleteSession(bg, "s_a"); err != nil {
				t.Fatalf("DeleteSession: %v", err)
			}
			if err := ss.DeleteSession(bg, "s_missing"); err != nil {
				t.Fatalf("DeleteSession of a missing record: %v", err)
			}
			if _, ok, _ := ss.Session(bg, "s_a"); ok {
				t.Fatal("a deleted record is still there")
			}
			diff(t, "ListSessions after the delete", []store.SessionRecord{rec("s_b", "bob", "h2")}, list(t, ss))
		}},
		namedTest{"ConcurrentSaves", func(t *testing.T) {
			ss := s.open(t, Config{}).(store.Sessions)
			var wg sync.WaitGroup
			want := make([]store.SessionRecord, 200)
			for i := range want {
				want[i] = rec(fmt.Sprintf("s_%03d", i), "sub", fmt.Sprint(i))
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := ss.SaveSession(bg, want[i]); err != nil {
						t.Errorf("SaveSession: %v", err)
					}
				}()
			}
			wg.Wait()
			diff(t, "ListSessions", want, list(t, ss))
		}},
		namedTest{"Reopen", func(t *testing.T) {
			dir := t.TempDir()
			st := s.openDir(t, dir, Config{})
			if err := st.(store.Sessions).SaveSession(bg, rec("s_a", "alice", "h1")); err != nil {
				t.Fatalf("SaveSession: %v", err)
			}
			if err := st.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			var want []store.SessionRecord // an ephemeral store's new epoch has none
			if s.f.Durable {
				want = []store.SessionRecord{rec("s_a", "alice", "h1")}
			}
			diff(t, "ListSessions after reopen", want, list(t, s.openDir(t, dir, Config{}).(store.Sessions)))
		}},
		namedTest{"Shared", func(t *testing.T) { testSharedSessions(t, s) }},
	)
}

// testSharedSessions: on a store several nodes share, a resume is a
// compare-and-set on the resume hash (the current one, or the one
// presented at the last take, whose reply may have been lost; takes go
// one after the other, each a new generation), a detach is fenced by the
// generation of the take it follows,
// and each session whose deadline passed is ended by one caller only.
func testSharedSessions(t *testing.T, s *suite) {
	ss, ok := s.open(t, Config{}).(store.SharedSessions)
	if !ok {
		t.Skip("the store does not implement store.SharedSessions")
	}
	save := func(id, owner string) {
		t.Helper()
		if err := ss.SaveSession(bg, store.SessionRecord{ID: id, Subject: "alice", ResumeHash: []byte("h0"), Lease: "session:" + id, Owner: owner, Listed: true}); err != nil {
			t.Fatalf("SaveSession: %v", err)
		}
	}
	take := func(id, sub, old, new, node string) (store.SessionRecord, string, bool) {
		t.Helper()
		rec, prev, ok, err := ss.TakeSession(bg, id, sub, []byte(old), []byte(new), node, time.Now())
		if err != nil {
			t.Fatalf("TakeSession: %v", err)
		}
		return rec, prev, ok
	}
	save("s_a", "n1")
	if _, _, ok := take("s_a", "alice", "wrong", "h1", "n2"); ok {
		t.Fatal("taken with a wrong secret")
	}
	if _, _, ok := take("s_a", "bob", "h0", "h1", "n2"); ok {
		t.Fatal("taken by another subject")
	}
	if _, _, ok := take("s_none", "alice", "h0", "h1", "n2"); ok {
		t.Fatal("a missing session taken")
	}
	// Nodes resume with one secret at once: they take it in turn, each
	// fencing the one before (its detach, by generation).
	var wins atomic.Int32
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, ok, err := ss.TakeSession(bg, "s_a", "alice", []byte("h0"), []byte(fmt.Sprint("h1-", i)), fmt.Sprint("n", 2+i), time.Time{}); ok && err == nil {
				wins.Add(1)
			}
		}()
	}
	wg.Wait()
	if got, _, _ := ss.Session(bg, "s_a"); wins.Load() == 0 || got.Gen != int64(wins.Load()) {
		t.Fatalf("%d of 8 takes with one secret won, generation %d: want each a generation", wins.Load(), got.Gen)
	}
	// The secret presented at the last take stays good until the next
	// take (its reply may have been lost); the one it replaced, never
	// presented, and one presented before are refused.
	if _, _, ok := take("s_a", "alice", "h0", "h1", "n2"); !ok {
		t.Fatal("the secret presented at the last take, presented again: refused")
	}
	if _, _, ok := take("s_a", "alice", "h1-0", "hx", "n2"); ok {
		t.Fatal("a secret replaced without being presented: accepted")
	}
	if _, _, ok := take("s_a", "alice", "h1", "h1b", "n2"); !ok {
		t.Fatal("the current secret: refused")
	}
	if _, _, ok := take("s_a", "alice", "h0", "hx", "n2"); ok {
		t.Fatal("a secret presented two takes ago: accepted")
	}
	if _, _, ok := take("s_a", "alice", "h1b", "h1", "n2"); !ok {
		t.Fatal("the current secret: refused")
	}
	gen := func() int64 { g, _, _ := ss.Session(bg, "s_a"); return g.Gen }()
	rec, prev, ok := take("s_a", "alice", "h1", "h2", "n9")
	if !ok || prev != "n2" || rec.Owner != "n9" || rec.Gen != gen+1 || rec.Deadline != 0 || string(rec.ResumeHash) != "h2" {
		t.Fatalf("take: %+v prev %q ok %v", rec, prev, ok)
	}
	if owners, err := ss.SessionOwners(bg); err != nil || len(owners) != 1 || owners[0] != "n9" {
		t.Fatalf("SessionOwners: %v %v", owners, err)
	}
	// A detach of an earlier generation (the connection it was taken
	// from) leaves the session attached.
	if ok, err := ss.DetachSession(bg, "s_a", gen, time.Millisecond); ok || err != nil {
		t.Fatalf("a stale detach: %v %v", ok, err)
	}
	if ok, err := ss.DetachSession(bg, "s_a", gen+1, time.Hour); !ok || err != nil {
		t.Fatalf("detach: %v %v", ok, err)
	}
	if got, _, _ := ss.Session(bg, "s_a"); got.Deadline == 0 {
		t.Fatalf("a detached session has no deadline: %+v", got)
	}
	if ended, err := ss.EndDueSessions(bg, 100); err != nil || len(ended) != 0 {
		t.Fatalf("EndDueSessions before the deadline: %v %v", ended, err)
	}
	// Within the grace it can be resumed: attached again, no deadline.
	if rec, _, ok := take("s_a", "alice", "h2", "h3", "n1"); !ok || rec.Deadline != 0 || rec.Gen != gen+2 {
		t.Fatalf("resume within the grace: %+v %v", rec, ok)
	}
	// A take whose connect was read before the last take's, presenting
	// the secret that take was presented: its client gave up on it and
	// took the session over elsewhere, and holds the current secret. It
	// writes nothing (else that secret would be void). A retry after a
	// lost answer is read after the take it follows, and wins.
	save("s_o", "n1")
	if n, ok := ss.(store.Nodes); ok { // a node beats before it serves: the store knows its clock
		if _, err := n.Beat(bg, "n1"); err != nil {
			t.Fatal(err)
		}
	}
	read := time.Now()
	takeAt := func(old, new, node string, at time.Duration) (store.SessionRecord, error) {
		t.Helper()
		rec, _, ok, err := ss.TakeSession(bg, "s_o", "alice", []byte(old), []byte(new), node, read.Add(at))
		if err == nil && !ok {
			t.Fatalf("take presenting %s at %v: refused", old, at)
		}
		return rec, err
	}
	if _, err := takeAt("h0", "h1", "n2", 2*time.Second); err != nil { // the client's second try
		t.Fatal(err)
	}
	if _, err := takeAt("h0", "hx", "n3", 0); !errors.Is(err, store.ErrStaleTake) { // its first, landing late
		t.Fatalf("a take read before the last one, presenting its secret: %v, want ErrStaleTake", err)
	}
	if got, _, _ := ss.Session(bg, "s_o"); got.Owner != "n2" || got.Gen != 1 || string(got.ResumeHash) != "h1" || string(got.PrevHash) != "h0" {
		t.Fatalf("after a stale take: %+v, want it as the take before left it", got)
	}
	if rec, err := takeAt("h0", "h2", "n4", 3*time.Second); err != nil || rec.Owner != "n4" || rec.Gen != 2 {
		t.Fatalf("a retry after a lost answer: %+v %v", rec, err)
	}
	if rec, err := takeAt("h2", "h3", "n5", time.Second); err != nil || rec.Gen != 3 { // the secret itself is proof
		t.Fatalf("the current secret, read early: %+v %v", rec, err)
	}
	if _, _, ok, err := ss.TakeSession(bg, "s_o", "alice", []byte("h2"), []byte("h4"), "n6", time.Time{}); !ok || err != nil {
		t.Fatalf("a retry whose read is not known: %v %v", ok, err)
	}
	if err := ss.DeleteSession(bg, "s_o"); err != nil {
		t.Fatal(err)
	}
	// The sessions of a dead node start their grace.
	save("s_b", "n1")
	save("s_c", "n7")
	if n, err := ss.ReleaseSessions(bg, []string{"n1"}, time.Millisecond); err != nil || n != 2 {
		t.Fatalf("ReleaseSessions: %d %v, want 2", n, err)
	}
	time.Sleep(20 * time.Millisecond)
	if _, _, ok := take("s_b", "alice", "h0", "h1", "n2"); ok {
		t.Fatal("a session past its deadline taken")
	}
	// A node's sessions from the store's list of them: those taken
	// elsewhere or detached since are not its own any more; more than
	// one script's batch go.
	for i := range 600 {
		save(fmt.Sprint("s_n", i), "n8")
	}
	if _, _, ok := take("s_n0", "alice", "h0", "h1", "n2"); !ok {
		t.Fatal("take")
	}
	if ok, err := ss.DetachSession(bg, "s_n1", 0, time.Hour); !ok || err != nil {
		t.Fatalf("detach: %v %v", ok, err)
	}
	if n, err := ss.ReleaseNodeSessions(bg, "n8", time.Millisecond); err != nil || n != 598 {
		t.Fatalf("ReleaseNodeSessions: %d %v, want 598", n, err)
	}
	if n, err := ss.ReleaseNodeSessions(bg, "n8", time.Millisecond); err != nil || n != 0 {
		t.Fatalf("ReleaseNodeSessions again: %d %v, want 0", n, err)
	}
	if got, _, _ := ss.Session(bg, "s_n0"); got.Owner != "n2" || got.Deadline != 0 {
		t.Fatalf("a session taken from the released node: %+v, want attached to n2", got)
	}
	if got, _, _ := ss.Session(bg, "s_n1"); got.Deadline < time.Now().Add(30*time.Minute).UnixMilli() {
		t.Fatalf("a session detached before its node's release: %+v, want its own grace (an hour)", got)
	}
	if got, _, _ := ss.Session(bg, "s_n599"); got.Deadline == 0 {
		t.Fatalf("a released session: %+v, want a deadline", got)
	}
	for i := range 600 {
		if err := ss.DeleteSession(bg, fmt.Sprint("s_n", i)); err != nil {
			t.Fatal(err)
		}
	}
	// Keys listed with a session come back with it when it ends, each
	// once; a missing session lists nothing.
	for _, k := range [][2]string{{"r", "k"}, {"r", "k"}, {"r2", "j"}} {
		if got, err := ss.ListSessionKey(bg, "s_a", k[0], k[1]); got != store.Listed || err != nil {
			t.Fatalf("ListSessionKey(s_a, %v): %v %v", k, got, err)
		}
	}
	if got, err := ss.ListSessionKey(bg, "s_none", "r", "k"); got != store.NotListed || err != nil {
		t.Fatalf("ListSessionKey of a missing session: %v %v, want NotListed", got, err)
	}
	// Many nodes end the due sessions at once: each once.
	ended := make(chan string, 16)
	var keysOfA []store.LeaseKey
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			recs, err := ss.EndDueSessions(bg, 100)
			if err != nil {
				t.Errorf("EndDueSessions: %v", err)
			}
			for _, r := range recs {
				ended <- r.ID + " " + r.Lease
				if r.ID == "s_a" {
					keysOfA = r.Keys // one goroutine gets it
				} else if len(r.Keys) != 0 {
					t.Errorf("session %s ended with keys %v, none listed", r.ID, r.Keys)
				}
			}
		}()
	}
	wg.Wait()
	close(ended)
	var got []string
	for e := range ended {
		got = append(got, e)
	}
	sort.Strings(got)
	diff(t, "ended sessions", []string{"s_a session:s_a", "s_b session:s_b"}, got)
	sort.Slice(keysOfA, func(i, j int) bool { return keysOfA[i].Room < keysOfA[j].Room })
	diff(t, "keys listed with s_a", []store.LeaseKey{{Room: "r", Key: "k"}, {Room: "r2", Key: "j"}}, keysOfA)
	if err := ss.ForgetSessionKeys(bg, "s_a"); err != nil {
		t.Fatalf("ForgetSessionKeys: %v", err)
	}
	if got, err := ss.ListSessionKey(bg, "s_a", "r", "late"); got != store.NotListed || err != nil {
		t.Fatalf("ListSessionKey of an ended session: %v %v, want NotListed (the caller deletes the key)", got, err)
	}
	// CurrentKeys reads keys as they are, lease included; missing ones
	// are left out.
	st := ss.(store.Store)
	if _, err := st.Apply(bg, "cur", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "a", Value: []byte("1"), Lease: "session:s_c"}, {Type: store.OpPut, Key: "b", Value: []byte("2")}}}); err != nil {
		t.Fatal(err)
	}
	kvs, err := ss.CurrentKeys(bg, "cur", []string{"a", "missing", "b"})
	if err != nil || len(kvs) != 2 || kvs[0].Key != "a" || kvs[0].Lease != "session:s_c" || kvs[0].ModRev != 1 || kvs[1].Key != "b" || kvs[1].Lease != "" {
		t.Fatalf("CurrentKeys: %+v %v", kvs, err)
	}
	diff(t, "records left", []string{"s_c"}, func() (ids []string) {
		l, _ := ss.ListSessions(bg)
		for _, r := range l {
			ids = append(ids, r.ID)
		}
		return ids
	}())
}
