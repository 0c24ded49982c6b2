package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/statecast/statecast/store/redistest"
)

// The README's commands, run as a newcomer runs them: its console
// examples against one fresh `statecast serve`, each command as written
// (only the server's address differs: STATECAST_URL points at it), their
// output compared to what the README shows, exactly; its snippet of the
// SDK in Node, its printed lines compared; the other shell commands run
// where they can be or named below with why not.

const readmePath = "../../README.md"

// readmeBlock is one fenced block of the README.
type readmeBlock struct {
	lang  string
	lines []string
	line  int // of its opening fence, from 1
}

func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	var blocks []readmeBlock
	var cur *readmeBlock
	for i, l := range strings.Split(string(b), "\n") {
		switch {
		case cur == nil && strings.HasPrefix(l, "```"):
			cur = &readmeBlock{lang: strings.TrimPrefix(l, "```"), line: i + 1}
		case cur != nil && l == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.lines = append(cur.lines, l)
		}
	}
	if cur != nil {
		t.Fatalf("README.md:%d: a block is not closed", cur.line)
	}
	return blocks
}

// shellWords splits a command line as sh does for the README's commands:
// words, 'single' and "double" quotes (\" and \\ escaped in them), and a
// # comment after a space.
func shellWords(line string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(line); i++ {
		ch := line[i]
		switch {
		case ch == ' ' || ch == '\t':
			if inWord {
				words, inWord = append(words, w.String()), false
				w.Reset()
			}
		case ch == '#' && !inWord:
			return words, nil
		case ch == '\'':
			j := strings.IndexByte(line[i+1:], '\'')
			if j < 0 {
				return nil, fmt.Errorf("unclosed ' in %q", line)
			}
			w.WriteString(line[i+1 : i+1+j])
			i, inWord = i+1+j, true
		case ch == '"':
			i++
			for ; i < len(line) && line[i] != '"'; i++ {
				if line[i] == '\\' && i+1 < len(line) && (line[i+1] == '"' || line[i+1] == '\\') {
					i++
				}
				w.WriteByte(line[i])
			}
			if i == len(line) {
				return nil, fmt.Errorf("unclosed \" in %q", line)
			}
			inWord = true
		default:
			w.WriteByte(ch)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// readmeShellCommands are the README's sh commands this test does not
// run, and why; any other must be one it runs (a `statecast serve`).
var readmeShellCommands = map[string]string{
	"make test": "it runs this test",
	"mkdir mypage && cp demo/sdk/statecast.js mypage/ && cd mypage": "checked: the file it copies exists",
	"python3 -m http.server 8000":                                   "a static file server of the reader's own page, not statecast's",
}

// TestReadmeShellCommands: each `statecast serve` of the README's sh
// blocks starts and listens with the flags it shows (on a free port, in
// a temporary directory); the others are the ones known above.
func TestReadmeShellCommands(t *testing.T) {
	bin := statecastBin(t)
	n := 0
	for _, b := range readmeBlocks(t) {
		if b.lang != "sh" {
			continue
		}
		for i, l := range b.lines {
			cmd, _, _ := strings.Cut(l, "#")
			cmd = strings.TrimSpace(cmd)
			where := fmt.Sprintf("README.md:%d", b.line+1+i)
			if why, ok := readmeShellCommands[cmd]; ok {
				if strings.HasPrefix(why, "checked") {
					if _, err := os.Stat("../../demo/sdk/statecast.js"); err != nil {
						t.Errorf("%s: %v", where, err)
					}
				}
				continue
			}
			args, err := shellWords(cmd)
			if err != nil || len(args) < 4 || strings.Join(args[:4], " ") != "go run ./cmd/statecast serve" {
				t.Errorf("%s: %q: neither a `go run ./cmd/statecast serve` nor a command this test knows (%v)", where, cmd, err)
				continue
			}
			n++
			readmeServe(t, bin, where, args[4:])
		}
	}
	if n == 0 {
		t.Error("the README starts no server in its sh blocks")
	}
}

// readmeServe runs `statecast serve args` on a free port in a fresh
// directory until it listens, then stops it.
func readmeServe(t *testing.T, bin, where string, args []string) {
	t.Helper()
	cmd := exec.Command(bin, append(append([]string{"serve"}, args...), "--addr", "127.0.0.1:0")...)
	cmd.Dir = t.TempDir() // its ./data
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), "statecast listening on http://127.0.0.1:") {
		select {
		case err := <-exited:
			t.Errorf("%s: serve %q exited (%v) before listening:\n%s", where, args, err, out.String())
			return
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			t.Errorf("%s: serve %q did not listen within 20 s:\n%s", where, args, out.String())
			return
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := <-exited; err != nil {
		t.Errorf("%s: serve %q after SIGTERM: %v\n%s", where, args, err, out.String())
	}
}

// readmeCommand is one `$ statecast …` line of a console block and the
// output the README shows after it.
type readmeCommand struct {
	where string
	args  []string
	want  []string
}

// readmeWatch is a `statecast watch` the README leaves running (until
// Ctrl-C) while it shows more commands, and later more of its output.
type readmeWatch struct {
	c      readmeCommand
	out    syncBuffer
	cmd    *exec.Cmd
	exited chan struct{}
	failed bool // its output was reported wrong already
}

// TestReadmeConsole: the README's console examples, in order, against one
// fresh server, print exactly what the README shows.
func TestReadmeConsole(t *testing.T) {
	bin := statecastBin(t)
	n := &mnNode{name: "readme", redisURL: "memory", rated: true}
	n.start(t)
	defer n.signal(syscall.SIGTERM, 10*time.Second)
	env := append(os.Environ(), "STATECAST_URL="+n.HTTP())

	var watch *readmeWatch
	stopWatch := func() {
		if watch == nil {
			return
		}
		var waited error
		if !watch.failed {
			waited = watch.wait()
		}
		_ = watch.cmd.Process.Signal(syscall.SIGINT) // Ctrl-C
		select {
		case <-watch.exited:
		case <-time.After(10 * time.Second):
			_ = watch.cmd.Process.Kill()
			<-watch.exited
			t.Errorf("%s: the watch did not stop on SIGINT", watch.c.where)
		}
		switch got, want := watch.out.String(), joinLines(watch.c.want); {
		case watch.failed:
		case waited != nil:
			t.Error(waited)
		case got != want:
			t.Errorf("%s: statecast %s printed\n%s\nthe README shows\n%s", watch.c.where, strings.Join(watch.c.args, " "), got, want)
		}
		watch = nil
	}
	defer stopWatch()
	ran := 0
	for _, b := range readmeBlocks(t) {
		if b.lang != "console" {
			continue
		}
		cmds, more := consoleCommands(t, b)
		if len(more) > 0 { // more output of the watch left running
			if watch == nil {
				t.Fatalf("README.md:%d: output of no command", b.line)
			}
			watch.c.want = append(watch.c.want, more...)
			if err := watch.wait(); err != nil {
				watch.failed = true
				t.Fatal(err)
			}
		}
		for _, c := range cmds {
			ran++
			if c.args[0] == "watch" {
				stopWatch()
				watch = &readmeWatch{c: c, exited: make(chan struct{})}
				watch.cmd = exec.Command(bin, c.args...)
				watch.cmd.Env, watch.cmd.Stdout, watch.cmd.Stderr = env, &watch.out, &watch.out
				watch.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
				if err := watch.cmd.Start(); err != nil {
					t.Fatal(err)
				}
				go func(w *readmeWatch) { _ = w.cmd.Wait(); close(w.exited) }(watch)
				if err := watch.wait(); err != nil { // its first lines before the next command
					watch.failed = true
					t.Fatal(err)
				}
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			cmd := exec.CommandContext(ctx, bin, c.args...)
			cmd.Env = env
			out, err := cmd.CombinedOutput()
			cancel()
			if got, want := string(out), joinLines(c.want); got != want {
				t.Errorf("%s: statecast %s printed\n%s\nthe README shows\n%s", c.where, strings.Join(c.args, " "), got, want)
			}
			if failed := strings.HasPrefix(joinLines(c.want), "statecast: "); failed != (err != nil) {
				t.Errorf("%s: statecast %s: exit %v, want a failure: %v", c.where, strings.Join(c.args, " "), err, failed)
			}
		}
	}
	if ran < 5 {
		t.Errorf("ran %d commands of the README's console blocks; were they read?", ran)
	}
}

// consoleCommands returns the `$ statecast` commands of a console block
// with the output shown after each, or, for a block of output only, its
// lines (more).
func consoleCommands(t *testing.T, b readmeBlock) (cmds []readmeCommand, more []string) {
	t.Helper()
	for i, l := range b.lines {
		rest, isCmd := strings.CutPrefix(l, "$ ")
		if !isCmd {
			if len(cmds) == 0 {
				more = append(more, l)
			} else {
				cmds[len(cmds)-1].want = append(cmds[len(cmds)-1].want, l)
			}
			continue
		}
		where := fmt.Sprintf("README.md:%d", b.line+1+i)
		words, err := shellWords(rest)
		if err != nil || len(words) < 2 || words[0] != "statecast" {
			t.Fatalf("%s: %q is not a statecast command (%v)", where, rest, err)
		}
		cmds = append(cmds, readmeCommand{where: where, args: words[1:]})
	}
	return cmds, more
}

// wait waits until the watch printed at least the lines the README shows.
func (w *readmeWatch) wait() error {
	want := joinLines(w.c.want)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.HasPrefix(w.out.String(), want) {
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: statecast %s printed\n%s\nwithin 10 s; the README shows\n%s", w.c.where, strings.Join(w.c.args, " "), w.out.String(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil
}

func joinLines(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return strings.Join(lines, "\n") + "\n"
}

// TestReadmeSDKSnippet: the README's SDK snippet, run in Node on a fresh
// server (its URL's address rewritten to the server's), prints the lines
// the README says it prints.
func TestReadmeSDKSnippet(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("node is not installed")
		}
		redistest.NoteSkipped("the README's SDK snippet (node not installed)")
		t.Skip("node is not installed")
	}
	var snippet, want []string
	blocks := readmeBlocks(t)
	for i, b := range blocks {
		if b.lang == "js" && snippet == nil {
			snippet = b.lines
			if i+1 < len(blocks) && blocks[i+1].lang == "" {
				want = blocks[i+1].lines
			}
		}
	}
	if snippet == nil || want == nil {
		t.Fatal("no js block followed by the output it prints in README.md")
	}
	n := &mnNode{name: "readme-sdk", redisURL: "memory", rated: true}
	n.start(t)
	defer n.signal(syscall.SIGTERM, 10*time.Second)

	dir := t.TempDir()
	bundle, err := os.ReadFile("../../demo/sdk/statecast.js")
	if err != nil {
		t.Fatal(err)
	}
	src := strings.Join(snippet, "\n")
	if !strings.Contains(src, "ws://127.0.0.1:8080/v1/ws") {
		t.Fatal("the snippet's URL is not ws://127.0.0.1:8080/v1/ws")
	}
	src = strings.ReplaceAll(src, "ws://127.0.0.1:8080/v1/ws", n.WS())
	for name, b := range map[string][]byte{"statecast.js": bundle, "snippet.mjs": []byte(src)} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Node 20 has WebSocket behind this flag; later versions by default.
	cmd := exec.Command(node, "--experimental-websocket", "snippet.mjs")
	cmd.Dir = dir
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	defer func() { _ = cmd.Process.Kill(); <-exited }() // its client stays connected
	lines := func() int { return len(regexp.MustCompile("\n").FindAllStringIndex(out.String(), -1)) }
	deadline := time.Now().Add(20 * time.Second)
	for lines() < len(want) && time.Now().Before(deadline) {
		select {
		case <-exited:
			deadline = time.Now()
		case <-time.After(10 * time.Millisecond):
		}
	}
	time.Sleep(300 * time.Millisecond) // a line too many would come now
	// When the first put's own event comes before its reply, the watch
	// shows the entry pending, then confirmed: the same line twice, as the
	// README says below its output.
	twice := slices.Insert(slices.Clone(want), 2, want[1])
	if got := out.String(); got != joinLines(want) && got != joinLines(twice) {
		t.Errorf("the SDK snippet printed\n%s\nthe README shows\n%s", got, joinLines(want))
	}
}
