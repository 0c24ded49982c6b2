package main

// Helpers of the multi-node tests (multinode_test.go): real `statecast
// serve` processes on one redis-server started by store/redistest, Go
// clients (client/) that follow a room across nodes and check the
// revision contract as they go, writers that track which writes were
// acknowledged, and a loopback TCP proxy between a node and Redis that
// can cut the connection or drop only pub/sub pushes.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/cmd/statecast/internal/dockerfile"
	"github.com/statecast/statecast/cmd/statecast/internal/proc"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
	"github.com/statecast/statecast/store/redisstore"
	"github.com/statecast/statecast/store/redistest"
)

// ---------------------------------------------------------------- binary

var (
	helpOnce sync.Once
	mnBin    string // set by statecastBin, for restarts off the test's goroutine
	mnHelp   string // `statecast serve -h`, to see which flags exist
)

// statecastBin returns the statecast binary the Dockerfile builds (built
// once per test process; STATECAST_TEST_RACE=1 builds it with -race).
func statecastBin(t testing.TB) string {
	t.Helper()
	bin := dockerfile.Binary(t)
	helpOnce.Do(func() {
		mnBin = bin
		out, _ := exec.Command(bin, "serve", "-h").CombinedOutput()
		mnHelp = string(out)
	})
	return bin
}

// serveHasFlag reports whether `statecast serve` knows --name.
func serveHasFlag(name string) bool { return strings.Contains(mnHelp, "-"+name+" ") }

func TestMain(m *testing.M) {
	code := m.Run()
	dockerfile.Cleanup()
	os.Exit(code)
}

// pause waits d, or less when ctx ends first.
func pause(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// ---------------------------------------------------------------- nodes

// mnNode is one `statecast serve` process.
type mnNode struct {
	name     string
	redisURL string
	extra    []string
	port     int  // kept across restarts
	rated    bool // at the default --write-rate, not the tests' 100000

	mu     sync.Mutex
	cmd    *exec.Cmd
	out    *proc.Tail
	exited chan struct{}
	url    string // http://127.0.0.1:port
}

func (n *mnNode) HTTP() string { n.mu.Lock(); defer n.mu.Unlock(); return n.url }
func (n *mnNode) WS() string   { return wsURL(n.HTTP()) }

// wsURL is the WebSocket endpoint of the node at httpURL.
func wsURL(httpURL string) string { return "ws" + strings.TrimPrefix(httpURL, "http") + "/v1/ws" }

// start starts the process and waits until it listens and /readyz is 200.
func (n *mnNode) start(t testing.TB) {
	t.Helper()
	statecastBin(t)
	if err := n.restart(); err != nil {
		t.Fatalf("node %s: %v", n.name, err)
	}
}

// restart is start for callers off the test's goroutine, once the binary
// is built.
func (n *mnNode) restart() error {
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		if err = n.tryStart(mnBin); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the old port may linger
	}
	return err
}

func (n *mnNode) tryStart(bin string) error {
	args := []string{"serve", "--addr", "127.0.0.1:" + strconv.Itoa(n.port), "--store", n.redisURL,
		"--node-id", n.name, "--log-level", "warn"}
	if !n.rated {
		args = append(args, "--write-rate", "100000")
	}
	args = append(args, n.extra...)
	cmd := exec.Command(bin, args...)
	out := proc.NewTail(64 << 10)
	cmd.Stderr = out
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			out.Write([]byte(line + "\n"))
			if rest, ok := strings.CutPrefix(line, "statecast listening on "); ok {
				u, _, _ := strings.Cut(rest, " ")
				select {
				case addr <- u:
				default:
				}
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(exited) }()
	var url string
	select {
	case url = <-addr:
	case <-exited:
		return fmt.Errorf("exited before listening; output:\n%s", out)
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("did not listen within 30 s; output:\n%s", out)
	}
	p, _ := strconv.Atoi(url[strings.LastIndex(url, ":")+1:])
	n.mu.Lock()
	n.cmd, n.out, n.exited, n.url, n.port = cmd, out, exited, url, p
	n.mu.Unlock()
	hc := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if resp, err := hc.Get(url + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
	}
	n.kill()
	return fmt.Errorf("%s/readyz not 200 within 20 s; output:\n%s", url, out)
}

