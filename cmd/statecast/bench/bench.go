// Package bench is the load tool, statecast bench: it drives a running
// server over real sockets and reports delivered messages per second,
// end-to-end latency, loss, and the server's CPU and memory; it drives a
// reference broadcast server (the "ceiling", package ceiling, statecast
// bench ceiling) the same way, so figures can be set against it. Run is
// its entry point.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/cmd/statecast/bench/ceiling"
	"github.com/statecast/statecast/cmd/statecast/internal/flags"
	"github.com/statecast/statecast/cmd/statecast/internal/proc"
)

const usage = `usage:
  statecast bench SCENARIO [flags]
  statecast bench compare SCENARIO [--ceiling-bin PATH] [--statecast-bin PATH] [flags]
  statecast bench ceiling [--addr HOST:PORT] [--batch] [--history N] [--queue N]

scenarios:
  fanout   --subs N subscribers of one room; --rate writes/s of --payload bytes
  rooms    --rooms R rooms of --subs-per-room subscribers each; --rate writes/s in all
  idle     --conns N idle subscribed connections: server RSS per connection
  resume   a subscriber misses --events K writes, then resumes (median of --repeat)
  storm    --conns N subscribers drop at once, --storm-writes happen, all resume at once
  writes   --events K writes as fast as --writers connections with --window in flight allow
           (shared out: each connection has window/writers in flight); --rooms N spreads them
           over ROOM-0…ROOM-<N-1>, --write-url over several nodes; reports writes/s and latency
  attack   --attack NAME: one client trying to take the server's CPU, memory or fds (below)
  scale    --part I/N of --conns subscribers over --rooms rooms (ROOM-0…) on the --sub-url nodes,
           from --source addresses, steered over stdin (below); scale-mark: one marked write to
           each room through --url; scale-merge: the reports on stdin added up

Writes go over --writers connections (default 4) with up to --window requests in
flight; each value carries its write's sequence number, from which subscribers
measure latency (send to receipt, writes sent during the window after --warmup).

The server is --url (statecast: http://127.0.0.1:8080, ceiling: http://127.0.0.1:8001),
or started with --spawn "COMMAND LINE" (stopped with SIGTERM at the end). Its CPU and
memory are read from /proc when --server-pid is given or it was spawned. compare spawns
the ceiling, then statecast, on free loopback ports and prints both figures and their ratio.

The ceiling is the reference broadcast server figures are set against: encode once,
queue to every socket, one writer goroutine per socket, slow sockets closed; --batch
joins the queued messages into one frame. statecast bench ceiling runs it (-h: its
protocol); compare spawns it from this executable unless --ceiling-bin names another
program speaking that protocol, and statecast serve likewise unless --statecast-bin.

Several nodes on one store: --sub-url (repeatable) spreads the subscribers over other
nodes while the writer stays on --url, so latency is publish on one node to delivery on
another; --redis-pid reports the Redis server's CPU per write (repeatable: several masters),
--node-pid the CPU and RSS of the other nodes (repeatable).

scale is one of several processes that together hold more connections than one process
may open (RLIMIT_NOFILE) from more source addresses than one has ports
(cmd/statecast/bench/scale.sh runs them). Connection i of --conns is this process's when
i % N = I; it subscribes to ROOM-<i % rooms>, on the nodes in turn (--placement rr) or on
node <room % nodes> (--placement room), from the --source addresses in turn (127.0.0.2-127.0.0.9,
comma-separated), and with --lease holds the key c<i>, bound to its session, in room
ROOM-lease-I-<node>. A connection that loses its node resumes at once on another, with its
session and from its position. Commands on stdin, one a line, each answered by a JSON line:
  wait D   until every connection is subscribed, or D passes
  report   the figures so far: marked writes received (send to receipt, wall clock) by
           connection and as a histogram; resumes: how (replay, synced, snapshot), whether the
           session was kept, loss to resumed
  reset    report, then zero the marked-write and resume figures
  leases   report, with this part's session-leased keys still in the store counted
  quit     (or the end of input) close everything and exit

 what the attacker got, the server's CPU seconds, peak RSS
and peak open fds (from /proc every 100 ms), and what a well-behaved bystander saw
meanwhile (latency p50/p99 and failures):
  unsub-prefixes   --prefix-subs subscriptions of --prefixes key prefixes on one
                   WebSocket, then their unsubs (bystander: writes in another room)
  history-bytes    --writes puts of --value-bytes values to one room, --watchers raw
                   sockets watching it that never read (rate_limited writes are resent)
  slow-body        --attack-conns connections each sending a PUT with Content-Length 10
                   and 1 body byte, then stalling, held up to --attack-hold
                   (bystander: /healthz and WebSocket opens on new connections)
  sse-flood        --attack-conns SSE watch streams (try a server with --max-connections 100)
  none             no attack for 3 s: the bystander's figures on a quiet server
  http-write-rate  --http-writes PUTs on one keep-alive connection: HTTP 200 vs 429
  etcd-txn-ranges  --attack-conns (2) etcd Txns at once, each 128 ranges of a 2 MiB room
  etcd-watch-noread --attack-conns (10) etcd connections × 256 watches with prev_kv that
                   never read, while 300 puts of 200 KiB go by
  etcd-idle        --attack-conns (50) connections to the etcd API that send nothing,
                   held up to --attack-hold (25s)
                   (the etcd attacks need --etcd-addr, the server's statecast serve --etcd-addr)
  snapshot-amplify a 100 MB room of --value-bytes values, 20 WebSockets subscribing to
                   it at once, then 10 HTTP clients listing it at once (paged, as the
                   Go client does): peak RSS of each phase
  room-growth      transactions of 256 puts of new keys (values up to --value-bytes, at most
                   4000) from 127.0.0.2 for --attack-hold (default 10s): room bytes/s
A spawned server keeps this machine's file limit (the load tool raises only its own);
set the server's with --spawn "sh -c 'ulimit -n N && exec statecast serve …'".
`

