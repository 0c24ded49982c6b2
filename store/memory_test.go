package store_test

import (
	"testing"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/storetest"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, storetest.Factory{
		// Memory keeps nothing on disk: dir is ignored, and a reopened
		// store is empty with a new epoch.
		Open: func(t testing.TB, dir string, cfg storetest.Config) store.Store {
			return store.NewMemory(store.MemoryConfig{Limits: cfg.Limits, Retention: cfg.Retention, Clock: cfg.Clock})
		},
		Durable: false,
	})
}