func (n *mnNode) signal(sig syscall.Signal, wait time.Duration) {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(wait):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// kill is a crash: SIGKILL, nothing flushed.
func (n *mnNode) kill() { n.signal(syscall.SIGKILL, 10*time.Second) }

// stop is a graceful shutdown (SIGTERM: sockets closed with 1012).
func (n *mnNode) stop() { n.signal(syscall.SIGTERM, 20*time.Second) }

func (n *mnNode) output() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.out == nil {
		return ""
	}
	return n.out.String()
}

// ---------------------------------------------------------------- cluster

type mnOptions struct {
	AOF     bool     // redis-server with appendonly + appendfsync always
	Fsync   string   // with AOF: its appendfsync policy instead of always
	Proxied bool     // every node reaches Redis through its own redisProxy
	Cluster bool     // a 3-master Redis Cluster instead of one redis-server (no AOF, no proxy)
	Args    []string // extra serve flags for every node
}

// mnCluster is a redis-server, N nodes on it, and a redisstore.Store of the
// test's own for reading the room as Redis holds it.
type mnCluster struct {
	t       *testing.T
	redis   *redistest.Server // nil on a cluster
	nodes   []*mnNode
	proxies []*redisProxy // per node when Proxied
	st      *redisstore.Store
	nodeTO  time.Duration // --node-timeout, 0 when the build lacks it
	// ownReads counts the test's own snapshot reads (one HGETALL each),
	// so that commandstats can be corrected for them.
	ownReads atomic.Int64
}

const mnNodeTimeout = 3 * time.Second

func startCluster(t *testing.T, n int, opts mnOptions) *mnCluster {
	t.Helper()
	redistest.Require(t)
	statecastBin(t)
	c := &mnCluster{t: t}
	args := append([]string{"--lease-grace", "1s"}, opts.Args...)
	storeURL := ""
	if opts.Cluster {
		// The seeds as one --store value: the first a URL, the others
		// host:port (redisstore.Config accepts both).
		storeURL = "redis://" + strings.Join(redistest.StartCluster(t, 3).Addrs(), ",")
		args = append(args, "--redis-cluster")
	} else {
		c.redis = redistest.Start(t, redistest.Options{AOF: opts.AOF, Fsync: opts.Fsync})
		storeURL = c.redis.URL()
	}
	if serveHasFlag("node-timeout") {
		c.nodeTO = mnNodeTimeout
		args = append(args, "--node-timeout", mnNodeTimeout.String())
	}
	for i := range n {
		url := storeURL
		if opts.Proxied {
			p := startProxy(t, c.redis.Addr())
			c.proxies = append(c.proxies, p)
			url = "redis://" + p.Addr() + "/0"
		}
		node := &mnNode{name: fmt.Sprintf("n%d", i), redisURL: url, extra: args}
		node.start(t)
		c.nodes = append(c.nodes, node)
	}
	t.Cleanup(func() {
		for _, node := range c.nodes {
			node.kill()
		}
		if t.Failed() {
			for _, node := range c.nodes {
				t.Logf("node %s output (tail):\n%s", node.name, tail(node.output(), 3000))
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := redisstore.New(ctx, redisstore.Config{URL: storeURL, Cluster: opts.Cluster})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c.st = st
	return c
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func (c *mnCluster) httpURLs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.HTTP())
	}
	return out
}

func (c *mnCluster) wsURLs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.WS())
	}
	return out
}

// snapshot reads the room from Redis.
func (c *mnCluster) snapshot(room string) store.Snapshot {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		var s store.Snapshot
		c.ownReads.Add(1)
		if s, err = c.st.Snapshot(ctx, room, ""); err == nil {
			return s
		}
		time.Sleep(100 * time.Millisecond)
	}
	c.t.Fatalf("snapshot of %s from Redis: %v", room, err)
	return store.Snapshot{}
}

