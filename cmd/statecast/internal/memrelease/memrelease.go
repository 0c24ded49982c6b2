// Package memrelease gives an idle server's spare heap back to the
// operating system.
//
// The Go runtime lets the heap grow to about twice its live size before
// collecting (GOGC=100) and returns freed pages to the system only slowly.
// After a burst (100,000 clients connecting, a large snapshot) a node that
// goes quiet keeps that peak resident: its RSS per idle connection is about
// twice what the connections hold. The Releaser looks every period and,
// when the heap holds much more than is live and little has been allocated
// since its last look, collects and returns the spare at once
// (debug.FreeOSMemory). A busy node is left alone: there the spare is the
// collector's working room, and returning it would cost a collection and
// page faults to take it back.
package memrelease

import (
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
)

// Thresholds: a release is due when the spare heap is at least MinSpare and
// a quarter of the live heap, and the allocations since the last look are
// under a quarter of the spare (the node is idle, not between collections).
const (
	MinSpare      = 8 << 20
	DefaultPeriod = 10 * time.Second
)

// Due reports whether spare bytes of heap beside live bytes, with allocated
// bytes allocated since the last look, are worth returning.
func Due(spare, live, allocated uint64) bool {
	return spare >= MinSpare && spare >= live/4 && allocated < spare/4
}

// Releaser looks at the heap every period until Stop.
type Releaser struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
	// released, if not nil, is told of each release (for logs and tests).
	released func(spare, live uint64)
}

// Start starts a Releaser; released, if not nil, is told of each release.
func Start(period time.Duration, released func(spare, live uint64)) *Releaser {
	r := &Releaser{stop: make(chan struct{}), done: make(chan struct{}), released: released}
	go r.run(period)
	return r
}

// Stop ends the Releaser and waits for it.
func (r *Releaser) Stop() {
	r.once.Do(func() { close(r.stop) })
	<-r.done
}

func (r *Releaser) run(period time.Duration) {
	defer close(r.done)
	t := time.NewTicker(period)
	defer t.Stop()
	samples := newSamples()
	_, _, lastAllocs := samples.read()
	for {
		select {
		case <-r.stop:
			return
		case <-t.C:
		}
		spare, live, allocs := samples.read()
		if Due(spare, live, allocs-lastAllocs) {
			debug.FreeOSMemory()
			if r.released != nil {
				r.released(spare, live)
			}
			_, _, allocs = samples.read()
		}
		lastAllocs = allocs
	}
}

// samples reads the runtime's heap metrics.
type samples []metrics.Sample

const (
	heapFree    = "/memory/classes/heap/free:bytes"    // free, not yet returned
	heapObjects = "/memory/classes/heap/objects:bytes" // live and not yet swept
	heapUnused  = "/memory/classes/heap/unused:bytes"  // reserved for objects, unused
	heapLive    = "/gc/heap/live:bytes"                // marked live by the last GC
	heapAllocs  = "/gc/heap/allocs:bytes"              // allocated since the start
)

func newSamples() samples {
	return samples{{Name: heapFree}, {Name: heapObjects}, {Name: heapUnused}, {Name: heapLive}, {Name: heapAllocs}}
}

// read returns the spare heap (resident heap beyond the live heap), the
// live heap and the bytes allocated so far.
func (s samples) read() (spare, live, allocs uint64) {
	metrics.Read(s)
	var held uint64
	for _, v := range s[:3] {
		held += value(v)
	}
	live, allocs = value(s[3]), value(s[4])
	if held > live {
		spare = held - live
	}
	return spare, live, allocs
}

func value(s metrics.Sample) uint64 {
	if s.Value.Kind() != metrics.KindUint64 {
		return 0 // not known to this runtime
	}
	return s.Value.Uint64()
}
