package storetest

import (
	"fmt"
	"sort"
	"sync"
	"testing"

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
	)
}