// commandCalls returns the calls counters of INFO commandstats, by command
// (lower case: "hgetall", "exec", "xrange", ...).
// wantLoads fails the test unless every node has loaded rooms n times
// (statecast_room_loads_total of its /metrics) since it started.
func (c *mnCluster) wantLoads(when, room string, n int) {
	c.t.Helper()
	for _, node := range c.nodes {
		got, err := node.metric("statecast_room_loads_total")
		if err != nil {
			c.t.Fatal(err)
		}
		if got != float64(n) {
			c.t.Errorf("%s: node %s loaded rooms %v times, want %d (room %s)", when, node.name, got, n, room)
		}
	}
}

// metric reads an unlabelled counter or gauge of the node's /metrics.
func (n *mnNode) metric(name string) (float64, error) {
	resp, err := http.Get(n.HTTP() + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	return 0, fmt.Errorf("node %s: no %s in /metrics", n.name, name)
}

func (c *mnCluster) commandCalls() map[string]int {
	c.t.Helper()
	info, err := redistest.Do(c.redis.Addr(), "INFO", "commandstats")
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string]int{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok {
			continue
		}
		n, _ := strconv.Atoi(strings.Split(rest, ",")[0])
		out[strings.TrimPrefix(name, "cmdstat_")] = n
	}
	return out
}

// ---------------------------------------------------------------- followers

// gate pauses followers between connections while closed.
type gate struct {
	mu sync.Mutex
	ch chan struct{} // nil: open
}

func (g *gate) close() {
	g.mu.Lock()
	if g.ch == nil {
		g.ch = make(chan struct{})
	}
	g.mu.Unlock()
}

func (g *gate) open() {
	g.mu.Lock()
	if g.ch != nil {
		close(g.ch)
		g.ch = nil
	}
	g.mu.Unlock()
}

