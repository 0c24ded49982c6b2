package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/statecast/statecast/client"
	"github.com/statecast/statecast/cmd/statecast/internal/flags"
	"github.com/statecast/statecast/server/wire"
)

// The client commands talk to a server over its HTTP API, like etcdctl:
// get, put and del are one request each; watch streams Server-Sent Events
// until interrupted.

var cliUsage = map[string]string{
	"get":   "statecast get ROOM [KEY] [--prefix P] [--filter EXPR] [--consistency l|s] [-w json]",
	"put":   "statecast put ROOM KEY VALUE [--if-rev N] [--lease-ttl D] [-w json]",
	"del":   "statecast del ROOM KEY [--if-rev N] [-w json]",
	"watch": "statecast watch ROOM [--prefix P]... [--key K]... [--filter EXPR] [--from N] [-v] [-w json]",
}

// runClient runs a client command until it is done or, for watch and put
// --lease-ttl, until interrupted (SIGINT, SIGTERM).
func runClient(cmd string, args []string, out io.Writer) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runClientCtx(ctx, cmd, args, out, os.Stderr)
}

// cliFlags are the flags of every client command.
type cliFlags struct {
	url, token, output string
	filter             string
	prefixes, keys     flags.List
	ifRev              optUint
	leaseTTL           time.Duration
	from               uint64
	verbose            bool
	consistency        string
}

// runClientCtx is runClient with the context that ends long-running
// commands (tests cancel it) and the stream for notices.
func runClientCtx(ctx context.Context, cmd string, args []string, out, errOut io.Writer) error {
	var f cliFlags
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(errOut)
	fs.Usage = func() {
		fmt.Fprintf(errOut, "usage: %s\n", cliUsage[cmd])
		fs.PrintDefaults()
	}
	fs.StringVar(&f.url, "url", "http://127.0.0.1:8080", "server URL")
	fs.StringVar(&f.token, "token", "", "bearer token (JWT)")
	fs.StringVar(&f.output, "w", "simple", "output format: simple or json")
	switch cmd {
	case "get":
		fs.Var(&f.prefixes, "prefix", "list the keys under this prefix")
		fs.StringVar(&f.filter, "filter", "", "list only the keys whose value passes this CEL expression, e.g. 'value.players < value.max'")
		fs.StringVar(&f.consistency, "consistency", "l", "l (linearizable: every write acknowledged before, on any node) or s (serializable: this node's view at once)")
	case "put":
		fs.Var(&f.ifRev, "if-rev", "write only if the key's mod_rev is N (0: only if it does not exist)")
		fs.DurationVar(&f.leaseTTL, "lease-ttl", 0, "bind the key to a lease of this TTL, kept alive until interrupted")
	case "del":
		fs.Var(&f.ifRev, "if-rev", "delete only if the key's mod_rev is N")
	case "watch":
		fs.Var(&f.prefixes, "prefix", "watch only keys under this prefix (repeatable)")
		fs.Var(&f.keys, "key", "watch this exact key, not the keys it starts (repeatable)")
		fs.StringVar(&f.filter, "filter", "", "watch only the keys whose value passes this CEL expression (keys entering and leaving it live)")
		fs.Uint64Var(&f.from, "from", 0, "start at revision N: replay what followed, then live (0: current state, then live)")
		fs.BoolVar(&f.verbose, "v", false, "also print progress marks")
	default:
		return fmt.Errorf("unknown command %q", cmd)
	}
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := flags.FromEnv(fs); err != nil {
		return err
	}
	if f.output != "simple" && f.output != "json" {
		return fmt.Errorf("-w %q: want simple or json", f.output)
	}
	if len(pos) == 0 {
		return fmt.Errorf("usage: %s", cliUsage[cmd])
	}
	switch f.consistency {
	case "", "l", "linearizable", "s", "serializable":
	default:
		return fmt.Errorf("--consistency %q: want l or s", f.consistency)
	}
	base := f.url
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	c := &cli{h: &client.HTTP{URL: base, Token: f.token}, f: &f, out: out, errOut: errOut, json: f.output == "json"}
	switch cmd {
	case "get":
		err = c.get(ctx, pos)
	case "put":
		err = c.put(ctx, pos)
	case "del":
		err = c.del(ctx, pos)
	case "watch":
		err = c.watch(ctx, pos)
	}
	return plainError(err)
}

