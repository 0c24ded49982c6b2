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
		h, err := ls.LeaseHolder(bg, id)
		if err != nil {
			t.Fatalf("LeaseHolder: %v", err)
		}
		return h
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
	if h, _, _ := ls.KeepAliveLease(bg, "ttl_a", "bob"); h != "alice" {
		t.Fatalf("keep-alive by another subject: holder %q, want alice", h)
	}
	if h, ttl, err := ls.KeepAliveLease(bg, "ttl_a", "alice"); h != "alice" || ttl != time.Minute || err != nil {
		t.Fatalf("keep-alive = %q, %v, %v; want alice, 1m", h, ttl, err)
	}
	if !attach("ttl_a", "k1", 5) || !attach("ttl_a", "k2", 6) || !attach("ttl_a", "k1", 7) {
		t.Fatal("attach to a live lease refused")
	}
	if h, keys, _ := ls.RevokeLease(bg, "ttl_a", "bob"); h != "alice" || len(keys) != 0 {
		t.Fatalf("revoke by another subject: %q %v", h, keys)
	}
	h, keys, err := ls.RevokeLease(bg, "ttl_a", "alice")
	sort.Slice(keys, func(i, j int) bool { return keys[i].Key < keys[j].Key })
	if err != nil || h != "alice" {
		t.Fatalf("revoke: %q %v", h, err)
	}
	diff(t, "the revoked lease's keys", []store.LeaseKey{{Room: "r", Key: "k1", ModRev: 7}, {Room: "r", Key: "k2", ModRev: 6}}, keys)
	if holder("ttl_a") != "" || attach("ttl_a", "k3", 8) {
		t.Fatal("a revoked lease is still alive")
	}
	if h, _, _ := ls.RevokeLease(bg, "ttl_a", "alice"); h != "" {
		t.Fatal("a lease revoked twice")
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
		if h, _, _ := ls.KeepAliveLease(bg, "ttl_d", "bob"); h != "bob" {
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
	if holder("ttl_d") != "" {
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
		"ttl_a": keys, "ttl_d": {{Room: "r", Key: "kd", ModRev: 9}},
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
