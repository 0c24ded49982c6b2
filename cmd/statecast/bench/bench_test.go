package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/statecast/statecast/cmd/statecast/bench/ceiling"
	"github.com/statecast/statecast/cmd/statecast/internal/dockerfile"
	"github.com/statecast/statecast/cmd/statecast/internal/proc"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// statecastBin is the statecast command as the Dockerfile builds it, for
// the tests that spawn it as the load tool does.
func statecastBin(t *testing.T) string { return dockerfile.Binary(t) }

func TestMain(m *testing.M) {
	code := m.Run()
	dockerfile.Cleanup()
	os.Exit(code)
}

// startStatecast starts an in-process statecast node on a memory store
// that takes writes as fast as the load tool sends them (cfg.WriteRate
// unless given), and returns its URL. A given store is shared: two
// nodes on one store act as two nodes of a cluster.
func startStatecast(t *testing.T, cfg server.Config, st store.Store) string {
	t.Helper()
	if cfg.WriteRate == 0 {
		cfg.WriteRate = 1e6
	}
	return servertest.Start(t, servertest.Options{Server: cfg, Store: st,
		Memory: store.MemoryConfig{Retention: store.RetentionPolicy{Default: store.Retention{MaxEvents: 20000}}}}).TS.URL
}

// runJSON runs statecast bench with --json and decodes its result.
func runJSON(t *testing.T, args ...string) *result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var out, errOut bytes.Buffer
	if err := Run(ctx, append(args, "--json"), &out, &errOut); err != nil {
		t.Fatalf("bench %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
	}
	var r result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatalf("bench output %q: %v", out.String(), err)
	}
	if len(r.Notes) > 0 {
		t.Logf("notes: %q", r.Notes)
	}
	return &r
}

// checkFanout asserts the shape of a fanout or rooms result with no loss.
func checkFanout(t *testing.T, r *result, subs int, rate float64) {
	t.Helper()
	if r.Subs != subs {
		t.Errorf("subs = %d, want %d", r.Subs, subs)
	}
	if r.WritesPerS < rate*0.5 || r.WritesPerS > rate*1.5 {
		t.Errorf("writes/s = %.1f, want about %g", r.WritesPerS, rate)
	}
	if r.Delivered <= 0 || r.DeliveredPerS <= 0 {
		t.Errorf("delivered = %d (%.1f/s), want > 0", r.Delivered, r.DeliveredPerS)
	}
	if r.LostSubs != 0 || r.LostMsgs != 0 || r.Disconnected != 0 {
		t.Errorf("lost subs %d, lost msgs %d, disconnected %d; want none (notes %q)", r.LostSubs, r.LostMsgs, r.Disconnected, r.Notes)
	}
	if r.LatencySamples == 0 {
		t.Fatal("no latency samples")
	}
	q := []float64{r.LatencyP50Ms, r.LatencyP99Ms, r.LatencyP999Ms, r.LatencyMaxMs}
	if q[0] <= 0 || !slices.IsSorted(q) {
		t.Errorf("latency p50, p99, p99.9, max = %v ms: want positive and ordered", q)
	}
}

func TestFanoutStatecast(t *testing.T) {
	url := startStatecast(t, server.Config{}, nil)
	// Both protocol versions, one also decoded whole: each subscriber's
	// view is checked against the room, whatever it parsed.
	// The tool's own WebSocket reader (--raw-reader) too.
	for _, extra := range [][]string{{"--protocol", "v1", "--full-decode"}, {"--protocol", "v2"}, {"--protocol", "v2", "--raw-reader"}, {"--protocol", "v1", "--raw-reader"}} {
		r := runJSON(t, append([]string{"fanout", "--url", url, "--subs", "3", "--rate", "50", "--duration", "500ms", "--warmup", "100ms"}, extra...)...)
		checkFanout(t, r, 3, 50)
	}
	// One writer connection: each reply is checked to be the next revision.
	r := runJSON(t, "fanout", "--url", url, "--subs", "5", "--rate", "50", "--duration", "1s", "--warmup", "200ms", "--writers", "1")
	checkFanout(t, r, 5, 50)
	// Every subscriber gets every write: about 5 × 50 per second.
	if r.DeliveredPerS < 0.5*250 || r.DeliveredPerS > 1.5*250 {
		t.Errorf("delivered/s = %.1f, want about 250", r.DeliveredPerS)
	}
	if r.ServerCPUUsPerMsg != 0 || r.ServerRSSMB != 0 {
		t.Errorf("server CPU/RSS reported without a pid: %+v", r)
	}
	if r.Target != "statecast" || r.Scenario != "fanout" || !strings.HasPrefix(r.Command, "statecast bench fanout --url") {
		t.Errorf("result header: %q %q %q", r.Target, r.Scenario, r.Command)
	}
}

