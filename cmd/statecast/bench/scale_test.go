package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"os/exec"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/statecast/statecast/store/redistest"
)

// scaleProc is one `statecast bench scale` process of a test.
type scaleProc struct {
	t   *testing.T
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startScaleProc(t *testing.T, bin string, args ...string) *scaleProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"bench", "scale"}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &scaleProc{t: t, cmd: cmd, in: in, out: bufio.NewScanner(stdout)}
	p.out.Buffer(nil, 4<<20)
	t.Cleanup(func() {
		in.Close() // end of input: the process closes its connections and exits
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("bench scale %v: %v\n%s", args, err, errOut.String())
			}
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("bench scale %v did not exit at the end of its input", args)
		}
	})
	return p
}

// ask sends a command and decodes the report it answers with.
func (p *scaleProc) ask(cmd string) *scaleReport {
	p.t.Helper()
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		p.t.Fatalf("%s: %v", cmd, err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("%s: no answer (%v)", cmd, p.out.Err())
	}
	var r scaleReport
	if err := json.Unmarshal(p.out.Bytes(), &r); err != nil {
		p.t.Fatalf("%s: %q: %v", cmd, p.out.Text(), err)
	}
	if r.Command != cmd && cmd[:4] != "wait" {
		p.t.Fatalf("asked %q, answered %q", cmd, r.Command)
	}
	return &r
}

// askAll asks every process and merges the answers.
func askAll(ps []*scaleProc, cmd string) (*scaleReport, []*scaleReport) {
	var reps []*scaleReport
	for _, p := range ps {
		reps = append(reps, p.ask(cmd))
	}
	return mergeScale(reps), reps
}

