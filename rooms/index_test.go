package rooms

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestIndexAddRemoveKeepsPositions adds watchers with overlapping sets of
// prefixes and removes them in random order, checking after each step
// that every bucket entry sits where its watcher says and that match
// finds exactly the watchers a scan finds.
func TestIndexAddRemoveKeepsPositions(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	x := newIndex()
	var live []*Watcher
	check := func() {
		t.Helper()
		n := 0
		for prefix, es := range x.byPrefix {
			for i, e := range es {
				if e.w.prefixes[e.k] != prefix || e.w.pos[e.k] != int32(i) {
					t.Fatalf("bucket %q[%d]: watcher prefix %q at pos %d", prefix, i, e.w.prefixes[e.k], e.w.pos[e.k])
				}
				n++
			}
		}
		for key, es := range x.byKey {
			for i, e := range es {
				if e.w.prefixes[e.k] != exactSelector(key) || e.w.pos[e.k] != int32(i) {
					t.Fatalf("key bucket %q[%d]: watcher selector %q at pos %d", key, i, e.w.prefixes[e.k], e.w.pos[e.k])
				}
				n++
			}
		}
		want := 0
		for _, w := range live {
			want += len(w.prefixes)
		}
		if n != want {
			t.Fatalf("%d entries in the index, want %d", n, want)
		}
		for _, key := range []string{"a", "ab", "abc", "b7", "c/1/2", "zz", "a1/", "b2/", "c3/", "a1/x"} {
			var got, scan []*Watcher
			x.match(key, func(w *Watcher) { got = append(got, w) })
			for _, w := range live {
				if matchesAny(key, w.prefixes) {
					scan = append(scan, w)
				}
			}
			less := func(a, b *Watcher) int { return strings.Compare(fmt.Sprintf("%p", a), fmt.Sprintf("%p", b)) }
			slices.SortFunc(got, less)
			slices.SortFunc(scan, less)
			if !slices.Equal(got, scan) {
				t.Fatalf("match(%q): %d watchers, scan finds %d", key, len(got), len(scan))
			}
		}
	}
	for step := 0; step < 400; step++ {
		if len(live) > 0 && rng.IntN(3) == 0 {
			i := rng.IntN(len(live))
			w := live[i]
			for k := range w.prefixes {
				x.remove(w, k)
			}
			live = slices.Delete(live, i, i+1)
		} else {
			var ps, keys []string
			for range 1 + rng.IntN(20) {
				ps = append(ps, fmt.Sprintf("%c%d/", 'a'+rng.IntN(3), rng.IntN(30)))
			}
			for range rng.IntN(10) { // exact keys, some covered by a prefix
				keys = append(keys, fmt.Sprintf("%c%d/", 'a'+rng.IntN(3), rng.IntN(30)))
			}
			ps = normalizePrefixes(ps[:rng.IntN(len(ps)+1)], keys)
			w := &Watcher{prefixes: ps, pos: make([]int32, len(ps))}
			for k := range ps {
				x.add(w, k)
			}
			live = append(live, w)
		}
		check()
	}
}
