package ceiling

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

const usage = `usage: statecast bench ceiling [flags]

Runs the reference broadcast server (the ceiling) that statecast bench
compare sets statecast against; compare spawns this command unless given
--ceiling-bin. Its protocol: GET /ws[?since=OFFSET] (WebSocket), POST
/publish, GET /stats. It has no auth, so it listens on loopback only. Its
flags are not read from the environment.

flags:
`

// Run serves the ceiling as args say until ctx ends, then closes it.
// Usage and the listening address go to errOut.
func Run(ctx context.Context, args []string, errOut io.Writer) error {
	fs := flag.NewFlagSet("bench ceiling", flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprint(errOut, usage)
		fs.PrintDefaults()
	}
	var cfg Config
	addr := fs.String("addr", "127.0.0.1:8001", "listen address, on loopback")
	fs.BoolVar(&cfg.Batch, "batch", false, "join the messages queued for a socket into one frame, separated by \\n")
	fs.IntVar(&cfg.History, "history", 100_000, "messages retained for ?since=")
	fs.IntVar(&cfg.Queue, "queue", 10_000, "messages queued for a socket before it is closed as too slow")
	fs.IntVar(&cfg.MaxFrame, "max-frame", 1<<20, "bytes of a batch at most (statecast's frames: 65536)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench ceiling: unexpected argument %q", fs.Arg(0))
	}
	if cfg.History < 1 || cfg.Queue < 1 || cfg.MaxFrame < 1 {
		return errors.New("bench ceiling: --history, --queue and --max-frame must be at least 1")
	}
	host, _, err := net.SplitHostPort(*addr)
	if ip := net.ParseIP(host); err != nil || host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("bench ceiling: --addr %q: want a loopback HOST:PORT (the ceiling has no auth)", *addr)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	s := New(cfg)
	hs := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(errOut, "ceiling: listening on http://%s (batch %v, history %d, queue %d, max frame %d)\n", ln.Addr(), cfg.Batch, cfg.History, cfg.Queue, cfg.MaxFrame)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	select {
	case err := <-served:
		s.Close()
		return err
	case <-ctx.Done():
	}
	// The sockets first: Shutdown does not wait for hijacked connections.
	s.Close()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = hs.Shutdown(sctx)
	<-served // http.ErrServerClosed
	return err
}