// TestScaleOverProcesses runs the scale scenario as scale.sh does, small:
// 3 nodes on one redis-server, 2 client processes from 2 source addresses
// each holding 150 subscribed connections with a session-leased key, a
// marked write to each room, then one node SIGKILLed: every client of it
// resumes on another node with its session, from its position, and its
// key outlives the dead node's sessions.
func TestScaleOverProcesses(t *testing.T) {
	bin := statecastBin(t)
	rs := redistest.Start(t, redistest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var nodes []*spawned
	var urls []string
	for range 3 {
		var sp *spawned
		var u string
		var err error
		for try := 0; sp == nil; try++ { // a port found free may be taken before the node binds it
			if try == 3 {
				t.Fatalf("cannot start a node: %v", err)
			}
			port, perr := freePort()
			if perr != nil {
				t.Fatal(perr)
			}
			u = "http://127.0.0.1:" + strconv.Itoa(port)
			// A dead node's sessions end 1 s after the others notice (2 s):
			// a client that did not resume its session would lose its key
			// within the test.
			sp, err = spawnServer(ctx, []string{bin, "serve", "--store", rs.URL(), "--addr", "127.0.0.1:" + strconv.Itoa(port),
				"--write-rate", "1000000", "--node-timeout", "2s", "--lease-grace", "1s", "--log-level", "warn"}, u+"/readyz", 20*time.Second)
		}
		t.Cleanup(sp.stop)
		nodes = append(nodes, sp)
		urls = append(urls, u)
	}
	const conns, rooms = 300, 3
	var ps []*scaleProc
	for i := range 2 {
		args := []string{"--part", strconv.Itoa(i) + "/2", "--conns", strconv.Itoa(conns), "--rooms", strconv.Itoa(rooms),
			"--room", "sc", "--lease", "--source", "127.0.0." + strconv.Itoa(2+2*i) + "-127.0.0." + strconv.Itoa(3+2*i)}
		for _, u := range urls {
			args = append(args, "--sub-url", u)
		}
		ps = append(ps, startScaleProc(t, bin, args...))
	}

	m, _ := askAll(ps, "wait 20s")
	if m.Ready != conns || m.Conns != conns || m.SubscribedS <= 0 || m.Errors != 0 {
		t.Fatalf("subscribed: %d of %d ready in %.2fs, %d errors (%s)", m.Ready, m.Conns, m.SubscribedS, m.Errors, m.FirstError)
	}
	if want := []int{100, 100, 100}; !slices.Equal(m.ConnsOnNode, want) {
		t.Errorf("connections on the nodes %v, want %v", m.ConnsOnNode, want)
	}
	if m, _ := askAll(ps, "leases"); leaseKeys(m) != conns {
		t.Fatalf("session-leased keys in the store: %d, want %d", leaseKeys(m), conns)
	}

	// mark makes marked write seq to every room, waits until the
	// processes received every delivery (each subscriber one), and
	// returns the merged figures since the last reset.
	mark := func(seq int) *scaleReport {
		t.Helper()
		var out bytes.Buffer
		if err := Run(ctx, []string{"scale-mark", "--url", urls[0], "--rooms", strconv.Itoa(rooms), "--room", "sc",
			"--seq", strconv.Itoa(seq)}, &out, io.Discard); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; {
			if m, _ := askAll(ps, "report"); m.Marks >= conns || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		m, reps := askAll(ps, "reset")
		if want := map[string]int{"1": conns}; !maps.Equal(m.MarksPerConn, want) {
			t.Errorf("mark %d: connections by marked writes received %v, want %v: each exactly once", seq, m.MarksPerConn, want)
		}
		// The merge: counts add up, the histogram holds every delivery,
		// the last delivery is the slowest process's.
		var n uint64
		var last uint64
		for _, r := range reps {
			n += r.MarkLatency.N
			last = max(last, r.MarkLatency.Max)
		}
		if m.Marks != conns || m.MarkLatency.N != n || n != conns || m.MarkLatency.Max != last ||
			m.MarkMaxMs != float64(last)/1e6 || !(0 < m.MarkP50Ms && m.MarkP50Ms <= m.MarkP99Ms && m.MarkP99Ms <= m.MarkMaxMs) {
			t.Errorf("mark %d: merged %d marks, histogram of %d (parts %d), max %v ns (parts' %d), p50/p99/max %.2f/%.2f/%.2f ms",
				seq, m.Marks, m.MarkLatency.N, n, m.MarkLatency.Max, last, m.MarkP50Ms, m.MarkP99Ms, m.MarkMaxMs)
		}
		return m
	}
	mark(1)

	if err := nodes[2].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// The processes see the loss at once (the kernel closes the dead
	// node's sockets); wait for it, then for everyone back.
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m, _ := askAll(ps, "report"); m.Losses >= 100 {
			break
		}
	}
	m, _ = askAll(ps, "wait 15s")
	if m.Ready != conns || m.Losses != 100 || m.Resumes != 100 || m.SessionResumed != 100 || m.SessionNew != 0 ||
		m.Gaps != 0 || m.ConnsOnNode[2] != 0 || m.ResumeAllS <= 0 || m.ResumeLatency.N != 100 {
		t.Fatalf("after the kill: %d of %d ready; %d lost, %d resumed (session kept %d, new %d), %d gaps, on the nodes %v, all back in %.2fs",
			m.Ready, conns, m.Losses, m.Resumes, m.SessionResumed, m.SessionNew, m.Gaps, m.ConnsOnNode, m.ResumeAllS)
	}
	if m.ByReplay+m.BySynced+m.BySnapshot != 100 {
		t.Errorf("resumed by replay %d, synced %d, snapshot %d: want 100 in all", m.ByReplay, m.BySynced, m.BySnapshot)
	}
	// The resumed connections get the next write like the others.
	mark(2)
	// Past the dead node's timeout and its sessions' grace, every key is
	// still there: each session was resumed.
	time.Sleep(4 * time.Second)
	if m, _ := askAll(ps, "leases"); leaseKeys(m) != conns || m.Errors != 0 {
		t.Fatalf("session-leased keys after the kill: %d, want %d (errors %d: %s)", leaseKeys(m), conns, m.Errors, m.FirstError)
	}
}

// leaseKeys is the report's count of session-leased keys (-1: none).
func leaseKeys(m *scaleReport) int {
	if m.LeaseKeys == nil {
		return -1
	}
	return *m.LeaseKeys
}

// TestMergeScale: merging reports gives the figures of one histogram
// holding every value, and adds counts and per-connection tallies.
func TestMergeScale(t *testing.T) {
	var all, a, b latencyHist
	for i := range 1000 {
		d := time.Duration(i*i) * time.Microsecond
		all.Record(d)
		if i%3 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	var ah atomicHist
	for _, c := range []uint64{5, 300, 7} {
		ah.Record(time.Duration(c))
	}
	if j := ah.json(); j.N != 3 || j.Min != 5 || j.Max != 300 || j.Sum != 312 || len(j.Buckets) != 3 {
		t.Errorf("atomicHist: %+v", j)
	}
	ra := &scaleReport{Parts: 1, Conns: 2, Ready: 2, Marks: int64(a.Count()), StartedNs: 100, SubscribedNs: 1100, FirstLostNs: 5000, LastResumedNs: 9000,
		MarksPerConn: map[string]int{"1": 2}, MarkLatency: a.toJSON(), ConnsOnNode: []int{1, 1}}
	rb := &scaleReport{Parts: 1, Conns: 3, Ready: 3, Marks: int64(b.Count()), StartedNs: 50, SubscribedNs: 2050, FirstLostNs: 4000, LastResumedNs: 7000,
		MarksPerConn: map[string]int{"1": 2, "0": 1}, MarkLatency: b.toJSON(), ConnsOnNode: []int{3}}
	var in bytes.Buffer
	for _, r := range []*scaleReport{ra, rb} {
		_ = json.NewEncoder(&in).Encode(r)
	}
	var out bytes.Buffer
	if err := runScaleMerge(&in, &out); err != nil {
		t.Fatal(err)
	}
	var m scaleReport
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	if m.Parts != 2 || m.Conns != 5 || m.Ready != 5 || m.Marks != 1000 || !maps.Equal(m.MarksPerConn, map[string]int{"1": 4, "0": 1}) ||
		!slices.Equal(m.ConnsOnNode, []int{4, 1}) {
		t.Errorf("merged counts: %+v", m)
	}
	if m.MarkP50Ms != ms(all.Quantile(0.5)) || m.MarkP99Ms != ms(all.Quantile(0.99)) || m.MarkMaxMs != ms(all.Max()) || m.MarkLatency.N != 1000 {
		t.Errorf("merged p50/p99/max %v/%v/%v ms, want %v/%v/%v", m.MarkP50Ms, m.MarkP99Ms, m.MarkMaxMs,
			ms(all.Quantile(0.5)), ms(all.Quantile(0.99)), ms(all.Max()))
	}
	if m.SubscribedS != 2000/1e9 || m.ResumeAllS != 5000/1e9 {
		t.Errorf("subscribed in %v s, all resumed in %v s; want 2e-6 and 5e-6", m.SubscribedS, m.ResumeAllS)
	}
}
