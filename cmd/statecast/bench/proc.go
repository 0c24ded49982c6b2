package bench

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/statecast/statecast/cmd/statecast/internal/proc"
)

// The load tool reads the server's CPU time (proc.CPU) and memory from
// /proc, raises its own file limit, and can start the server itself.

// procRSS is the resident set size of process pid in bytes (VmRSS).
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err == nil {
					return kb << 10, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no VmRSS", pid)
}

// selfCPU is the CPU time this process has used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// machineBusy is the CPU time all processes of the machine have used so
// far (user, nice and system in /proc/stat; interrupt time and guests
// excluded), or -1 when unknown.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return -1
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 4 || f[0] != "cpu" {
		return -1
	}
	var busy uint64
	for _, v := range f[1:4] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return -1
		}
		busy += n
	}
	return time.Duration(busy) * (time.Second / proc.ClockTicks)
}

// localPorts is the number of ephemeral ports (ip_local_port_range), or 0
// when unknown.
func localPorts() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || hi < lo {
		return 0
	}
	return hi - lo + 1
}

// checkCapacity makes sure this process can hold conns sockets to one
// server port (fresh ones: reconnects double that while the old ones sit
// in TIME_WAIT) and says what limits them.
func checkCapacity(conns, fresh int) error {
	limit, err := proc.RaiseNofile()
	if err != nil {
		return fmt.Errorf("cannot raise RLIMIT_NOFILE: %v", err)
	}
	if need := uint64(conns) + 64; limit < need {
		return fmt.Errorf("RLIMIT_NOFILE is %d (hard limit), too low for %d connections (need about %d): raise the hard limit (ulimit -Hn, or LimitNOFILE= in systemd)", limit, conns, need)
	}
	if p := localPorts(); p > 0 && fresh > p {
		return fmt.Errorf("%d connections to one server port need %d local ports but ip_local_port_range has %d: widen net.ipv4.ip_local_port_range", conns, fresh, p)
	}
	return nil
}

// spawned is a server process started by the load tool.
type spawned struct {
	args   []string
	cmd    *exec.Cmd
	out    *proc.Tail
	exited chan struct{}
	err    error // of Wait, set before exited is closed
}

// spawnServer starts args and waits until probe (a URL) answers 2xx. The
// process is killed if this process dies first (Pdeathsig).
func spawnServer(ctx context.Context, args []string, probe string, timeout time.Duration) (*spawned, error) {
	cmd := exec.Command(args[0], args[1:]...)
	out := proc.NewTail(16 << 10)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("spawn %s: %w", proc.Quote(args), err)
	}
	s := &spawned{args: args, cmd: cmd, out: out, exited: make(chan struct{})}
	go func() {
		s.err = cmd.Wait()
		close(s.exited)
	}()
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true}}
	deadline := time.Now().Add(timeout)
	for {
		resp, err := hc.Get(probe)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return s, nil
			}
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("%s exited before answering (%v); its output:\n%s", proc.Quote(args), s.err, out)
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("%s did not answer %s within %v; its output:\n%s", proc.Quote(args), probe, timeout, out)
		}
	}
}

// pid is the process id.
func (s *spawned) pid() int { return s.cmd.Process.Pid }

// stop sends SIGTERM and waits up to 20 s for the process to exit, then
// kills it.
func (s *spawned) stop() {
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