// config holds the flags of one bench command.
type config struct {
	scenario              string
	target, url, spawn    string
	pid                   int
	json                  bool
	room                  string
	subs, keys, payload   int
	rate                  float64
	duration, warmup      time.Duration
	drain, timeout, hold  time.Duration
	rooms, perRoom, conns int
	events, repeat        int
	stormWrites           int
	dialConc, window      int
	writeVia              string
	writers               int
	waitIdle              time.Duration
	protocol              string // statecast's WebSocket subprotocol
	fullDecode            bool   // subscribers decode each message whole, as a generic client
	rawReader             bool   // subscribers use the tool's minimal WebSocket client
	cpuProfile            string
	subURLs, writeURLs    flags.List
	redisPIDs, nodePIDs   []int
	roomsSet              bool // --rooms was given

	// attack
	attack                             string
	prefixes, prefixSubs               int
	attackWrites, valueBytes, watchers int
	attackConns, httpWrites            int
	attackHold                         time.Duration
	etcdAddr                           string

	// scale
	part, sources, placement string
	lease                    bool
	seq                      int
	server                   string // statecast or centrifugo

	// compare
	ceilingBin, statecastBin   string
	ceilingArgs, statecastArgs string

	args []string // as given, for echoing
}

var scenarios = []string{"fanout", "rooms", "idle", "resume", "storm", "writes", "attack", "scale", "scale-mark", "scale-merge"}

