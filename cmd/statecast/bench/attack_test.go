package bench

import (
	"context"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/statecast/statecast/cmd/statecast/internal/proc"
)

// spawnFlags are the bench flags that spawn the real statecast binary on
// a free port with serve flags extra.
func spawnFlags(t *testing.T, extra ...string) []string {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	serve := append([]string{statecastBin(t), "serve", "--addr", addr, "--store", "memory"}, extra...)
	return []string{"--url", "http://" + addr, "--spawn", proc.Quote(serve)}
}

// TestBenchAttacks runs each attack at a tiny size against a spawned
// server: the server's figures are measured and the bystander ran
// without failing (at these sizes nothing should hurt it), but for the
// WebSockets a full node refuses (503, Statecast-Refused: full) by design.
func TestAttacks(t *testing.T) {
	etcdPort, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	etcdAddr := "127.0.0.1:" + strconv.Itoa(etcdPort) // each spawned server in turn
	etcdServe := []string{"--etcd-addr", etcdAddr}
	cases := []struct {
		attack string
		flags  []string
		serve  []string
		check  func(t *testing.T, a *attackReport)
	}{
		{"unsub-prefixes", []string{"--prefixes", "10"}, nil, func(t *testing.T, a *attackReport) {
			if a.Counts["sub ok"] != 3 || a.Counts["unsub ok"] != 3 {
				t.Errorf("counts %v, want 3 subs and 3 unsubs acknowledged", a.Counts)
			}
		}},
		{"history-bytes", []string{"--writes", "30", "--value-bytes", "1000"}, nil, func(t *testing.T, a *attackReport) {
			if a.Counts["put ok"] != 30 || len(a.Outcome) != 2 || !strings.HasPrefix(a.Outcome[1], "watcher 1: ") {
				t.Errorf("counts %v, outcome %q: want 30 writes and the watcher's state", a.Counts, a.Outcome)
			}
		}},
		{"slow-body", []string{"--attack-conns", "20", "--attack-hold", "500ms"}, nil, func(t *testing.T, a *attackReport) {
			if a.Counts["connection opened"] != 20 || a.Counts["cut by the server"]+a.Counts["still open at the end"] != 20 {
				t.Errorf("counts %v: want 20 opened, each cut or still open", a.Counts)
			}
			if a.FDsPeak < 20 {
				t.Errorf("server fds %d before, %d peak: want the 20 stalled connections seen", a.FDsBefore, a.FDsPeak)
			}
			if a.Bystander.WSOpens == 0 {
				t.Error("the bystander opened no WebSocket")
			}
		}},
		{"sse-flood", []string{"--attack-conns", "20", "--attack-hold", "200ms"}, []string{"--max-connections", "10"}, func(t *testing.T, a *attackReport) {
			answered := 0
			for k, v := range a.Counts {
				if strings.HasPrefix(k, "HTTP ") {
					answered += v
				}
			}
			if a.Counts["connection opened"] != 20 || answered != 20 {
				t.Errorf("counts %v: want 20 streams answered", a.Counts)
			}
		}},
		{"none", nil, nil, func(t *testing.T, a *attackReport) {
			if a.Bystander.Ops == 0 || a.Bystander.Failures != 0 {
				t.Errorf("bystander %+v: want operations and no failure on a quiet server", a.Bystander)
			}
		}},
		{"http-write-rate", []string{"--http-writes", "50"}, nil, func(t *testing.T, a *attackReport) {
			if a.Counts["HTTP 200"]+a.Counts["HTTP 429"] != 50 {
				t.Errorf("counts %v: want 50 PUTs answered 200 or 429", a.Counts)
			}
		}},
		{"cel-equality", nil, nil, func(t *testing.T, a *attackReport) {
			if a.Counts["sub invalid_filter"] != 2 || a.Counts["put ok"] != 20 {
				t.Errorf("counts %v: want both filters refused invalid_filter, 20 puts ok", a.Counts)
			}
		}},
		{"etcd-txn-ranges", []string{"--attack-conns", "1", "--etcd-addr", etcdAddr}, etcdServe, func(t *testing.T, a *attackReport) {
			if a.Counts["txn ResourceExhausted"] != 1 {
				t.Errorf("counts %v: want the txn refused", a.Counts)
			}
		}},
		{"etcd-watch-noread", []string{"--attack-conns", "1", "--etcd-addr", etcdAddr}, etcdServe, func(t *testing.T, a *attackReport) {
			if a.Counts["stream still sending"] != 1 {
				t.Errorf("counts %v: want the stream sending when read", a.Counts)
			}
		}},
		{"etcd-idle", []string{"--attack-conns", "5", "--attack-hold", "300ms", "--etcd-addr", etcdAddr}, etcdServe, func(t *testing.T, a *attackReport) {
			if a.Counts["connection opened"] != 5 || a.Counts["closed by the server"]+a.Counts["still open at the end"] != 5 {
				t.Errorf("counts %v: want 5 opened, each closed or still open", a.Counts)
			}
		}},
		{"room-growth", []string{"--value-bytes", "100", "--attack-hold", "1s"}, []string{"--room-max-keys", "600"}, func(t *testing.T, a *attackReport) {
			if a.Counts["txn ok"] != 2 || a.Counts["txn quota_exceeded"] == 0 {
				t.Errorf("counts %v: want 2 txns of 256 puts committed, then quota_exceeded", a.Counts)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.attack, func(t *testing.T) {
			args := append([]string{"attack", "--attack", c.attack}, c.flags...)
			r := runJSON(t, append(args, spawnFlags(t, c.serve...)...)...)
			a := r.Attack
			if a == nil || a.Attack != c.attack || r.ServerPID == 0 {
				t.Fatalf("result %+v", r)
			}
			if a.ServerCPUS <= 0 || a.RSSBeforeMB <= 0 || a.RSSPeakMB < a.RSSBeforeMB || a.FDsBefore <= 0 || a.FDsPeak < a.FDsBefore || a.FDLimit <= 0 || a.Samples == 0 {
				t.Errorf("server figures not measured: %+v", a)
			}
			if a.WindowS < minAttackWindow.Seconds() || len(a.Outcome) == 0 || a.Params == "" {
				t.Errorf("window %v s, outcome %q, params %q", a.WindowS, a.Outcome, a.Params)
			}
			b := a.Bystander
			failed := b.Failures
			if c.attack == "sse-flood" { // it fills the node (--max-connections 10)
				failed -= b.WSFailures
			}
			if b.Ops == 0 || failed != 0 || b.P50Ms <= 0 || b.P99Ms < b.P50Ms {
				t.Errorf("bystander %+v: want operations, none failed", b)
			}
			c.check(t, a)
		})
	}
}

func TestAttackFlags(t *testing.T) {
	for _, args := range [][]string{
		{"attack", "--url", "http://127.0.0.1:1"},
		{"attack", "--attack", "nope", "--url", "http://127.0.0.1:1"},
	} {
		err := Run(context.Background(), args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--attack must be one of unsub-prefixes") {
			t.Errorf("%q: %v", args, err)
		}
	}
	err := Run(context.Background(), []string{"attack", "--attack", "sse-flood", "--target", "ceiling"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "statecast only") {
		t.Errorf("against the ceiling: %v", err)
	}
}
