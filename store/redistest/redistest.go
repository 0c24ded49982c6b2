// Package redistest starts throwaway redis-server processes for tests: a
// standalone server on a free loopback port (without persistence, or with
// AOF), and a local Redis Cluster of several masters.
//
// Every server is started by the test that needs it and stopped by its pid
// in t.Cleanup, so tests never touch a Redis they did not start. When
// redis-server is not installed the test is skipped, except in CI
// (CI=true), where it fails: CI must exercise the Redis backend.
package redistest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Require skips t (or fails it in CI) unless redis-server and redis-cli
// are installed.
func Require(t testing.TB) {
	t.Helper()
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("redistest: %s not found (CI must install it: apt-get install redis-server redis-tools): %v", bin, err)
			}
			NoteSkipped("Redis tests (redis-server, redis-cli not installed)")
			t.Skipf("redistest: %s not installed: %v", bin, err)
		}
	}
}

// NoteSkipped records what a run skipped for a missing tool in the file
// $STATECAST_SKIPPED names (make test sets it, and lists the file at the
// end), so that a green run says what it did not check.
func NoteSkipped(what string) {
	if p := os.Getenv("STATECAST_SKIPPED"); p != "" {
		if f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			_, _ = f.WriteString(what + "\n")
			_ = f.Close()
		}
	}
}

// Options configure a server.
type Options struct {
	// AOF turns on the append-only file with appendfsync always, so every
	// acknowledged write survives a kill.
	AOF bool
	// Fsync, with AOF, is its appendfsync policy instead of always
	// (everysec: a machine crash may lose the last second, as CutAOF does).
	Fsync string
	// Cluster starts the server with cluster mode enabled.
	Cluster bool
	// ReplicaOf (host:port) starts the server as a replica of that master.
	ReplicaOf string
	// Args are extra redis-server arguments.
	Args []string
	// TLS, when set, makes the server listen with TLS only, on Port, and
	// ask clients for a certificate (see NewTLS).
	TLS *TLS

	sentinel string // the sentinel.conf to start from: a Sentinel (sentinel.go)
}