// parseFlags parses SCENARIO and the flags, in any order.
func parseFlags(args []string, compare bool, errOut io.Writer) (*config, error) {
	c := &config{args: args}
	name := "bench"
	if compare {
		name = "bench compare"
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, usage)
		fmt.Fprintln(errOut, "\nflags:")
		fs.PrintDefaults()
	}
	if !compare {
		fs.StringVar(&c.target, "target", "statecast", "server kind: statecast or ceiling")
		fs.StringVar(&c.url, "url", "", "server URL (default by --target: http://127.0.0.1:8080 or http://127.0.0.1:8001)")
		fs.IntVar(&c.pid, "server-pid", 0, "server process id, for its CPU and RSS from /proc")
		fs.StringVar(&c.spawn, "spawn", "", "start the server with this command line, wait until --url answers, SIGTERM it at the end")
		fs.Var(&c.subURLs, "sub-url", "statecast: subscribers connect to these nodes in turn (repeatable); the writer stays on --url")
		fs.Var(&c.writeURLs, "write-url", "statecast, writes: the writer's connections go to these nodes in turn (repeatable; default --url)")
		fs.Func("redis-pid", "redis-server process id: report its CPU per write (repeatable: the sum of several servers')", pidList(&c.redisPIDs))
		fs.Func("node-pid", "process id of another statecast node (besides --server-pid): report its CPU and RSS (repeatable)", pidList(&c.nodePIDs))
	} else {
		fs.StringVar(&c.ceilingBin, "ceiling-bin", "", "another reference broadcast server's binary, run with -addr, -batch and -history (default: this executable's bench ceiling)")
		fs.StringVar(&c.statecastBin, "statecast-bin", "", "the statecast binary (default: this executable)")
		fs.StringVar(&c.ceilingArgs, "ceiling-args", "", "extra flags for the ceiling")
		fs.StringVar(&c.statecastArgs, "statecast-args", "", "extra flags for statecast serve")
	}
	fs.BoolVar(&c.json, "json", false, "print one JSON line instead of a table")
	fs.StringVar(&c.room, "room", "bench", "room written (rooms: ROOM-0, ROOM-1, …)")
	fs.IntVar(&c.subs, "subs", 1000, "fanout: subscribers")
	fs.Float64Var(&c.rate, "rate", 1000, "fanout, rooms: writes per second (rooms: in total)")
	fs.IntVar(&c.payload, "payload", 100, "bytes of each value (a JSON string)")
	fs.IntVar(&c.keys, "keys", 10, "keys written in turn: k0…k<N-1>")
	fs.DurationVar(&c.duration, "duration", 10*time.Second, "fanout, rooms: measured window")
	fs.DurationVar(&c.warmup, "warmup", 2*time.Second, "fanout, rooms: writing before the window, not measured")
	fs.DurationVar(&c.drain, "drain", 15*time.Second, "fanout, rooms: longest wait for subscribers to catch up after the writer stops")
	fs.DurationVar(&c.timeout, "timeout", 120*time.Second, "bound of each phase (connecting, replies, resyncs)")
	fs.IntVar(&c.rooms, "rooms", 100, "rooms: rooms; writes: write to ROOM-0…ROOM-<N-1> in turn instead of ROOM")
	fs.IntVar(&c.perRoom, "subs-per-room", 10, "rooms: subscribers per room")
	fs.IntVar(&c.conns, "conns", 10000, "idle, storm: connections")
	fs.DurationVar(&c.hold, "hold", 5*time.Second, "idle: how long the connections are held before RSS is read")
	fs.IntVar(&c.events, "events", 10000, "resume: writes missed")
	fs.IntVar(&c.repeat, "repeat", 5, "resume: runs (the median is reported)")
	fs.IntVar(&c.stormWrites, "storm-writes", 10, "storm: writes while the clients are away")
	fs.IntVar(&c.dialConc, "dial-concurrency", 200, "connections being opened at a time")
	fs.IntVar(&c.window, "window", 1000, "writes in flight at most")
	fs.StringVar(&c.writeVia, "write-via", "ws", "statecast's writer: ws (put requests on WebSockets) or http (PUT /v1/rooms/{room}/kv/{key} pipelined on keep-alive HTTP/1.1 connections, as the ceiling's POST /publish)")
	fs.IntVar(&c.writers, "writers", 4, "writer connections, used in turn (with 1, each reply is checked to commit at the next revision)")
	fs.BoolVar(&c.fullDecode, "full-decode", false, "subscribers also decode every message with encoding/json into a generic value, as a client written from the protocol would (the load tool's own scanner reads only what it checks)")
	fs.BoolVar(&c.rawReader, "raw-reader", false, "subscribers use the tool's own minimal WebSocket client (one read syscall parses many frames; no per-message context or lock) instead of github.com/coder/websocket: a client that costs little CPU, so that a run on one machine measures the server more than the tool")
	fs.StringVar(&c.protocol, "protocol", "v2", "statecast protocol version the subscribers and writers speak: v2 (dense JSON) or v1 (PROTOCOL.md)")
	fs.StringVar(&c.cpuProfile, "cpuprofile", "", "write the load tool's own CPU profile to this file")
	fs.StringVar(&c.attack, "attack", "", "attack: which one ("+attackNames()+")")
	fs.IntVar(&c.prefixes, "prefixes", 80000, "attack unsub-prefixes: key prefixes per subscription")
	fs.IntVar(&c.prefixSubs, "prefix-subs", 3, "attack unsub-prefixes: subscriptions")
	fs.IntVar(&c.attackWrites, "writes", 2645, "attack history-bytes: writes")
	fs.IntVar(&c.valueBytes, "value-bytes", 250000, "attack history-bytes: bytes of each value (a JSON string)")
	fs.IntVar(&c.watchers, "watchers", 1, "attack history-bytes: watchers that never read")
	fs.IntVar(&c.attackConns, "attack-conns", 0, "attack slow-body, sse-flood: connections (default 20200 and 3000; capped by RLIMIT_NOFILE and local ports)")
	fs.DurationVar(&c.attackHold, "attack-hold", 0, "attack slow-body: longest wait for the server to cut a stalled connection (default 30s); sse-flood: how long streams are held (default 3s)")
	fs.IntVar(&c.httpWrites, "http-writes", 1000, "attack http-write-rate: PUTs")
	fs.StringVar(&c.etcdAddr, "etcd-addr", "", "attack etcd-*: the server's etcd API, HOST:PORT (its statecast serve --etcd-addr)")
	fs.StringVar(&c.part, "part", "0/1", "scale: this process's share I/N of --conns: the connections i with i % N = I")
	fs.StringVar(&c.sources, "source", "", "scale: local source addresses, in turn: comma-separated loopback addresses or ranges A-B (default: the kernel's choice)")
	fs.StringVar(&c.placement, "placement", "rr", "scale: rr (connections over the --sub-url nodes in turn) or room (a room's connections on one node)")
	fs.BoolVar(&c.lease, "lease", false, "scale: each connection holds a session-leased key")
	fs.IntVar(&c.seq, "seq", 0, "scale-mark: the marked write's number, carried in its value")
	fs.StringVar(&c.server, "server", "statecast", "scale, scale-mark: what the nodes are: statecast, or centrifugo (Centrifugo v6: its JSON client protocol on /connection/websocket, marked writes by its HTTP API with the key \""+centrifugoAPIKey+"\"; no --lease)")
	fs.DurationVar(&c.waitIdle, "wait-idle", 0, "before each run, wait up to this long for the other processes of the machine to use under 10% of a CPU (a shared machine)")

	var pos []string
	rest := args
	for {
		if err := fs.Parse(rest); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	if err := flags.FromEnv(fs); err != nil {
		return nil, err
	}
	fs.Visit(func(f *flag.Flag) { c.roomsSet = c.roomsSet || f.Name == "rooms" })
	if len(pos) != 1 {
		fs.Usage()
		return nil, errors.New("bench: want one SCENARIO: " + strings.Join(scenarios, ", "))
	}
	c.scenario = pos[0]
	known := false
	for _, s := range scenarios {
		known = known || s == c.scenario
	}
	switch {
	case !known:
		return nil, fmt.Errorf("bench: unknown scenario %q (want %s)", c.scenario, strings.Join(scenarios, ", "))
	case c.protocol != "v1" && c.protocol != "v2":
		return nil, fmt.Errorf("bench: --protocol must be v1 or v2, not %q", c.protocol)
	case !compare && c.target != "statecast" && c.target != "ceiling":
		return nil, fmt.Errorf("bench: --target must be statecast or ceiling, not %q", c.target)
	case !compare && c.pid != 0 && c.spawn != "":
		return nil, errors.New("bench: give --server-pid or --spawn, not both")
	case c.subs < 1 || c.rooms < 1 || c.perRoom < 1 || c.conns < 1 || c.events < 1 || c.repeat < 1 || c.stormWrites < 1:
		return nil, errors.New("bench: counts must be at least 1")
	case c.rate <= 0 || c.duration <= 0 || c.warmup < 0 || c.timeout <= 0:
		return nil, errors.New("bench: --rate and --duration must be positive")
	case c.keys < 1 || c.keys > 1000 || c.payload < 1 || c.payload > 64<<10:
		return nil, errors.New("bench: --keys must be 1…1000 and --payload 1…65536")
	case c.writeVia != "ws" && c.writeVia != "http":
		return nil, fmt.Errorf("bench: --write-via %q: want ws or http", c.writeVia)
	case c.dialConc < 1 || c.window < 1 || c.writers < 1:
		return nil, errors.New("bench: --dial-concurrency, --window and --writers must be at least 1")
	case !validRoom(c.room):
		return nil, fmt.Errorf("bench: bad --room %q", c.room)
	}
	for _, u := range c.subURLs {
		if pu, err := url.Parse(u); err != nil || pu.Scheme != "http" || !loopback(pu.Hostname()) {
			return nil, fmt.Errorf("bench: bad --sub-url %q: want http:// on this machine", u)
		}
	}
	for _, u := range c.writeURLs {
		if pu, err := url.Parse(u); err != nil || pu.Scheme != "http" || !loopback(pu.Hostname()) {
			return nil, fmt.Errorf("bench: bad --write-url %q: want http:// on this machine", u)
		}
	}
	if !compare && c.url == "" {
		c.url = "http://127.0.0.1:8080"
		if c.target == "ceiling" {
			c.url = "http://127.0.0.1:8001"
		}
	}
	return c, nil
}

