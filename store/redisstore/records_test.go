package redisstore

import (
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// TestImportRecords: imported TTL leases keep their holder, TTL and
// deadline, list their keys and end at the deadline with them, once even
// when imported twice (a migration run again); an imported session
// without a deadline waits attached to an owner no node is, one with a
// deadline past is due at once.
func TestImportRecords(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	soon := time.Now().Add(time.Second).UnixMilli()
	lease := store.LeaseRecord{ID: "ttl_1", Holder: "bob", TTLms: 30000, Deadline: soon}
	keys := map[string][]store.LeaseKey{"ttl_1": {{Room: "r", Key: "k", ModRev: 3}}}
	sessions := []store.SessionRecord{
		{ID: "s_1", Subject: "ann", ResumeHash: []byte("h1"), Lease: "session:s_1", Owner: "n1", Gen: 4, Listed: true},
		{ID: "s_2", Subject: "cy", ResumeHash: []byte("h2"), Lease: "session:s_2", Deadline: 1},
	}
	for range 2 {
		if err := s.ImportRecords(bg, sessions, []store.LeaseRecord{lease}, keys); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.LeaseRecords(bg); err != nil || !reflect.DeepEqual(got, []store.LeaseRecord{lease}) {
		t.Errorf("LeaseRecords: %+v, %v; want %+v", got, err, lease)
	}
	if st, err := s.KeepAliveLease(bg, "ttl_1", "eve"); err != nil || !st.Alive || st.Holder != "bob" || st.TTL != 30*time.Second {
		t.Errorf("the imported lease: %+v, %v", st, err)
	}
	if ok, err := s.GrantLease(bg, "ttl_2", "bob", time.Minute, 2); !ok || err != nil {
		t.Errorf("bob holds one lease after importing it twice, may grant a second of 2: %v, %v", ok, err)
	}
	owners, err := s.SessionOwners(bg)
	if err != nil || !slices.Equal(owners, []string{importedOwner}) {
		t.Errorf("session owners: %q, %v; want only %q", owners, err, importedOwner)
	}
	due, err := s.EndDueSessions(bg, 10)
	if err != nil || len(due) != 1 || due[0].ID != "s_2" || due[0].Listed {
		t.Errorf("sessions due: %+v, %v; want s_2, unlisted", due, err)
	}
	if ended, err := s.EndDueLeases(bg, 10); err != nil || len(ended) != 0 {
		t.Errorf("leases ended before the deadline: %+v, %v", ended, err)
	}
	time.Sleep(time.Until(time.UnixMilli(soon)) + 10*time.Millisecond)
	ended, err := s.EndDueLeases(bg, 10)
	if err != nil || !reflect.DeepEqual(ended, keys) {
		t.Errorf("leases ended at the deadline: %+v, %v; want %+v", ended, err, keys)
	}
}
