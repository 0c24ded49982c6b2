package hooks_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/store"
)

// countingReceiver verifies each delivery and counts its revisions, and
// the delay of each from its commit to its arrival.
type countingReceiver struct {
	revs atomic.Int64
	mu   sync.Mutex
	lags []time.Duration
}

func (c *countingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := hooks.VerifyRequest(r, secret, 0, 0)
	if err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var d hooks.Delivery
	if err := json.Unmarshal(body, &d); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	now := time.Now()
	c.mu.Lock()
	for _, rev := range d.Revisions {
		c.lags = append(c.lags, now.Sub(time.UnixMilli(rev.TimeMS)))
	}
	c.mu.Unlock()
	c.revs.Add(int64(len(d.Revisions)))
	_, _ = io.WriteString(w, "ok")
}

func benchStores(b *testing.B) map[string]func() store.Store {
	return map[string]func() store.Store{
		"memory": func() store.Store { return memory(0) },
		"file": func() store.Store {
			st, err := store.OpenFile(store.FileConfig{Path: filepath.Join(b.TempDir(), "db")})
			if err != nil {
				b.Fatal(err)
			}
			return st
		},
	}
}

// BenchmarkWebhookThroughput: revisions/s delivered to a receiver on
// loopback, from a backlog of 32,000 revisions over 16 rooms (one small put
// each) per b.N, with signing, verification and a cursor write per POST.
// With -short (make test's smoke run) the backlog is 1,600 revisions.
func BenchmarkWebhookThroughput(b *testing.B) {
	rooms, perRoom := 16, 2000
	if testing.Short() {
		perRoom = 100
	}
	for _, name := range []string{"memory", "file"} {
		b.Run(name, func(b *testing.B) {
			rc := &countingReceiver{}
			srv := httptest.NewServer(rc)
			defer srv.Close()
			ctx := context.Background()
			for range b.N {
				b.StopTimer()
				st := benchStores(b)[name]()
				backlog(b, st, rooms, perRoom)
				rc.revs.Store(0)
				b.StartTimer()
				w, err := hooks.New(st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: srv.URL}}, Secret: secret, Node: "b"})
				if err != nil {
					b.Fatal(err)
				}
				if err := w.Start(ctx); err != nil {
					b.Fatal(err)
				}
				for rc.revs.Load() < int64(rooms*perRoom) {
					time.Sleep(time.Millisecond)
				}
				b.StopTimer()
				w.Close()
				st.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(b.N*rooms*perRoom)/b.Elapsed().Seconds(), "revisions/s")
		})
	}
}

// backlog commits perRoom puts to each of rooms registered rooms, written
// while no hook runs.
func backlog(b *testing.B, st store.Store, rooms, perRoom int) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for r := range rooms {
		room := fmt.Sprintf("doc:%d", r)
		if _, err := st.Apply(ctx, hooks.InternalRoom, store.Put("room/"+room, []byte("{}"))); err != nil {
			b.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perRoom {
				if _, err := st.Apply(ctx, room, store.Put(fmt.Sprintf("k%d", i%50), []byte(`{"n":1}`))); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkWebhookLag: the delay from commit to arrival at the receiver,
// p50 and p99, under 1,000 writes/s over 10 rooms for 2 s per b.N (0.2 s
// with -short).
func BenchmarkWebhookLag(b *testing.B) {
	writes := 2000
	if testing.Short() {
		writes = 200
	}
	for _, name := range []string{"memory", "file"} {
		b.Run(name, func(b *testing.B) {
			st := benchStores(b)[name]()
			defer st.Close()
			rc := &countingReceiver{}
			srv := httptest.NewServer(rc)
			defer srv.Close()
			ctx := context.Background()
			w, err := hooks.New(st, hooks.Config{Hooks: []hooks.Route{{Pattern: "doc:*", URL: srv.URL}}, Secret: secret, Node: "b"})
			if err != nil {
				b.Fatal(err)
			}
			if err := w.Start(ctx); err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			const rate, rooms = 1000, 10
			total := 0
			for range b.N {
				tick := time.NewTicker(time.Second / rate)
				for i := range writes {
					<-tick.C
					room := fmt.Sprintf("doc:%d", i%rooms)
					if err := w.BeforeApply(ctx, room); err != nil {
						b.Fatal(err)
					}
					go func() {
						if _, err := st.Apply(ctx, room, store.Put(fmt.Sprintf("k%d", i%50), []byte(`{"n":1}`))); err != nil {
							b.Error(err)
						}
					}()
				}
				tick.Stop()
				total += writes
			}
			for rc.revs.Load() < int64(total) {
				time.Sleep(time.Millisecond)
			}
			rc.mu.Lock()
			lags := slices.Clone(rc.lags)
			rc.mu.Unlock()
			slices.Sort(lags)
			b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}