// pidList parses a flag of comma-separated process ids into *dst,
// appending on every use.
func pidList(dst *[]int) func(string) error {
	return func(v string) error {
		for _, f := range strings.Split(v, ",") {
			pid, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || pid <= 0 {
				return fmt.Errorf("bad pid %q", f)
			}
			*dst = append(*dst, pid)
		}
		return nil
	}
}

// validRoom accepts room names (PROTOCOL.md §1) short enough for a
// -N suffix.
func validRoom(r string) bool {
	if r == "" || len(r) > 120 {
		return false
	}
	for _, c := range r {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("._:-@", c)) {
			return false
		}
	}
	return true
}

// startProfile writes this process's CPU profile to path until stop.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// loopback reports whether host names this machine's loopback.
func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Run runs statecast bench with args (what follows "bench" on the command
// line) until done or ctx ends; results go to out, progress and usage to
// errOut.
func Run(ctx context.Context, args []string, out, errOut io.Writer) error {
	if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(out, usage)
		return nil
	}
	if len(args) > 0 && args[0] == "ceiling" {
		return ceiling.Run(ctx, args[1:], errOut)
	}
	// The load tool allocates little per message; collect less often.
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	if len(args) > 0 && args[0] == "compare" {
		err := runCompare(ctx, args[1:], out, errOut)
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	cfg, err := parseFlags(args, false, errOut)
	if errors.Is(err, flag.ErrHelp) {
		return nil // -h: the usage was printed
	}
	if err != nil {
		return err
	}
	logf := func(format string, a ...any) { fmt.Fprintf(errOut, "bench: "+format+"\n", a...) }
	if cfg.cpuProfile != "" {
		stop, err := startProfile(cfg.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	switch cfg.scenario {
	case "scale":
		return runScale(ctx, cfg, os.Stdin, out, errOut)
	case "scale-mark":
		if u, err := url.Parse(cfg.url); err != nil || u.Scheme != "http" || !loopback(u.Hostname()) {
			return fmt.Errorf("bench: bad --url %q: want http:// on this machine", cfg.url)
		}
		return runScaleMark(ctx, cfg, out)
	case "scale-merge":
		return runScaleMerge(os.Stdin, out)
	}
	if cfg.scenario == "attack" {
		if err := prepareAttack(cfg); err != nil {
			return err
		}
	}
	var spawnArgs []string
	if cfg.spawn != "" {
		if spawnArgs, err = proc.Split(cfg.spawn); err != nil {
			return err
		}
	}
	res, err := runTarget(ctx, cfg, cfg.target, cfg.url, cfg.pid, spawnArgs, logf)
	if err != nil {
		return err
	}
	res.Command = "statecast bench " + proc.Quote(cfg.args)
	if cfg.json {
		b, err := json.Marshal(res)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", b)
		return err
	}
	if res.Attack != nil {
		printAttack(out, res)
		return nil
	}
	printResult(out, res)
	return nil
}

// runTarget runs cfg.scenario against one server, spawning it first
// when spawnArgs is set.
func runTarget(ctx context.Context, cfg *config, target, base string, pid int, spawnArgs []string, logf func(string, ...any)) (*result, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("bench: bad --url %q", base)
	}
	if !loopback(u.Hostname()) {
		return nil, fmt.Errorf("bench: refusing non-loopback target %s: the load tool only drives servers on this machine", u.Host)
	}
	ceiling := target == "ceiling"
	if ceiling && cfg.scenario == "attack" {
		return nil, errors.New("bench: attacks are on statecast only")
	}
	if ceiling && cfg.scenario == "rooms" {
		return nil, errors.New("bench: the ceiling has no rooms: run fanout against it")
	}
	res := &result{Scenario: cfg.scenario, Target: target, URL: base}
	if pid != 0 || len(spawnArgs) > 0 {
		// The server's CPU is measured: say if something else loads the
		// machine.
		if busy, err := waitIdle(ctx, cfg.waitIdle); err != nil {
			return nil, err
		} else if busy > 20 {
			res.addNote("before the run other processes used %.0f%% of a CPU", busy)
		}
	}
	if len(spawnArgs) > 0 {
		probe := strings.TrimRight(base, "/") + "/readyz"
		if ceiling {
			probe = strings.TrimRight(base, "/") + "/stats"
		}
		logf("starting %s", proc.Quote(spawnArgs))
		sp, err := spawnServer(ctx, spawnArgs, probe, 30*time.Second)
		if err != nil {
			return nil, err
		}
		defer sp.stop()
		pid = sp.pid()
		res.ServerCmd = proc.Quote(spawnArgs)
	}
	res.ServerPID = pid
	e := newEnv(cfg, ceiling, strings.TrimRight(base, "/"), pid, logf)
	defer e.close()
	switch cfg.scenario {
	case "fanout":
		err = e.runFanout(ctx, res, 1, cfg.subs)
	case "rooms":
		err = e.runFanout(ctx, res, cfg.rooms, cfg.perRoom)
	case "idle":
		err = e.runIdle(ctx, res)
	case "resume":
		err = e.runResume(ctx, res)
	case "storm":
		err = e.runStorm(ctx, res)
	case "writes":
		err = e.runWrites(ctx, res)
	case "attack":
		err = e.runAttack(ctx, res)
	}
	if err != nil {
		return nil, fmt.Errorf("bench %s against %s: %w", cfg.scenario, target, err)
	}
	return res, nil
}

// waitIdle waits up to d for a second in which the other processes of the
// machine use under 10% of a CPU; it returns the last percentage seen
// (over 0.5 s when d is 0).
func waitIdle(ctx context.Context, d time.Duration) (float64, error) {
	deadline := time.Now().Add(d)
	for {
		window := time.Second
		if d == 0 {
			window = 500 * time.Millisecond
		}
		a, self0 := machineBusy(), selfCPU()
		if err := sleepCtx(ctx, window); err != nil {
			return 0, err
		}
		b, self1 := machineBusy(), selfCPU()
		if a < 0 || b < 0 {
			return 0, nil
		}
		busy := 100 * ((b - a) - (self1 - self0)).Seconds() / window.Seconds()
		if busy < 10 || time.Now().After(deadline) {
			return busy, nil
		}
	}
}

// env is one server under load.
type env struct {
	cfg     *config
	ceiling bool
	base    string // http://host:port
	ws      string
	subWS   []string // the subscribers' nodes, when not base
	writeWS []string // the writer's nodes, when not base
	pid     int
	rest    *http.Client
	dialer  *http.Client
	pinger  *pinger
	logf    func(string, ...any)
	pingMS  atomic.Int64
}

func newEnv(cfg *config, ceiling bool, base string, pid int, logf func(string, ...any)) *env {
	ws := "ws" + strings.TrimPrefix(base, "http")
	if ceiling {
		ws += "/ws"
	} else {
		ws += "/v1/ws"
	}
	e := &env{
		cfg: cfg, ceiling: ceiling, base: base, ws: ws, pid: pid, logf: logf,
		rest: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8}},
		dialer: &http.Client{Transport: &http.Transport{
			Proxy:       nil,
			DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		}},
	}
	for _, u := range cfg.subURLs {
		e.subWS = append(e.subWS, "ws"+strings.TrimPrefix(strings.TrimRight(u, "/"), "http")+"/v1/ws")
	}
	for _, u := range cfg.writeURLs {
		e.writeWS = append(e.writeWS, "ws"+strings.TrimPrefix(strings.TrimRight(u, "/"), "http")+"/v1/ws")
	}
	e.pingMS.Store(25000)
	e.pinger = startPinger(func() time.Duration { return time.Duration(e.pingMS.Load()) * time.Millisecond })
	return e
}