// Server is one redis-server process.
type Server struct {
	t    testing.TB
	Port int
	Dir  string
	opts Options

	mu  sync.Mutex
	cmd *exec.Cmd
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// URL is the server's redis:// URL (rediss:// with the files of its TLS).
func (s *Server) URL() string {
	if s.opts.TLS != nil {
		return "rediss://" + s.Addr() + "/0?" + s.opts.TLS.Query()
	}
	return "redis://" + s.Addr() + "/0"
}

// CPU is the CPU time the running server has used (from /proc; 0 where
// that cannot be read), for benchmarks that report Redis CPU per write.
func (s *Server) CPU() time.Duration {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields 14 and 15 (utime, stime, in clock ticks) follow the command
	// name in parentheses.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ is 100 on Linux
}

// Start starts a redis-server on a free loopback port with its own data
// directory and waits until it answers PING. It is killed when t ends.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	Require(t)
	s := &Server{t: t, Dir: t.TempDir(), opts: opts}
	var err error
	for attempt := 0; attempt < 10; attempt++ {
		s.Port = freePort(opts.Cluster)
		if err = s.start(); err == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("redistest: cannot start redis-server: %v", err)
	return nil
}

func (s *Server) args() []string {
	if s.opts.sentinel != "" {
		return s.sentinelArgs()
	}
	a := []string{"--port", strconv.Itoa(s.Port)}
	if s.opts.TLS != nil {
		a = s.opts.TLS.args(s.Port)
	}
	a = append(a,
		"--bind", "127.0.0.1",
		"--dir", s.Dir,
		"--save", "",
		"--logfile", "redis.log",
		"--daemonize", "no",
		"--maxmemory-policy", "noeviction",
	)
	if s.opts.AOF {
		fsync := s.opts.Fsync
		if fsync == "" {
			fsync = "always"
		}
		a = append(a, "--appendonly", "yes", "--appendfsync", fsync)
	} else {
		a = append(a, "--appendonly", "no")
	}
	if host, port, ok := strings.Cut(s.opts.ReplicaOf, ":"); ok {
		a = append(a, "--replicaof", host, port)
	}
	if s.opts.Cluster {
		a = append(a, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000")
		if s.opts.TLS != nil {
			a = append(a, "--tls-cluster", "yes")
		}
	}
	return append(a, s.opts.Args...)
}

func (s *Server) start() error {
	if err := s.writeSentinelConf(); err != nil {
		return err
	}
	if s.opts.TLS != nil {
		tlsAddrs.Store(s.Addr(), s.opts.TLS.clientConf)
	}
	cmd := exec.Command("redis-server", s.args()...)
	// If the test binary dies, so does the server.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		reply, err := Do(s.Addr(), "PING")
		if err == nil && reply == "PONG" {
			break
		}
		select {
		case err := <-exited:
			return fmt.Errorf("redis-server on port %d exited: %v; log:\n%s", s.Port, err, s.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			return fmt.Errorf("redis-server on port %d did not answer PING (last: %q, %v); log:\n%s", s.Port, reply, err, s.logTail())
		}
	}
	s.mu.Lock()
	s.cmd = cmd
	s.mu.Unlock()
	// Reap the process when it exits; Kill waits for that.
	go func() {
		<-exited
		s.mu.Lock()
		if s.cmd == cmd {
			s.cmd = nil
		}
		s.mu.Unlock()
	}()
	return nil
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.Dir, "redis.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Kill stops the server with SIGKILL (a crash: nothing is saved on the
// way out) and waits until it has exited. Killing a stopped server does
// nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	for i := 0; i < 500; i++ { // the reaper clears s.cmd
		s.mu.Lock()
		done := s.cmd != cmd
		s.mu.Unlock()
		if done {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The port is free once nothing accepts on it.
	for i := 0; i < 200; i++ {
		c, err := net.DialTimeout("tcp", s.Addr(), 50*time.Millisecond)
		if err != nil {
			return
		}
		c.Close()
		time.Sleep(10 * time.Millisecond)
	}
}

// Restart kills the server and starts it again on the same port with the
// same data directory and options: without persistence it comes back
// empty; with AOF it reloads every acknowledged write.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	if err := s.StartAgain(); err != nil {
		t.Fatal(err)
	}
}

// StartAgain starts a killed server again on its port and data directory,
// for callers off the test's goroutine (which must not call t.Fatal).
func (s *Server) StartAgain() error {
	var err error
	for attempt := 0; attempt < 50; attempt++ {
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the port may linger briefly
	}
	return fmt.Errorf("redistest: cannot restart redis-server on port %d: %v", s.Port, err)
}

// Cluster is a local Redis Cluster of masters without replicas.
type Cluster struct {
	Nodes []*Server
}

// Addrs lists the masters' host:port.
func (c *Cluster) Addrs() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.Addr())
	}
	return out
}

// StartCluster starts n cluster-enabled servers, joins them into one
// cluster (no replicas) and waits until every node reports
// cluster_state:ok with n masters. From 3 masters up redis-cli --cluster
// create does it; it refuses fewer, whose slots are assigned here in equal
// ranges.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return startCluster(t, n, Options{Cluster: true})
}

// StartTLSCluster is StartCluster with every node on TLS only (its bus
// too), requiring client certificates (see NewTLS).
func StartTLSCluster(t testing.TB, n int, tc *TLS) *Cluster {
	t.Helper()
	return startCluster(t, n, Options{Cluster: true, TLS: tc})
}

// URL is the cluster's seed URL for a store (with --redis-cluster): every
// node's address, then the TLS files.
func (c *Cluster) URL() string {
	if tc := c.Nodes[0].opts.TLS; tc != nil {
		return "rediss://" + strings.Join(c.Addrs(), ",") + "?" + tc.Query()
	}
	return "redis://" + strings.Join(c.Addrs(), ",")
}