func (g *gate) wait(ctx context.Context) {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	if ch != nil {
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
}

// follower is a client that watches a whole room and stays on it: when
// its connection ends it resumes from its view's position on the next
// node of urls; when the server ends its subscription it resubscribes on
// the same connection. It checks the revision contract on every message
// (client.View plus: events of a whole-room watch have consecutive
// revisions).
type follower struct {
	name, room string
	urls       []string
	record     bool // keep every revision's events, for comparing orders
	gate       *gate

	mu           sync.Mutex
	idx          int
	moving       bool
	conn         *client.Conn
	view         *client.View
	log          []string // record: one line per event, "rev type key value"
	deliveries   int      // events + coalesced messages
	snapshots    map[string]int
	resumes      int // subscriptions with a position
	replays      int // of those, answered by replay (synced) rather than a snapshot
	unsubscribed int
	errs         []string
	deletes      map[string]int // delete events per key
	lat          []latSample    // record: publish-to-deliver of values carrying ts
	connects     int

	done chan struct{}
}

func newFollower(name, room string, urls []string, start int, record bool, g *gate) *follower {
	return &follower{name: name, room: room, urls: urls, idx: start % len(urls), record: record, gate: g,
		view: client.NewView(), snapshots: map[string]int{}, deletes: map[string]int{}, done: make(chan struct{})}
}

func (f *follower) start(ctx context.Context) { go f.run(ctx) }

func (f *follower) run(ctx context.Context) {
	defer close(f.done)
	for ctx.Err() == nil {
		if f.gate != nil {
			f.gate.wait(ctx)
		}
		f.mu.Lock()
		url := f.urls[f.idx]
		f.mu.Unlock()
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := client.Dial(dctx, url, nil)
		cancel()
		if err != nil {
			f.rotate()
			pause(ctx, time.Duration(20+rand.IntN(80))*time.Millisecond)
			continue
		}
		f.mu.Lock()
		f.conn = conn
		f.connects++
		f.mu.Unlock()
		f.serve(ctx, conn)
		conn.CloseNow()
		f.mu.Lock()
		f.conn = nil
		f.mu.Unlock()
		f.rotate()
	}
}

// rotate picks the next node, unless moveTo chose one.
func (f *follower) rotate() {
	f.mu.Lock()
	if f.moving {
		f.moving = false
	} else {
		f.idx = (f.idx + 1) % len(f.urls)
	}
	f.mu.Unlock()
}

// moveTo closes the connection and resumes on urls[i].
func (f *follower) moveTo(i int) {
	f.mu.Lock()
	f.idx, f.moving = i, true
	conn := f.conn
	f.mu.Unlock()
	if conn != nil {
		conn.Close()
	}
}

func (f *follower) serve(ctx context.Context, conn *client.Conn) {
	for ctx.Err() == nil {
		f.mu.Lock()
		pos := f.view.Position()
		f.mu.Unlock()
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		sub, err := conn.Subscribe(sctx, f.room, client.SubscribeOptions{From: pos})
		cancel()
		if err != nil {
			return
		}
		first := true
		if pos != nil {
			f.mu.Lock()
			f.resumes++
			f.mu.Unlock()
		}
		for {
			m, err := sub.Next(ctx)
			if err != nil {
				break
			}
			f.apply(m, pos != nil && first)
			if m.T != wire.TProgress {
				first = false
			}
		}
		select {
		case <-conn.Done():
			return
		default: // the server ended the subscription: subscribe again
		}
	}
}

func (f *follower) apply(m wire.Message, firstOfResume bool) {
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch m.T {
	case wire.TSnapshot:
		f.snapshots[m.Reason]++
	case wire.TSynced, wire.TEvents:
		if firstOfResume {
			f.replays++
		}
	case wire.TUnsubscribed:
		f.unsubscribed++
	}
	if m.T == wire.TEvents && f.view.Started && m.Rev != f.view.Rev+1 {
		f.errs = append(f.errs, fmt.Sprintf("gap: events at rev %d after rev %d", m.Rev, f.view.Rev))
	}
	if err := f.view.Apply(m); err != nil {
		f.errs = append(f.errs, err.Error())
		return
	}
	if m.T != wire.TEvents && m.T != wire.TCoalesced {
		return
	}
	f.deliveries++
	for _, ev := range m.Events {
		if ev.Type == "delete" {
			f.deletes[ev.Key]++
		}
		if f.record {
			f.log = append(f.log, fmt.Sprintf("%d %s %s %s", m.Rev, ev.Type, ev.Key, ev.Value))
			var v struct {
				W  int   `json:"w"`
				TS int64 `json:"ts"`
			}
			if ev.Type == "put" && json.Unmarshal(ev.Value, &v) == nil && v.TS > 0 {
				f.lat = append(f.lat, latSample{writer: v.W, node: f.idx, d: now.Sub(time.Unix(0, v.TS))})
			}
		}
	}
}

// at reports the follower's position.
func (f *follower) at() (string, uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.view.Epoch, f.view.Rev
}

func (f *follower) status() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Sprintf("%s: node %d, epoch %s rev %d, %d keys, connects %d, deliveries %d, snapshots %v, resumes %d (replay %d), unsubscribed %d, errors %d",
		f.name, f.idx, f.view.Epoch, f.view.Rev, len(f.view.Items), f.connects, f.deliveries, f.snapshots, f.resumes, f.replays, f.unsubscribed, len(f.errs))
}

// startFollowers starts n followers of room, follower i first on node
// i%len(urls); they stop when the test ends.
func startFollowers(t *testing.T, n int, room string, urls []string, record bool, g *gate) []*follower {
	ctx, cancel := context.WithCancel(context.Background())
	fs := make([]*follower, n)
	for i := range fs {
		fs[i] = newFollower(fmt.Sprintf("f%d", i), room, urls, i, record, g)
		fs[i].start(ctx)
	}
	t.Cleanup(func() {
		cancel()
		for _, f := range fs {
			f.mu.Lock()
			conn := f.conn
			f.mu.Unlock()
			if conn != nil {
				conn.CloseNow()
			}
		}
		for _, f := range fs {
			select {
			case <-f.done:
			case <-time.After(10 * time.Second):
				t.Errorf("follower %s did not stop", f.name)
			}
		}
	})
	return fs
}

