package storetest

import (
	"context"
	"sort"
	"testing"

	"github.com/statecast/statecast/store"
)

// leased lists st's leased keys as "room/key=lease", sorted.
func leased(t testing.TB, st store.Store) []string {
	t.Helper()
	var out []string
	err := st.Leased(context.Background(), func(room string, kv store.KV) error {
		out = append(out, room+"/"+kv.Key+"="+kv.Lease)
		return nil
	})
	if err != nil {
		t.Fatalf("Leased: %v", err)
	}
	sort.Strings(out)
	return out
}

func testLeases(t *testing.T, s *suite) {
	parallel(t,
		namedTest{"PutKeepsLeaseOnKVAndEvents", func(t *testing.T) {
			st := s.open(t, Config{})
			res := apply(t, st, "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "presence/a", Value: []byte("1"), Lease: "L1"}}})
			if res.Events[0].KV.Lease != "L1" {
				t.Fatalf("event lease %q, want L1", res.Events[0].KV.Lease)
			}
			snap := snapshot(t, st, "r", "")
			if len(snap.Items) != 1 || snap.Items[0].Lease != "L1" {
				t.Fatalf("snapshot items %+v, want presence/a with lease L1", snap.Items)
			}
			if h := history(t, st, "r", 1, 0); h[0].Events[0].KV.Lease != "L1" {
				t.Fatalf("history lease %q, want L1", h[0].Events[0].KV.Lease)
			}
		}},
		namedTest{"LeasedListsExactlyLeasedKeys", func(t *testing.T) {
			st := s.open(t, Config{})
			apply(t, st, "r1", store.Write{Ops: []store.Op{
				{Type: store.OpPut, Key: "a", Value: []byte("1"), Lease: "L1"},
				{Type: store.OpPut, Key: "b", Value: []byte("1")},
			}})
			apply(t, st, "r2", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "c", Value: []byte("1"), Lease: "L2"}}})
			diff(t, "leased keys", []string{"r1/a=L1", "r2/c=L2"}, leased(t, st))
		}},
		namedTest{"RewriteWithoutLeaseUnbinds", func(t *testing.T) {
			st := s.open(t, Config{})
			apply(t, st, "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "a", Value: []byte("1"), Lease: "L1"}}})
			put(t, st, "r", "a", "2")
			if got := leased(t, st); len(got) != 0 {
				t.Fatalf("leased after an unleased rewrite: %v", got)
			}
			apply(t, st, "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "a", Value: []byte("3"), Lease: "L2"}}})
			del(t, st, "r", "a")
			if got := leased(t, st); len(got) != 0 {
				t.Fatalf("leased after delete: %v", got)
			}
		}},
		namedTest{"LeasesSurviveRestartWhenDurable", func(t *testing.T) {
			if !s.f.Durable {
				t.Skip("not durable: a reopened store is empty")
			}
			dir := t.TempDir()
			st := s.openDir(t, dir, Config{})
			apply(t, st, "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "a", Value: []byte("1"), Lease: "L1"}}})
			st.Close()
			st = s.openDir(t, dir, Config{})
			diff(t, "leased keys after reopen", []string{"r/a=L1"}, leased(t, st))
		}},
	)
}
