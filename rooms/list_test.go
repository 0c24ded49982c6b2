package rooms_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/store"
)

// TestListPagesAtOneRevision: the pages of a list, read one after the
// other while writers put, delete and create keys across the whole
// range, are together exactly the room at the first page's revision.
func TestListPagesAtOneRevision(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "pages"
	for i := range 300 {
		put(t, e, room, fmt.Sprintf("k/%03d", i), fmt.Sprint(i))
	}
	put(t, e, room, "other", "1")
	want, err := e.List(ctx, room, "k/", rooms.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	var got []store.KV
	o := rooms.PageOptions{Limit: 17, MaxBytes: 17 * 80}
	for pages := 0; ; pages++ {
		p, err := e.ListPage(ctx, room, "k/", o, rooms.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Rev != want.Rev || len(p.Items) > o.Limit || pages > 300 {
			t.Fatalf("page %d at rev %d with %d items, want rev %d and at most %d", pages, p.Rev, len(p.Items), want.Rev, o.Limit)
		}
		got = append(got, p.Items...)
		if !p.More {
			break
		}
		o.After, o.Rev = p.Items[len(p.Items)-1].Key, p.Rev
		for range 5 { // writes before, inside and after the pages read so far
			k := fmt.Sprintf("k/%03d", rnd.IntN(320))
			if rnd.IntN(3) == 0 {
				del(t, e, room, k)
			} else {
				put(t, e, room, k, "2")
			}
		}
	}
	if diff := cmp.Diff(want.Items, got); diff != "" {
		t.Fatalf("pages differ from the room at rev %d (-want +got):\n%s", want.Rev, diff)
	}
}

// TestListPageBounds: a page stops at its byte bound (with at least one
// key), a revision past the head or older than the history is refused.
func TestListPageBounds(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{Default: store.Retention{MaxEvents: 5}}, rooms.Config{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 5}}})
	for i := range 10 {
		put(t, e, "b", fmt.Sprintf("k%d", i), `"`+fmt.Sprint(i)+`"`)
	}
	p, err := e.ListPage(ctx, "b", "", rooms.PageOptions{MaxBytes: 1}, rooms.ReadOptions{})
	if err != nil || len(p.Items) != 1 || !p.More {
		t.Fatalf("page of 1 byte: %d items, more %v, %v; want 1 item and more", len(p.Items), p.More, err)
	}
	if _, err := e.ListPage(ctx, "b", "", rooms.PageOptions{Rev: 11}, rooms.ReadOptions{}); !errors.Is(err, rooms.ErrFutureRevision) {
		t.Fatalf("rev past the head: %v", err)
	}
	var ce *store.CompactedError
	if _, err := e.ListPage(ctx, "b", "", rooms.PageOptions{Rev: 2}, rooms.ReadOptions{}); !errors.As(err, &ce) {
		t.Fatalf("rev older than the history: %v", err)
	}
	p, err = e.ListPage(ctx, "b", "", rooms.PageOptions{Rev: 6}, rooms.ReadOptions{})
	if err != nil || len(p.Items) != 6 || p.Rev != 6 {
		t.Fatalf("rev 6: %d items at %d, %v; want the 6 keys then", len(p.Items), p.Rev, err)
	}
}

// TestListRanges: the keys of several ranges (overlapping, touching,
// nested, empty, open-ended, in any order) read from one view are those
// of the room in any of them, sorted and each once.
func TestListRanges(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "ranges"
	for i := range 200 {
		put(t, e, room, fmt.Sprintf("k%03d", i*3), "v")
	}
	all, err := e.List(ctx, room, "", rooms.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rnd := rand.New(rand.NewPCG(3, 4))
	key := func() string { return fmt.Sprintf("k%03d", rnd.IntN(620)) }
	for round := range 300 {
		var rs []rooms.KeyRange
		for range 1 + rnd.IntN(5) {
			r := rooms.KeyRange{Lo: key(), Hi: key()}
			switch rnd.IntN(6) {
			case 0:
				r.Hi = "" // to the end
			case 1:
				r.Hi = r.Lo + "\x00" // one key
			case 2:
				r.Lo = "" // from the start
			}
			rs = append(rs, r)
		}
		got, err := e.ListRanges(ctx, room, rs, rooms.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var want []store.KV
		for _, kv := range all.Items {
			for _, r := range rs {
				if kv.Key >= r.Lo && (r.Hi == "" || kv.Key < r.Hi) {
					want = append(want, kv)
					break
				}
			}
		}
		if got.Rev != all.Rev {
			t.Fatalf("round %d: rev %d, want %d", round, got.Rev, all.Rev)
		}
		if diff := cmp.Diff(want, got.Items); diff != "" {
			t.Fatalf("round %d, ranges %q (-want +got):\n%s", round, rs, diff)
		}
	}
}

// TestListPageFromTo: a page bounded by From and To holds the keys of
// that range, at the head or a past revision, and its walk visits no key
// outside it (Keep sees only the range).
func TestListPageFromTo(t *testing.T) {
	ctx := context.Background()
	e, _ := newEngine(t, store.RetentionPolicy{}, rooms.Config{})
	const room = "bounds"
	for i := range 300 {
		put(t, e, room, fmt.Sprintf("k%03d", i), "1")
	}
	past := put(t, e, room, "k000", "2")
	rnd := rand.New(rand.NewPCG(5, 6))
	for i := range 100 { // changes after past, inside and outside the ranges
		k := fmt.Sprintf("k%03d", rnd.IntN(320))
		if i%3 == 0 {
			del(t, e, room, k)
		} else {
			put(t, e, room, k, "3")
		}
	}
	for round := range 200 {
		from, to := fmt.Sprintf("k%03d", rnd.IntN(320)), fmt.Sprintf("k%03d", rnd.IntN(320))
		if rnd.IntN(4) == 0 {
			to = ""
		}
		var rev uint64
		if rnd.IntN(2) == 0 {
			rev = past
		}
		all, err := e.ListPage(ctx, room, "k", rooms.PageOptions{Rev: rev}, rooms.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var want []store.KV
		for _, kv := range all.Items {
			if kv.Key >= from && (to == "" || kv.Key < to) {
				want = append(want, kv)
			}
		}
		keep := func(kv store.KV) bool {
			if kv.Key < from || to != "" && kv.Key >= to {
				t.Fatalf("round %d: the walk of [%q, %q) visited %q", round, from, to, kv.Key)
			}
			return true
		}
		got, err := e.ListPage(ctx, room, "k", rooms.PageOptions{Rev: rev, From: from, To: to, Keep: keep}, rooms.ReadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got.Items); diff != "" {
			t.Fatalf("round %d, [%q, %q) at rev %d (-want +got):\n%s", round, from, to, rev, diff)
		}
	}
}
