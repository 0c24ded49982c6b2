package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/cmd/statecast/internal/proc"
)

// statecast bench attack --attack NAME: one client trying to take the
// server's CPU, memory or file descriptors. Each attack is a small
// function; around it the server's CPU time, peak RSS and peak open fds
// are sampled from /proc every 100 ms, and a well-behaved bystander
// client measures what the others see meanwhile.

// attackSpec is one attack: its function and the bystander that suits it.
type attackSpec struct {
	name string
	// httpBystander: the bystander polls /healthz and opens WebSockets on
	// fresh connections (for attacks on connections and fds); otherwise it
	// writes and waits for its event on a WebSocket (attacks on CPU and
	// memory).
	httpBystander bool
	run           func(e *env, ctx context.Context, rep *attackReport) error
}

// sameRoom are the attacks whose WebSocket bystander writes in the
// attack's room (rep.room), not in a room of its own.
var sameRoom = map[string]bool{"cel-equality": true}

var attackSpecs = []attackSpec{
	{"unsub-prefixes", false, (*env).attackUnsubPrefixes},
	{"history-bytes", false, (*env).attackHistoryBytes},
	{"slow-body", true, (*env).attackSlowBody},
	{"sse-flood", true, (*env).attackSSEFlood},
	{"http-write-rate", false, (*env).attackHTTPWriteRate},
	{"cel-equality", false, (*env).attackCELEquality},
	{"etcd-txn-ranges", false, (*env).attackEtcdTxnRanges},
	{"etcd-watch-noread", false, (*env).attackEtcdWatchNoRead},
	{"etcd-idle", true, (*env).attackEtcdIdle},
	{"snapshot-amplify", false, (*env).attackSnapshotAmplify},
	{"room-growth", false, (*env).attackRoomGrowth},
	{"none", false, (*env).attackNone},
}

func attackNames() string {
	var n []string
	for _, a := range attackSpecs {
		n = append(n, a.name)
	}
	return strings.Join(n, ", ")
}

const (
	bystanderEvery   = 50 * time.Millisecond
	bystanderTimeout = 10 * time.Second // an operation slower than this is a failure
	samplerEvery     = 100 * time.Millisecond
	// minAttackWindow: the measurement lasts at least this long, so the
	// bystander has run even when the server refuses an attack at once.
	minAttackWindow = time.Second
)

// attackReport is what one attack measured. Server figures are -1 (and
// left out) when the server's pid is unknown.
type attackReport struct {
	Attack  string         `json:"attack"`
	Params  string         `json:"params"`
	Outcome []string       `json:"outcome"`          // what the attacker got
	Counts  map[string]int `json:"counts,omitempty"` // replies and connections by kind

	DurationS   float64 `json:"duration_s"` // of the attack itself
	WindowS     float64 `json:"window_s"`   // measured: at least minAttackWindow
	ServerCPUS  float64 `json:"server_cpu_s"`
	RSSBeforeMB float64 `json:"server_rss_before_mb"`
	RSSPeakMB   float64 `json:"server_rss_peak_mb"`
	RSSEndMB    float64 `json:"server_rss_end_mb"`
	FDsBefore   int     `json:"server_fds_before"`
	FDsPeak     int     `json:"server_fds_peak"`
	FDsEnd      int     `json:"server_fds_end"`
	FDLimit     int     `json:"server_fd_limit,omitempty"`
	Samples     int     `json:"samples"`

	Bystander bystanderReport `json:"bystander"`

	mu   sync.Mutex // guards Counts: attacks count from many goroutines
	room string     // the attack's room, when its bystander writes there
}