// parseInterspersed parses flags wherever they are among the positional
// arguments (etcdctl style: "get ROOM --prefix p/"); everything after "--"
// is positional, so a VALUE starting with '-' goes after "--".
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if n := len(args) - len(rest); n > 0 && args[n-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// optUint is an unsigned integer flag that knows whether it was given
// (--if-rev 0 means "must not exist", not "no condition").
type optUint struct{ v *uint64 }

func (o *optUint) String() string {
	if o.v == nil {
		return ""
	}
	return strconv.FormatUint(*o.v, 10)
}

func (o *optUint) Set(s string) error {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return errors.New("want an unsigned integer")
	}
	o.v = &n
	return nil
}

// plainError makes a transport failure a one-liner: "cannot reach URL:
// connection refused" rather than the whole request description.
func plainError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) && !errors.Is(err, context.Canceled) {
		u, _ := url.Parse(ue.URL)
		host := ue.URL
		if u != nil {
			host = u.Scheme + "://" + u.Host
		}
		return fmt.Errorf("cannot reach %s: %v", host, ue.Err)
	}
	return err
}

type cli struct {
	h      *client.HTTP
	f      *cliFlags
	out    io.Writer
	errOut io.Writer
	json   bool
}

func (c *cli) args(pos []string, lo, hi int, cmd string) error {
	if len(pos) < lo || len(pos) > hi {
		return fmt.Errorf("usage: %s", cliUsage[cmd])
	}
	return nil
}

// printJSON prints v on one line, values' text untouched.
func (c *cli) printJSON(v any) error {
	enc := json.NewEncoder(c.out)
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

func (c *cli) readOptions() client.ReadOptions {
	return client.ReadOptions{Serializable: c.f.consistency == "s" || c.f.consistency == "serializable"}
}

func (c *cli) get(ctx context.Context, pos []string) error {
	if err := c.args(pos, 1, 2, "get"); err != nil {
		return err
	}
	room := pos[0]
	if len(pos) == 2 {
		if len(c.f.prefixes) > 0 || c.f.filter != "" {
			return errors.New("get: give a KEY, or --prefix and --filter, not both")
		}
		it, _, err := c.h.GetWith(ctx, room, pos[1], c.readOptions())
		if err != nil {
			return err
		}
		if c.json {
			return c.printJSON(it)
		}
		_, err = fmt.Fprintf(c.out, "%s\n", it.Value)
		return err
	}
	if len(c.f.prefixes) > 1 {
		return errors.New("get: give one --prefix")
	}
	prefix := ""
	if len(c.f.prefixes) == 1 {
		prefix = c.f.prefixes[0]
	}
	ro := c.readOptions()
	ro.Filter = c.f.filter
	l, err := c.h.ListWith(ctx, room, prefix, ro)
	if err != nil {
		return err
	}
	if c.json {
		return c.printJSON(l)
	}
	sort.Slice(l.Items, func(i, j int) bool { return l.Items[i].Key < l.Items[j].Key })
	for _, it := range l.Items {
		if _, err := fmt.Fprintf(c.out, "%s = %s\n", it.Key, it.Value); err != nil {
			return err
		}
	}
	return nil
}

// parseValue reads VALUE as JSON when it is JSON, else as a string, so that
// "put r k hello" stores "hello" and "put r k 42" stores 42.
func parseValue(s string) json.RawMessage {
	if json.Valid([]byte(s)) {
		return json.RawMessage(s)
	}
	b, _ := json.Marshal(s) // a string always marshals
	return b
}

func (c *cli) printRev(rev uint64) error {
	if c.json {
		return c.printJSON(map[string]uint64{"rev": rev})
	}
	_, err := fmt.Fprintln(c.out, rev)
	return err
}

func (c *cli) put(ctx context.Context, pos []string) error {
	if err := c.args(pos, 3, 3, "put"); err != nil {
		return err
	}
	room, key, value := pos[0], pos[1], parseValue(pos[2])
	if c.f.leaseTTL == 0 {
		rev, err := c.h.Put(ctx, room, key, value, c.f.ifRev.v, "")
		if err != nil {
			return err
		}
		return c.printRev(rev)
	}
	ttl := c.f.leaseTTL
	id, err := c.h.GrantLease(ctx, ttl)
	if err != nil {
		return err
	}
	// From here on the lease is ours to end, whatever happens.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := c.h.Revoke(rctx, id); err != nil && !errors.Is(err, client.ErrNotFound) {
			fmt.Fprintf(c.errOut, "statecast: revoking lease %s: %v (its keys go when its TTL runs out)\n", id, plainError(err))
		}
	}()
	rev, err := c.h.Put(ctx, room, key, value, c.f.ifRev.v, id)
	if err != nil {
		return err
	}
	if err := c.printRev(rev); err != nil {
		return err
	}
	fmt.Fprintf(c.errOut, "statecast: lease %s (TTL %v) kept alive until interrupted; Ctrl-C revokes it and deletes %q\n", id, ttl, key)
	// Keep alive at a third of the TTL so that one lost request is not
	// fatal.
	t := time.NewTicker(max(ttl/3, 100*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if err := c.h.KeepAlive(ctx, id); err != nil && ctx.Err() == nil {
			if errors.Is(err, client.ErrNotFound) {
				return fmt.Errorf("lease %s ended (not kept alive in time); %q was deleted", id, key)
			}
			fmt.Fprintf(c.errOut, "statecast: keepalive: %v\n", plainError(err))
		}
	}
}