// TestBenchFanoutAcrossNodes: with --sub-url the subscribers are on other
// nodes than the writer. Here two servers share one memory store's
// engine, so a write on one is delivered by the other.
func TestFanoutAcrossNodes(t *testing.T) {
	st := store.NewMemory(store.MemoryConfig{})
	writerURL := startStatecast(t, server.Config{}, st)
	subURL := startStatecast(t, server.Config{}, st)
	// --node-pid reports a node's CPU and RSS; both nodes are this process.
	pid := strconv.Itoa(os.Getpid())
	r := runJSON(t, "fanout", "--url", writerURL, "--sub-url", subURL, "--subs", "4", "--rate", "50", "--duration", "1s", "--warmup", "200ms", "--node-pid", pid)
	checkFanout(t, r, 4, 50)
	if len(r.NodeCPUPctEach) != 1 || r.NodeCPUPctEach[0] <= 0 || len(r.NodeRSSMBEach) != 1 || r.NodeRSSMBEach[0] <= 0 {
		t.Errorf("--node-pid: CPU %v %%, RSS %v MB; want one positive figure each", r.NodeCPUPctEach, r.NodeRSSMBEach)
	}
}

// TestBenchWrites: the writes scenario commits exactly --events writes.
func TestWrites(t *testing.T) {
	url := startStatecast(t, server.Config{}, nil)
	r := runJSON(t, "writes", "--url", url, "--events", "300", "--writers", "1", "--window", "1", "--room", "w")
	if r.Events != 300 || r.WritesPerS <= 0 || r.Subs != 1 {
		t.Errorf("writes result %+v", r)
	}
	rev, _, err := (&env{cfg: &config{}, base: url, rest: http.DefaultClient}).roomState(context.Background(), "w")
	if err != nil || rev != 300 {
		t.Errorf("room w at revision %d (%v), want 300: one per write", rev, err)
	}
}

// TestWritesSpread: --rooms spreads the writes over rooms, --write-url
// the writer's connections over nodes, and the window over the
// connections; the latency of each write is reported.
func TestWritesSpread(t *testing.T) {
	st := store.NewMemory(store.MemoryConfig{})
	a, b := startStatecast(t, server.Config{}, st), startStatecast(t, server.Config{}, st)
	r := runJSON(t, "writes", "--url", a, "--write-url", a, "--write-url", b, "--events", "300", "--writers", "4", "--window", "8",
		"--rooms", "3", "--room", "spread")
	if r.Events != 300 || r.Rooms != 3 || r.AckP50Ms <= 0 || r.AckP99Ms < r.AckP50Ms {
		t.Errorf("writes result %+v", r)
	}
	e := &env{cfg: &config{}, base: b, rest: http.DefaultClient}
	for i := range 3 {
		if rev, _, err := e.roomState(context.Background(), "spread-"+strconv.Itoa(i)); err != nil || rev != 100 {
			t.Errorf("room spread-%d at revision %d (%v), want 100", i, rev, err)
		}
	}
}

func TestRoomsStatecast(t *testing.T) {
	url := startStatecast(t, server.Config{}, nil)
	r := runJSON(t, "rooms", "--url", url, "--rooms", "3", "--subs-per-room", "2", "--rate", "60", "--duration", "1s", "--warmup", "200ms", "--room", "rb")
	checkFanout(t, r, 6, 60)
	if r.Rooms != 3 {
		t.Errorf("rooms = %d, want 3", r.Rooms)
	}
	// Each write goes to one room of two subscribers.
	if r.OfferedPerS < 0.5*120 || r.OfferedPerS > 1.5*120 {
		t.Errorf("offered deliveries/s = %.1f, want about 120", r.OfferedPerS)
	}
}