// bystanderReport is what the well-behaved client saw during the attack.
type bystanderReport struct {
	Kind         string  `json:"kind"`
	Ops          int     `json:"ops"`
	Failures     int     `json:"failures"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	MaxMs        float64 `json:"max_ms"`
	WSOpens      int     `json:"ws_opens,omitempty"`
	WSFailures   int     `json:"ws_open_failures,omitempty"`
	FirstFailure string  `json:"first_failure,omitempty"`
}

func (r *attackReport) count(k string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Counts == nil {
		r.Counts = map[string]int{}
	}
	r.Counts[k] += n
}

func (r *attackReport) outcome(format string, a ...any) {
	r.Outcome = append(r.Outcome, fmt.Sprintf(format, a...))
}

// prepareAttack checks the attack flags and fills the defaults that
// depend on the attack.
func prepareAttack(c *config) error {
	var spec *attackSpec
	for i := range attackSpecs {
		if attackSpecs[i].name == c.attack {
			spec = &attackSpecs[i]
		}
	}
	if spec == nil {
		return fmt.Errorf("bench attack: --attack must be one of %s, not %q", attackNames(), c.attack)
	}
	switch {
	case c.prefixes < 1 || c.prefixSubs < 1 || c.attackWrites < 1 || c.httpWrites < 1 || c.watchers < 0 || c.attackConns < 0:
		return errors.New("bench attack: counts must be at least 1 (--watchers at least 0)")
	case c.valueBytes < 1 || c.valueBytes > 16<<20:
		return errors.New("bench attack: --value-bytes must be 1…16777216")
	case strings.HasPrefix(c.attack, "etcd-") && c.etcdAddr == "":
		return errors.New("bench attack: the etcd attacks need --etcd-addr, the server's etcd API (statecast serve --etcd-addr)")
	}
	if c.attackConns == 0 {
		c.attackConns = map[string]int{"slow-body": 20200, "sse-flood": 3000,
			"etcd-txn-ranges": 2, "etcd-watch-noread": 10, "etcd-idle": 50}[c.attack]
	}
	if c.attackHold == 0 {
		c.attackHold = map[string]time.Duration{"slow-body": 30 * time.Second, "sse-flood": 3 * time.Second, "etcd-idle": 25 * time.Second, "room-growth": 10 * time.Second}[c.attack]
	}
	return nil
}

// capConns raises this process's file limit for --attack-conns
// connections, or lowers --attack-conns to what the limit and the local
// ports allow. It runs after the server is spawned, so the server keeps
// the machine's limit (a spawned process inherits a raised one).
func (e *env) capConns(r *result) {
	c := e.cfg
	limit := ensureNofile(uint64(c.attackConns) + 1024)
	if max := int(limit) - 1024; c.attackConns > max {
		r.addNote("RLIMIT_NOFILE of the load tool is %d: %d connections instead of %d", limit, max, c.attackConns)
		c.attackConns = max
	}
	if p := localPorts(); p > 0 && c.attackConns > p-1000 {
		r.addNote("%d local ports: %d connections instead of %d", p, p-1000, c.attackConns)
		c.attackConns = p - 1000
	}
}

// ensureNofile raises this process's file limit to need when it can (the
// hard limit too when running as root) and returns the soft limit.
func ensureNofile(need uint64) uint64 {
	var lim syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) == nil && lim.Max < need {
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: need, Max: need})
	}
	n, _ := proc.RaiseNofile()
	return n
}

// runAttack runs cfg.attack with the sampler and the bystander around it.
func (e *env) runAttack(ctx context.Context, r *result) error {
	var spec attackSpec
	for _, a := range attackSpecs {
		if a.name == e.cfg.attack {
			spec = a
		}
	}
	if spec.httpBystander {
		e.capConns(r)
	}
	rep := &attackReport{Attack: spec.name, FDLimit: procFDLimit(e.pid)}
	if sameRoom[spec.name] {
		rep.room = attackRoom(spec.name)
	}
	r.Attack = rep
	rss0, fds0 := e.serverRSS(), procFDs(e.pid)
	smp := startSampler(e.pid)
	by := e.startBystander(ctx, spec.httpBystander, rep.room)
	select { // its first operation is not part of the attack
	case <-by.ready:
	case <-time.After(bystanderTimeout):
	}
	cpu0, t0 := threadsCPU(e.pid), time.Now()
	e.logf("attack %s: started", spec.name)
	err := spec.run(e, ctx, rep)
	rep.DurationS = time.Since(t0).Seconds()
	_ = sleepCtx(ctx, minAttackWindow-time.Since(t0))
	by.waitCounted(ctx) // on a loaded machine one operation may outlast the window
	rep.WindowS = time.Since(t0).Seconds()
	cpu1 := threadsCPU(e.pid)
	rep.Bystander = by.finish()
	rssPeak, fdsPeak, n := smp.finish()
	rep.Samples = n
	mb := func(b int64) float64 { return float64(b) / (1 << 20) }
	rep.ServerCPUS, rep.RSSBeforeMB, rep.RSSPeakMB, rep.RSSEndMB = -1, -1, -1, -1
	rep.FDsBefore, rep.FDsPeak, rep.FDsEnd = fds0, fdsPeak, procFDs(e.pid)
	if cpu0 >= 0 && cpu1 >= 0 {
		rep.ServerCPUS = max(0, cpu1-cpu0).Seconds() // a thread that exited takes its time with it
	}
	if rss0 >= 0 {
		rep.RSSBeforeMB, rep.RSSPeakMB, rep.RSSEndMB = mb(rss0), mb(rssPeak), mb(e.serverRSS())
	}
	return err
}

// attackRoom is a room of its own for each run, so runs against one
// server do not meet each other's history.
func attackRoom(what string) string {
	return fmt.Sprintf("attack-%s-%d", what, time.Now().UnixNano()%1e9)
}

// --- measurement -----------------------------------------------------

// sampler reads the server's RSS and open fds every samplerEvery and keeps
// the peaks.
type sampler struct {
	stop, done chan struct{}
	rss        int64
	fds, n     int
}

func startSampler(pid int) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{}), rss: -1, fds: -1}
	go func() {
		defer close(s.done)
		t := time.NewTicker(samplerEvery)
		defer t.Stop()
		for {
			if pid != 0 {
				if rss, err := procRSS(pid); err == nil {
					s.rss = max(s.rss, rss)
				}
				s.fds = max(s.fds, procFDs(pid))
				s.n++
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// finish stops the sampler (after one last sample) and returns the
// peaks and the number of samples.
func (s *sampler) finish() (rss int64, fds, n int) {
	close(s.stop)
	<-s.done
	return s.rss, s.fds, s.n
}

// threadsCPU is the CPU time pid's threads have used so far, to the
// nanosecond (/proc/PID/task/*/schedstat; /proc/PID/stat counts 10 ms
// ticks, too coarse for an attack the server refuses at once), or -1.
func threadsCPU(pid int) time.Duration {
	if pid == 0 {
		return -1
	}
	dir := "/proc/" + strconv.Itoa(pid) + "/task/"
	f, err := os.Open(dir)
	if err != nil {
		return -1
	}
	tasks, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return -1
	}
	var sum time.Duration
	for _, t := range tasks {
		b, err := os.ReadFile(dir + t + "/schedstat")
		if err != nil {
			continue // the thread exited
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, _ := strconv.ParseInt(f[0], 10, 64)
		sum += time.Duration(ns)
	}
	return sum
}

// procFDs is the number of open files of pid, or -1 when unknown.
func procFDs(pid int) int {
	if pid == 0 {
		return -1
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		return -1
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return -1
	}
	return len(names)
}

// procFDLimit is pid's soft RLIMIT_NOFILE, or 0 when unknown.
func procFDLimit(pid int) int {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "Max open files"); ok {
			if f := strings.Fields(rest); len(f) > 0 {
				n, _ := strconv.Atoi(f[0])
				return n
			}
		}
	}
	return 0
}

// bystander is the well-behaved client running beside the attack.
type bystander struct {
	cancel context.CancelFunc
	done   chan struct{}
	ready  chan struct{} // closed after the first operation
	once   sync.Once
	rep    bystanderReport
	hist   latencyHist
	ops    atomic.Int64 // operations counted in rep (the first is not)
}

// record counts an operation; the first one only makes the bystander ready.
func (b *bystander) record(d time.Duration) {
	first := true
	b.once.Do(func() { close(b.ready); first = false })
	if first {
		b.hist.Record(d)
		b.ops.Add(1)
	}
}

func (b *bystander) fail(err error) {
	b.ops.Add(1)
	b.rep.Failures++
	if b.rep.FirstFailure == "" {
		b.rep.FirstFailure = err.Error()
	}
}

// startBystander starts the bystander: over HTTP, a GET /healthz on a
// new connection every 50 ms and a WebSocket opened (upgrade, connect,
// connected) every tenth tick; otherwise a WebSocket client in a room of
// its own writing a key every 50 ms and waiting for its event.
func (e *env) startBystander(ctx context.Context, overHTTP bool, room string) *bystander {
	ctx, cancel := context.WithCancel(ctx)
	b := &bystander{cancel: cancel, done: make(chan struct{}), ready: make(chan struct{})}
	go func() {
		defer close(b.done)
		if overHTTP {
			b.rep.Kind = "GET /healthz on a new connection every 50 ms, a WebSocket opened every 500 ms"
			e.bystandHTTP(ctx, b)
		} else if room != "" {
			b.rep.Kind = "WebSocket write, then its event, every 50 ms in the attack's room"
			e.bystandWS(ctx, b, room)
		} else {
			b.rep.Kind = "WebSocket write, then its event, every 50 ms in another room"
			e.bystandWS(ctx, b, attackRoom("bystander"))
		}
	}()
	return b
}

// waitCounted waits, up to an operation's timeout, until the bystander
// has counted an operation, so that a report always holds one.
func (b *bystander) waitCounted(ctx context.Context) {
	end := time.Now().Add(bystanderTimeout)
	for b.ops.Load() == 0 && time.Now().Before(end) && sleepCtx(ctx, 10*time.Millisecond) == nil {
	}
}

func (b *bystander) finish() bystanderReport {
	b.cancel()
	<-b.done
	ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
	b.rep.Ops = int(b.hist.Count()) + b.rep.Failures
	b.rep.P50Ms, b.rep.P99Ms, b.rep.MaxMs = ms(b.hist.Quantile(0.5)), ms(b.hist.Quantile(0.99)), ms(b.hist.Max())
	return b.rep
}

func (e *env) bystandHTTP(ctx context.Context, b *bystander) {
	hc := &http.Client{Timeout: bystanderTimeout, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	defer hc.CloseIdleConnections()
	for tick := 0; ctx.Err() == nil; tick++ {
		t := time.Now()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, e.base+"/healthz", nil)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("GET /healthz: %s", resp.Status)
			}
		}
		if ctx.Err() != nil {
			return // cut by the end of the attack: not the server's doing
		}
		if err != nil {
			b.fail(err)
		} else {
			b.record(time.Since(t))
		}
		if tick%10 == 0 {
			b.rep.WSOpens++
			if err := e.openWS(ctx); err != nil && ctx.Err() == nil {
				b.rep.WSFailures++
				b.fail(fmt.Errorf("WebSocket: %w", err))
			}
		}
		_ = sleepCtx(ctx, bystanderEvery-time.Since(t))
	}
}

// openWS opens a WebSocket, waits for connected and closes it.
func (e *env) openWS(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, bystanderTimeout)
	defer cancel()
	c, err := e.wsSession(ctx)
	if err == nil {
		c.CloseNow()
	}
	return err
}

func (e *env) bystandWS(ctx context.Context, b *bystander, room string) {
	var c *websocket.Conn
	defer func() {
		if c != nil {
			c.CloseNow()
		}
	}()
	for seq := uint64(1); ctx.Err() == nil; seq++ {
		t := time.Now()
		if c == nil {
			var err error
			if c, err = e.bystanderConn(ctx, room); err != nil {
				if ctx.Err() == nil {
					b.fail(err)
				}
				_ = sleepCtx(ctx, bystanderEvery)
				continue
			}
		}
		err := bystanderWrite(ctx, c, room, seq)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			b.fail(err)
			c.CloseNow() // a Read cut by its deadline leaves the socket unusable
			c = nil
		} else {
			b.record(time.Since(t))
		}
		_ = sleepCtx(ctx, bystanderEvery-time.Since(t))
	}
}

// bystanderConn opens a WebSocket subscribed to room.
func (e *env) bystanderConn(ctx context.Context, room string) (*websocket.Conn, error) {
	dctx, cancel := context.WithTimeout(ctx, bystanderTimeout)
	defer cancel()
	c, err := e.dialStatecast(dctx)
	if err != nil {
		return nil, err
	}
	if err := c.Write(dctx, websocket.MessageText, []byte(`{"t":"connect"}`+"\n"+`{"t":"sub","id":1,"room":"`+room+`"}`)); err != nil {
		c.CloseNow()
		return nil, err
	}
	// Wait for the snapshot: a write sent before it could be in it
	// instead of in an event.
	for {
		_, data, err := c.Read(dctx)
		if err != nil {
			c.CloseNow()
			return nil, err
		}
		if bytes.Contains(data, []byte(`"t":"snapshot"`)) {
			return c, nil
		}
	}
}

// bystanderWrite puts seq and waits for its event.
func bystanderWrite(ctx context.Context, c *websocket.Conn, room string, seq uint64) error {
	ctx, cancel := context.WithTimeout(ctx, bystanderTimeout)
	defer cancel()
	id := strconv.FormatUint(seq+1, 10) // id 1 is the subscription
	v := strconv.FormatUint(seq, 10)
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"t":"put","id":`+id+`,"room":"`+room+`","key":"b","value":`+v+`}`)); err != nil {
		return err
	}
	for {
		_, data, err := c.Read(ctx)
		if ctx.Err() == context.DeadlineExceeded {
			return fmt.Errorf("no event within %v", bystanderTimeout)
		}
		if err != nil {
			return err
		}
		for _, m := range bytes.Split(data, []byte{'\n'}) {
			switch {
			case bytes.Contains(m, []byte(`"t":"events"`)):
				// v1: {"type":"put","key":"b","value":seq,…}; v2: ["b",seq,…]
				got, ok := fieldUint(m, []byte(`"value":`))
				if !ok {
					got, ok = fieldUint(m, []byte(`["b",`))
				}
				if ok && got == seq {
					return nil
				}
			case bytes.Contains(m, []byte(`"t":"err"`)):
				return fmt.Errorf("write refused: %.300s", m)
			}
		}
	}
}

