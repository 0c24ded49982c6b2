package main

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// The etcd client's own recipes (client/v3/concurrency, unchanged) and
// etcdctl's lock and elect against the built binary with its default
// flags: the file store, the default write rate.

// recipeServer starts the binary with default flags and returns a client
// of its etcd API; the test fails if one of its goroutines outlives it.
func recipeServer(t *testing.T) *clientv3.Client {
	t.Helper()
	leaks := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, leaks) }) // runs last
	addr := serveEtcd(t, &mnNode{name: "recipes", redisURL: "file", rated: true, extra: []string{"--data", t.TempDir()}})
	p := &pacer{every: time.Second / 150, burst: 100 * time.Millisecond}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(p.intercept)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// pacer spaces the suite's writes below the server's default write rate
// (200 ops per second per client address): etcd's client does not retry
// ResourceExhausted, and the recipes under contention exceed it (the STM
// levels did, run back to back).
// A burst goes at once (spacing every write would keep the contenders
// from ever meeting).
type pacer struct {
	mu    sync.Mutex
	next  time.Time // when the budget is spent up to now (GCRA's theoretical arrival time)
	every time.Duration
	burst time.Duration
}

func (p *pacer) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if n := writeOps(req); n > 0 {
		p.mu.Lock()
		if now := time.Now(); p.next.Before(now) {
			p.next = now
		}
		at := p.next.Add(-p.burst)
		p.next = p.next.Add(time.Duration(n) * p.every)
		p.mu.Unlock()
		select {
		case <-time.After(time.Until(at)):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return invoke(ctx, method, req, reply, cc, opts...)
}

// writeOps is how many ops of req the server's write rate counts (a txn's
// larger branch).
func writeOps(req any) int {
	writes := func(ops []*pb.RequestOp) (n int) {
		for _, op := range ops {
			if op.GetRequestPut() != nil || op.GetRequestDeleteRange() != nil {
				n++
			}
		}
		return n
	}
	switch r := req.(type) {
	case *pb.PutRequest, *pb.DeleteRangeRequest:
		return 1
	case *pb.TxnRequest:
		return max(writes(r.Success), writes(r.Failure))
	}
	return 0
}

func session(t *testing.T, cli *clientv3.Client) *concurrency.Session {
	t.Helper()
	s, err := concurrency.NewSession(cli, concurrency.WithTTL(10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// critical is a critical section that notices company.
type critical struct{ inside, overlaps atomic.Int64 }

func (c *critical) enter() {
	if c.inside.Add(1) != 1 {
		c.overlaps.Add(1)
	}
}
func (c *critical) leave() { c.inside.Add(-1) }

func TestEtcdRecipes(t *testing.T) {
	cli := recipeServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	// 8 clients × 20 increments of one counter under concurrency.Mutex.
	t.Run("mutex contended", func(t *testing.T) {
		const workers, increments = 8, 20
		var cs critical
		sessions := make([]*concurrency.Session, workers)
		for w := range workers {
			sessions[w] = session(t, cli)
		}
		err := together(workers, func(w int) error {
			m := concurrency.NewMutex(sessions[w], "/recipes/counter-lock")
			for range increments {
				if err := m.Lock(ctx); err != nil {
					return fmt.Errorf("worker %d: lock: %w", w, err)
				}
				cs.enter()
				err := increment(ctx, cli, "/recipes/counter")
				cs.leave()
				if err == nil {
					err = m.Unlock(ctx)
				}
				if err != nil {
					return fmt.Errorf("worker %d: %w", w, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		get, err := cli.Get(ctx, "/recipes/counter")
		if err != nil || len(get.Kvs) != 1 || string(get.Kvs[0].Value) != strconv.Itoa(workers*increments) || cs.overlaps.Load() != 0 {
			t.Fatalf("counter %v (%v), %d overlaps; want %d and none", get.Kvs, err, cs.overlaps.Load(), workers*increments)
		}
	})

	// Two clients acquire at the same instant, round after round.
	t.Run("two acquirers", func(t *testing.T) {
		const rounds = 40
		pair := []*concurrency.Session{session(t, cli), session(t, cli)}
		var cs critical
		for round := range rounds {
			name := "/recipes/pair-" + strconv.Itoa(round)
			err := together(2, func(i int) error {
				m := concurrency.NewMutex(pair[i], name)
				if err := m.Lock(ctx); err != nil {
					return err
				}
				cs.enter()
				time.Sleep(2 * time.Millisecond) // long enough for the other to get in, were it let
				cs.leave()
				return m.Unlock(ctx)
			})
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if n := cs.overlaps.Load(); n != 0 {
			t.Fatalf("both held the lock %d times in %d rounds", n, rounds)
		}
	})

	// A campaign that is its room's first write wins; an observer sees
	// each leader in turn.
	t.Run("election on a fresh room", func(t *testing.T) {
		a, b, o := session(t, cli), session(t, cli), session(t, cli)
		const name = "/fresh-election/e"
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		ea := concurrency.NewElection(a, name)
		if err := ea.Campaign(cctx, "a"); err != nil {
			t.Fatalf("first campaign: %v", err)
		}
		octx, ocancel := context.WithCancel(ctx)
		observed := concurrency.NewElection(o, name).Observe(octx)
		defer func() {
			ocancel()
			for range observed { // ends with its context
			}
		}()
		leader := func(want string) {
			t.Helper()
			for {
				select {
				case resp := <-observed:
					if len(resp.Kvs) == 1 && string(resp.Kvs[0].Value) == want {
						return
					}
				case <-cctx.Done():
					t.Fatalf("the observer did not see leader %q", want)
				}
			}
		}
		leader("a")
		won := make(chan error, 1)
		go func() { won <- concurrency.NewElection(b, name).Campaign(cctx, "b") }()
		if err := ea.Resign(cctx); err != nil {
			t.Fatal(err)
		}
		if err := <-won; err != nil {
			t.Fatalf("second campaign: %v", err)
		}
		leader("b")
	})

	// Concurrent random transfers between 4 accounts under concurrency.STM
	// keep the total at every isolation level that promises it.
	t.Run("stm", func(t *testing.T) {
		levels := map[string]concurrency.Isolation{"SerializableSnapshot": concurrency.SerializableSnapshot,
			"Serializable": concurrency.Serializable, "RepeatableReads": concurrency.RepeatableReads, "ReadCommitted": concurrency.ReadCommitted}
		for name, iso := range levels {
			t.Run(name, func(t *testing.T) {
				const accounts, workers, transfers, each = 4, 4, 10, 100
				acct := func(i int) string { return "/bank-" + strings.ToLower(name) + "/" + strconv.Itoa(i) }
				for i := range accounts {
					if _, err := cli.Put(ctx, acct(i), strconv.Itoa(each)); err != nil {
						t.Fatal(err)
					}
				}
				err := together(workers, func(int) error {
					for range transfers {
						from, to := rand.IntN(accounts), rand.IntN(accounts-1)
						if to >= from {
							to++
						}
						_, err := concurrency.NewSTM(cli, func(stm concurrency.STM) error {
							f, _ := strconv.Atoi(stm.Get(acct(from)))
							g, _ := strconv.Atoi(stm.Get(acct(to)))
							n := rand.IntN(f/2 + 1)
							stm.Put(acct(from), strconv.Itoa(f-n))
							stm.Put(acct(to), strconv.Itoa(g+n))
							return nil
						}, concurrency.WithIsolation(iso), concurrency.WithAbortContext(ctx))
						if err != nil {
							return err
						}
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
				total := 0
				for i := range accounts {
					get, err := cli.Get(ctx, acct(i))
					if err != nil {
						t.Fatal(err)
					}
					n, _ := strconv.Atoi(string(get.Kvs[0].Value))
					total += n
				}
				switch {
				case iso == concurrency.ReadCommitted: // drifts by design, as on etcd
					t.Logf("ReadCommitted total: %d of %d", total, accounts*each)
				case total != accounts*each:
					t.Fatalf("total %d, want %d", total, accounts*each)
				}
			})
		}
	})
}

// together runs f(0), …, f(n-1) at once and returns the first error
// when all have returned.
func together(n int, f func(i int) error) error {
	errs := make(chan error, n)
	for i := range n {
		go func() { errs <- f(i) }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// increment adds one to the counter at key (a read, then a write: only
// the lock keeps two apart).
func increment(ctx context.Context, cli *clientv3.Client, key string) error {
	get, err := cli.Get(ctx, key)
	if err != nil {
		return err
	}
	n := 0
	if len(get.Kvs) == 1 {
		n, _ = strconv.Atoi(string(get.Kvs[0].Value))
	}
	_, err = cli.Put(ctx, key, strconv.Itoa(n+1))
	return err
}

// TestEtcdctlLockElect: etcdctl lock with several holders at once, each
// running a command that checks and sets a marker (at most one inside),
// and etcdctl elect on a fresh room.
func TestEtcdctlLockElect(t *testing.T) {
	// The file store, whose commits take an fsync: contenders meet.
	command, _ := etcdctlWith(t, &mnNode{name: "etcdctl", redisURL: "file", rated: true, extra: []string{"--data", t.TempDir()}})
	dir := t.TempDir()
	marker, log := filepath.Join(dir, "inside"), filepath.Join(dir, "log")
	// mkdir is atomic: it fails when another holder is inside.
	script := fmt.Sprintf(`if mkdir %[1]q; then echo in >> %[2]q; sleep 0.05; rmdir %[1]q; else echo overlap >> %[2]q; fi`, marker, log)
	const holders, turns = 6, 3
	err := together(holders, func(int) error {
		for range turns {
			if out, err := command("", "lock", "/etcdctl-lock/l", "--", "sh", "-c", script).CombinedOutput(); err != nil {
				return fmt.Errorf("etcdctl lock: %v\n%s", err, out)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	if want := strings.Repeat("in\n", holders*turns); string(got) != want {
		t.Fatalf("the holders' log:\n%s\nwant %d entries, one inside at a time", got, holders*turns)
	}

	// elect on a fresh room prints the leader, and a listener sees it.
	elect := command("", "elect", "/etcdctl-elect/e", "leader-1")
	stdout, err := elect.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := elect.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = elect.Process.Kill(); _ = elect.Wait() }()
	lines := make(chan string, 4)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	var printed []string
	for len(printed) < 2 {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("etcdctl elect ended after %q", printed)
			}
			printed = append(printed, l)
		case <-time.After(10 * time.Second):
			t.Fatalf("etcdctl elect printed %q in 10 s; want the leader's key and value", printed)
		}
	}
	if !strings.HasPrefix(printed[0], "/etcdctl-elect/e/") || printed[1] != "leader-1" {
		t.Fatalf("etcdctl elect printed %q", printed)
	}
	listen := command("", "elect", "--listen", "/etcdctl-elect/e")
	out, _ := listen.StdoutPipe()
	if err := listen.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = listen.Process.Kill(); _ = listen.Wait() }()
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "/etcdctl-elect/e/") || !sc.Scan() || sc.Text() != "leader-1" {
		t.Fatalf("etcdctl elect --listen: %q", sc.Text())
	}
}