func (e *env) close() {
	e.pinger.close()
	e.rest.CloseIdleConnections()
	e.dialer.CloseIdleConnections()
}

func (e *env) hostport() string {
	u, _ := url.Parse(e.base)
	if u.Port() == "" {
		return u.Host + ":80"
	}
	return u.Host
}

// notePing adopts the ping interval a run's connections were given.
func (e *env) notePing(st *runState) {
	if ms := st.pingMS.Load(); ms > 0 {
		e.pingMS.Store(ms)
	}
}

// getJSON GETs path and decodes the reply.
func (e *env) getJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.base+path, nil)
	if err != nil {
		return err
	}
	resp, err := e.rest.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, clip(b))
	}
	return json.Unmarshal(b, v)
}

// roomState is a room's revision and items (GET /v1/rooms/{room}/kv).
func (e *env) roomState(ctx context.Context, room string) (uint64, []roomItem, error) {
	var l struct {
		Rev   uint64     `json:"rev"`
		Items []roomItem `json:"items"`
	}
	err := e.getJSON(ctx, "/v1/rooms/"+url.PathEscape(room)+"/kv", &l)
	return l.Rev, l.Items, err
}

// ceilingOffset is the ceiling's last published offset (GET /stats).
func (e *env) ceilingOffset(ctx context.Context) (uint64, error) {
	var s struct {
		Last uint64 `json:"last_offset"`
	}
	err := e.getJSON(ctx, "/stats", &s)
	return s.Last, err
}

