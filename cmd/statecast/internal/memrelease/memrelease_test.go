package memrelease

import (
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDue(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		spare, live, allocated uint64
		due                    bool
	}{
		{spare: 64 * mib, live: 100 * mib, allocated: 0, due: true},
		{spare: 64 * mib, live: 100 * mib, allocated: 15 * mib, due: true},
		{spare: 64 * mib, live: 100 * mib, allocated: 16 * mib, due: false}, // busy: the spare is the collector's room
		{spare: 4 * mib, live: 1 * mib, allocated: 0, due: false},           // too little to bother
		{spare: 20 * mib, live: 100 * mib, allocated: 0, due: false},        // under a quarter of live
		{spare: 25 * mib, live: 100 * mib, allocated: 0, due: true},
	} {
		if got := Due(c.spare, c.live, c.allocated); got != c.due {
			t.Errorf("Due(spare %d MiB, live %d MiB, allocated %d MiB) = %v, want %v", c.spare/mib, c.live/mib, c.allocated/mib, got, c.due)
		}
	}
}

var keep [][]byte

// After a burst that left a large spare heap, an idle process returns it.
func TestReleaserReturnsSpareHeap(t *testing.T) {
	for i := 0; i < 256; i++ { // 64 MiB, then dropped
		keep = append(keep, make([]byte, 256<<10))
	}
	keep = nil
	runtime.GC()
	released := make(chan uint64, 8)
	r := Start(50*time.Millisecond, func(spare, live uint64) { released <- spare })
	defer r.Stop()
	before := returned()
	select {
	case spare := <-released:
		if spare < MinSpare {
			t.Fatalf("released a spare of %d bytes, under MinSpare", spare)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no release of a 64 MiB spare heap within 10 s")
	}
	if after := returned(); after < before+MinSpare {
		t.Fatalf("heap returned to the system: %d bytes before, %d after", before, after)
	}
}

// returned is the heap memory returned to the system.
func returned() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
