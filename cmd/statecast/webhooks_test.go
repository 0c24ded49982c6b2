package main

// Webhooks under faults, with real processes: `statecast serve` nodes and
// a receiver process (the hidden `statecast webhook-receiver`, which
// verifies every signature and logs what it verified). Whatever fails —
// the receiver down, answering 500, slower than the timeout, killed
// mid-batch; a node SIGKILLed mid-delivery; Redis restarted — every
// committed revision reaches the receiver, in order per room, repeated only
// as a retry of the same revision (hookstest.Check over the receiver's log).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/statecast/statecast/cmd/statecast/internal/proc"
	"github.com/statecast/statecast/server"
	"github.com/statecast/statecast/server/hooks/hookstest"
)

const hookSecret = "webhook-test-secret"

// receiverProc is a `statecast webhook-receiver` process on a fixed port,
// restarted with other answers as a test goes.
type receiverProc struct {
	port   int
	log    string
	cmd    *exec.Cmd
	out    *proc.Tail
	exited chan struct{}
}

func newReceiverProc(t testing.TB) *receiverProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r := &receiverProc{port: port, log: filepath.Join(t.TempDir(), "deliveries.jsonl")}
	t.Cleanup(r.kill)
	return r
}

func (r *receiverProc) URL() string { return fmt.Sprintf("http://127.0.0.1:%d/hook", r.port) }

// start runs the receiver with extra flags (--status, --delay) and waits
// until it listens.
func (r *receiverProc) start(t testing.TB, extra ...string) {
	t.Helper()
	r.kill()
	for attempt := 0; ; attempt++ {
		args := append([]string{"webhook-receiver", "--addr", "127.0.0.1:" + strconv.Itoa(r.port),
			"--secret", hookSecret, "--log", r.log}, extra...)
		cmd := exec.Command(statecastBin(t), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		r.out = proc.NewTail(16 << 10)
		cmd.Stderr = r.out
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.cmd, r.exited = cmd, make(chan struct{})
		listening := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(stdout)
			ok := sc.Scan() && strings.HasPrefix(sc.Text(), "webhook-receiver listening on ")
			listening <- ok
			for sc.Scan() {
			}
		}()
		go func(exited chan struct{}) { _ = cmd.Wait(); close(exited) }(r.exited)
		if <-listening {
			return
		}
		<-r.exited
		if attempt == 50 {
			t.Fatalf("webhook-receiver did not start: %s", r.out)
		}
		time.Sleep(100 * time.Millisecond) // the port may linger
	}
}

// kill is a crash: SIGKILL, whatever request it was handling unanswered.
func (r *receiverProc) kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	<-r.exited
	r.cmd = nil
}

func (r *receiverProc) records(t testing.TB) []hookstest.Record {
	t.Helper()
	b, err := os.ReadFile(r.log)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return hookstest.ReadLog(b)
}

// hookArgs are the serve flags of a webhook to r with short timeouts.
func hookArgs(r *receiverProc) []string {
	return []string{"--webhook", "doc:*=" + r.URL(), "--webhook-secret", hookSecret,
		"--webhook-timeout", "500ms", "--webhook-max-backoff", "300ms", "--webhook-batch", "20"}
}

// hookWriters put to rooms through urls (round robin) until stopped; the
// writes a crash makes fail are simply not committed, or are, and then
// delivered like any other.
func hookWriters(rooms []string, urls func() []string, every time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	hc := &http.Client{Timeout: 2 * time.Second}
	for i, room := range rooms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				us := urls()
				u := fmt.Sprintf("%s/v1/rooms/%s/kv/k%d", us[(i+n)%len(us)], room, n%7)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPut, u, strings.NewReader(strconv.Itoa(n)))
				req.Header.Set("Content-Type", "application/json")
				if resp, err := hc.Do(req); err == nil {
					resp.Body.Close()
				}
				pause(ctx, every)
			}
		}()
	}
	return func() { cancel(); wg.Wait() }
}

// roomRev reads a room's revision through a node.
func roomRev(t *testing.T, url, room string) uint64 {
	t.Helper()
	resp, err := http.Get(url + "/v1/rooms/" + room + "/kv")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var l struct{ Rev uint64 }
	if err := json.NewDecoder(resp.Body).Decode(&l); err != nil {
		t.Fatal(err)
	}
	return l.Rev
}

// inspectHooks reads a node's webhooks from its inspector; a paused node
// does not answer in time.
func inspectHooks(url string) ([]struct{ Claimed bool }, error) {
	resp, err := (&http.Client{Timeout: time.Second}).Get(url + "/v1/admin/inspect")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Hooks []struct{ Claimed bool } `json:"hooks"`
	}
	return r.Hooks, json.NewDecoder(resp.Body).Decode(&r)
}

var _ = server.InspectReply{} // the shape inspectHooks reads

