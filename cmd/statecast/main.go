// Command statecast runs a statecast server (serve) and talks to one over
// HTTP like etcdctl does for etcd (get, put, del, watch).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/statecast/statecast/cmd/statecast/bench"
)

const usage = `statecast: realtime shared state in rooms

usage:
  statecast serve [flags]                      run a server (default: file store in ./data, 127.0.0.1:8080)
  statecast get ROOM [KEY] [--prefix P]        read a key, or the keys under a prefix
  statecast put ROOM KEY VALUE [--if-rev N] [--lease-ttl D]
  statecast del ROOM KEY [--if-rev N]
  statecast watch ROOM [--prefix P] [--from N] print every change, from revision N on
  statecast bench SCENARIO [flags]             load a running server: fanout, rooms, idle, resume, storm, writes, attack, scale
  statecast bench compare SCENARIO [flags]     run a scenario against the reference server (the ceiling), then statecast
  statecast bench ceiling [--addr HOST:PORT]   run the reference broadcast server the figures are set against
  statecast healthcheck [--addr HOST:PORT]     exit 0 if the local server answers /healthz (container health check)
  statecast backup [--url URL] FILE            save a consistent backup of a running server's store
  statecast restore --store STORE FILE         restore a backup into an empty store (server stopped)
  statecast migrate --from STORE --to STORE    copy every room, keeping epochs (e.g. file:./data to redis://host:6379/0)

Every flag can also be set by environment (STATECAST_ plus the flag name in
upper case with - as _, e.g. STATECAST_ADDR). The client commands talk to
--url (or STATECAST_URL, default http://127.0.0.1:8080).
Run "statecast COMMAND -h" for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	cmd, args := os.Args[1], os.Args[2:]
	var err error
	switch cmd {
	case "serve":
		err = serve(args)
	case "get", "put", "del", "watch":
		err = runClient(cmd, args, os.Stdout)
	case "bench":
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		err = bench.Run(ctx, args, os.Stdout, os.Stderr)
		stop()
	case "healthcheck":
		err = healthcheck(args)
	case "backup", "restore", "migrate":
		err = runBackupCmd(cmd, args)
	case "webhook-receiver": // hidden: a receiver for the tests and figures
		err = webhookReceiver(args)
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "statecast: unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "statecast:", err)
		os.Exit(1)
	}
}
