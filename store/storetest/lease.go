package storetest

import (
	"context"
	"errors"
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
		namedTest{"KeepLeaseKeepsTheBinding", func(t *testing.T) {
			st := s.open(t, Config{})
			apply(t, st, "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "a", Value: []byte("1"), Lease: "L1"}}})
			res := apply(t, st, "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "a", Value: []byte("2"), KeepLease: true}}})
			if kv := res.Events[0].KV; kv.Lease != "L1" || string(kv.Value) != "2" || kv.Version != 2 {
				t.Fatalf("kept put's event %+v, want value 2 at version 2 under L1", kv)
			}
			if h := history(t, st, "r", 2, 0); h[0].Events[0].KV.Lease != "L1" {
				t.Fatalf("history lease %q, want L1", h[0].Events[0].KV.Lease)
			}
			diff(t, "leased keys", []string{"r/a=L1"}, leased(t, st))
		}},
		namedTest{"KeepLeaseOnUnleasedOrNewKeyBindsNone", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "r", "a", "1")
			res := apply(t, st, "r", store.Write{Ops: []store.Op{
				{Type: store.OpPut, Key: "a", Value: []byte("2"), KeepLease: true},
				{Type: store.OpPut, Key: "b", Value: []byte("3"), KeepLease: true},
			}})
			for _, ev := range res.Events {
				if ev.KV.Lease != "" {
					t.Fatalf("event %+v bound to a lease", ev.KV)
				}
			}
			if got := leased(t, st); len(got) != 0 {
				t.Fatalf("leased: %v, want none", got)
			}
			if snap := snapshot(t, st, "r", ""); len(snap.Items) != 2 || string(snap.Items[1].Value) != "3" {
				t.Fatalf("snapshot %+v, want a=2 and b=3", snap.Items)
			}
		}},
		namedTest{"KeepLeaseInATxn", func(t *testing.T) {
			st := s.open(t, Config{})
			apply(t, st, "r", store.Write{Ops: []store.Op{
				{Type: store.OpPut, Key: "a", Value: []byte("1"), Lease: "L1"},
				{Type: store.OpPut, Key: "b", Value: []byte("1"), Lease: "L2"},
			}})
			res := apply(t, st, "r", store.Write{Conds: []store.Cond{{Key: "a", ModRev: 1}}, Ops: []store.Op{
				{Type: store.OpPut, Key: "a", Value: []byte("2"), KeepLease: true},
				{Type: store.OpPut, Key: "b", Value: []byte("2")},
				{Type: store.OpPut, Key: "c", Value: []byte("2"), Lease: "L3"},
			}})
			if len(res.Events) != 3 || res.Events[0].KV.Lease != "L1" || res.Events[0].Prev.Lease != "L1" {
				t.Fatalf("txn events %+v, want a kept under L1", res.Events)
			}
			diff(t, "leased keys", []string{"r/a=L1", "r/c=L3"}, leased(t, st))
		}},
		namedTest{"KeepValueAndMustExist", func(t *testing.T) {
			st := s.open(t, Config{})
			put(t, st, "r", "a", "1")
			res := apply(t, st, "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "a", KeepValue: true, Lease: "L1"}}})
			if kv := res.Events[0].KV; string(kv.Value) != "1" || kv.Lease != "L1" || kv.ModRev != 2 {
				t.Fatalf("kept value's event %+v, want value 1 under L1 at 2", kv)
			}
			for _, op := range []store.Op{
				{Type: store.OpPut, Key: "b", KeepValue: true},
				{Type: store.OpPut, Key: "b", Value: []byte("1"), KeepLease: true, MustExist: true},
			} {
				_, err := st.Apply(context.Background(), "r", store.Write{Ops: []store.Op{{Type: store.OpPut, Key: "c", Value: []byte("1")}, op}})
				if !errors.Is(err, store.ErrKeyNotFound) {
					t.Fatalf("put %+v of a missing key: %v, want ErrKeyNotFound", op, err)
				}
			}
			if h := head(t, st, "r"); h != 2 {
				t.Fatalf("head %d after refused writes, want 2", h)
			}
			if snap := snapshot(t, st, "r", ""); len(snap.Items) != 1 {
				t.Fatalf("snapshot %+v: a refused write wrote", snap.Items)
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