func (c *cli) del(ctx context.Context, pos []string) error {
	if err := c.args(pos, 2, 2, "del"); err != nil {
		return err
	}
	rev, err := c.h.Delete(ctx, pos[0], pos[1], c.f.ifRev.v)
	if err != nil {
		return err
	}
	return c.printRev(rev)
}

// watch prints every change until interrupted; the client reconnects a
// broken stream after its last revision, so the output has no gap.
func (c *cli) watch(ctx context.Context, pos []string) error {
	if err := c.args(pos, 1, 1, "watch"); err != nil {
		return err
	}
	err := c.h.WatchWith(ctx, pos[0], client.WatchOptions{Prefixes: c.f.prefixes, Keys: c.f.keys, Filter: c.f.filter, From: c.f.from}, c.printEvent)
	if ctx.Err() != nil {
		return nil // interrupted: the normal end of a watch
	}
	return err
}

func (c *cli) printEvent(ev client.SSEEvent) error {
	if c.json {
		if ev.Event == "progress" && !c.f.verbose {
			return nil
		}
		return c.printJSON(struct {
			ID    string          `json:"id,omitempty"`
			Event string          `json:"event"`
			Data  json.RawMessage `json:"data"`
		}{ev.ID, ev.Event, ev.Data})
	}
	m, err := ev.Message()
	if err != nil {
		return err
	}
	var b strings.Builder
	switch m.T {
	case wire.TEvents:
		writeEvents(&b, m.Events)
	case wire.TCoalesced:
		fmt.Fprintf(&b, "%d COALESCED\n", m.Rev)
		writeEvents(&b, m.Events)
	case wire.TSnapshot:
		fmt.Fprintf(&b, "%d RESET (%s, %d keys)\n", m.Rev, m.Reason, len(m.Items))
		for _, it := range m.Items {
			fmt.Fprintf(&b, "  %s = %s\n", it.Key, it.Value)
		}
	case wire.TSynced:
		fmt.Fprintf(&b, "%d SYNCED\n", m.Rev)
	case wire.TProgress:
		if c.f.verbose {
			fmt.Fprintf(&b, "%d PROGRESS\n", m.Rev)
		}
	case wire.TErr:
		// The server ends the stream after this; Watch reconnects.
		fmt.Fprintf(c.errOut, "statecast: watch: %s: %s (reconnecting)\n", m.Code, m.Message)
	}
	_, err = io.WriteString(c.out, b.String())
	return err
}

// writeEvents prints each event at its own revision (a coalesced
// message's events have their own mod_revs).
func writeEvents(b *strings.Builder, evs []wire.Event) {
	for _, ev := range evs {
		if ev.Type != "put" {
			fmt.Fprintf(b, "%d %s %s\n", ev.ModRev, strings.ToUpper(ev.Type), ev.Key) // DELETE, or LEAVE (a filtered watch)
		} else {
			fmt.Fprintf(b, "%d PUT %s = %s\n", ev.ModRev, ev.Key, ev.Value)
		}
	}
}
