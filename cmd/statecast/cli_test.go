package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/server/servertest"
	"github.com/statecast/statecast/server/wire"
)

// syncBuffer is written by a running command while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until buf holds want.
func waitFor(t *testing.T, buf *syncBuffer, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(buf.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("output\n%s\ndoes not contain %q", buf, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runCmd runs one command to its end and returns its output.
func runCmd(t *testing.T, url string, cmd string, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := runClientCtx(context.Background(), cmd, append([]string{"--url", url}, args...), &out, &errOut)
	return out.String(), err
}

// mustRun runs a command that must succeed.
func mustRun(t *testing.T, url string, cmd string, args ...string) string {
	t.Helper()
	out, err := runCmd(t, url, cmd, args...)
	if err != nil {
		t.Fatalf("%s %q: %v", cmd, args, err)
	}
	return out
}

func TestCLIGetPutDel(t *testing.T) {
	url := servertest.Start(t, servertest.Options{}).TS.URL
	for _, c := range []struct{ arg, rev string }{
		{"hello", "1\n"}, // not JSON: a string
		{"42", "2\n"},
		{`{"a": [1, true]}`, "3\n"},
		{`"quoted"`, "4\n"},
	} {
		key := map[string]string{"hello": "s", "42": "n", `{"a": [1, true]}`: "o/1", `"quoted"`: "o/2"}[c.arg]
		if out := mustRun(t, url, "put", "r", key, c.arg); out != c.rev {
			t.Fatalf("put %s %s printed %q, want %q", key, c.arg, out, c.rev)
		}
	}
	for key, want := range map[string]string{"s": `"hello"`, "n": "42", "o/1": `{"a":[1,true]}`, "o/2": `"quoted"`} {
		if out := mustRun(t, url, "get", "r", key); out != want+"\n" {
			t.Fatalf("get r %s = %q, want %q", key, out, want)
		}
	}
	if out := mustRun(t, url, "get", "r"); out != "n = 42\no/1 = {\"a\":[1,true]}\no/2 = \"quoted\"\ns = \"hello\"\n" {
		t.Fatalf("get r:\n%s", out)
	}
	// Flags after positionals, and before them.
	if out := mustRun(t, url, "get", "r", "--prefix", "o/"); out != "o/1 = {\"a\":[1,true]}\no/2 = \"quoted\"\n" {
		t.Fatalf("get r --prefix o/:\n%s", out)
	}
	if out := mustRun(t, url, "get", "--prefix=o/", "-w", "json", "r"); !strings.HasPrefix(out, `{"epoch":"`) || !strings.Contains(out, `"rev":4,"items":[{"key":"o/1","value":{"a":[1,true]},"create_rev":3,"mod_rev":3,"version":1}`) {
		t.Fatalf("get -w json r --prefix o/:\n%s", out)
	}
	if out := mustRun(t, url, "get", "r", "s", "-w", "json"); out != `{"key":"s","value":"hello","create_rev":1,"mod_rev":1,"version":1}`+"\n" {
		t.Fatalf("get r s -w json: %s", out)
	}
	// A VALUE starting with '-' goes after "--".
	if out := mustRun(t, url, "put", "r", "neg", "--", "-5"); out != "5\n" {
		t.Fatalf("put r neg -- -5 printed %q", out)
	}
	if out := mustRun(t, url, "get", "r", "neg"); out != "-5\n" {
		t.Fatalf("get r neg = %q", out)
	}

	if out := mustRun(t, url, "del", "r", "s"); out != "6\n" {
		t.Fatalf("del printed %q", out)
	}
	if out := mustRun(t, url, "del", "r", "s", "-w", "json"); out != `{"rev":6}`+"\n" {
		t.Fatalf("del of a missing key printed %q (want the unchanged rev)", out)
	}
	if _, err := runCmd(t, url, "get", "r", "s"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("get of a deleted key: %v", err)
	}
}

func TestCLIParseValue(t *testing.T) {
	for in, want := range map[string]string{
		"hello": `"hello"`, "42": `42`, "-1.5e3": `-1.5e3`, "007": `"007"`, "": `""`,
		"true": `true`, "null": `null`, `{"a":1}`: `{"a":1}`, `{bad`: `"{bad"`, `say "hi"`: `"say \"hi\""`,
	} {
		if got := string(parseValue(in)); got != want {
			t.Errorf("parseValue(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestCLIConflict(t *testing.T) {
	url := servertest.Start(t, servertest.Options{}).TS.URL
	mustRun(t, url, "put", "r", "k", "v")
	_, err := runCmd(t, url, "put", "r", "k", "w", "--if-rev", "5")
	if err == nil || err.Error() != `conflict: key "k" has mod_rev 1` {
		t.Fatalf("put --if-rev 5 = %v", err)
	}
	if out := mustRun(t, url, "put", "--if-rev", "1", "r", "k", "w"); out != "2\n" {
		t.Fatalf("put --if-rev 1 printed %q", out)
	}
	if out := mustRun(t, url, "put", "r", "new", "x", "--if-rev", "0"); out != "3\n" {
		t.Fatalf("put --if-rev 0 printed %q", out)
	}
	if _, err := runCmd(t, url, "put", "r", "new", "x", "--if-rev", "0"); err == nil || err.Error() != `conflict: key "new" has mod_rev 3` {
		t.Fatalf("second put --if-rev 0 = %v", err)
	}
	if _, err := runCmd(t, url, "del", "r", "gone", "--if-rev", "2"); err == nil || err.Error() != `conflict: key "gone" does not exist` {
		t.Fatalf("del --if-rev of a missing key = %v", err)
	}
}

func TestCLIEnv(t *testing.T) {
	url := servertest.Start(t, servertest.Options{}).TS.URL
	t.Setenv("STATECAST_URL", strings.TrimPrefix(url, "http://")) // a scheme is optional
	var out bytes.Buffer
	if err := runClientCtx(context.Background(), "put", []string{"r", "k", "1"}, &out, &out); err != nil || out.String() != "1\n" {
		t.Fatalf("put with STATECAST_URL = %q, %v", out.String(), err)
	}
	t.Setenv("STATECAST_TOKEN", "x")
	if err := runClientCtx(context.Background(), "get", []string{"r", "k"}, &out, &out); err != nil {
		t.Fatalf("an unused token is ignored by a server without auth: %v", err)
	}
}

func TestCLIErrors(t *testing.T) {
	url := servertest.Start(t, servertest.Options{}).TS.URL
	for _, c := range []struct {
		cmd  string
		args []string
		want string
	}{
		{"get", nil, "usage: statecast get ROOM"},
		{"put", []string{"r", "k"}, "usage: statecast put ROOM KEY VALUE"},
		{"del", []string{"r"}, "usage: statecast del ROOM KEY"},
		{"watch", []string{"r", "s"}, "usage: statecast watch ROOM"},
		{"get", []string{"r", "k", "--prefix", "p"}, "give a KEY, or --prefix"},
		{"get", []string{"r", "k", "--filter", "true"}, "give a KEY, or --prefix and --filter"},
		{"get", []string{"r", "--filter", "value.n =="}, "invalid_filter: invalid filter at 1:11: Syntax error"},
		{"watch", []string{"r", "--filter", "n > 1"}, "invalid_filter: invalid filter at 1:1: undeclared reference to 'n'"},
		{"get", []string{"r", "--nope"}, "flag provided but not defined: -nope"},
		{"put", []string{"r", "k", "v", "--if-rev", "x"}, "want an unsigned integer"},
		{"get", []string{"r", "-w", "yaml"}, `-w "yaml"`},
		{"get", []string{"bad room", "k"}, "invalid_room"},
		{"get", []string{"r", "--url", "http://127.0.0.1:1"}, "cannot reach http://127.0.0.1:1: "},
	} {
		var out, errOut bytes.Buffer
		args := append([]string{"--url", url}, c.args...)
		err := runClientCtx(context.Background(), c.cmd, args, &out, &errOut)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s %q = %v, want one line with %q", c.cmd, c.args, err, c.want)
		}
	}
	var errOut bytes.Buffer
	if err := runClientCtx(context.Background(), "watch", []string{"-h"}, &errOut, &errOut); err != nil || !strings.Contains(errOut.String(), "-from") {
		t.Fatalf("watch -h = %v, printed %q", err, errOut.String())
	}
}

// startCLI runs a long-running command until the returned stop is called;
// stop returns its error.
func startCLI(t *testing.T, url, cmd string, args ...string) (out, errOut *syncBuffer, stop func() error) {
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut = new(syncBuffer), new(syncBuffer)
	done := make(chan error, 1)
	go func() { done <- runClientCtx(ctx, cmd, append(args, "--url", url), out, errOut) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				err = errors.New("the command did not stop when its context was cancelled")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return out, errOut, stop
}

func TestCLIWatch(t *testing.T) {
	url := servertest.Start(t, servertest.Options{}).TS.URL
	ctx := context.Background()
	h := &client.HTTP{URL: url}
	mustRun(t, url, "put", "r", "g/1", "one")     // 1
	mustRun(t, url, "put", "r", "other", "x")     // 2
	mustRun(t, url, "put", "r", "g/2", `{"n":2}`) // 3

	out, _, stop := startCLI(t, url, "watch", "r", "--prefix", "g/")
	waitFor(t, out, "3 RESET (initial, 2 keys)\n  g/1 = \"one\"\n  g/2 = {\"n\":2}\n")
	mustRun(t, url, "put", "r", "g/1", "uno")                                                                                                      // 4
	mustRun(t, url, "put", "r", "other", "y")                                                                                                      // 5: not under g/
	mustRun(t, url, "del", "r", "g/2")                                                                                                             // 6
	if _, err := h.Txn(ctx, "r", nil, []wire.TxnOp{{Type: "put", Key: "g/3", Value: wire.Value(`3`)}, {Type: "delete", Key: "g/1"}}); err != nil { // 7
		t.Fatal(err)
	}
	waitFor(t, out, "7 DELETE g/1\n")
	if err := stop(); err != nil {
		t.Fatalf("watch ended with %v, want nil on interrupt", err)
	}
	want := "3 RESET (initial, 2 keys)\n  g/1 = \"one\"\n  g/2 = {\"n\":2}\n" +
		"4 PUT g/1 = \"uno\"\n6 DELETE g/2\n7 PUT g/3 = 3\n7 DELETE g/1\n"
	if out.String() != want {
		t.Fatalf("watch printed\n%s\nwant\n%s", out, want)
	}

	// --from replays, then marks the live boundary.
	out, _, stop = startCLI(t, url, "watch", "--from", "5", "r", "-v")
	waitFor(t, out, "SYNCED")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want = "5 PUT other = \"y\"\n6 DELETE g/2\n7 PUT g/3 = 3\n7 DELETE g/1\n7 SYNCED\n"
	if out.String() != want {
		t.Fatalf("watch --from 5 printed\n%s\nwant\n%s", out, want)
	}

	// -w json: one event per line, data as sent.
	out, _, stop = startCLI(t, url, "watch", "r", "--from", "7", "-w", "json")
	waitFor(t, out, `"event":"synced"`)
	_ = stop()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var first struct {
		ID    string          `json:"id"`
		Event string          `json:"event"`
		Data  json.RawMessage `json:"data"`
	}
	if len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &first) != nil || first.ID != "7" || first.Event != "txn" {
		t.Fatalf("watch -w json printed\n%s", out)
	}

	// --key: the exact key alone, never the keys it starts.
	mustRun(t, url, "put", "r", "g/33", "33") // 8
	out, _, stop = startCLI(t, url, "watch", "--from", "1", "r", "--key", "g/3", "-v")
	waitFor(t, out, "SYNCED")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if want := "7 PUT g/3 = 3\n8 SYNCED\n"; out.String() != want {
		t.Fatalf("watch --key g/3 printed\n%s\nwant\n%s", out, want)
	}
}

// TestCLIWatchFilter: watch --filter prints the filtered view: keys
// entering as PUT, leaving as LEAVE; get --filter lists the same keys.
func TestCLIWatchFilter(t *testing.T) {
	url := servertest.Start(t, servertest.Options{}).TS.URL
	mustRun(t, url, "put", "r", "g/1", `{"n":1}`) // 1
	mustRun(t, url, "put", "r", "g/2", `{"n":5}`) // 2
	out, _, stop := startCLI(t, url, "watch", "r", "--prefix", "g/", "--filter", "value.n > 2")
	waitFor(t, out, "2 RESET (initial, 1 keys)\n  g/2 = {\"n\":5}\n")
	mustRun(t, url, "put", "r", "g/1", `{"n":3}`) // 3: enters
	mustRun(t, url, "put", "r", "g/2", `{"n":2}`) // 4: leaves
	mustRun(t, url, "put", "r", "g/2", `{"n":0}`) // 5: stays out
	mustRun(t, url, "del", "r", "g/1")            // 6: leaves
	waitFor(t, out, "6 LEAVE g/1\n")
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := "2 RESET (initial, 1 keys)\n  g/2 = {\"n\":5}\n3 PUT g/1 = {\"n\":3}\n4 LEAVE g/2\n6 LEAVE g/1\n"
	if out.String() != want {
		t.Fatalf("watch --filter printed\n%s\nwant\n%s", out, want)
	}
	mustRun(t, url, "put", "r", "g/3", `{"n":9}`)
	if got := mustRun(t, url, "get", "r", "--prefix", "g/", "--filter", "value.n > 2"); got != "g/3 = {\"n\":9}\n" {
		t.Fatalf("get --filter printed %q", got)
	}
}

func TestCLIPutLease(t *testing.T) {
	url := servertest.Start(t, servertest.Options{}).TS.URL
	h := &client.HTTP{URL: url}
	out, errOut, stop := startCLI(t, url, "put", "r", "presence/me", "here", "--lease-ttl", "1s")
	waitFor(t, out, "1\n")
	waitFor(t, errOut, "Ctrl-C revokes it")
	// Kept alive past its TTL.
	time.Sleep(1500 * time.Millisecond)
	it, _, err := h.Get(context.Background(), "r", "presence/me")
	if err != nil || !it.Lease || string(it.Value) != `"here"` {
		t.Fatalf("leased key = %+v, %v", it, err)
	}
	if err := stop(); err != nil {
		t.Fatalf("put --lease-ttl ended with %v", err)
	}
	if _, _, err := h.Get(context.Background(), "r", "presence/me"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("key after interrupt: %v, want it deleted with its lease", err)
	}
}
