package redisstore

import (
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redistest"
)

// The scripts of the build before byte retention (6af5286^), to write as
// an old node does during a rolling deploy or after a rollback.
var (
	//go:embed testdata/prebytes/retain.lua
	preBytesRetainLua string
	//go:embed testdata/prebytes/apply.lua
	preBytesApplyLua string
	preBytesApply    = redis.NewScript(preBytesRetainLua + preBytesApplyLua)
)

// oldPut writes key=val to room as a node of the old build does, with
// commit time at.
func oldPut(t testing.TB, raw *redis.Client, k roomKeys, maxEv int, key, val string, at time.Time, n int, wid ...string) {
	t.Helper()
	w := ""
	if len(wid) > 0 {
		w = wid[0]
	}
	args := []any{"unused-epoch", maxEv, "", "", 60000, 1,
		fmt.Sprint(at.UnixMilli()), fmt.Sprint("old.", n), w, "", 0, 1, "P", key, val, ""}
	v, err := preBytesApply.Run(bg, raw, []string{k.meta, k.kv, k.log, k.wids}, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if r := v[0].([]any); r[0] != "OK" {
		t.Fatalf("old apply: %v", r)
	}
}

// TestUpgradeKeepsPreBytesHistory: a room whose log holds only entries of
// the old build (rolled back, or written by old nodes during a rolling
// deploy) while meta's cum is already past MaxBytes (the new build wrote
// that much in this epoch before). DESIGN says such an entry "counts as
// 0"; the new build's next write should keep them (they are well within
// both bounds), not drop the whole log but the head.
func TestUpgradeKeepsPreBytesHistory(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	const maxEv, maxBytes = 20, 4000
	s := openStore(t, srv.URL(), func(c *Config) {
		c.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: maxEv, MaxBytes: maxBytes}}
	})
	room := "upgrade"
	k := s.keys(room)
	val := strings.Repeat("v", 100)
	for i := range 40 { // the new build: cum ~ 40 × 250 > maxBytes
		mustApply(t, s, room, store.Put(fmt.Sprint("k", i%5), []byte(val)))
	}
	cum, base := metaBytes(t, raw, k)
	t.Logf("after 40 new writes: cum %d, base %d", cum, base)
	// The old build (rolled back): 10 writes, 10 events, ~2,500 bytes.
	const old = 10
	for i := range old - 1 {
		oldPut(t, raw, k, old, fmt.Sprint("k", i%5), val, time.Now(), i)
	}
	// The last of them with a write id, as a client's write whose reply
	// was lost in the deploy: it will retry on a new node.
	oldPut(t, raw, k, old, "retried", "once", time.Now(), old, "wid-1")
	_, revs := streamBytes(t, raw, k)
	t.Logf("after %d old writes: log %v", old, revs)
	// Forward again: one write of the new build.
	res := mustApply(t, s, room, store.Put("k0", []byte(val)))
	_, revs = streamBytes(t, raw, k)
	if len(revs) < old+1 {
		t.Errorf("after one new write: log %v, want the %d old revisions kept before head %d (%d events, ~%d bytes, within %d and %d)",
			revs, old, res.Rev, old+1, (old+1)*250, maxEv, maxBytes)
	}
	if _, err := s.History(bg, room, res.Rev-uint64(old), 0); err != nil {
		t.Errorf("History from %d: %v", res.Rev-uint64(old), err)
	}
	// The retry (without Since) of the write the old node committed at
	// res.Rev-1: a duplicate, not a second commit.
	w := store.Put("retried", []byte("once"))
	w.Wid = "wid-1"
	if r := mustApply(t, s, room, w); !r.Dup {
		t.Errorf("retry of wid-1 (committed at %d): committed again at %d, want Dup", res.Rev-1, r.Rev)
	}
}

// TestReadTrimKeepsPreBytesHistory: the same at read time (trim.lua),
// within one rolling deploy: old nodes wrote the whole log, only its
// oldest entry is past MaxAge, and a new node's read drops all of it,
// head included.
func TestReadTrimKeepsPreBytesHistory(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	const maxEv, maxBytes = 10, 4000
	s := openStore(t, srv.URL(), func(c *Config) {
		c.Retention = store.RetentionPolicy{Default: store.Retention{MaxEvents: maxEv, MaxBytes: maxBytes, MaxAge: time.Minute}}
	})
	room := "readtrim"
	k := s.keys(room)
	val := strings.Repeat("v", 100)
	for i := range 40 {
		mustApply(t, s, room, store.Put(fmt.Sprint("k", i%5), []byte(val)))
	}
	now := time.Now()
	for i := range maxEv { // old nodes push every new entry out; the first is 2 min old
		at := now
		if i == 0 {
			at = now.Add(-2 * time.Minute)
		}
		oldPut(t, raw, k, maxEv, fmt.Sprint("k", i%5), val, at, i)
	}
	_, revs := streamBytes(t, raw, k)
	head := revs[len(revs)-1]
	// A read from the expired revision trims it: the oldest replayable
	// revision is then the second.
	_, err := s.History(bg, room, revs[0], 0)
	var ce *store.CompactedError
	if !errors.As(err, &ce) || ce.Oldest != revs[1] {
		t.Errorf("History from %d (the only one expired): %v, want compacted with oldest %d", revs[0], err, revs[1])
	}
	_, after := streamBytes(t, raw, k)
	if len(after) != maxEv-1 {
		t.Errorf("after the read: log %v, want %v (head %d)", after, revs[1:], head)
	}
}

// TestUpgradeWidsOfAnOlderBuild: during a rolling deploy an older node
// stores a client's id as it came (unscoped, no fingerprint in its log
// entry). A newer node finds it by the write's LegacyWid, so a retry is
// its commit, not a second one; and the id found under its own name (an
// entry without f) matches whatever content comes with it.
func TestUpgradeWidsOfAnOlderBuild(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	s := openStore(t, srv.URL(), nil)
	const room = "mixed"
	k := s.keys(room)
	mustApply(t, s, room, store.Put("k", []byte("new build first")))
	preQuotaPut(t, raw, k, "retried", "once", "c.7") // the build before scoped ids

	retry := store.Put("retried", []byte("once"))
	retry.Wid, retry.LegacyWid = "~scope~c.7", "c.7"
	res := mustApply(t, s, room, retry)
	if !res.Dup || res.Rev != 2 {
		t.Errorf("retry of the older node's write: %+v, want dup at 2", res)
	}
	other := store.Put("retried", []byte("something else"))
	other.Wid = "c.7"
	if res := mustApply(t, s, room, other); !res.Dup || res.Rev != 2 {
		t.Errorf("the older node's id with other content: %+v, want dup at 2 (its entry has no fingerprint)", res)
	}
	// The newer node's entry keeps every field the older one reads.
	fresh := store.Put("k", []byte("v"))
	fresh.Wid = "~scope~c.8"
	at := mustApply(t, s, room, fresh)
	e, err := raw.XRange(bg, k.log, fmt.Sprintf("%d-0", at.Rev), fmt.Sprintf("%d-0", at.Rev)).Result()
	if err != nil || len(e) != 1 {
		t.Fatalf("entry of revision %d: %v %v", at.Rev, e, err)
	}
	if e[0].Values["w"] != fresh.Wid || e[0].Values["f"] != store.FingerprintOf(fresh) {
		t.Errorf("entry fields %v, want w %q and f its fingerprint", e[0].Values, fresh.Wid)
	}
}