// waitFollowers waits until every follower is at the room's head in
// Redis, then checks that each view equals the room and that no follower
// saw a break of the revision contract. It returns the snapshot.
func (c *mnCluster) waitFollowers(room string, fs []*follower, within time.Duration) store.Snapshot {
	c.t.Helper()
	snap, behind, diffs := c.converge(room, fs, within)
	if behind != "" {
		c.t.Fatal(behind)
	}
	for _, d := range diffs {
		c.t.Error(d)
	}
	return snap
}

// converge is waitFollowers reporting instead of failing: behind says who
// did not reach the head in time; diffs lists views that differ from the
// room and breaks of the revision contract.
func (c *mnCluster) converge(room string, fs []*follower, within time.Duration) (snap store.Snapshot, behind string, diffs []string) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		snap = c.snapshot(room)
		n := 0
		for _, f := range fs {
			if e, r := f.at(); e != snap.Epoch || r != snap.Rev {
				n++
			}
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			var lines []string
			for i, f := range fs {
				if e, r := f.at(); e != snap.Epoch || r != snap.Rev || i < 3 {
					if len(lines) < 12 {
						lines = append(lines, f.status())
					}
				}
			}
			return snap, fmt.Sprintf("%d of %d followers not at the room's head (epoch %s rev %d) within %v:\n%s",
				n, len(fs), snap.Epoch, snap.Rev, within, strings.Join(lines, "\n")), nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	want := snapshotItems(snap)
	for _, f := range fs {
		f.mu.Lock()
		got := viewItems(f.view)
		errs := append([]string(nil), f.errs...)
		f.errs = nil
		f.mu.Unlock()
		if len(errs) > 0 {
			diffs = append(diffs, fmt.Sprintf("%s broke the revision contract %d times, first: %s", f.name, len(errs), errs[0]))
		}
		if d := diffItems(got, want); d != "" {
			diffs = append(diffs, fmt.Sprintf("%s: view differs from the room in Redis at rev %d: %s", f.name, snap.Rev, d))
		}
	}
	return snap, "", diffs
}

func snapshotItems(s store.Snapshot) []string {
	out := make([]string, 0, len(s.Items))
	for _, kv := range s.Items {
		out = append(out, fmt.Sprintf("%s=%s c%d m%d v%d", kv.Key, kv.Value, kv.CreateRev, kv.ModRev, kv.Version))
	}
	return out
}

func viewItems(v *client.View) []string {
	var out []string
	for _, it := range v.Sorted() {
		out = append(out, fmt.Sprintf("%s=%s c%d m%d v%d", it.Key, it.Value, it.CreateRev, it.ModRev, it.Version))
	}
	return out
}

func diffItems(got, want []string) string {
	g := map[string]bool{}
	for _, s := range got {
		g[s] = true
	}
	w := map[string]bool{}
	for _, s := range want {
		w[s] = true
	}
	var missing, extra []string
	for _, s := range want {
		if !g[s] {
			missing = append(missing, s)
		}
	}
	for _, s := range got {
		if !w[s] {
			extra = append(extra, s)
		}
	}
	if len(missing) == 0 && len(extra) == 0 {
		return ""
	}
	lim := func(x []string) []string {
		if len(x) > 5 {
			return append(x[:5:5], "…")
		}
		return x
	}
	return fmt.Sprintf("%d missing %v, %d extra %v", len(missing), lim(missing), len(extra), lim(extra))
}

// ---------------------------------------------------------------- writers

// opStatus is what a write's reply said.
type opStatus uint8

const (
	opAcked   opStatus = iota + 1
	opFailed           // an error reply other than outcome_unknown: not applied
	opUnknown          // outcome_unknown, or no reply
)

type trackedOp struct {
	seq    int
	del    bool
	start  time.Time
	status opStatus
}

