package redisstore_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
	"github.com/statecast/statecast/store/storetest"
)

// factory opens Redis stores on srvURL; each dir maps to its own key
// prefix, so subtests are isolated and reopening a dir sees its data.
func factory(url string, cluster bool, mods ...func(*redisstore.Config)) storetest.Factory {
	return storetest.Factory{
		Open: func(t testing.TB, dir string, cfg storetest.Config) store.Store {
			sum := sha1.Sum([]byte(dir))
			rc := redisstore.Config{
				URL:           url,
				Cluster:       cluster,
				Prefix:        "t" + hex.EncodeToString(sum[:8]),
				Limits:        cfg.Limits,
				Retention:     cfg.Retention,
				Clock:         cfg.Clock,
				CheckInterval: 200 * time.Millisecond,
			}
			for _, m := range mods {
				m(&rc)
			}
			r, err := redisstore.New(context.Background(), rc)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			return r
		},
		Durable: true,
	}
}

func TestConformance(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	storetest.Run(t, factory(srv.URL(), false))
}

// TestPagedSnapshotConformance runs the suite with every snapshot
// taken in HSCAN pages plus the stream (the path of rooms of more than
// SnapshotPageAbove keys).
func TestPagedSnapshotConformance(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	storetest.Run(t, factory(srv.URL(), false, func(c *redisstore.Config) { c.SnapshotPageAbove = 1 }))
}

// TestClusterConformance runs the whole suite against a local Redis
// Cluster of 3 masters: every room's keys share one hash tag.
func TestClusterConformance(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	storetest.Run(t, factory(strings.Join(c.Addrs(), ","), true))
}
