package main

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/statecast/statecast/store/redistest"
)

// etcdctlBin returns the real etcdctl (Debian's etcd-client, installed by
// .ci/run): the test is skipped without it, and fails in CI.
func etcdctlBin(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("etcdctl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("etcdctl is not installed (Debian: apt-get install etcd-client; .ci/run does)")
		}
		redistest.NoteSkipped("etcdctl tests (etcdctl not installed: Debian's etcd-client)")
		t.Skip("etcdctl is not installed (Debian: etcd-client)")
	}
	return p
}

// etcdctlOn starts statecast serve --etcd-addr with extra flags and
// returns how to run etcdctl against it: command builds the command with
// stdin; run runs it and fails the test unless it succeeds.
func etcdctlOn(t *testing.T, extra ...string) (command func(stdin string, args ...string) *exec.Cmd, run func(stdin string, args ...string) string) {
	t.Helper()
	_, _, command, run = etcdctlNode(t, 60*time.Second, extra...)
	return command, run
}

// etcdctlWith is etcdctlOn with the node to start.
func etcdctlWith(t *testing.T, n *mnNode) (command func(stdin string, args ...string) *exec.Cmd, run func(stdin string, args ...string) string) {
	t.Helper()
	_, command, run = etcdctlFor(t, 60*time.Second, n)
	return command, run
}

// etcdctlNode is etcdctlOn that also returns the node and its etcd
// address; etcdctl runs for at most timeout over the test.
func etcdctlNode(t *testing.T, timeout time.Duration, extra ...string) (n *mnNode, addr string, command func(stdin string, args ...string) *exec.Cmd, run func(stdin string, args ...string) string) {
	t.Helper()
	n = &mnNode{name: "etcd", redisURL: "memory", extra: extra}
	addr, command, run = etcdctlFor(t, timeout, n)
	return n, addr, command, run
}

