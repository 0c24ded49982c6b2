// Package dockerfile reads the repository's Dockerfile for the tests: its
// build stages, and its `go build` command, which Binary runs so that every
// test that starts statecast processes runs the binary the image ships.
package dockerfile

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/statecast/statecast/cmd/statecast/internal/proc"
)

// Instr is one instruction: its keyword in upper case and the rest of the line.
type Instr struct{ Cmd, Args string }

// Stage is the instructions of one build stage, FROM first.
type Stage []Instr

// Find returns the arguments of the stage's cmd instructions, in order.
func (st Stage) Find(cmd string) []string {
	var out []string
	for _, in := range st {
		if in.Cmd == cmd {
			out = append(out, in.Args)
		}
	}
	return out
}

// Parse returns the stages of the Dockerfile at path, joining continued
// lines and skipping comments.
func Parse(path string) ([]Stage, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var stages []Stage
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
		in := Instr{strings.ToUpper(cmd), strings.TrimSpace(args)}
		if in.Cmd == "FROM" {
			stages = append(stages, nil)
		}
		if len(stages) == 0 {
			return nil, fmt.Errorf("%s: %s before the first FROM", path, in.Cmd)
		}
		stages[len(stages)-1] = append(stages[len(stages)-1], in)
	}
	return stages, nil
}

// Words splits a shell command line of the Dockerfile as a shell would.
func Words(s string) ([]string, error) {
	w, err := proc.Split(s)
	if err == nil && len(w) == 0 {
		err = fmt.Errorf("empty command")
	}
	return w, err
}

// Build is the first stage's `RUN [VAR=value ...] go build ...`.
type Build struct {
	Env  []string // the VAR=value words before go
	Args []string // the words after go, "build" first
	Out  string   // the -o path
}

// BuildCommand returns the go build of the first stage.
func BuildCommand(stages []Stage) (Build, error) {
	var b Build
	if len(stages) == 0 {
		return b, fmt.Errorf("no build stage")
	}
	for _, a := range stages[0].Find("RUN") {
		w, err := Words(a)
		if err != nil {
			return b, fmt.Errorf("RUN %s: %w", a, err)
		}
		if i := slices.Index(w, "go"); i >= 0 && i+1 < len(w) && w[i+1] == "build" {
			b.Env, b.Args = w[:i], w[i+1:]
		}
	}
	if b.Args == nil {
		return b, fmt.Errorf("no RUN … go build in the first stage")
	}
	o := slices.Index(b.Args, "-o")
	if o < 0 || o+1 >= len(b.Args) {
		return b, fmt.Errorf("go %s: no -o", strings.Join(b.Args, " "))
	}
	b.Out = b.Args[o+1]
	return b, nil
}

// Repo is the repository's root: the directory of the go.mod of the
// module the tests run in.
func Repo() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	return filepath.Dir(strings.TrimSpace(string(out))), nil
}

var (
	buildOnce sync.Once
	binDir    string
	bin       string
	buildErr  error
)

// Binary builds the statecast command once per test process with the
// Dockerfile's build command and returns its path; Cleanup removes it.
// Every test process builds with the same flags, so the build cache
// compiles the project once for all of them. STATECAST_TEST_RACE=1 builds
// it with -race instead (cgo on), to look for races in the processes.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() { bin, buildErr = build() })
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return bin
}

func build() (string, error) {
	repo, err := Repo()
	if err != nil {
		return "", err
	}
	stages, err := Parse(filepath.Join(repo, "Dockerfile"))
	if err != nil {
		return "", err
	}
	b, err := BuildCommand(stages)
	if err != nil {
		return "", err
	}
	if binDir, err = os.MkdirTemp("", "statecast-test-bin-"); err != nil {
		return "", err
	}
	path := filepath.Join(binDir, "statecast")
	args := slices.Clone(b.Args)
	args[slices.Index(args, "-o")+1] = path
	env := b.Env
	if os.Getenv("STATECAST_TEST_RACE") == "1" {
		args = slices.Insert(args, 1, "-race")
		env = slices.DeleteFunc(slices.Clone(env), func(e string) bool { return e == "CGO_ENABLED=0" })
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return path, nil
}

// Cleanup removes what Binary built; call it from TestMain after m.Run.
func Cleanup() {
	if binDir != "" {
		os.RemoveAll(binDir)
	}
}