func (e *env) dialWS(ctx context.Context, u string, subprotocols []string) (*websocket.Conn, error) {
	c, err := untilAdmitted(ctx, func() (*websocket.Conn, error) {
		c, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
			HTTPClient:      e.dialer,
			Subprotocols:    subprotocols,
			CompressionMode: websocket.CompressionDisabled,
		})
		return c, busyOf(resp, err)
	})
	if err != nil {
		return nil, err
	}
	c.SetReadLimit(64 << 20)
	return c, nil
}

// busyError: the node answered an upgrade 503 with Retry-After: it works
// on as many connects as it takes (--max-connecting).
type busyError struct {
	after time.Duration
	full  bool // Statecast-Refused: full: the node has no connection to give
	err   error
}

func (e *busyError) Error() string {
	if e.full {
		return fmt.Sprintf("full, retry after %v: %v", e.after, e.err)
	}
	return fmt.Sprintf("busy, retry after %v: %v", e.after, e.err)
}

// busyOf returns a *busyError for an upgrade answered 503 with
// Retry-After, else err.
func busyOf(resp *http.Response, err error) error {
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		return err
	}
	s, perr := strconv.Atoi(resp.Header.Get("Retry-After"))
	if perr != nil || s <= 0 {
		return err
	}
	return &busyError{after: time.Duration(s) * time.Second, full: resp.Header.Get("Statecast-Refused") == "full", err: err}
}