// tracker records every write of the writers, per key, to check at the
// end that no acknowledged write is missing: a key must hold the result of
// its last acknowledged write or of a later write of unknown outcome.
type tracker struct {
	mu      sync.Mutex
	ops     map[string][]trackedOp
	lossEnd time.Time // writes started before this may have been lost with Redis's state
	acked   int
	failed  int
	unknown int
}

func newTracker() *tracker { return &tracker{ops: map[string][]trackedOp{}} }

// lost marks that Redis's state was lost (restart without persistence,
// FLUSHALL) just now: writes started before are no longer checked.
func (tr *tracker) lost() {
	tr.mu.Lock()
	tr.lossEnd = time.Now()
	tr.mu.Unlock()
}

func (tr *tracker) add(key string, op trackedOp) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.ops[key] = append(tr.ops[key], op)
	switch op.status {
	case opAcked:
		tr.acked++
	case opFailed:
		tr.failed++
	default:
		tr.unknown++
	}
}

func (tr *tracker) counts() (acked, failed, unknown int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.acked, tr.failed, tr.unknown
}

// check compares the tracked keys with the room in snap; it returns one
// line per key whose state no sequence of the replies can explain.
func (tr *tracker) check(snap store.Snapshot) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	have := map[string]int{} // key -> seq of its value
	for _, kv := range snap.Items {
		var v struct {
			S int `json:"s"`
		}
		if json.Unmarshal(kv.Value, &v) == nil {
			have[kv.Key] = v.S
		}
	}
	var bad []string
	for key, ops := range tr.ops {
		last := -1
		for i, op := range ops {
			if op.status == opAcked {
				last = i
			}
		}
		if last < 0 || ops[last].start.Before(tr.lossEnd) {
			continue
		}
		seq, present := have[key]
		ok := false
		// The last acknowledged write, or any write of unknown outcome
		// (one given up on may still have committed later).
		for i, op := range ops {
			if op.status == opFailed || op.status == opAcked && i != last {
				continue
			}
			if op.del && !present || !op.del && present && seq == op.seq {
				ok = true
				break
			}
		}
		if !ok {
			st := "absent"
			if present {
				st = fmt.Sprintf("seq %d", seq)
			}
			bad = append(bad, fmt.Sprintf("%s: last acknowledged write seq %d (delete %v) is missing: Redis has %s", key, ops[last].seq, ops[last].del, st))
		}
	}
	sort.Strings(bad)
	return bad
}

// writer writes keys w<id>/k<j> of a room through one node at a time,
// moving to the next node when its connection ends; every 5th write is a
// delete. Values carry the writer, a sequence number and the send time.
type writer struct {
	id       int
	room     string
	urls     []string
	keys     int
	interval time.Duration
	tr       *tracker

	idx  atomic.Int64
	done chan struct{}
}

func startWriters(t *testing.T, n int, room string, urls []string, interval time.Duration, tr *tracker) (stop func()) {
	return startWritersFrom(t, 0, n, room, urls, interval, tr)
}