// --- the attacks -----------------------------------------------------

// wsSession opens a WebSocket and waits for connected.
func (e *env) wsSession(ctx context.Context) (*websocket.Conn, error) {
	c, err := e.dialStatecast(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"t":"connect"}`)); err != nil {
		c.CloseNow()
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, data, err := c.Read(rctx)
	if err != nil || !bytes.Contains(data, []byte(`"t":"connected"`)) {
		c.CloseNow()
		return nil, fmt.Errorf("no connected reply (%v): %s", err, clip(data))
	}
	return c, nil
}

// replyTo reads until the ok or err of request id and returns it; other
// messages are skipped.
func replyTo(ctx context.Context, c *websocket.Conn, id uint64) ([]byte, error) {
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return nil, err
		}
		for _, m := range bytes.Split(data, []byte{'\n'}) {
			if (bytes.HasPrefix(m, []byte(`{"t":"ok"`)) || bytes.HasPrefix(m, []byte(`{"t":"err"`))) && fieldEq(m, `"id":`, id) {
				return m, nil
			}
		}
	}
}

func fieldEq(m []byte, name string, v uint64) bool {
	got, ok := fieldUint(m, []byte(name))
	return ok && got == v
}

// replyCode is "ok" or the error code of a reply.
func replyCode(m []byte) string {
	if bytes.HasPrefix(m, []byte(`{"t":"ok"`)) {
		return "ok"
	}
	return string(fieldStr(m, []byte(`"code":"`)))
}

// attackUnsubPrefixes: --prefix-subs subscriptions of --prefixes distinct
// key prefixes each on one WebSocket, then their unsubscriptions.
func (e *env) attackUnsubPrefixes(ctx context.Context, rep *attackReport) error {
	n, subs := e.cfg.prefixes, e.cfg.prefixSubs
	room := attackRoom("unsub")
	c, err := e.wsSession(ctx)
	if err != nil {
		return err
	}
	defer c.CloseNow()
	// Fixed-width prefixes "p0000001/": 12 bytes each in the frame, so
	// 80,000 of them fit the default 1 MiB frame.
	width := len(strconv.Itoa(n))
	frame := func(id int) []byte {
		b := []byte(`{"t":"sub","id":` + strconv.Itoa(id) + `,"room":"` + room + `","prefixes":[`)
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			b = fmt.Appendf(b, `"p%0*d/"`, width, i)
		}
		return append(b, "]}"...)
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	var acked []int
	var subTime, unsubTime time.Duration
	size := 0
	for id := 1; id <= subs; id++ {
		f := frame(id)
		size = len(f)
		t := time.Now()
		if err := c.Write(rctx, websocket.MessageText, f); err != nil {
			return fmt.Errorf("sub %d: %w", id, err)
		}
		m, err := replyTo(rctx, c, uint64(id))
		if err != nil {
			return fmt.Errorf("sub %d: %w", id, err)
		}
		subTime += time.Since(t)
		code := replyCode(m)
		rep.count("sub "+code, 1)
		if code == "ok" {
			acked = append(acked, id)
		}
	}
	rep.Params = fmt.Sprintf("%d subscriptions of %d prefixes (frame %d bytes)", subs, n, size)
	for _, id := range acked {
		t := time.Now()
		uid := uint64(1000 + id)
		if err := c.Write(rctx, websocket.MessageText, []byte(`{"t":"unsub","id":`+strconv.FormatUint(uid, 10)+`,"sub":`+strconv.Itoa(id)+`}`)); err != nil {
			return fmt.Errorf("unsub %d: %w", id, err)
		}
		m, err := replyTo(rctx, c, uid)
		if err != nil {
			return fmt.Errorf("unsub %d: %w", id, err)
		}
		unsubTime += time.Since(t)
		rep.count("unsub "+replyCode(m), 1)
	}
	rep.outcome("%d of %d subs acknowledged in %.2f s", len(acked), subs, subTime.Seconds())
	if refused := subs - len(acked); refused > 0 {
		var codes []string
		for k, v := range rep.Counts {
			if strings.HasPrefix(k, "sub ") && k != "sub ok" {
				codes = append(codes, fmt.Sprintf("%s ×%d", strings.TrimPrefix(k, "sub "), v))
			}
		}
		sort.Strings(codes)
		rep.outcome("%d refused: %s", refused, strings.Join(codes, ", "))
	}
	if len(acked) > 0 {
		rep.outcome("%d unsubs answered in %.2f s", len(acked), unsubTime.Seconds())
	}
	return nil
}

// attackHistoryBytes: --writes puts of --value-bytes values to one room
// on one WebSocket while --watchers raw sockets watch it and never read.
// Writes refused with rate_limited are sent again after a pause: the
// attacker stays under the limit and the history fills all the same.
func (e *env) attackHistoryBytes(ctx context.Context, rep *attackReport) error {
	n, size, keys := e.cfg.attackWrites, e.cfg.valueBytes, e.cfg.keys
	room := attackRoom("history")
	rep.Params = fmt.Sprintf("%d writes of %d-byte values over %d keys, %d watchers that never read", n, size, keys, e.cfg.watchers)
	var watchers []net.Conn
	defer func() {
		for _, w := range watchers {
			w.Close()
		}
	}()
	for range e.cfg.watchers {
		w, err := e.rawWS(ctx, []byte(`{"t":"connect"}`+"\n"+`{"t":"sub","id":1,"room":"`+room+`"}`))
		if err != nil {
			return fmt.Errorf("watcher: %w", err)
		}
		watchers = append(watchers, w)
	}
	c, err := e.wsSession(ctx)
	if err != nil {
		return err
	}
	defer c.CloseNow()
	value := `"` + strings.Repeat("x", size-2) + `"` // a JSON string of size bytes
	if size < 2 {
		value = "1"
	}
	put := func(i int) []byte {
		return []byte(`{"t":"put","id":` + strconv.Itoa(i+1) + `,"room":"` + room + `","key":"k` + strconv.Itoa(i%keys) + `","value":` + value + `}`)
	}
	rctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	// Up to window writes in flight; the reader hands rate-limited ones
	// back to be sent again and frees a slot for every other reply.
	const window = 16
	slots := make(chan struct{}, window)
	retry := make(chan int, n)
	var committed, limited atomic.Int64
	readErr := readReplies(rctx, c, func(id uint64, code string) {
		switch code {
		case "ok":
			committed.Add(1)
		case "rate_limited":
			limited.Add(1)
			retry <- int(id) - 1
			return // its slot goes with it
		default:
			rep.count("put "+code, 1)
		}
		<-slots
	})
	// A slot is held from a write's sending to its final reply, so the
	// writes are all answered when next is n and no slot is held.
	for next := 0; next < n || len(slots) > 0; {
		var free chan struct{}
		if next < n {
			free = slots
		}
		select {
		case i := <-retry:
			_ = sleepCtx(rctx, 20*time.Millisecond)
			if err := c.Write(rctx, websocket.MessageText, put(i)); err != nil {
				return fmt.Errorf("write %d: %w", i, err)
			}
		case free <- struct{}{}:
			if err := c.Write(rctx, websocket.MessageText, put(next)); err != nil {
				return fmt.Errorf("write %d: %w", next, err)
			}
			next++
		case err := <-readErr:
			return fmt.Errorf("writes not all answered: %w", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := rctx.Err(); err != nil {
		return fmt.Errorf("writes not all answered: %w", err)
	}
	rep.count("put ok", int(committed.Load()))
	rep.count("put rate_limited (sent again)", int(limited.Load()))
	rep.outcome("%d writes committed (%.0f MB of values), %d rate_limited replies sent again", committed.Load(), float64(committed.Load())*float64(size)/(1<<20), limited.Load())
	for i, w := range watchers {
		rep.outcome("watcher %d: %s", i+1, drainState(w))
	}
	return nil
}

// attackCELEquality: a client with read access watches the room with
// two filters that compare whole values (80 values a side, and value ==
// value), while another writes celWrites values of celValueBytes there
// one after the other. CEL charges == on lists and maps by their items,
// not by what comparing them walks, so each write was evaluated for
// hundreds of milliseconds under the room's lock, where the bystander's
// writes wait.
func (e *env) attackCELEquality(ctx context.Context, rep *attackReport) error {
	const celWrites, celValueBytes = 20, 80 << 10
	room := rep.room
	list := "[" + strings.TrimSuffix(strings.Repeat("value,", 80), ",") + "]"
	filters := []string{list + " == " + list, "value == value"}
	rep.Params = fmt.Sprintf("watches with the filters %q (%d bytes) and %q; %d writes of %d-byte values", clip([]byte(filters[0])), len(filters[0]), filters[1], celWrites, celValueBytes)
	rctx, cancel := context.WithTimeout(ctx, e.cfg.timeout)
	defer cancel()
	w, err := e.wsSession(rctx)
	if err != nil {
		return err
	}
	defer w.CloseNow()
	for i, f := range filters {
		q := strconv.Quote(f) // ASCII without escapes: also JSON
		if err := w.Write(rctx, websocket.MessageText, []byte(`{"t":"sub","id":`+strconv.Itoa(i+1)+`,"room":"`+room+`","filter":`+q+`}`)); err != nil {
			return err
		}
		m, err := subReply(rctx, w, uint64(i+1))
		if err != nil {
			return fmt.Errorf("filter %d: %w", i+1, err)
		}
		rep.count("sub "+m, 1)
		rep.outcome("filter %d: %s", i+1, m)
	}
	go func() { // the watcher reads what it is sent, as a client does
		for rctx.Err() == nil {
			if _, _, err := w.Read(rctx); err != nil {
				return
			}
		}
	}()
	c, err := e.wsSession(rctx)
	if err != nil {
		return err
	}
	defer c.CloseNow()
	item := `{"a":[1,2,3]}`
	value := `{"l":[` + strings.TrimSuffix(strings.Repeat(item+",", (celValueBytes-8)/(len(item)+1)), ",") + `]}`
	t0 := time.Now()
	for i := range celWrites {
		id := uint64(i + 1)
		put := `{"t":"put","id":` + strconv.FormatUint(id, 10) + `,"room":"` + room + `","key":"v` + strconv.Itoa(i%2) + `","value":` + value + `}`
		if err := c.Write(rctx, websocket.MessageText, []byte(put)); err != nil {
			return fmt.Errorf("write %d: %w", i, err)
		}
		m, err := replyTo(rctx, c, id)
		if err != nil {
			return fmt.Errorf("write %d: %w", i, err)
		}
		rep.count("put "+replyCode(m), 1)
	}
	rep.outcome("%d writes answered in %.2f s", celWrites, time.Since(t0).Seconds())
	return nil
}

// subReply reads until the reply to subscription id: "snapshot" when it
// started, else its error code.
func subReply(ctx context.Context, c *websocket.Conn, id uint64) (string, error) {
	for {
		_, data, err := c.Read(ctx)
		if err != nil {
			return "", err
		}
		for _, m := range bytes.Split(data, []byte{'\n'}) {
			switch {
			case bytes.Contains(m, []byte(`"t":"snapshot"`)) && fieldEq(m, `"s":`, id):
				return "snapshot", nil
			case bytes.HasPrefix(m, []byte(`{"t":"err"`)) && fieldEq(m, `"id":`, id):
				return replyCode(m), nil
			}
		}
	}
}

// drainState reads what the server sent a watcher that never read, for
// up to 3 s, and says whether the server had closed the socket.
func drainState(c net.Conn) string {
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	n, err := io.Copy(io.Discard, c)
	mb := float64(n) / (1 << 20)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Sprintf("still open (%.1f MB were waiting in the socket)", mb)
	}
	return fmt.Sprintf("closed by the server (%.1f MB were waiting in the socket)", mb)
}

// rawWS opens a WebSocket over a plain TCP socket and sends first as one
// client frame: the socket is then left alone, never read.
func (e *env) rawWS(ctx context.Context, first []byte) (net.Conn, error) {
	d := net.Dialer{Timeout: 10 * time.Second}
	c, err := d.DialContext(ctx, "tcp", e.hostport())
	if err != nil {
		return nil, err
	}
	req := "GET /v1/ws HTTP/1.1\r\nHost: " + e.hostport() + "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: statecast.v1.json\r\n\r\n"
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReaderSize(c, 1) // nothing past the headers may be buffered here
	if _, err = c.Write([]byte(req)); err == nil {
		var resp *http.Response
		if resp, err = http.ReadResponse(br, nil); err == nil && resp.StatusCode != http.StatusSwitchingProtocols {
			err = fmt.Errorf("upgrade: %s", resp.Status)
		}
	}
	if err == nil {
		_, err = c.Write(clientFrame(first))
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	_ = c.SetDeadline(time.Time{})
	return c, nil
}

// clientFrame is a final masked text frame carrying p (RFC 6455 §5.2).
func clientFrame(p []byte) []byte {
	b := []byte{0x81}
	switch n := len(p); {
	case n < 126:
		b = append(b, 0x80|byte(n))
	case n < 1<<16:
		b = append(b, 0x80|126, byte(n>>8), byte(n))
	default:
		b = append(b, 0x80|127, 0, 0, 0, 0, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	}
	key := [4]byte{0x5a, 0x17, 0xc3, 0x8e}
	b = append(b, key[:]...)
	for i, c := range p {
		b = append(b, c^key[i%4])
	}
	return b
}

// dialMany opens n TCP connections (--dial-concurrency at a time), sends
// each its request, and hands each open one to hold in its own goroutine;
// it returns when every hold has returned.
func (e *env) dialMany(ctx context.Context, n int, request []byte, rep *attackReport, hold func(c net.Conn, sent time.Time), failed func()) {
	sem := make(chan struct{}, e.cfg.dialConc)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	count := func(k string, err error) {
		rep.count(k, 1)
		mu.Lock()
		if err != nil && firstErr == nil {
			firstErr = err
		}
		mu.Unlock()
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	for range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := d.DialContext(ctx, "tcp", e.hostport())
			if err == nil {
				_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
				if _, err = c.Write(request); err != nil {
					c.Close()
				}
			}
			<-sem
			if err != nil {
				count("connection refused or failed", err)
				if failed != nil {
					failed()
				}
				return
			}
			count("connection opened", nil)
			defer c.Close()
			hold(c, time.Now())
		}()
	}
	wg.Wait()
	if firstErr != nil {
		rep.outcome("first connection failure: %v", firstErr)
	}
}

// attackSlowBody: connections that each send a PUT's headers and one of
// its ten body bytes, then stall; each is held until the server cuts it
// or --attack-hold passes.
func (e *env) attackSlowBody(ctx context.Context, rep *attackReport) error {
	n, hold := e.cfg.attackConns, e.cfg.attackHold
	rep.Params = fmt.Sprintf("%d connections sending 1 of 10 body bytes, held up to %v", n, hold)
	req := []byte("PUT /v1/rooms/" + attackRoom("slow") + "/kv/k HTTP/1.1\r\nHost: " + e.hostport() +
		"\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n1")
	var mu sync.Mutex
	var cuts []time.Duration
	var answered, open atomic.Int64
	e.dialMany(ctx, n, req, rep, func(c net.Conn, sent time.Time) {
		_ = c.SetReadDeadline(sent.Add(hold))
		buf := make([]byte, 512)
		k, err := c.Read(buf)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			open.Add(1)
			return
		}
		if k > 0 {
			answered.Add(1) // e.g. 408; the server may still hold the socket
		}
		mu.Lock()
		cuts = append(cuts, time.Since(sent))
		mu.Unlock()
	}, nil)
	opened := rep.Counts["connection opened"]
	rep.outcome("%d of %d connections opened, %d refused or failed", opened, n, rep.Counts["connection refused or failed"])
	if len(cuts) > 0 {
		slices.Sort(cuts)
		rep.outcome("%d cut by the server (%d with an answer) after %.1f s (median), %.1f s (max)", len(cuts), answered.Load(),
			cuts[len(cuts)/2].Seconds(), cuts[len(cuts)-1].Seconds())
	}
	rep.outcome("%d still open after %v", open.Load(), hold)
	rep.count("cut by the server", len(cuts))
	rep.count("still open at the end", int(open.Load()))
	return nil
}

// attackSSEFlood: SSE watch streams, each on its own connection, held
// --attack-hold once all are opened.
func (e *env) attackSSEFlood(ctx context.Context, rep *attackReport) error {
	n, hold := e.cfg.attackConns, e.cfg.attackHold
	rep.Params = fmt.Sprintf("%d SSE streams, held %v after the last one", n, hold)
	req := []byte("GET /v1/rooms/" + attackRoom("sse") + "/watch HTTP/1.1\r\nHost: " + e.hostport() + "\r\nAccept: text/event-stream\r\n\r\n")
	allOpen := make(chan struct{})
	var once sync.Once
	var pending sync.WaitGroup
	pending.Add(n)
	go func() { pending.Wait(); once.Do(func() { close(allOpen) }) }()
	defer once.Do(func() { close(allOpen) })
	e.dialMany(ctx, n, req, rep, func(c net.Conn, _ time.Time) {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		k := "no answer"
		if err == nil {
			k = "HTTP " + strconv.Itoa(resp.StatusCode)
		}
		rep.count(k, 1)
		pending.Done()
		if err == nil && resp.StatusCode == http.StatusOK {
			select {
			case <-allOpen:
			case <-ctx.Done():
			}
			_ = sleepCtx(ctx, hold)
		}
	}, pending.Done)
	rep.outcome("%d streams accepted (HTTP 200) of %d", rep.Counts["HTTP 200"], n)
	return nil
}

// attackHTTPWriteRate: --http-writes PUTs one after another on one
// keep-alive connection.
func (e *env) attackHTTPWriteRate(ctx context.Context, rep *attackReport) error {
	n := e.cfg.httpWrites
	rep.Params = fmt.Sprintf("%d PUTs on one keep-alive connection", n)
	var conns atomic.Int64
	tr := &http.Transport{Proxy: nil, MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conns.Add(1)
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, addr)
		}}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: tr}
	defer tr.CloseIdleConnections()
	u := e.base + "/v1/rooms/" + attackRoom("rate") + "/kv/k"
	t := time.Now()
	retryAfter := 0
	for i := range n {
		req, err := http.NewRequestWithContext(ctx, http.MethodPut, u, strings.NewReader(strconv.Itoa(i)))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			rep.count("request failed", 1)
			continue
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		rep.count("HTTP "+strconv.Itoa(resp.StatusCode), 1)
		if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Retry-After") != "" {
			retryAfter++
		}
	}
	el := time.Since(t).Seconds()
	rep.outcome("%d PUTs in %.2f s (%.0f/s) over %d connection(s): %d HTTP 200, %d HTTP 429 (%d with Retry-After)",
		n, el, float64(n)/el, conns.Load(), rep.Counts["HTTP 200"], rep.Counts["HTTP 429"], retryAfter)
	return nil
}

// roomGrowthOps is the puts of each room-growth transaction: the most a
// write may carry.
const roomGrowthOps = 256

// attackRoomGrowth: one client, from an address of its own (127.0.0.2,
// so the bystander's write budget is not its), sends transactions of 256
// puts of new keys, values as large as one 1 MiB frame allows (at most
// --value-bytes), 4 in flight, for --attack-hold; a rate_limited one is
// sent again after 20 ms. It reports the bytes of keys and values the room
// took per second and the writes refused for the room's quota.
func (e *env) attackRoomGrowth(ctx context.Context, rep *attackReport) error {
	size := min(e.cfg.valueBytes, 4000) // 256 puts in one 1 MiB frame
	room := attackRoom("growth")
	rep.Params = fmt.Sprintf("txns of %d puts of new keys, %d-byte values, 4 in flight, for %v, from 127.0.0.2", roomGrowthOps, size, e.cfg.attackHold)
	hc := &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: (&net.Dialer{
		Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext}}
	c, _, err := websocket.Dial(ctx, e.ws, &websocket.DialOptions{HTTPClient: hc, Subprotocols: e.subprotocols(),
		CompressionMode: websocket.CompressionDisabled})
	if err != nil {
		return fmt.Errorf("attacker from 127.0.0.2: %w", err)
	}
	defer c.CloseNow()
	c.SetReadLimit(64 << 20)
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"t":"connect"}`)); err != nil {
		return err
	}
	value := `"` + strings.Repeat("x", size-2) + `"`
	txn := func(i int) []byte {
		var b strings.Builder
		b.WriteString(`{"t":"txn","id":` + strconv.Itoa(i+1) + `,"room":"` + room + `","ops":[`)
		for j := range roomGrowthOps {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"type":"put","key":"k` + strconv.Itoa(i) + `.` + strconv.Itoa(j) + `","value":` + value + `}`)
		}
		b.WriteString(`]}`)
		return []byte(b.String())
	}
	keyBytes := func(i int) int64 { // of txn i's keys, values as stored
		n := int64(0)
		for j := range roomGrowthOps {
			n += int64(len("k"+strconv.Itoa(i)+"."+strconv.Itoa(j)) + len(value))
		}
		return n
	}
	hold, cancel := context.WithTimeout(ctx, e.cfg.attackHold)
	defer cancel()
	rctx, rcancel := context.WithTimeout(ctx, e.cfg.attackHold+e.cfg.timeout)
	defer rcancel()
	const window = 4
	slots := make(chan struct{}, window)
	retry := make(chan int, window)
	var grown atomic.Int64
	readErr := readReplies(rctx, c, func(id uint64, code string) {
		rep.count("txn "+code, 1)
		switch code {
		case "ok":
			grown.Add(keyBytes(int(id) - 1))
		case "rate_limited":
			retry <- int(id) - 1
			return // its slot goes with it
		}
		<-slots
	})
	t0 := time.Now()
	next := 0
	for hold.Err() == nil || len(slots) > 0 {
		var free chan struct{}
		if hold.Err() == nil {
			free = slots
		}
		select {
		case i := <-retry:
			if hold.Err() != nil {
				<-slots
				continue
			}
			_ = sleepCtx(hold, 20*time.Millisecond)
			if err := c.Write(rctx, websocket.MessageText, txn(i)); err != nil {
				return fmt.Errorf("txn %d: %w", i, err)
			}
		case free <- struct{}{}:
			if err := c.Write(rctx, websocket.MessageText, txn(next)); err != nil {
				return fmt.Errorf("txn %d: %w", next, err)
			}
			next++
		case <-hold.Done():
		case err := <-readErr:
			return fmt.Errorf("attacker's reads: %w", err)
		case <-rctx.Done():
			return fmt.Errorf("replies: %w", rctx.Err())
		}
	}
	el := time.Since(t0).Seconds()
	rep.outcome("the room took %.1f MiB of keys and values in %.1f s: %.2f MiB/s (%d txns committed, %d rate_limited, %d quota_exceeded)",
		float64(grown.Load())/(1<<20), el, float64(grown.Load())/(1<<20)/el, rep.Counts["txn ok"], rep.Counts["txn rate_limited"], rep.Counts["txn quota_exceeded"])
	return nil
}