// untilAdmitted calls dial until the node does not answer busy, waiting
// between Retry-After and twice it before each new try, as a client does
// (the jitter spreads the clients a node refused at once).
func untilAdmitted[T any](ctx context.Context, dial func() (T, error)) (T, error) {
	for {
		c, err := dial()
		var busy *busyError
		if !errors.As(err, &busy) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return c, err
		case <-time.After(busy.after + rand.N(busy.after)):
		}
	}
}

// dialSub opens a subscriber's connection: the library's, or with
// --raw-reader the tool's own minimal client.
func (e *env) dialSub(ctx context.Context, u string, subprotocols []string) (wsConn, error) {
	if !e.cfg.rawReader {
		c, err := e.dialWS(ctx, u, subprotocols)
		if err != nil {
			return nil, err
		}
		return libConn{c}, nil
	}
	c, err := untilAdmitted(ctx, func() (*rawConn, error) {
		return dialRaw(ctx, (&net.Dialer{Timeout: 10 * time.Second}).DialContext, u, subprotocols)
	})
	if err != nil {
		return nil, err
	}
	return c, nil
}

func (e *env) dialStatecast(ctx context.Context) (*websocket.Conn, error) {
	return e.dialWS(ctx, e.ws, e.subprotocols())
}

// subprotocols is what a statecast connection offers: one version, so a
// run measures the one asked for.
func (e *env) subprotocols() []string {
	return []string{"statecast." + e.cfg.protocol + ".json"}
}

// connectSub opens a connection for s and starts its reader. With from,
// it resumes at s's position: statecast sub from {epoch, lastRev+1}, the
// ceiling ?since=lastRev.
func (e *env) connectSub(ctx context.Context, st *runState, s *subscriber, room string, from bool) error {
	s.replayed = 0
	var c wsConn
	var err error
	if e.ceiling {
		u := e.ws
		if from {
			u += "?since=" + strconv.FormatUint(s.lastRev.Load(), 10)
		}
		s.subAt = st.now()
		if c, err = e.dialSub(ctx, u, nil); err != nil {
			return err
		}
	} else {
		u := e.ws
		if len(e.subWS) > 0 {
			u = e.subWS[s.idx%len(e.subWS)]
		}
		if c, err = e.dialSub(ctx, u, e.subprotocols()); err != nil {
			return err
		}
		frame := []byte(`{"t":"connect"}` + "\n" + `{"t":"sub","id":1,"room":"` + room + `"`)
		if from {
			epoch, _ := json.Marshal(s.epoch)
			frame = append(frame, `,"from":{"epoch":`...)
			frame = append(frame, epoch...)
			frame = append(frame, `,"rev":`...)
			frame = strconv.AppendUint(frame, s.lastRev.Load()+1, 10)
			frame = append(frame, '}')
		}
		frame = append(frame, '}')
		s.subAt = st.now()
		if err := c.writeText(ctx, frame); err != nil {
			c.closeNow()
			return err
		}
		e.pinger.add(c)
	}
	done := make(chan struct{})
	s.mu.Lock()
	s.conn, s.done = c, done
	s.mu.Unlock()
	s.closing.Store(false)
	if e.ceiling && s.wantRev <= s.lastRev.Load() {
		s.markReady(st, st.now())
	}
	go s.read(c, st, done)
	return nil
}

// connectAll connects subs with at most --dial-concurrency dials at a
// time, retrying failed dials until --timeout. It returns the retries and
// the subscribers it could not connect, with the first error.
func (e *env) connectAll(ctx context.Context, st *runState, subs []*subscriber, room func(*subscriber) string, from bool) (retries int64, failed int, firstErr error) {
	deadline := time.Now().Add(e.cfg.timeout)
	sem := make(chan struct{}, e.cfg.dialConc)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var nRetries atomic.Int64
	for _, s := range subs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return nRetries.Load(), len(subs), ctx.Err()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			backoff := 50 * time.Millisecond
			for {
				dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
				err := e.connectSub(dctx, st, s, room(s), from)
				cancel()
				if err == nil {
					return
				}
				if ctx.Err() != nil || time.Now().Add(backoff).After(deadline) {
					mu.Lock()
					failed++
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					return
				}
				nRetries.Add(1)
				time.Sleep(backoff)
				backoff = min(2*backoff, time.Second)
			}
		}()
	}
	wg.Wait()
	return nRetries.Load(), failed, firstErr
}

// waitReady waits until want subscribers are ready (st.ready).
func (e *env) waitReady(ctx context.Context, st *runState, want int64) error {
	deadline := time.Now().Add(e.cfg.timeout)
	for st.ready.Load() < want {
		if time.Now().After(deadline) {
			return fmt.Errorf("only %d of %d subscribers ready after %v", st.ready.Load(), want, e.cfg.timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Millisecond):
		}
	}
	e.notePing(st)
	return nil
}

