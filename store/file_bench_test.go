package store

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkFileDurableWrites measures acknowledged (fsynced) writes per
// second with one writer and with 64: group commit should make the second
// many times the first, since 64 writers share each fsync.
func BenchmarkFileDurableWrites(b *testing.B) {
	for _, writers := range []int{1, 64} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			f, err := OpenFile(FileConfig{Path: b.TempDir() + "/statecast.db"})
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			value := bytes.Repeat([]byte("v"), 100)
			var next atomic.Int64
			commits0 := f.commits.Load()
			b.ResetTimer()
			var wg sync.WaitGroup
			for range writers {
				wg.Go(func() {
					for i := next.Add(1); i <= int64(b.N); i = next.Add(1) {
						room := fmt.Sprintf("bench-%d", i%4)
						if _, err := f.Apply(bg, room, Put(fmt.Sprintf("key-%d", i%1000), value)); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "writes/s")
			b.ReportMetric(float64(b.N)/float64(max(1, f.commits.Load()-commits0)), "writes/commit")
		})
	}
}
