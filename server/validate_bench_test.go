package server_test

import (
	"slices"
	"testing"
	"time"

	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/hooks"
	"github.com/statecast/statecast/server/servertest"
)

// BenchmarkValidateHook measures what a validation hook adds to a write:
// one WebSocket puts to a room the hook covers (game:1, a backend on
// loopback that allows at once) and to one it does not (plain:1), in
// turn, and reports each one's latency percentiles and their difference.
// For the README's figure: -benchtime 5000x.
func BenchmarkValidateHook(b *testing.B) {
	backend := newHookBackend(b, func(hooks.ValidateRequest) (int, string) { return 200, allow })
	v, err := hooks.NewValidator(hooks.ValidatorConfig{
		Routes: hooks.Routes{{Pattern: "game:*", URL: backend.srv.URL}}, Secret: hookSecret})
	if err != nil {
		b.Fatal(err)
	}
	n := servertest.Start(b, servertest.Options{Server: server.Config{Validate: v, WriteRate: 1e9}})
	c := dial(b, n, nil)
	ctx := servertest.Context(b)
	with, without := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		for _, room := range []string{"game:1", "plain:1"} {
			start := time.Now()
			if _, err := c.Put(ctx, room, "k", i); err != nil {
				b.Fatal(err)
			}
			if room == "game:1" {
				with = append(with, time.Since(start))
			} else {
				without = append(without, time.Since(start))
			}
		}
	}
	b.StopTimer()
	p := func(ds []time.Duration, q float64) float64 {
		slices.Sort(ds)
		return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))].Microseconds())
	}
	b.ReportMetric(p(without, 0.5), "p50-µs-plain")
	b.ReportMetric(p(without, 0.99), "p99-µs-plain")
	b.ReportMetric(p(with, 0.5), "p50-µs-hooked")
	b.ReportMetric(p(with, 0.99), "p99-µs-hooked")
	b.ReportMetric(p(with, 0.5)-p(without, 0.5), "p50-µs-added")
	b.ReportMetric(p(with, 0.99)-p(without, 0.99), "p99-µs-added")
}