func startCluster(t testing.TB, n int, opts Options) *Cluster {
	t.Helper()
	Require(t)
	c := &Cluster{}
	for range n {
		c.Nodes = append(c.Nodes, Start(t, opts))
	}
	if n >= 3 {
		args := append([]string{"--cluster", "create"}, c.Addrs()...)
		args = append(args, "--cluster-replicas", "0", "--cluster-yes")
		if tc := opts.TLS; tc != nil {
			args = append(args, "--tls", "--cacert", tc.CA, "--cert", tc.Cert, "--key", tc.Key)
		}
		out, err := exec.Command("redis-cli", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
		}
	} else {
		for i, node := range c.Nodes {
			lo, hi := strconv.Itoa(16384*i/n), strconv.Itoa(16384*(i+1)/n-1)
			if _, err := Do(node.Addr(), "CLUSTER", "ADDSLOTSRANGE", lo, hi); err != nil {
				t.Fatalf("redistest: CLUSTER ADDSLOTSRANGE on %s: %v", node.Addr(), err)
			}
			if _, err := Do(node.Addr(), "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.Nodes[0].Port)); err != nil {
				t.Fatalf("redistest: CLUSTER MEET from %s: %v", node.Addr(), err)
			}
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, node := range c.Nodes {
		for {
			info, err := Do(node.Addr(), "CLUSTER", "INFO")
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_size:"+strconv.Itoa(n)+"\r\n") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("redistest: cluster node %s not ok: %q %v", node.Addr(), info, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

// freePort picks a loopback port that is free now (and, for a cluster
// node, whose bus port +10000 is free too).
func freePort(cluster bool) int {
	for {
		p := 20000 + rand.IntN(30000)
		if !portFree(p) || (cluster && !portFree(p+10000)) {
			continue
		}
		return p
	}
}

func portFree(p int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// Do sends one command to addr over a fresh connection and returns the
// reply as a string: a simple or bulk string as is, an integer in
// decimal, an array's elements joined by newlines. An error reply is
// returned as an error.
func Do(addr string, args ...string) (string, error) {
	c, err := dial(addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(c))
}

func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", errors.New("redistest: empty reply")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", errors.New(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return "", err
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", err
		}
		var parts []string
		for range max(n, 0) {
			p, err := readReply(r)
			if err != nil {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redistest: unexpected reply %q", line)
}

// ReadRESP appends one complete RESP2/RESP3 value read from r, as raw
// bytes, to buf: for proxies that cut or drop whole replies.
func ReadRESP(r *bufio.Reader, buf []byte) ([]byte, error) {
	line, err := r.ReadBytes('\n')
	if err != nil {
		return buf, err
	}
	buf = append(buf, line...)
	if len(line) < 3 {
		return buf, fmt.Errorf("resp: short line %q", line)
	}
	n, _ := strconv.Atoi(string(line[1 : len(line)-2]))
	switch line[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return buf, nil
	case '$', '!', '=':
		if n < 0 {
			return buf, nil
		}
		start := len(buf)
		buf = append(buf, make([]byte, n+2)...)
		_, err := io.ReadFull(r, buf[start:])
		return buf, err
	case '*', '~', '>':
		for i := 0; i < n; i++ {
			if buf, err = ReadRESP(r, buf); err != nil {
				return buf, err
			}
		}
		return buf, nil
	case '%':
		for i := 0; i < 2*n; i++ {
			if buf, err = ReadRESP(r, buf); err != nil {
				return buf, err
			}
		}
		return buf, nil
	case '|': // attributes, then the value they describe
		for i := 0; i < 2*n; i++ {
			if buf, err = ReadRESP(r, buf); err != nil {
				return buf, err
			}
		}
		return ReadRESP(r, buf)
	}
	return buf, fmt.Errorf("resp: unknown type %q", line[0])
}

// incrAOF is the file the server appends its writes to now (Redis 7's
// multi-part AOF: the newest appendonlydir/*.incr.aof).
func (s *Server) incrAOF() (string, error) {
	files, err := filepath.Glob(filepath.Join(s.Dir, "appendonlydir", "*.incr.aof"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("redistest: no incremental AOF in %s (%v)", s.Dir, err)
	}
	newest, best := "", -1
	for _, f := range files {
		// appendonly.aof.<N>.incr.aof
		parts := strings.Split(filepath.Base(f), ".")
		if len(parts) >= 4 {
			if n, err := strconv.Atoi(parts[len(parts)-3]); err == nil && n > best {
				newest, best = f, n
			}
		}
	}
	if newest == "" {
		return "", fmt.Errorf("redistest: no numbered incremental AOF among %v", files)
	}
	return newest, nil
}

// AOFSize is the size of the AOF the server appends to now.
func (s *Server) AOFSize() (int64, error) {
	f, err := s.incrAOF()
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(f)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

// CutAOF cuts the AOF of a killed server back to size (an AOFSize taken
// earlier), as an OS crash under appendfsync everysec loses the writes
// of the last second, and returns how many bytes it cut. Redis loads a
// file whose last command is cut short (aof-load-truncated, its
// default).
func (s *Server) CutAOF(size int64) (int64, error) {
	f, err := s.incrAOF()
	if err != nil {
		return 0, err
	}
	st, err := os.Stat(f)
	if err != nil {
		return 0, err
	}
	if st.Size() < size {
		return 0, fmt.Errorf("redistest: %s is %d bytes, below the %d to cut back to", f, st.Size(), size)
	}
	return st.Size() - size, os.Truncate(f, size)
}