// --- report ------------------------------------------------------------

// printAttack prints an attack's result as a table.
func printAttack(out io.Writer, r *result) {
	if r.Command != "" {
		fmt.Fprintf(out, "$ %s\n", r.Command)
	}
	fmt.Fprintf(out, "target: %s", r.URL)
	if r.ServerPID != 0 {
		fmt.Fprintf(out, " (pid %d)", r.ServerPID)
	} else {
		fmt.Fprint(out, " (pid unknown: no server CPU, RSS or fds; give --server-pid or --spawn)")
	}
	fmt.Fprintln(out)
	if r.ServerCmd != "" {
		fmt.Fprintf(out, "server: %s\n", r.ServerCmd)
	}
	fmt.Fprintln(out)
	a := r.Attack
	t := [][]string{{"attack " + a.Attack, a.Params}}
	for i, o := range a.Outcome {
		name := ""
		if i == 0 {
			name = "attacker got"
		}
		t = append(t, []string{name, o})
	}
	keys := make([]string, 0, len(a.Counts))
	for k := range a.Counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		t = append(t, []string{"  " + k, strconv.Itoa(a.Counts[k])})
	}
	t = append(t, []string{"attack duration / measured", fmtNum(a.DurationS) + " s / " + fmtNum(a.WindowS) + " s"})
	if r.ServerPID != 0 {
		t = append(t,
			[]string{"server CPU", fmtNum(a.ServerCPUS) + " s"},
			[]string{"server RSS before / peak / end", fmt.Sprintf("%s / %s / %s MB", fmtNum(a.RSSBeforeMB), fmtNum(a.RSSPeakMB), fmtNum(a.RSSEndMB))},
			[]string{"server open fds before / peak / end", fmt.Sprintf("%d / %d / %d (limit %d)", a.FDsBefore, a.FDsPeak, a.FDsEnd, a.FDLimit)})
	}
	b := a.Bystander
	t = append(t,
		[]string{"bystander", b.Kind},
		[]string{"bystander ops / failures", fmt.Sprintf("%d / %d", b.Ops, b.Failures)},
		[]string{"bystander latency p50 / p99 / max", fmt.Sprintf("%s / %s / %s ms", fmtNum(b.P50Ms), fmtNum(b.P99Ms), fmtNum(b.MaxMs))})
	if b.WSOpens > 0 {
		t = append(t, []string{"bystander WebSockets opened / failed", fmt.Sprintf("%d / %d", b.WSOpens, b.WSFailures)})
	}
	if b.FirstFailure != "" {
		t = append(t, []string{"bystander first failure", b.FirstFailure})
	}
	printLeftTable(out, t)
	printNotes(out, r)
}

