package storetest

import (
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
)

// testSharedLeases: on a store several nodes share, a TTL lease is a
// record any caller keeps alive or revokes (its holder only), bounded per
// holder; keys attach to a live lease only; a lease whose deadline
// passed is ended by one caller only, which gets its keys; and an ended
// lease's keys stay listed until forgotten.
func testSharedLeases(t *testing.T, s *suite) {
	ls, ok := s.open(t, Config{}).(store.SharedLeases)
	if !ok {
		t.Skip("the store does not implement store.SharedLeases")
	}
	grant := func(id, holder string, ttl time.Duration) bool {
		t.Helper()
		ok, err := ls.GrantLease(bg, id, holder, ttl, 2)
		if err != nil {
			t.Fatalf("GrantLease: %v", err)
		}
		return ok
	}
	holder := func(id string) string {
		t.Helper()
		st, err := ls.Lease(bg, id)
		if err != nil {
			t.Fatalf("Lease: %v", err)
		}
		if !st.Alive {
			return "(ended)"
		}
		return st.Holder
	}
	attach := func(id, key string, rev uint64) bool {
		t.Helper()
		ok, err := ls.AttachLease(bg, id, store.LeaseKey{Room: "r", Key: key, ModRev: rev})
		if err != nil {
			t.Fatalf("AttachLease: %v", err)
		}
		return ok
	}
	if !grant("ttl_a", "alice", time.Minute) || !grant("ttl_b", "alice", time.Minute) {
		t.Fatal("a grant within the bound was refused")
	}
	if grant("ttl_c", "alice", time.Minute) {
		t.Fatal("a third lease granted to a holder bounded to 2")
	}
	if !grant("ttl_x", "bob", time.Minute) {
		t.Fatal("another holder's grant refused")
	}
	if h := holder("ttl_a"); h != "alice" {
		t.Fatalf("holder of ttl_a = %q, want alice", h)
	}
	if st, _ := ls.KeepAliveLease(bg, "ttl_a", "bob"); !st.Alive || st.Holder != "alice" {
		t.Fatalf("keep-alive by another subject: %+v, want alive, held by alice", st)
	}
	if st, err := ls.KeepAliveLease(bg, "ttl_a", "alice"); st != (store.LeaseState{Alive: true, Holder: "alice", TTL: time.Minute}) || err != nil {
		t.Fatalf("keep-alive = %+v, %v; want alice's, 1m", st, err)
	}
	// k1 is written at 7 after 5, but the attaches arrive the other way.
	if !attach("ttl_a", "k1", 7) || !attach("ttl_a", "k2", 6) || !attach("ttl_a", "k1", 5) {
		t.Fatal("attach to a live lease refused")
	}
	if st, keys, _ := ls.RevokeLease(bg, "ttl_a", "bob"); st.Holder != "alice" || len(keys) != 0 {
		t.Fatalf("revoke by another subject: %+v %v", st, keys)
	}
	st, keys, err := ls.RevokeLease(bg, "ttl_a", "alice")
	sort.Slice(keys, func(i, j int) bool { return keys[i].Key < keys[j].Key })
	if err != nil || !st.Alive || st.Holder != "alice" {
		t.Fatalf("revoke: %+v %v", st, err)
	}
	diff(t, "the revoked lease's keys (each at its latest revision)", []store.LeaseKey{{Room: "r", Key: "k1", ModRev: 7}, {Room: "r", Key: "k2", ModRev: 6}}, keys)
	if holder("ttl_a") != "(ended)" || attach("ttl_a", "k3", 8) {
		t.Fatal("a revoked lease is still alive")
	}
	if st, _, _ := ls.RevokeLease(bg, "ttl_a", "alice"); st.Alive {
		t.Fatal("a lease revoked twice")
	}
	// An anonymous holder ("") is a holder like any other.
	if !grant("ttl_anon", "", time.Minute) || holder("ttl_anon") != "" {
		t.Fatal("an anonymous lease is not alive")
	}
	if st, _, err := ls.RevokeLease(bg, "ttl_anon", ""); !st.Alive || err != nil {
		t.Fatalf("revoke of an anonymous lease: %+v %v", st, err)
	}
	if !grant("ttl_c", "alice", time.Minute) {
		t.Fatal("the revoke did not give the holder's count back")
	}

	// A short lease kept alive outlives its TTL; once left alone, of 8
	// callers ending due leases, one gets it, with its keys.
	if !grant("ttl_d", "bob", 300*time.Millisecond) || !attach("ttl_d", "kd", 9) {
		t.Fatal("grant or attach of ttl_d refused")
	}
	for range 6 {
		time.Sleep(100 * time.Millisecond)
		if st, _ := ls.KeepAliveLease(bg, "ttl_d", "bob"); st.Holder != "bob" || !st.Alive {
			t.Fatal("a lease kept alive ended")
		}
	}
	time.Sleep(500 * time.Millisecond)
	var mu sync.Mutex
	got := map[string][][]store.LeaseKey{}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			ended, err := ls.EndDueLeases(bg, 100)
			if err != nil {
				t.Errorf("EndDueLeases: %v", err)
			}
			mu.Lock()
			for id, keys := range ended {
				got[id] = append(got[id], keys)
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	diff(t, "leases ended", map[string][][]store.LeaseKey{"ttl_d": {{{Room: "r", Key: "kd", ModRev: 9}}}}, got)
	if holder("ttl_d") != "(ended)" {
		t.Fatal("an ended lease is still alive")
	}
	ids, err := ls.LeaseIDs(bg)
	sort.Strings(ids)
	if err != nil {
		t.Fatal(err)
	}
	diff(t, "LeaseIDs", []string{"ttl_b", "ttl_c", "ttl_x"}, ids)

	// Ended leases keep their key lists until forgotten.
	pending, err := ls.EndedLeaseKeys(bg, 100)
	if err != nil {
		t.Fatal(err)
	}
	diff(t, "ended leases not yet forgotten", map[string][]store.LeaseKey{
		"ttl_a": keys, "ttl_anon": {}, "ttl_d": {{Room: "r", Key: "kd", ModRev: 9}},
	}, sortedLists(pending))
	for id := range pending {
		if err := ls.ForgetLeaseKeys(bg, id); err != nil {
			t.Fatal(err)
		}
	}
	if pending, _ := ls.EndedLeaseKeys(bg, 100); len(pending) != 0 {
		t.Fatalf("forgotten key lists still listed: %v", pending)
	}
}

func sortedLists(m map[string][]store.LeaseKey) map[string][]store.LeaseKey {
	for _, keys := range m {
		sort.Slice(keys, func(i, j int) bool { return keys[i].Key < keys[j].Key })
	}
	return m
}
