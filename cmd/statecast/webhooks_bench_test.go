package main

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkWebhookProcesses: a `statecast serve` process (file store) with
// a webhook to a receiver process, both on loopback, under 1,000 HTTP
// writes/s over 10 rooms for 3 s per b.N (0.5 s with -short): the delay from each revision's
// commit to its arrival at the receiver (p50, p99), and the revisions/s
// delivered. Run: go test -run '^$' -bench WebhookProcesses -benchtime 1x ./cmd/statecast
func BenchmarkWebhookProcesses(b *testing.B) {
	rcv := newReceiverProc(b)
	rcv.start(b)
	node := &mnNode{name: "bench", redisURL: "file", extra: []string{"--data", b.TempDir(),
		"--webhook", "doc:*=" + rcv.URL(), "--webhook-secret", hookSecret}}
	node.start(b)
	defer node.kill()
	const rate, rooms = 1000, 10
	writes := 3 * rate
	if testing.Short() {
		writes = rate / 2
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 10 * time.Second}
	sem := make(chan struct{}, 256)
	b.ResetTimer()
	for range b.N {
		tick := time.NewTicker(time.Second / rate)
		for i := range writes {
			<-tick.C
			sem <- struct{}{}
			go func() {
				defer func() { <-sem }()
				u := fmt.Sprintf("%s/v1/rooms/doc:%d/kv/k%d", node.HTTP(), i%rooms, i%50)
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, u, strings.NewReader(strconv.Itoa(i)))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := hc.Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
		tick.Stop()
	}
	for range cap(sem) {
		sem <- struct{}{}
	}
	want := b.N * writes
	deadline := time.Now().Add(30 * time.Second)
	var lags []time.Duration
	for time.Now().Before(deadline) {
		lags = lags[:0]
		for _, rec := range rcv.records(b) {
			if rec.Status/100 != 2 {
				continue
			}
			for _, r := range rec.Delivery.Revisions {
				lags = append(lags, time.Duration(rec.Received-r.TimeMS*1000)*time.Microsecond)
			}
		}
		if len(lags) >= want {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.StopTimer()
	if len(lags) < want {
		b.Fatalf("%d of %d revisions delivered", len(lags), want)
	}
	slices.Sort(lags)
	b.ReportMetric(float64(lags[len(lags)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(lags[len(lags)*99/100].Microseconds())/1000, "p99-ms")
	b.ReportMetric(float64(lags[len(lags)-1].Microseconds())/1000, "max-ms")
}