// printLeftTable is printTable with every column left-aligned (the
// values here are sentences).
func printLeftTable(out io.Writer, rows [][]string) {
	w := 0
	for _, r := range rows {
		w = max(w, len([]rune(r[0])))
	}
	for n, r := range rows {
		fmt.Fprintf(out, "%s%s   %s\n", r[0], strings.Repeat(" ", w-len([]rune(r[0]))), r[1])
		if n == 0 {
			fmt.Fprintln(out, strings.Repeat("-", w+3+len([]rune(r[1]))))
		}
	}
}

// attackNone attacks nothing for 3 s: what the bystander sees on a quiet
// server, the baseline of the other attacks' figures.
func (e *env) attackNone(ctx context.Context, rep *attackReport) error {
	rep.Params = "no attack, 3 s"
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(3 * time.Second):
	}
	rep.outcome("nothing sent for 3 s")
	return nil
}

// readReplies reads c's frames until it fails and calls fn with the id
// and code of every reply in them; the read's error comes on the channel
// returned.
func readReplies(ctx context.Context, c *websocket.Conn, fn func(id uint64, code string)) <-chan error {
	readErr := make(chan error, 1)
	go func() {
		for {
			_, data, err := c.Read(ctx)
			if err != nil {
				readErr <- err
				return
			}
			for _, m := range bytes.Split(data, []byte{'\n'}) {
				if id, ok := fieldUint(m, []byte(`"id":`)); ok {
					fn(id, replyCode(m))
				}
			}
		}
	}()
	return readErr
}
