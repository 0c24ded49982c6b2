package redistest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Failover is a master, its replicas and the Sentinels that watch them
// and promote a replica when the master fails, all on loopback.
type Failover struct {
	Name      string    // the master's name at the Sentinels
	Data      []*Server // the master first, then its replicas
	Sentinels []*Server
	// Timeout is the Sentinels' failover-timeout: a Sentinel that took
	// part in a failover of the master starts or votes for no other
	// within twice that. Promoted is when WaitPromoted last saw one.
	Timeout  time.Duration
	Promoted time.Time
}

// StartFailover starts a master (with opts), replicas replicas of it and
// sentinels Sentinels (quorum: a majority of them) that consider the
// master down after downAfter without a reply, and waits until every
// replica is in sync and every Sentinel knows every replica and every
// other Sentinel.
func StartFailover(t testing.TB, replicas, sentinels int, downAfter time.Duration, opts Options) *Failover {
	t.Helper()
	Require(t)
	f := &Failover{Name: "statecast", Timeout: 2*downAfter + time.Second}
	// Replication starts at once (no wait for more replicas before a
	// diskless sync).
	opts.Args = append(opts.Args, "--repl-diskless-sync-delay", "0")
	master := Start(t, opts)
	f.Data = append(f.Data, master)
	for range replicas {
		ro := opts
		ro.ReplicaOf = master.Addr()
		f.Data = append(f.Data, Start(t, ro))
	}
	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d\n"+
		"sentinel down-after-milliseconds %s %d\n"+
		"sentinel failover-timeout %s %d\n"+
		"sentinel parallel-syncs %s %d\n",
		f.Name, master.Port, sentinels/2+1,
		f.Name, downAfter.Milliseconds(),
		f.Name, f.Timeout.Milliseconds(),
		f.Name, replicas)
	for range sentinels {
		f.Sentinels = append(f.Sentinels, Start(t, Options{sentinel: conf, TLS: opts.TLS}))
	}
	if err := f.wait(20*time.Second, func() error { return f.ready(master, replicas, sentinels) }); err != nil {
		t.Fatalf("redistest: the failover group did not settle: %v", err)
	}
	return f
}

// URL is the redis+sentinel:// URL of the group's master.
func (f *Failover) URL() string {
	var addrs []string
	for _, s := range f.Sentinels {
		addrs = append(addrs, s.Addr())
	}
	if tc := f.Data[0].opts.TLS; tc != nil {
		return "rediss+sentinel://" + strings.Join(addrs, ",") + "/" + f.Name + "/0?" + tc.Query()
	}
	return "redis+sentinel://" + strings.Join(addrs, ",") + "/" + f.Name + "/0"
}

