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

	"github.com/statecast/statecast/cmd/statecast/internal/dockerfile"
)

func execForm(t *testing.T, what, args string) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(args), &v); err != nil || len(v) == 0 {
		t.Fatalf("%s %s: want the exec form [\"…\"]: %v", what, args, err)
	}
	return v
}

// words splits a shell command line of the Dockerfile, failing t if it cannot.
func words(t *testing.T, s string) []string {
	t.Helper()
	w, err := dockerfile.Words(s)
	if err != nil {
		t.Fatalf("cannot split %q: %v", s, err)
	}
	return w
}

func TestDockerfile(t *testing.T) {
	repo, err := dockerfile.Repo()
	if err != nil {
		t.Fatal(err)
	}
	stages, err := dockerfile.Parse(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if len(stages) < 2 {
		t.Fatalf("%d stages, want a build stage and a runtime stage", len(stages))
	}
	final := stages[len(stages)-1]

	// Sources copied from the build context exist.
	for _, st := range stages {
		for _, args := range st.Find("COPY") {
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

	// The build command, run with its environment and flags (by
	// dockerfile.Binary, so every test that starts statecast runs this
	// binary), writes a static, stripped binary where the runtime stage
	// copies it from.
	build, err := dockerfile.BuildCommand(stages)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(build.Env, "CGO_ENABLED=0") {
		t.Errorf("the build runs with %v, want CGO_ENABLED=0", build.Env)
	}
	if os.Getenv("STATECAST_TEST_RACE") == "1" {
		t.Skip("STATECAST_TEST_RACE=1: the test binary is a -race build, not the Dockerfile's")
	}
	bin := dockerfile.Binary(t)
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
	for _, args := range final.Find("COPY") {
		if w := words(t, args); strings.HasPrefix(w[0], "--from=") && slices.Contains(w, build.Out) {
			binPath = w[len(w)-1]
		}
	}
	if binPath == "" {
		t.Fatalf("the runtime stage does not copy %s", build.Out)
	}
	if ep := final.Find("ENTRYPOINT"); len(ep) != 1 || execForm(t, "ENTRYPOINT", ep[0])[0] != binPath {
		t.Errorf("ENTRYPOINT %v, want [%q]", ep, binPath)
	}
	if u := final.Find("USER"); len(u) != 1 || strings.HasPrefix(u[0], "root") || strings.HasPrefix(u[0], "0") {
		t.Errorf("USER %v: want one non-root user", u)
	}
	envs := strings.Join(final.Find("ENV"), " ")
	if !slices.Contains(final.Find("VOLUME"), "/data") || !strings.Contains(envs, "STATECAST_DATA=/data") {
		t.Errorf("VOLUME %v, ENV %q: want /data as the volume and the data directory", final.Find("VOLUME"), envs)
	}
	if !slices.Contains(final.Find("EXPOSE"), "8080") || !strings.Contains(envs, "STATECAST_ADDR=0.0.0.0:8080") {
		t.Errorf("EXPOSE %v, ENV %q: want port 8080 exposed and listened on", final.Find("EXPOSE"), envs)
	}

	// The health check runs the built binary: healthy against a server
	// answering /healthz on the address the image's ENV would give.
	hc := final.Find("HEALTHCHECK")
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
