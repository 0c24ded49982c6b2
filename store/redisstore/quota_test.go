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

// The scripts of the build before room quotas (69ceccf): they keep no
// usage in meta, as an old node writes during a rolling deploy.
var (
	//go:embed testdata/prequota/retain.lua
	preQuotaRetainLua string
	//go:embed testdata/prequota/apply.lua
	preQuotaApplyLua string
	preQuotaApply    = redis.NewScript(preQuotaRetainLua + preQuotaApplyLua)
)

// preQuotaPut writes key=val to room as a node of the build before
// quotas (and before scoped write ids) does, with write id wid if given.
func preQuotaPut(t testing.TB, raw *redis.Client, k roomKeys, key, val string, wid ...string) {
	t.Helper()
	w := ""
	if len(wid) > 0 {
		w = wid[0]
	}
	args := []any{"unused-epoch", 1000, "", "", 60000, 1 << 30, 1,
		fmt.Sprint(time.Now().UnixMilli()), "old." + key, w, "", 0, 1, "P", key, val, ""}
	v, err := preQuotaApply.Run(bg, raw, []string{k.meta, k.kv, k.log, k.wids}, args...).Slice()
	if err != nil {
		t.Fatal(err)
	}
	if r := v[0].([]any); r[0] != "OK" {
		t.Fatalf("old apply: %v", r)
	}
}

// wantQuotaError fails unless err is a quota error counting keys and bytes.
func wantQuotaError(t testing.TB, err error, keys, bytes int64) {
	t.Helper()
	var qe *store.QuotaError
	if !errors.As(err, &qe) || qe.Keys != keys || qe.Bytes != bytes {
		t.Fatalf("got %v, want a quota error counting %d keys and %d bytes", err, keys, bytes)
	}
}

// TestUpgradeCountsUsage: a room written before quotas has no usage in
// meta, and one last written by an old node during a rolling deploy has a
// stale one (counted at an older revision): the next write counts the
// room (in HSCAN pages), is held to the quota, and stores the count.
func TestUpgradeCountsUsage(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	raw := rawRedis(t, srv.Addr())
	const keys = 2500 // more than one HSCAN page
	s := openStore(t, srv.URL(), func(c *Config) { c.Limits.MaxRoomKeys = keys + 1 })
	val := strings.Repeat("v", 10)

	t.Run("without usage", func(t *testing.T) {
		room := "prequota"
		k := s.keys(room)
		for i := range keys {
			preQuotaPut(t, raw, k, fmt.Sprintf("k%04d", i), val) // 15 bytes each
		}
		mustApply(t, s, room, store.Put("new", nil))
		_, err := s.Apply(bg, room, store.Put("over", nil))
		wantQuotaError(t, err, keys+2, keys*15+3+4)
		mustApply(t, s, room, store.Delete("new"))
		u, err := raw.HMGet(bg, k.meta, "ukeys", "ubytes", "urev", "rev").Result()
		if err != nil {
			t.Fatal(err)
		}
		if want := []any{fmt.Sprint(keys), fmt.Sprint(keys * 15), fmt.Sprint(keys + 2), fmt.Sprint(keys + 2)}; fmt.Sprint(u) != fmt.Sprint(want) {
			t.Errorf("meta ukeys, ubytes, urev, rev = %v, want %v", u, want)
		}
	})
	t.Run("stale after an old node's write", func(t *testing.T) {
		room := "mixed"
		k := s.keys(room)
		mustApply(t, s, room, store.Put("a", []byte(val)))
		preQuotaPut(t, raw, k, "b", val) // not counted by the old node
		for i := range keys - 2 {
			preQuotaPut(t, raw, k, fmt.Sprintf("k%04d", i), val)
		}
		mustApply(t, s, room, store.Put("c", nil))
		_, err := s.Apply(bg, room, store.Put("d", nil))
		wantQuotaError(t, err, keys+2, 11*2+(keys-2)*15+1+1)
	})
}
