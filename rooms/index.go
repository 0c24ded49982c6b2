package rooms

import (
	"slices"
	"strings"

	"github.com/google/btree"

	"github.com/statecast/statecast/store"
)

// index finds the watchers whose prefix matches a key with one map lookup
// per distinct prefix length in use, instead of a scan of all watchers:
// a key of length L can only match prefixes of length <= L, and the
// prefix of a given length is key[:length]. A watcher of exact keys is
// found with one more lookup, whatever their lengths. Guarded by the
// room's mutex.
type index struct {
	byPrefix map[string][]entry
	byKey    map[string][]entry // exact-key selectors, by their key
	lens     []int              // distinct prefix lengths in use, ascending
	lenCount map[int]int        // prefixes in use per length
}

// entry is one watcher's k-th prefix in a bucket. Keeping k beside the
// watcher lets remove fix the moved entry's position in O(1): looking the
// prefix up among the watcher's prefixes made unwatching quadratic in a
// watcher's prefix count.
type entry struct {
	w *Watcher
	k int32
}

func newIndex() *index {
	return &index{byPrefix: make(map[string][]entry), byKey: make(map[string][]entry), lenCount: make(map[int]int)}
}

// add indexes w under its k-th prefix.
func (x *index) add(w *Watcher, k int) {
	prefix := w.prefixes[k]
	if key, ok := selectorKey(prefix); ok {
		ws := x.byKey[key]
		w.pos[k] = int32(len(ws))
		x.byKey[key] = append(ws, entry{w: w, k: int32(k)})
		return
	}
	ws := x.byPrefix[prefix]
	if len(ws) == 0 {
		if x.lenCount[len(prefix)] == 0 {
			i, _ := slices.BinarySearch(x.lens, len(prefix))
			x.lens = slices.Insert(x.lens, i, len(prefix))
		}
		x.lenCount[len(prefix)]++
	}
	w.pos[k] = int32(len(ws))
	x.byPrefix[prefix] = append(ws, entry{w: w, k: int32(k)})
}

// remove takes w's k-th prefix out of the index in O(1): the last watcher
// of the bucket moves into its place.
func (x *index) remove(w *Watcher, k int) {
	prefix := w.prefixes[k]
	if key, ok := selectorKey(prefix); ok {
		if ws := removeEntry(x.byKey[key], w, k); len(ws) > 0 {
			x.byKey[key] = ws
		} else {
			delete(x.byKey, key)
		}
		return
	}
	ws := removeEntry(x.byPrefix[prefix], w, k)
	if len(ws) > 0 {
		x.byPrefix[prefix] = ws
		return
	}
	delete(x.byPrefix, prefix)
	if x.lenCount[len(prefix)]--; x.lenCount[len(prefix)] == 0 {
		delete(x.lenCount, len(prefix))
		i, _ := slices.BinarySearch(x.lens, len(prefix))
		x.lens = slices.Delete(x.lens, i, i+1)
	}
}

// removeEntry takes w's k-th entry out of bucket ws in O(1): the last
// watcher of the bucket moves into its place.
func removeEntry(ws []entry, w *Watcher, k int) []entry {
	i := int(w.pos[k])
	if i >= len(ws) || ws[i].w != w || ws[i].k != int32(k) {
		panic("rooms: index out of sync")
	}
	last := ws[len(ws)-1]
	ws[i] = last
	last.w.pos[last.k] = int32(i)
	ws[len(ws)-1] = entry{}
	return ws[:len(ws)-1]
}

// match calls fn for every watcher with a prefix of key, or of key
// itself. A watcher with several matching prefixes is passed once per
// prefix; callers dedupe.
func (x *index) match(key string, fn func(*Watcher)) {
	for _, e := range x.byKey[key] {
		fn(e.w)
	}
	for _, l := range x.lens {
		if l > len(key) {
			return
		}
		for _, e := range x.byPrefix[key[:l]] {
			fn(e.w)
		}
	}
}

// A watcher's selectors (its prefixes) are key prefixes, or exact keys
// spelt as the key followed by NUL, which no key contains: such a
// selector sorts right after its key, before any longer key, and a prefix
// covering its key covers it (normalizePrefixes), so the selectors of a
// watcher stay sorted and disjoint.

// exactSelector is the selector of exactly key.
func exactSelector(key string) string { return key + "\x00" }

// selectorKey returns the key of an exact selector; ok is false for a
// prefix.
func selectorKey(p string) (key string, ok bool) {
	if n := len(p) - 1; n >= 0 && p[n] == 0 {
		return p[:n], true
	}
	return "", false
}

// selects reports whether selector p takes key.
func selects(p, key string) bool {
	if k, ok := selectorKey(p); ok {
		return key == k
	}
	return len(key) >= len(p) && key[:len(p)] == p
}

// matchesAny reports whether one of selectors takes key.
func matchesAny(key string, selectors []string) bool {
	for _, p := range selectors {
		if selects(p, key) {
			return true
		}
	}
	return false
}

// ascend calls fn with the items of view that selector p takes, in key
// order, until fn returns false.
func ascend(view *btree.BTreeG[store.KV], p string, fn func(store.KV) bool) {
	if k, ok := selectorKey(p); ok {
		if kv, found := view.Get(store.KV{Key: k}); found {
			fn(kv)
		}
		return
	}
	view.AscendGreaterOrEqual(store.KV{Key: p}, func(kv store.KV) bool {
		return strings.HasPrefix(kv.Key, p) && fn(kv)
	})
}