// startWritersFrom starts writers first..first+n-1, writer i on node i%len(urls).
func startWritersFrom(t *testing.T, first, n int, room string, urls []string, interval time.Duration, tr *tracker) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ws := make([]*writer, n)
	for j := range ws {
		i := first + j
		ws[j] = &writer{id: i, room: room, urls: urls, keys: 8, interval: interval, tr: tr, done: make(chan struct{})}
		ws[j].idx.Store(int64(i % len(urls)))
		go ws[j].run(ctx)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			for _, w := range ws {
				select {
				case <-w.done:
				case <-time.After(15 * time.Second):
					t.Errorf("writer %d did not stop", w.id)
				}
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func (w *writer) run(ctx context.Context) {
	defer close(w.done)
	var conn *client.Conn
	defer func() {
		if conn != nil {
			conn.CloseNow()
		}
	}()
	seq := 0
	for ctx.Err() == nil {
		if conn == nil {
			dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			c, err := client.Dial(dctx, w.urls[w.idx.Load()%int64(len(w.urls))], nil)
			cancel()
			if err != nil {
				w.idx.Add(1)
				pause(ctx, 50*time.Millisecond)
				continue
			}
			conn = c
		}
		seq++
		key := fmt.Sprintf("w%d/k%d", w.id, seq%w.keys)
		op := trackedOp{seq: seq, del: seq%5 == 0, start: time.Now()}
		wctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		var err error
		if op.del {
			_, err = conn.Delete(wctx, w.room, key)
		} else {
			val := fmt.Sprintf(`{"w":%d,"s":%d,"ts":%d}`, w.id, seq, time.Now().UnixNano())
			_, err = conn.Put(wctx, w.room, key, json.RawMessage(val))
		}
		cancel()
		var ce *client.Error
		switch {
		case err == nil:
			op.status = opAcked
		case errors.Is(err, client.ErrOutcomeUnknown):
			op.status = opUnknown
		case errors.As(err, &ce):
			op.status = opFailed
		default:
			op.status = opUnknown
		}
		w.tr.add(key, op)
		select {
		case <-conn.Done():
			conn.CloseNow()
			conn = nil
			w.idx.Add(1)
		default:
		}
		if err != nil {
			pause(ctx, 50*time.Millisecond)
		} else {
			pause(ctx, w.interval)
		}
	}
}

// ---------------------------------------------------------------- proxy

// redisProxy forwards loopback TCP connections to Redis. Cut closes every
// connection and refuses new ones until Restore; DropPushes(true) drops
// the pub/sub messages (smessage, message) Redis sends, and nothing else,
// so a node loses pushes without seeing its connection drop.
type redisProxy struct {
	ln      net.Listener
	target  string
	dropped atomic.Int64
	drop    atomic.Bool

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startProxy(t testing.TB, target string) *redisProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &redisProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *redisProxy) Addr() string { return p.ln.Addr().String() }

func (p *redisProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		u, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut || p.conns == nil {
			p.mu.Unlock()
			c.Close()
			u.Close()
			continue
		}
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(u, c)
			p.closePair(c, u)
		}()
		go func() {
			defer p.wg.Done()
			p.copyReplies(c, u)
			p.closePair(c, u)
		}()
	}
}

func (p *redisProxy) closePair(a, b net.Conn) {
	a.Close()
	b.Close()
	p.mu.Lock()
	if p.conns != nil {
		delete(p.conns, a)
		delete(p.conns, b)
	}
	p.mu.Unlock()
}

// copyReplies copies whole RESP values from Redis to the node, leaving
// out pushes while dropping.
func (p *redisProxy) copyReplies(dst io.Writer, src io.Reader) {
	r := bufio.NewReaderSize(src, 64<<10)
	var buf []byte
	for {
		var err error
		buf, err = redistest.ReadRESP(r, buf[:0])
		if err != nil {
			return
		}
		if p.drop.Load() && isPush(buf) {
			p.dropped.Add(1)
			continue
		}
		if _, err := dst.Write(buf); err != nil {
			return
		}
	}
}

// isPush: a pub/sub message ([s]message channel payload).
func isPush(v []byte) bool {
	if len(v) == 0 || (v[0] != '>' && v[0] != '*') {
		return false
	}
	i := bytes.IndexByte(v, '\n')
	rest := bytes.ToLower(v[i+1:])
	return bytes.HasPrefix(rest, []byte("$8\r\nsmessage\r\n")) || bytes.HasPrefix(rest, []byte("$7\r\nmessage\r\n"))
}

// Cut closes every connection through the proxy and refuses new ones.
func (p *redisProxy) Cut() {
	p.mu.Lock()
	p.cut = true
	conns := p.conns
	p.conns = map[net.Conn]struct{}{}
	p.mu.Unlock()
	for c := range conns {
		c.Close()
	}
}

// Restore accepts connections again.
func (p *redisProxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

func (p *redisProxy) close() {
	p.ln.Close()
	p.Cut()
	p.mu.Lock()
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// ---------------------------------------------------------------- misc

// latSample is one delivery's time from the writer's send to the
// follower, with the writer and the follower's node.
type latSample struct {
	writer, node int
	d            time.Duration
}

func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))]
}