// closeSubs drops the subscribers' connections at once (no close
// handshake) and waits for their readers.
func (e *env) closeSubs(subs []*subscriber) {
	for _, s := range subs {
		s.closing.Store(true)
		s.mu.Lock()
		c := s.conn
		s.conn = nil
		s.mu.Unlock()
		if c != nil {
			e.pinger.remove(c)
			c.closeNow()
		}
	}
	for _, s := range subs {
		s.mu.Lock()
		done := s.done
		s.mu.Unlock()
		if done != nil {
			<-done
		}
	}
}

// sumMsgs is the number of messages the subscribers have received.
func sumMsgs(subs []*subscriber) int64 {
	var n int64
	for _, s := range subs {
		n += s.msgs.Load()
	}
	return n
}

// sleepCtx sleeps d unless ctx ends first.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cpuSample is the CPU time used so far by the server (-1: unknown), the
// load tool and all processes of the machine (-1: unknown).
// redis is the sum of the Redis servers' (-1: unknown), redisEach each
// one's.
// nodes and nodeEach are the other statecast nodes' (--node-pid), like
// redis.
type cpuSample struct {
	server, tool, machine, redis, nodes time.Duration
	redisEach, nodeEach                 []time.Duration
}

func (e *env) sampleCPU() cpuSample {
	c := cpuSample{server: e.serverCPU(), tool: selfCPU(), machine: machineBusy()}
	c.redis, c.redisEach = pidsCPU(e.cfg.redisPIDs)
	c.nodes, c.nodeEach = pidsCPU(e.cfg.nodePIDs)
	return c
}

// pidsCPU is the CPU time so far of processes pids, in all and each, or
// -1 when there are none or one cannot be read.
func pidsCPU(pids []int) (sum time.Duration, each []time.Duration) {
	if len(pids) == 0 {
		return -1, nil
	}
	for _, pid := range pids {
		d, err := proc.CPU(pid)
		if err != nil {
			return -1, nil
		}
		sum += d
		each = append(each, d)
	}
	return sum, each
}

// nodesRSS is the RSS in MB of each --node-pid process (0: unreadable).
func (e *env) nodesRSS() []float64 {
	var out []float64
	for _, pid := range e.cfg.nodePIDs {
		n, _ := procRSS(pid)
		out = append(out, float64(n)/(1<<20))
	}
	return out
}

// cpuShares fills the CPU figures of r for the window between a and b.
func (r *result) cpuShares(a, b cpuSample, win time.Duration) {
	pct := func(d time.Duration) float64 { return 100 * d.Seconds() / win.Seconds() }
	r.ToolCPUPct = pct(b.tool - a.tool)
	if a.nodes >= 0 && b.nodes >= 0 {
		for i := range b.nodeEach {
			r.NodeCPUPctEach = append(r.NodeCPUPctEach, pct(b.nodeEach[i]-a.nodeEach[i]))
		}
	}
	if a.server >= 0 && b.server >= 0 {
		r.ServerCPUPct = pct(b.server - a.server)
	}
	if a.machine >= 0 && b.machine >= 0 && a.server >= 0 && b.server >= 0 {
		// The other processes of the machine: figures are to be trusted
		// only when they are near 0.
		r.OtherCPUPct = max(0, pct(b.machine-a.machine)-r.ServerCPUPct-r.ToolCPUPct)
		if a.redis >= 0 && b.redis >= 0 {
			r.RedisCPUPct = pct(b.redis - a.redis)
			if len(b.redisEach) > 1 {
				for i := range b.redisEach {
					r.RedisCPUPctEach = append(r.RedisCPUPctEach, pct(b.redisEach[i]-a.redisEach[i]))
				}
			}
			r.OtherCPUPct = max(0, r.OtherCPUPct-r.RedisCPUPct)
		}
		if a.nodes >= 0 && b.nodes >= 0 {
			r.OtherCPUPct = max(0, r.OtherCPUPct-pct(b.nodes-a.nodes))
		}
		if r.OtherCPUPct > 20 {
			r.addNote("other processes used %.0f%% of a CPU during the measurement: figures are disturbed", r.OtherCPUPct)
		}
	}
}

// serverCPU is the server's CPU time so far, or -1 when its pid is unknown.
func (e *env) serverCPU() time.Duration {
	if e.pid == 0 {
		return -1
	}
	d, err := proc.CPU(e.pid)
	if err != nil {
		return -1
	}
	return d
}

// serverRSS is the server's resident memory, or -1 when its pid is unknown.
func (e *env) serverRSS() int64 {
	if e.pid == 0 {
		return -1
	}
	n, err := procRSS(e.pid)
	if err != nil {
		return -1
	}
	return n
}