// receiverDown is how long the receiver stays down: 30 s under make soak,
// 2 s in make test.
func receiverDown() time.Duration {
	if *soakFor != 0 || os.Getenv("SOAK") != "" {
		return 30 * time.Second
	}
	return 2 * time.Second
}

// noRaces fails the test when a node built with -race (STATECAST_TEST_RACE=1)
// reported one: a killed node never gets to exit with the race's status.
func noRaces(t *testing.T, nodes ...*mnNode) {
	t.Helper()
	for _, n := range nodes {
		if out := n.output(); strings.Contains(out, "WARNING: DATA RACE") {
			t.Errorf("node %s reported a data race:\n%s", n.name, tail(out, 6000))
		}
	}
}

// waitDelivered waits until the receiver's log passes hookstest.Check for
// every room at its revision (read by rev each time: a write whose client
// gave up may still commit after the writers stopped), and fails the test
// with what is wrong otherwise. It returns what it checked.
func waitDelivered(t *testing.T, r *receiverProc, rooms []string, rev func(room string) uint64, snapshots bool, within time.Duration) map[string]hookstest.Want {
	t.Helper()
	want := map[string]hookstest.Want{}
	if err := hookstest.Wait(within, func() error {
		for _, room := range rooms {
			want[room] = hookstest.Want{Rev: rev(room), Snapshots: snapshots}
		}
		return hookstest.Check(r.records(t), want)
	}); err != nil {
		t.Fatalf("deliveries (%d records): %v", len(r.records(t)), err)
	}
	return want
}

func TestWebhooksUnderReceiverAndNodeFaults(t *testing.T) {
	t.Parallel()
	rcv := newReceiverProc(t)
	rcv.start(t)
	node := &mnNode{name: "n0", redisURL: "file", extra: append([]string{"--data", t.TempDir()}, hookArgs(rcv)...)}
	node.start(t)
	t.Cleanup(func() {
		node.kill()
		if t.Failed() {
			t.Logf("node output:\n%s\nreceiver output:\n%s", tail(node.output(), 3000), rcv.out)
		}
	})
	rooms := []string{"doc:a", "doc:b", "doc:c", "doc:d"}
	stop := hookWriters(rooms, func() []string { return []string{node.HTTP()} }, 5*time.Millisecond)
	defer stop()
	step := func(what string, d time.Duration) { t.Log(what); time.Sleep(d) }

	step("receiver slow (batches in flight), then killed mid-batch", 0)
	rcv.start(t, "--delay", "150ms")
	time.Sleep(500 * time.Millisecond)
	rcv.kill()
	step("receiver down for "+receiverDown().String(), receiverDown())
	rcv.start(t, "--status", "500")
	step("receiver answering 500", time.Second)
	rcv.start(t, "--delay", "1s")
	step("receiver slower than --webhook-timeout (500ms)", 1500*time.Millisecond)
	rcv.start(t, "--delay", "50ms")
	time.Sleep(300 * time.Millisecond)
	step("node SIGKILLed mid-delivery, then restarted", 0)
	node.kill()
	if err := node.restart(); err != nil {
		t.Fatal(err)
	}
	rcv.start(t)
	time.Sleep(500 * time.Millisecond)
	stop()

	want := waitDelivered(t, rcv, rooms, func(room string) uint64 { return roomRev(t, node.HTTP(), room) }, false, 30*time.Second)
	noRaces(t, node)
	t.Logf("delivered: %v in %d POSTs", want, len(rcv.records(t)))
}

