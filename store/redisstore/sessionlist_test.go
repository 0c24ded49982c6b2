package redisstore

import (
	"fmt"
	"testing"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// TestSessionKeyList: a session's key list expires unless listed to (so a
// list its ender never forgets — an older build's — goes), and a session
// that lists more keys than the store keeps stops listing and is ended by
// a scan: its record no longer says Listed, and its list is gone.
func TestSessionKeyList(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	s := openStore(t, srv.URL(), nil)
	raw := rawRedis(t, srv.Addr())
	if err := s.SaveSession(bg, store.SessionRecord{ID: "s_1", Subject: "u", ResumeHash: []byte("h"), Lease: "session:s_1", Listed: true}); err != nil {
		t.Fatal(err)
	}
	list := s.sessionKeyList() + "s_1"
	if got, err := s.ListSessionKey(bg, "s_1", "r", "k0"); got != store.Listed || err != nil {
		t.Fatalf("ListSessionKey: %v %v", got, err)
	}
	if ttl := raw.PTTL(bg, list).Val(); ttl <= 0 || ttl > listTTL {
		t.Errorf("the list's TTL is %v, want up to %v", ttl, listTTL)
	}
	for i := 1; i < maxListedKeys; i++ {
		if got, err := s.ListSessionKey(bg, "s_1", "r", fmt.Sprint("k", i)); got != store.Listed || err != nil {
			t.Fatalf("ListSessionKey %d: %v %v", i, got, err)
		}
	}
	if got, _ := s.ListSessionKey(bg, "s_1", "r", "k0"); got != store.Listed {
		t.Errorf("a key listed again when the list is full: %v, want Listed", got)
	}
	if got, err := s.ListSessionKey(bg, "s_1", "r", "one-more"); got != store.ListFull || err != nil {
		t.Fatalf("ListSessionKey past %d keys: %v %v, want ListFull", maxListedKeys, got, err)
	}
	rec, _, err := s.Session(bg, "s_1")
	if err != nil || rec.Listed {
		t.Errorf("the record of a full list: %+v %v, want Listed false (its end scans)", rec, err)
	}
	if n := raw.Exists(bg, list).Val(); n != 0 {
		t.Errorf("the full list is still there")
	}
	if got, _ := s.ListSessionKey(bg, "s_1", "r", "yet-another"); got != store.ListFull {
		t.Errorf("a key listed after the list filled up: %v, want ListFull", got)
	}
}
