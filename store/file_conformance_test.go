package store_test

// The conformance suite imports package store, so it runs from this
// external test package rather than from file_test.go (package store).

import (
	"path/filepath"
	"testing"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/storetest"
)

func TestFileConformance(t *testing.T) {
	storetest.Run(t, storetest.Factory{
		Open: func(t testing.TB, dir string, cfg storetest.Config) store.Store {
			f, err := store.OpenFile(store.FileConfig{
				Path:      filepath.Join(dir, "statecast.db"),
				Limits:    cfg.Limits,
				Retention: cfg.Retention,
				Clock:     cfg.Clock,
			})
			if err != nil {
				t.Fatalf("OpenFile: %v", err)
			}
			return f
		},
		Durable: true,
	})
}