// Master asks the Sentinels which server is the master now.
func (f *Failover) Master() (*Server, error) {
	var last error
	for _, s := range f.Sentinels {
		reply, err := Do(s.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", f.Name)
		if err != nil {
			last = err
			continue
		}
		if _, port, ok := strings.Cut(reply, "\n"); ok {
			for _, d := range f.Data {
				if strconv.Itoa(d.Port) == port {
					return d, nil
				}
			}
		}
		last = fmt.Errorf("sentinel %s names master %q", s.Addr(), reply)
	}
	return nil, last
}

// WaitPromoted waits until every Sentinel names a master other than old
// and that master says it is one; it returns it.
func (f *Failover) WaitPromoted(old *Server, timeout time.Duration) (*Server, error) {
	var m *Server
	err := f.wait(timeout, func() error {
		var err error
		for _, s := range f.Sentinels {
			if !s.running() {
				continue
			}
			reply, err := Do(s.Addr(), "SENTINEL", "GET-MASTER-ADDR-BY-NAME", f.Name)
			if err != nil {
				return err
			}
			if strings.HasSuffix(reply, "\n"+strconv.Itoa(old.Port)) {
				return fmt.Errorf("sentinel %s still names %s", s.Addr(), old.Addr())
			}
		}
		if m, err = f.Master(); err != nil {
			return err
		}
		role, err := Do(m.Addr(), "ROLE")
		if err != nil || !strings.HasPrefix(role, "master") {
			return fmt.Errorf("%s is not a master yet (%q, %v)", m.Addr(), role, err)
		}
		return nil
	})
	if err == nil {
		f.Promoted = time.Now()
	}
	return m, err
}

// ready checks that master has replicas replicas online and every
// Sentinel knows them and the other Sentinels.
func (f *Failover) ready(master *Server, replicas, sentinels int) error {
	info, err := Do(master.Addr(), "INFO", "replication")
	if err != nil {
		return err
	}
	if online := strings.Count(info, "state=online"); online < replicas {
		return fmt.Errorf("%d of %d replicas online", online, replicas)
	}
	for _, s := range f.Sentinels {
		reply, err := Do(s.Addr(), "SENTINEL", "MASTER", f.Name)
		if err != nil {
			return err
		}
		fields := strings.Split(reply, "\n")
		got := map[string]string{}
		for i := 0; i+1 < len(fields); i += 2 {
			got[fields[i]] = fields[i+1]
		}
		if got["num-slaves"] != strconv.Itoa(replicas) || got["num-other-sentinels"] != strconv.Itoa(sentinels-1) {
			return fmt.Errorf("sentinel %s knows %s replicas and %s other sentinels", s.Addr(), got["num-slaves"], got["num-other-sentinels"])
		}
	}
	return nil
}

func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

func (f *Failover) wait(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Signal sends sig to the running server: SIGSTOP freezes it (its
// sockets stay open; it reads, answers and replicates nothing), SIGCONT
// thaws it. Callers off the test's goroutine may use it.
func (s *Server) Signal(sig syscall.Signal) error {
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("redistest: redis-server on port %d is not running", s.Port)
	}
	return cmd.Process.Signal(sig)
}

// WaitReplicated waits until every replica connected to master has
// acknowledged the master's replication offset as it is when called: it
// holds everything the master held then.
func (f *Failover) WaitReplicated(master *Server, timeout time.Duration) error {
	info, err := Do(master.Addr(), "INFO", "replication")
	if err != nil {
		return err
	}
	target, ok := infoField(info, "master_repl_offset")
	if !ok {
		return fmt.Errorf("redistest: no master_repl_offset in %q", info)
	}
	return f.wait(timeout, func() error {
		info, err := Do(master.Addr(), "INFO", "replication")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(info, "\r\n") {
			if !strings.HasPrefix(line, "slave") || !strings.Contains(line, "offset=") {
				continue
			}
			_, off, _ := strings.Cut(line, "offset=")
			off, _, _ = strings.Cut(off, ",")
			if o, _ := strconv.ParseInt(off, 10, 64); o < target {
				return fmt.Errorf("redistest: replica %q is behind the master's offset %d", line, target)
			}
		}
		return nil
	})
}

// infoField reads an integer field of an INFO reply.
func infoField(info, name string) (int64, bool) {
	i := strings.Index(info, name+":")
	if i < 0 {
		return 0, false
	}
	v, _, _ := strings.Cut(info[i+len(name)+1:], "\r\n")
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil
}

// writeSentinelConf writes a Sentinel's configuration file the first
// time it starts; later it keeps what the Sentinel rewrote in it.
func (s *Server) writeSentinelConf() error {
	if s.opts.sentinel == "" {
		return nil
	}
	p := filepath.Join(s.Dir, "sentinel.conf")
	if _, err := os.Stat(p); err == nil || !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return os.WriteFile(p, []byte(s.opts.sentinel), 0o644)
}

func (s *Server) sentinelArgs() []string {
	port := []string{"--port", strconv.Itoa(s.Port)}
	if s.opts.TLS != nil {
		port = s.opts.TLS.args(s.Port)
	}
	return append(append([]string{filepath.Join(s.Dir, "sentinel.conf"), "--sentinel"}, port...),
		"--bind", "127.0.0.1",
		"--dir", s.Dir,
		"--logfile", "redis.log",
		"--daemonize", "no",
	)
}

// Rejoin starts old, a killed member of the group, again as a replica of
// master (without persistence it comes back empty and syncs from it), and
// waits until master sees it online. Callers off the test's goroutine
// may use it: it reports failure as an error.
func (f *Failover) Rejoin(old, master *Server) error {
	old.mu.Lock()
	old.opts.ReplicaOf = master.Addr()
	old.mu.Unlock()
	if err := old.StartAgain(); err != nil {
		return err
	}
	return f.wait(20*time.Second, func() error {
		info, err := Do(master.Addr(), "INFO", "replication")
		if err != nil {
			return err
		}
		if !strings.Contains(info, "port="+strconv.Itoa(old.Port)+",state=online") {
			return fmt.Errorf("%s is not an online replica of %s yet", old.Addr(), master.Addr())
		}
		return nil
	})
}

// StartReplicatedCluster starts a Redis Cluster of masters masters with
// one replica each (cluster-node-timeout nodeTimeout, after which the
// replicas of a failed master promote one), and waits until every node
// reports cluster_state:ok with masters masters.
func StartReplicatedCluster(t testing.TB, masters int, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	Require(t)
	c := &Cluster{}
	for range 2 * masters {
		c.Nodes = append(c.Nodes, Start(t, Options{Cluster: true, Args: []string{
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10), "--repl-diskless-sync-delay", "0"}}))
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.WaitOK(masters, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

// WaitOK waits until every running node reports cluster_state:ok with
// masters masters and every replica's link up.
func (c *Cluster) WaitOK(masters int, timeout time.Duration) error {
	f := &Failover{}
	return f.wait(timeout, func() error {
		for _, n := range c.Nodes {
			if !n.running() {
				continue
			}
			info, err := Do(n.Addr(), "CLUSTER", "INFO")
			if err != nil || !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_size:"+strconv.Itoa(masters)+"\r\n") {
				return fmt.Errorf("redistest: cluster node %s not ok: %q %v", n.Addr(), info, err)
			}
			if role, err := Do(n.Addr(), "ROLE"); err != nil || strings.HasPrefix(role, "slave") && !strings.Contains(role, "\nconnected\n") {
				return fmt.Errorf("redistest: cluster replica %s not connected: %q %v", n.Addr(), role, err)
			}
		}
		return nil
	})
}

// MasterOf returns the running node that serves key's slot as a master,
// as that node itself says.
func (c *Cluster) MasterOf(key string) (*Server, error) {
	for _, n := range c.Nodes {
		if !n.running() {
			continue
		}
		slot, err := Do(n.Addr(), "CLUSTER", "KEYSLOT", key)
		if err != nil {
			return nil, err
		}
		s, _ := strconv.Atoi(slot)
		nodes, err := Do(n.Addr(), "CLUSTER", "NODES")
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) < 9 || !strings.Contains(f[2], "myself") || !strings.Contains(f[2], "master") {
				continue
			}
			for _, r := range f[8:] {
				lo, hi, ok := strings.Cut(r, "-")
				if !ok {
					hi = lo
				}
				l, _ := strconv.Atoi(lo)
				h, _ := strconv.Atoi(hi)
				if l <= s && s <= h {
					return n, nil
				}
			}
		}
	}
	return nil, fmt.Errorf("redistest: no running master serves %q", key)
}