func TestIdleStatecast(t *testing.T) {
	url := startStatecast(t, server.Config{}, nil)
	r := runJSON(t, "idle", "--url", url, "--conns", "20", "--hold", "200ms")
	if r.Conns != 20 || r.Disconnected != 0 || r.LostSubs != 0 || r.ConnectS <= 0 {
		t.Errorf("idle result: %+v", r)
	}
}

// A server that refuses writes stops the run with the reason.
func TestWriterRefused(t *testing.T) {
	url := startStatecast(t, server.Config{WriteRate: 20, WriteBurst: 20}, nil)
	start := time.Now()
	err := Run(context.Background(), []string{"fanout", "--url", url, "--subs", "2", "--rate", "200", "--duration", "10s", "--warmup", "200ms"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "rate_limited") || !strings.Contains(err.Error(), "--write-rate") {
		t.Errorf("fanout above the server's write rate: %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("the run went on for %v after the writer failed", time.Since(start))
	}
}

// Idle subscribers never write: the tool pings them so that the server
// does not close them as silent (after 2 × ping_ms).
func TestIdleKeepsAlive(t *testing.T) {
	url := startStatecast(t, server.Config{PingInterval: 2 * time.Second}, nil)
	r := runJSON(t, "idle", "--url", url, "--conns", "5", "--hold", "5s")
	if r.Disconnected != 0 {
		t.Errorf("%d connections closed while idle: %q", r.Disconnected, r.Notes)
	}
}

func TestResumeStatecast(t *testing.T) {
	url := startStatecast(t, server.Config{}, nil)
	if r := runJSON(t, "resume", "--url", url, "--events", "300", "--repeat", "1", "--protocol", "v1"); r.ResumeComplete != 1 || r.LostMsgs != 0 {
		t.Errorf("resume over protocol v1: complete %d, lost %d (notes %q)", r.ResumeComplete, r.LostMsgs, r.Notes)
	}
	r := runJSON(t, "resume", "--url", url, "--events", "300", "--repeat", "3")
	if r.ResumeComplete != 3 || r.ResumeSnapshots != 0 || r.LostMsgs != 0 {
		t.Errorf("resume: complete %d, snapshots %d, lost %d; want 3, 0, 0 (notes %q)", r.ResumeComplete, r.ResumeSnapshots, r.LostMsgs, r.Notes)
	}
	if len(r.ResumeMs) != 3 || r.ResumeMinMs <= 0 || r.ResumeMinMs > r.ResumeMedianMs || r.ResumeMedianMs > r.ResumeMaxMs {
		t.Errorf("resume times: %v (min %v, median %v, max %v)", r.ResumeMs, r.ResumeMinMs, r.ResumeMedianMs, r.ResumeMaxMs)
	}
}

func TestResumeFallsBackToSnapshot(t *testing.T) {
	// History of 20000 events in the test server: missing more than that
	// comes back as a snapshot, which the tool must say.
	if testing.Short() {
		t.Skip("writes 20k events")
	}
	url := startStatecast(t, server.Config{}, nil)
	r := runJSON(t, "resume", "--url", url, "--events", "20500", "--repeat", "1")
	if r.ResumeSnapshots != 1 || r.ResumeComplete != 0 {
		t.Errorf("resume past history: complete %d, snapshots %d; want 0, 1", r.ResumeComplete, r.ResumeSnapshots)
	}
}

func TestStormStatecast(t *testing.T) {
	url := startStatecast(t, server.Config{}, nil)
	r := runJSON(t, "storm", "--url", url, "--conns", "30", "--storm-writes", "5", "--dial-concurrency", "8")
	if r.StormReplayed != 30 || r.StormSnapshot != 0 || r.LostSubs != 0 {
		t.Errorf("storm: replayed %d, snapshot %d, lost %d; want 30, 0, 0 (notes %q)", r.StormReplayed, r.StormSnapshot, r.LostSubs, r.Notes)
	}
	if r.StormAllS <= 0 || r.StormP50Ms <= 0 || r.StormP50Ms > r.StormP99Ms || r.StormP99Ms > r.StormAllS*1000*1.01 {
		t.Errorf("storm times: all %v s, p50 %v ms, p99 %v ms", r.StormAllS, r.StormP50Ms, r.StormP99Ms)
	}
}

// spawnCeiling are the bench flags that spawn statecast bench ceiling
// from the statecast binary on a free port, as compare does.
func spawnCeiling(t *testing.T) []string {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	return []string{"--url", "http://" + addr, "--spawn", proc.Quote([]string{statecastBin(t), "bench", "ceiling", "-addr", addr, "-batch"})}
}

// The scenarios run against the ceiling in-process, and spawned by the
// tool, which then reads its CPU and RSS.
func TestCeiling(t *testing.T) {
	c := ceiling.New(ceiling.Config{Batch: true})
	ts := httptest.NewServer(c)
	t.Cleanup(func() {
		c.Close()
		ts.Close()
	})
	for name, target := range map[string][]string{"in-process": {"--url", ts.URL}, "spawned": spawnCeiling(t)} {
		target = append(target, "--target", "ceiling")
		t.Run(name, func(t *testing.T) { testCeiling(t, target, name == "spawned") })
	}
}

func testCeiling(t *testing.T, target []string, spawned bool) {
	t.Run("fanout", func(t *testing.T) {
		r := runJSON(t, append([]string{"fanout", "--subs", "5", "--rate", "50", "--duration", "1s", "--warmup", "200ms"}, target...)...)
		checkFanout(t, r, 5, 50)
		if r.Target != "ceiling" {
			t.Errorf("target %q", r.Target)
		}
		raw := runJSON(t, append([]string{"fanout", "--subs", "5", "--rate", "50", "--duration", "1s", "--warmup", "200ms", "--raw-reader"}, target...)...)
		checkFanout(t, raw, 5, 50)
		// CPU: /proc's 10 ms ticks can read 0 for 250 messages (TestCompare).
		if spawned && (r.ServerPID == 0 || r.ServerCPUUsPerMsg < 0 || r.ServerRSSMB <= 0) {
			t.Errorf("spawned server: pid %d, CPU %v µs/msg, RSS %v MB", r.ServerPID, r.ServerCPUUsPerMsg, r.ServerRSSMB)
		}
	})
	t.Run("idle", func(t *testing.T) {
		r := runJSON(t, append([]string{"idle", "--conns", "20", "--hold", "200ms"}, target...)...)
		if r.Conns != 20 || r.Disconnected != 0 {
			t.Errorf("idle: %+v", r)
		}
		if spawned && (r.RSSBeforeMB <= 0 || r.ServerRSSMB < r.RSSBeforeMB) {
			t.Errorf("spawned server: RSS %v → %v MB", r.RSSBeforeMB, r.ServerRSSMB)
		}
	})
	t.Run("resume", func(t *testing.T) {
		r := runJSON(t, append([]string{"resume", "--events", "300", "--repeat", "2"}, target...)...)
		if r.ResumeComplete != 2 || r.LostMsgs != 0 || r.ResumeMedianMs <= 0 {
			t.Errorf("resume: %+v", r)
		}
	})
	t.Run("storm", func(t *testing.T) {
		r := runJSON(t, append([]string{"storm", "--conns", "30", "--storm-writes", "5"}, target...)...)
		if r.StormReplayed != 30 || r.LostSubs != 0 {
			t.Errorf("storm: %+v", r)
		}
	})
	t.Run("rooms", func(t *testing.T) {
		err := Run(context.Background(), append([]string{"rooms"}, target...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "no rooms") {
			t.Errorf("rooms against the ceiling: %v", err)
		}
	})
}

// compare spawns the ceiling and statecast from its own executable: the
// README's commands, in small.
func TestCompare(t *testing.T) {
	cmd := exec.Command(statecastBin(t), "bench", "compare", "fanout", "--subs", "3", "--rate", "50", "--duration", "1s", "--warmup", "200ms", "--json")
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var c comparison
	if err := json.Unmarshal(out, &c); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if c.CeilingErr != "" || c.StatecastErr != "" || c.Ceiling == nil || c.Statecast == nil {
		t.Fatalf("compare: %s", out)
	}
	for _, r := range []*result{c.Ceiling, c.Statecast} {
		checkFanout(t, r, 3, 50)
		// /proc counts CPU in 10 ms ticks: the ceiling's share of 150
		// messages can read 0 (it did on a loaded CI machine), never less.
		if r.ServerPID == 0 || r.ServerCPUUsPerMsg < 0 {
			t.Errorf("%s: pid %d, CPU %v µs/msg: want the spawned server measured", r.Target, r.ServerPID, r.ServerCPUUsPerMsg)
		}
	}
	if !strings.Contains(c.Ceiling.ServerCmd, "bench ceiling") || !strings.Contains(c.Statecast.ServerCmd, " serve ") {
		t.Errorf("servers spawned: %q, %q", c.Ceiling.ServerCmd, c.Statecast.ServerCmd)
	}
	if c.Ratios["delivered msgs/s"] <= 0 {
		t.Errorf("ratios %v", c.Ratios)
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "want one SCENARIO"},
		{[]string{"nope"}, "unknown scenario"},
		{[]string{"fanout", "--target", "redis"}, "--target"},
		{[]string{"fanout", "--url", "http://192.0.2.1:8080"}, "non-loopback"},
		{[]string{"fanout", "--server-pid", "1", "--spawn", "x"}, "not both"},
		{[]string{"fanout", "--room", "a b"}, "--room"},
		{[]string{"fanout", "--rate", "0"}, "--rate"},
		{[]string{"fanout", "--protocol", "v3"}, "--protocol"},
		{[]string{"fanout", "--sub-url", "http://192.0.2.1:8080"}, "--sub-url"},
	} {
		err := Run(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bench %q: error %v, want one containing %q", tc.args, err, tc.want)
		}
	}
	for _, args := range [][]string{{"-h"}, {"fanout", "-h"}, {"compare", "storm", "--help"}} {
		if err := Run(context.Background(), args, io.Discard, io.Discard); err != nil {
			t.Errorf("bench %q: %v", args, err)
		}
	}
	// Flags may come before the scenario, and the URL follows the target.
	c, err := parseFlags([]string{"--target", "ceiling", "storm", "--conns", "7"}, false, io.Discard)
	if err != nil || c.scenario != "storm" || c.conns != 7 || c.url != "http://127.0.0.1:8001" {
		t.Errorf("parse: %+v, %v", c, err)
	}
}

func TestHistQuantiles(t *testing.T) {
	var h latencyHist
	if h.Quantile(0.5) != 0 || h.Count() != 0 {
		t.Fatal("empty histogram")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([]float64, 200000)
	for i := range vals {
		// log-uniform from 1 µs to 10 s
		vals[i] = math.Exp(math.Log(1e3) + rng.Float64()*(math.Log(1e10)-math.Log(1e3)))
		h.Record(time.Duration(vals[i]))
	}
	slices.Sort(vals)
	for _, q := range []float64{0.001, 0.1, 0.5, 0.9, 0.99, 0.999, 0.9999, 1} {
		exact := vals[int(math.Ceil(q*float64(len(vals))))-1]
		got := float64(h.Quantile(q))
		if rel := math.Abs(got-exact) / exact; rel > 0.01 {
			t.Errorf("q%v = %v, exact %v: error %.2f%% > 1%%", q, got, exact, 100*rel)
		}
	}
	if h.Max() != time.Duration(vals[len(vals)-1]) && math.Abs(float64(h.Max())-vals[len(vals)-1]) > 1 {
		t.Errorf("max %v, want %v", h.Max(), vals[len(vals)-1])
	}

	// Merge equals recording everything in one.
	var a, b, all latencyHist
	for i, v := range vals[:1000] {
		if i%2 == 0 {
			a.Record(time.Duration(v))
		} else {
			b.Record(time.Duration(v))
		}
		all.Record(time.Duration(v))
	}
	a.Merge(&b)
	for _, q := range []float64{0.5, 0.99} {
		if a.Quantile(q) != all.Quantile(q) || a.Count() != all.Count() || a.Mean() != all.Mean() {
			t.Errorf("merged q%v = %v, want %v", q, a.Quantile(q), all.Quantile(q))
		}
	}

	// Every value lies in its bucket, buckets are at most 1/128 wide and
	// indexes are monotonic.
	prev := -1
	for v := uint64(0); v < 1<<40; v = v + 1 + v/97 {
		i := histIndex(v)
		lo, hi := histBounds(i)
		if v < histCeiling && (v < lo || v > hi) {
			t.Fatalf("%d in bucket %d = [%d, %d]", v, i, lo, hi)
		}
		if hi-lo > lo/128 {
			t.Fatalf("bucket %d = [%d, %d] too wide", i, lo, hi)
		}
		if i < prev || i >= histBuckets {
			t.Fatalf("index %d of %d after %d", i, v, prev)
		}
		prev = i
	}
	var c latencyHist
	c.Record(-time.Second)
	c.Record(1000 * time.Second)
	if c.Quantile(0) != 0 || c.Max() != 1000*time.Second || c.Quantile(1) > 1000*time.Second {
		t.Errorf("clamping: q0 %v, q1 %v, max %v", c.Quantile(0), c.Quantile(1), c.Max())
	}
}

// The hot-path scanner reads what the server's own encoder writes.
func TestScanServerMessages(t *testing.T) {
	for _, cd := range []wire.Codec{wire.JSON, wire.JSON2} {
		t.Run(cd.Subprotocol(), func(t *testing.T) { testScanServerMessages(t, cd) })
	}
}

func testScanServerMessages(t *testing.T, cd wire.Codec) {
	st := newRunState(false, 10)
	s := newSubscriber(0, 0, 10)
	connected, _ := cd.Append(nil, &wire.Connected{T: wire.TConnected, V: cd.Version(), PingMS: 1000})
	s.statecastMessage(connected, st, 1)
	frame, err := cd.Append(nil, &wire.Snapshot{T: wire.TSnapshot, S: 1, Epoch: "ep1", Rev: 7, Reason: "initial", Items: []wire.Item{
		{Key: "k1", Value: wire.Value(`{"a":"b\"}","key":"k2"}`), CreateRev: 1, ModRev: 7, Version: 2},
		{Key: "other\"key", Value: wire.Value(`[1,2]`), CreateRev: 3, ModRev: 3, Version: 1},
	}})
	if err != nil {
		t.Fatal(err)
	}
	list := cd.AppendEventList(nil, 8, []wire.Event{
		{Type: "put", Key: "k3", Value: wire.Value(`"v8"`), CreateRev: 8, ModRev: 8, Version: 1},
		{Type: "delete", Key: "other\"key", ModRev: 8},
	})
	frame = cd.AppendEvents(frame, wire.TEvents, 1, 8, list)
	list = cd.AppendEventList(nil, 10, []wire.Event{{Type: "put", Key: "k1", Value: wire.Value(`null`), CreateRev: 1, ModRev: 10, Version: 3}})
	frame = cd.AppendEvents(frame, wire.TCoalesced, 1, 10, list)
	frame, _ = cd.Append(frame, &wire.Mark{T: wire.TSynced, S: 1, Rev: 10})

	for _, line := range bytes.Split(frame, []byte("\n")) {
		s.statecastMessage(line, st, 1)
	}
	if s.epoch != "ep1" || s.snapInitial != 1 || s.events != 1 || s.coalesced != 1 || s.synced != 1 || s.lastRev.Load() != 10 {
		t.Errorf("scan: epoch %q snapshots %d events %d coalesced %d synced %d rev %d", s.epoch, s.snapInitial, s.events, s.coalesced, s.synced, s.lastRev.Load())
	}
	if s.gaps != 0 || s.disorder != 0 || s.err != nil {
		t.Errorf("gaps %d disorder %d err %v", s.gaps, s.disorder, s.err)
	}
	room := []roomItem{{Key: "k1", Value: json.RawMessage(`null`)}, {Key: "k3", Value: json.RawMessage(`"v8"`)}}
	if d := s.viewDiff(room); d != "" {
		t.Errorf("view differs: %s", d)
	}
	if d := s.viewDiff(room[:1]); d == "" {
		t.Error("an extra key was not noticed")
	}
	if d := s.viewDiff([]roomItem{room[0], {Key: "k3", Value: json.RawMessage(`"v9"`)}}); d == "" {
		t.Error("a wrong value was not noticed")
	}

	// A missing revision is a gap; a synced beyond what came is one too.
	list = cd.AppendEventList(nil, 12, []wire.Event{{Type: "put", Key: "k2", Value: wire.Value(`1`), CreateRev: 12, ModRev: 12, Version: 1}})
	s.statecastMessage(cd.AppendEvents(nil, wire.TEvents, 1, 12, list), st, 1)
	if s.gaps != 1 {
		t.Errorf("gaps = %d after skipping revision 11", s.gaps)
	}
	b, _ := cd.Append(nil, &wire.Err{T: wire.TErr, ID: 3, Code: "forbidden", Message: "no"})
	s.statecastMessage(b, st, 1)
	if s.err == nil {
		t.Error("err message not reported")
	}

	// The ceiling's messages: offsets must follow each other.
	c := newSubscriber(0, 0, 10)
	st.ceiling = true
	for _, o := range []int{1, 2, 4} {
		c.ceilingMessage([]byte(`{"o":`+strconv.Itoa(o)+`,"d":{"o":99}}`), st, 1)
	}
	if c.lastRev.Load() != 4 || c.gaps != 1 {
		t.Errorf("ceiling: last %d gaps %d, want 4 and 1", c.lastRev.Load(), c.gaps)
	}
}

func TestSkipJSON(t *testing.T) {
	for _, v := range []string{`"a"`, `"a\"b"`, `"a\\"`, `"\\\""`, `""`, `12.5e3`, `true`, `null`,
		`{"a":"}","b":[1,{"c":"]"}]}`, `[["\"]"]]`, `{}`} {
		if n := skipJSON([]byte(v + `,"next":1}`)); n != len(v) {
			t.Errorf("skipJSON(%s…) = %d, want %d", v, n, len(v))
		}
	}
	if n := skipJSON([]byte(`"open`)); n != 5 {
		t.Errorf("unterminated string: %d", n)
	}
}

func TestCompareTable(t *testing.T) {
	c := &comparison{
		Scenario: "fanout", Command: "statecast bench compare fanout",
		Ceiling:   &result{Scenario: "fanout", Target: "ceiling", ServerPID: 10, Subs: 1000, Rate: 1000, DeliveredPerS: 1e6, LatencyP99Ms: 100, ServerCPUUsPerMsg: 1},
		Statecast: &result{Scenario: "fanout", Target: "statecast", ServerPID: 11, Subs: 1000, Rate: 1000, DeliveredPerS: 5e5, LatencyP99Ms: 300, ServerCPUUsPerMsg: 2},
	}
	c.ratios()
	if c.Ratios["delivered msgs/s"] != 0.5 || c.Ratios["latency p99"] != 3 || c.Ratios["server CPU per delivered msg"] != 2 {
		t.Errorf("ratios %v", c.Ratios)
	}
	var out bytes.Buffer
	printComparison(&out, c)
	for _, want := range []string{"statecast/ceiling", "1.000M", "500.0k", "0.50", "3.00", "lost: subscribers"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

func TestFmtNum(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 7: "7", 99999: "99999", 0.1234: "0.123", 1.234: "1.23",
		12.34: "12.3", 123.4: "123", 123456: "123.5k", 999960: "1.000M", 2.5e6: "2.500M", -3.5: "-3.50"} {
		if got := fmtNum(v); got != want {
			t.Errorf("fmtNum(%v) = %q, want %q", v, got, want)
		}
	}
}

func TestHelpers(t *testing.T) {
	if cpu, err := proc.CPU(os.Getpid()); err != nil || cpu < 0 {
		t.Errorf("proc.CPU: %v %v", cpu, err)
	}
	if rss, err := procRSS(os.Getpid()); err != nil || rss <= 0 {
		t.Errorf("procRSS: %v %v", rss, err)
	}
	for seq, payload := range map[uint64]int{0: 100, 123456: 10, 7: 3} {
		v := appendValue(nil, seq, payload)
		var s string
		if err := json.Unmarshal(v, &s); err != nil || (len(v) != payload && payload >= len(strconv.FormatUint(seq, 10))+3) {
			t.Errorf("value of %d at %d bytes: %s (%d bytes, %v)", seq, payload, v, len(v), err)
		}
	}
}