// etcdctlFor starts n with --etcd-addr and returns its etcd address and
// how to run etcdctl against it, for at most timeout over the test.
func etcdctlFor(t *testing.T, timeout time.Duration, n *mnNode) (addr string, command func(stdin string, args ...string) *exec.Cmd, run func(stdin string, args ...string) string) {
	t.Helper()
	ctl := etcdctlBin(t)
	addr = serveEtcd(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	command = func(stdin string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, ctl, append([]string{"--endpoints", addr, "--dial-timeout", "5s", "--command-timeout", "10s"}, args...)...)
		cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
		cmd.Stdin = strings.NewReader(stdin)
		return cmd
	}
	run = func(stdin string, args ...string) string {
		t.Helper()
		out, err := command(stdin, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("etcdctl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	return addr, command, run
}

// serveEtcd starts n with --etcd-addr and returns the etcd API's address.
func serveEtcd(t *testing.T, n *mnNode) string {
	t.Helper()
	n.extra = append([]string{"--etcd-addr", "127.0.0.1:0"}, n.extra...)
	n.start(t)
	t.Cleanup(n.stop)
	m := regexp.MustCompile(`statecast: etcd v3 API on (\S+)`).FindStringSubmatch(n.output())
	if m == nil {
		t.Fatalf("no etcd address in the output:\n%s", n.output())
	}
	return m[1]
}

// TestEtcdctl: the real etcdctl against the real binary's --etcd-addr:
// put, get --prefix -w json, del, watch --prefix --rev, txn, lease grant
// and keep-alive, endpoint status and health.
func TestEtcdctl(t *testing.T) {
	command, run := etcdctlOn(t)
	if out := run("", "put", "/room/a", "hello"); out != "OK\n" {
		t.Fatalf("put: %q", out)
	}
	run("", "put", "/room/b", `{"n":1}`)
	var got struct {
		Header struct{ Revision int64 }
		Kvs    []struct{ Key, Value string } // base64
		Count  int64
	}
	if err := json.Unmarshal([]byte(run("", "get", "--prefix", "/room/", "-w", "json")), &got); err != nil {
		t.Fatal(err)
	}
	b64 := func(s string) string { b, _ := base64.StdEncoding.DecodeString(s); return string(b) }
	if got.Header.Revision != 3 || got.Count != 2 || b64(got.Kvs[0].Key) != "/room/a" || b64(got.Kvs[0].Value) != "hello" || b64(got.Kvs[1].Value) != `{"n":1}` {
		t.Fatalf("get --prefix -w json: %+v", got)
	}
	if out := run("", "del", "/room/a"); out != "1\n" {
		t.Fatalf("del: %q", out)
	}

	// watch --prefix --rev 1 replays the three revisions, then a live one.
	watch := command("", "watch", "--prefix", "--rev", "1", "/room/")
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watch.Process.Kill(); _ = watch.Wait() }()
	lines := bufio.NewScanner(stdout)
	expect := func(want ...string) {
		t.Helper()
		for _, w := range want {
			if !lines.Scan() || lines.Text() != w {
				t.Fatalf("watch: got %q, want %q", lines.Text(), w)
			}
		}
	}
	expect("PUT", "/room/a", "hello", "PUT", "/room/b", `{"n":1}`, "DELETE", "/room/a", "") // a delete's value: none
	run("", "put", "/room/c", "live")
	expect("PUT", "/room/c", "live")

	txn := "mod(\"/room/b\") > \"0\"\nvalue(\"/room/c\") = \"live\"\n\nput /room/t yes\n\nput /room/t no\n\n"
	if out := run(txn, "txn"); out != "SUCCESS\n\nOK\n" {
		t.Fatalf("txn: %q", out)
	}
	expect("PUT", "/room/t", "yes")

	grant := regexp.MustCompile(`^lease ([0-9a-f]+) granted with TTL\(10s\)`).FindStringSubmatch(run("", "lease", "grant", "10"))
	if grant == nil {
		t.Fatal("lease grant: unexpected output")
	}
	run("", "put", "--lease="+grant[1], "/room/leased", "v")
	if out := run("", "lease", "keep-alive", "--once", grant[1]); !strings.Contains(out, "lease "+grant[1]+" keepalived with TTL(10)") {
		t.Fatalf("lease keep-alive: %q", out)
	}
	if out := run("", "lease", "timetolive", "--keys", grant[1]); !strings.Contains(out, "attached keys([/room/leased])") {
		t.Fatalf("lease timetolive: %q", out)
	}
	run("", "lease", "revoke", grant[1])
	expect("PUT", "/room/leased", "v", "DELETE", "/room/leased", "")

	var status []struct {
		Endpoint string
		Status   struct{ Version string }
	}
	if err := json.Unmarshal([]byte(run("", "endpoint", "status", "-w", "json")), &status); err != nil || len(status) != 1 || status[0].Status.Version == "" {
		t.Fatalf("endpoint status: %+v, %v", status, err)
	}
	if out := run("", "endpoint", "health"); !strings.Contains(out, "is healthy") {
		t.Fatalf("endpoint health: %q", out)
	}
	// A range over rooms is refused, with the reason.
	out, err := command("", "get", "--prefix", "/ro").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "spans rooms") {
		t.Fatalf("get over rooms: %v\n%s", err, out)
	}
}

// TestEtcdctlWithToken: with auth, etcdctl --user <any>:<JWT> sends the
// token (Authenticate hands it back as the session token); without one
// it is refused.
func TestEtcdctlWithToken(t *testing.T) {
	const key = "a secret of the etcdctl test, 32+ bytes long"
	secret := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(secret, []byte(key), 0o600); err != nil {
		t.Fatal(err)
	}
	command, run := etcdctlOn(t, "--jwt-hmac-secret-file", secret)
	token, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": "ops", "exp": time.Now().Add(time.Hour).Unix(),
		"statecast": map[string]any{"grants": []any{map[string]any{"room": "ops", "access": "rw"}}}}).SignedString([]byte(key))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := command("", "put", "/ops/k", "v").CombinedOutput(); err == nil || !strings.Contains(string(out), "token is required") {
		t.Fatalf("put without a token: %v\n%s", err, out)
	}
	user := "--user=ops:" + token
	run("", user, "put", "/ops/k", "v")
	if out := run("", user, "get", "/ops/k"); out != "/ops/k\nv\n" {
		t.Fatalf("get with the token: %q", out)
	}
	if out, err := command("", user, "put", "/other/k", "v").CombinedOutput(); err == nil || !strings.Contains(string(out), "does not allow writing") {
		t.Fatalf("put outside the token's grants: %v\n%s", err, out)
	}
}