func TestWebhooksNodesOnRedis(t *testing.T) {
	t.Parallel()
	rcv := newReceiverProc(t)
	rcv.start(t, "--delay", "20ms")
	c := startCluster(t, 3, mnOptions{AOF: true, Args: hookArgs(rcv)})
	holder := func() int {
		t.Helper()
		found := -1
		for i, n := range c.nodes {
			hs, err := inspectHooks(n.HTTP())
			if err != nil || len(hs) != 1 {
				continue // a node down
			}
			if hs[0].Claimed {
				if found >= 0 {
					t.Fatalf("nodes %d and %d both deliver the hook", found, i)
				}
				found = i
			}
		}
		return found
	}
	rooms := []string{"doc:a", "doc:b", "doc:c"}
	stop := hookWriters(rooms, c.httpURLs, 5*time.Millisecond)
	defer stop()
	time.Sleep(time.Second)
	h := holder()
	if h < 0 {
		t.Fatal("no node delivers the hook")
	}
	t.Logf("node %d delivers; SIGKILL it mid-delivery", h)
	c.nodes[h].kill()
	killed := time.Now()
	// Another node takes over once the claim is silent for --node-timeout.
	if err := hookstest.Wait(3*mnNodeTimeout, func() error {
		if g := holder(); g < 0 || g == h {
			return fmt.Errorf("no other node took the hook over")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(killed)
	t.Logf("taken over %v after the kill (--node-timeout %v)", took.Round(time.Millisecond), mnNodeTimeout)
	if took < mnNodeTimeout*3/5 {
		t.Errorf("taken over after %v: a live holder's claim (renewed every %v) would not have been respected", took, mnNodeTimeout/5)
	}
	t.Log("Redis restarted (AOF: nothing acknowledged is lost)")
	c.redis.Restart(t)
	if err := c.nodes[h].restart(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	stop()
	want := waitDelivered(t, rcv, rooms, func(room string) uint64 { return c.snapshot(room).Rev }, false, 30*time.Second)
	noRaces(t, c.nodes...)
	t.Logf("delivered: %v in %d POSTs", want, len(rcv.records(t)))
}

// Redis restarted without persistence loses every room, the registry and
// the cursors with them: the rooms start new epochs at revision 1, which
// the hook delivers from there (a receiver seeing a new epoch from
// revision 1 knows the room started over empty).
func TestWebhooksRedisLosesItsState(t *testing.T) {
	t.Parallel()
	rcv := newReceiverProc(t)
	rcv.start(t)
	c := startCluster(t, 2, mnOptions{Args: hookArgs(rcv)})
	rooms := []string{"doc:a", "doc:b"}
	stop := hookWriters(rooms, c.httpURLs, 5*time.Millisecond)
	defer stop()
	time.Sleep(time.Second)
	t.Log("Redis restarted without persistence")
	c.redis.Restart(t)
	time.Sleep(2 * time.Second)
	stop()
	// The node delivering may see a room's new epoch before it sees that
	// its claim went with the registry: then it sends a snapshot (epoch)
	// of the emptied room first, which is right too.
	want := waitDelivered(t, rcv, rooms, func(room string) uint64 { return c.snapshot(room).Rev }, true, 30*time.Second)
	epochs := map[string]bool{}
	for _, r := range rcv.records(t) {
		epochs[r.Delivery.Epoch] = true
	}
	if len(epochs) < 2*len(rooms) {
		t.Errorf("deliveries in %d epochs, want the rooms' epochs before and after the restart", len(epochs))
	}
	noRaces(t, c.nodes...)
	t.Logf("delivered: %v in %d POSTs", want, len(rcv.records(t)))
}

// A delivering node paused past the claim timeout (SIGSTOP: a GC pause, a
// frozen VM) is taken over; when it resumes, its cursor writes fail on the
// claim, so it stops delivering: what it sent meanwhile is a repeat of
// revisions, never a gap or a cursor moved past what the new holder saw.
func TestWebhooksPausedHolderIsFenced(t *testing.T) {
	t.Parallel()
	rcv := newReceiverProc(t)
	rcv.start(t, "--delay", "20ms")
	c := startCluster(t, 2, mnOptions{Args: hookArgs(rcv)})
	claimed := func() []int {
		var out []int
		for i, n := range c.nodes {
			if hs, err := inspectHooks(n.HTTP()); err == nil && len(hs) == 1 && hs[0].Claimed {
				out = append(out, i)
			}
		}
		return out
	}
	rooms := []string{"doc:a", "doc:b"}
	var other atomic.Int32 // the node the writers use: never the paused one
	stop := hookWriters(rooms, func() []string { return []string{c.nodes[other.Load()].HTTP()} }, 5*time.Millisecond)
	defer stop()
	time.Sleep(500 * time.Millisecond)
	holders := claimed()
	if len(holders) != 1 {
		t.Fatalf("nodes delivering: %v, want one", holders)
	}
	h := holders[0]
	other.Store(int32(1 - h))
	c.nodes[h].mu.Lock()
	paused := c.nodes[h].cmd.Process
	c.nodes[h].mu.Unlock()
	if err := paused.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// The other node takes over (the paused one cannot answer its
	// inspector meanwhile: claimed() skips it).
	if err := hookstest.Wait(3*mnNodeTimeout, func() error {
		if got := claimed(); len(got) != 1 || got[0] == h {
			return fmt.Errorf("delivering: %v", got)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	if err := paused.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	stop()
	want := waitDelivered(t, rcv, rooms, func(room string) uint64 { return c.snapshot(room).Rev }, false, 30*time.Second)
	if got := claimed(); len(got) != 1 || got[0] == h {
		t.Errorf("after the pause ended, delivering: %v, want only node %d", got, 1-h)
	}
	// Its next claim tick notices (a node just resumed from a pause on a
	// loaded machine may take a while to run it).
	waitUntil(t, 10*time.Second, "the resumed node to notice it lost the claim", func() bool {
		out := c.nodes[h].output()
		return strings.Contains(out, "lost the hook's claim") || strings.Contains(out, "another node took the hook's claim")
	})
	noRaces(t, c.nodes...)
	t.Logf("delivered: %v in %d POSTs", want, len(rcv.records(t)))
}
