package main

// No container engine runs here, so this test checks what can be checked of
// the repository's Dockerfile without one: the files it copies exist, the
// build command it runs succeeds and makes a static, stripped binary, and
// the health check, entrypoint, volume and port agree with that binary.

import (
	"debug/elf"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/statecast/statecast/cmd/statecast/internal/proc"
)

// instr is one Dockerfile instruction: its keyword and the rest of the line.
type instr struct{ cmd, args string }

// parseDockerfile returns the instructions of each build stage, joining
// continued lines and skipping comments.
func parseDockerfile(t testing.TB, path string) [][]instr {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var stages [][]instr
	var line string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "#") || (l == "" && line == "") {
			continue
		}
		if cont, ok := strings.CutSuffix(l, `\`); ok {
			line += cont + " "
			continue
		}
		line += l
		cmd, args, _ := strings.Cut(line, " ")
		line = ""
		in := instr{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			t.Fatalf("%s before the first FROM", in.cmd)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	return stages
}

// words splits a shell command line of the Dockerfile with the load
// tool's splitter (quotes and escapes as a shell reads them).
func words(t testing.TB, s string) []string {
	t.Helper()
	w, err := proc.Split(s)
	if err != nil || len(w) == 0 {
		t.Fatalf("cannot split %q: %v", s, err)
	}
	return w
}

func find(st []instr, cmd string) []string {
	var out []string
	for _, in := range st {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return out
}

func execForm(t *testing.T, what, args string) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(args), &v); err != nil || len(v) == 0 {
		t.Fatalf("%s %s: want the exec form [\"…\"]: %v", what, args, err)
	}
	return v
}

// dockerBuild returns the environment, the arguments after "go" and the
// output path of the first stage's `go build`.
func dockerBuild(t testing.TB, stages [][]instr) (env, args []string, out string) {
	t.Helper()
	for _, a := range find(stages[0], "RUN") {
		w := words(t, a)
		i := slices.Index(w, "go")
		if i < 0 || i+1 >= len(w) || w[i+1] != "build" {
			continue
		}
		env, args = w[:i], w[i+1:]
	}
	if args == nil {
		t.Fatal("no RUN … go build in the first stage")
	}
	o := slices.Index(args, "-o")
	if o < 0 || o+1 >= len(args) {
		t.Fatalf("go %s: no -o", strings.Join(args, " "))
	}
	return env, args, args[o+1]
}

func TestDockerfile(t *testing.T) {
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	stages := parseDockerfile(t, filepath.Join(repo, "Dockerfile"))
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a runtime stage", len(stages))
	}
	final := stages[len(stages)-1]

	// Sources copied from the build context exist.
	for _, st := range stages {
		for _, args := range find(st, "COPY") {
			w := words(t, args)
			if strings.HasPrefix(w[0], "--from=") {
				continue
			}
			for _, src := range w[:len(w)-1] {
				if _, err := os.Stat(filepath.Join(repo, src)); err != nil && !strings.HasPrefix(src, "--") {
					t.Errorf("COPY %s: %v", args, err)
				}
			}
		}
	}

	// The build command, run with its environment and flags (statecastBin
	// runs it, so the multi-node tests run this binary), writes a static,
	// stripped binary where the runtime stage copies it from.
	env, buildArgs, out := dockerBuild(t, stages)
	if !slices.Contains(env, "CGO_ENABLED=0") {
		t.Errorf("the build runs with %v, want CGO_ENABLED=0", env)
	}
	bin := statecastBin(t)
	if os.Getenv("MULTINODE_RACE") == "1" { // statecastBin's is a -race build: build one as the Dockerfile does
		bin = filepath.Join(t.TempDir(), "statecast")
		args := slices.Clone(buildArgs)
		args[slices.Index(args, "-o")+1] = bin
		cmd := exec.Command("go", args...)
		cmd.Dir, cmd.Env = repo, append(os.Environ(), env...)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary names an interpreter: it is dynamically linked")
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("the binary needs %v: not static", libs)
	}
	if f.Section(".symtab") != nil {
		t.Error("the binary has a symbol table: -ldflags '-s -w' did not apply")
	}

	// The runtime stage: binary copied from the build output, run as it.
	var binPath string
	for _, args := range find(final, "COPY") {
		if w := words(t, args); strings.HasPrefix(w[0], "--from=") && slices.Contains(w, out) {
			binPath = w[len(w)-1]
		}
	}
	if binPath == "" {
		t.Fatalf("the runtime stage does not copy %s", out)
	}
	if ep := find(final, "ENTRYPOINT"); len(ep) != 1 || execForm(t, "ENTRYPOINT", ep[0])[0] != binPath {
		t.Errorf("ENTRYPOINT %v, want [%q]", ep, binPath)
	}
	if u := find(final, "USER"); len(u) != 1 || strings.HasPrefix(u[0], "root") || strings.HasPrefix(u[0], "0") {
		t.Errorf("USER %v: want one non-root user", u)
	}
	envs := strings.Join(find(final, "ENV"), " ")
	if !slices.Contains(find(final, "VOLUME"), "/data") || !strings.Contains(envs, "STATECAST_DATA=/data") {
		t.Errorf("VOLUME %v, ENV %q: want /data as the volume and the data directory", find(final, "VOLUME"), envs)
	}
	if !slices.Contains(find(final, "EXPOSE"), "8080") || !strings.Contains(envs, "STATECAST_ADDR=0.0.0.0:8080") {
		t.Errorf("EXPOSE %v, ENV %q: want port 8080 exposed and listened on", find(final, "EXPOSE"), envs)
	}

	// The health check runs the built binary: healthy against a server
	// answering /healthz on the address the image's ENV would give.
	hc := find(final, "HEALTHCHECK")
	if len(hc) != 1 {
		t.Fatalf("HEALTHCHECK %v, want one", hc)
	}
	_, form, ok := strings.Cut(hc[0], "CMD ")
	probe := execForm(t, "HEALTHCHECK CMD", strings.TrimSpace(form))
	if !ok || probe[0] != binPath {
		t.Fatalf("HEALTHCHECK %s: want CMD [%q, …]", hc[0], binPath)
	}
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.NotFound(w, r)
		}
	}))
	defer ts.Close()
	run := exec.Command(bin, probe[1:]...)
	run.Env = append(os.Environ(), "STATECAST_ADDR="+strings.TrimPrefix(ts.URL, "http://"))
	if b, err := run.CombinedOutput(); err != nil {
		t.Errorf("%v against a healthy server: %v\n%s", probe, err, b)
	}
}
