package rooms

import "slices"

// index finds the watchers whose prefix matches a key with one map lookup
// per distinct prefix length in use, instead of a scan of all watchers:
// a key of length L can only match prefixes of length <= L, and the
// prefix of a given length is key[:length]. Guarded by the room's mutex.
type index struct {
	byPrefix map[string][]entry
	lens     []int       // distinct prefix lengths in use, ascending
	lenCount map[int]int // prefixes in use per length
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
	return &index{byPrefix: make(map[string][]entry), lenCount: make(map[int]int)}
}

// add indexes w under its k-th prefix.
func (x *index) add(w *Watcher, k int) {
	prefix := w.prefixes[k]
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
	ws := x.byPrefix[prefix]
	i := int(w.pos[k])
	if i >= len(ws) || ws[i].w != w || ws[i].k != int32(k) {
		panic("rooms: index out of sync")
	}
	last := ws[len(ws)-1]
	ws[i] = last
	last.w.pos[last.k] = int32(i)
	ws[len(ws)-1] = entry{}
	ws = ws[:len(ws)-1]
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

// match calls fn for every watcher with a prefix of key. A watcher with
// several matching prefixes is passed once per prefix; callers dedupe.
func (x *index) match(key string, fn func(*Watcher)) {
	for _, l := range x.lens {
		if l > len(key) {
			return
		}
		for _, e := range x.byPrefix[key[:l]] {
			fn(e.w)
		}
	}
}

// matchesAny reports whether key starts with one of prefixes.
func matchesAny(key string, prefixes []string) bool {
	for _, p := range prefixes {
		if len(key) >= len(p) && key[:len(p)] == p {
			return true
		}
	}
	return false
}
