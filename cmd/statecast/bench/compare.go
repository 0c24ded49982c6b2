package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/statecast/statecast/cmd/statecast/internal/proc"
)

// runCompare runs one scenario against the ceiling, then against
// statecast, each spawned on a free loopback port and stopped after its
// run, and prints both figures with their ratio.
func runCompare(ctx context.Context, args []string, out, errOut io.Writer) error {
	cfg, err := parseFlags(args, true, errOut)
	if err != nil {
		return err
	}
	// Both servers are this executable unless given: statecast bench
	// ceiling and statecast serve.
	ceilingCmd, statecastBin := []string{cfg.ceilingBin}, cfg.statecastBin
	if cfg.ceilingBin == "" || statecastBin == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench compare: %w: give --ceiling-bin and --statecast-bin", err)
		}
		if cfg.ceilingBin == "" {
			ceilingCmd = []string{self, "bench", "ceiling"}
		}
		if statecastBin == "" {
			statecastBin = self
		}
	}
	ceilingExtra, err := optionalCommand(cfg.ceilingArgs)
	if err != nil {
		return err
	}
	statecastExtra, err := optionalCommand(cfg.statecastArgs)
	if err != nil {
		return err
	}
	logf := func(format string, a ...any) { fmt.Fprintf(errOut, "bench: "+format+"\n", a...) }
	history := strconv.Itoa(max(20000, 2*cfg.events))
	cmp := &comparison{Scenario: cfg.scenario, Command: "statecast bench compare " + proc.Quote(cfg.args)}

	if cfg.scenario == "rooms" {
		cmp.CeilingErr = "the ceiling has no rooms"
	} else {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		spawn := append(append(ceilingCmd, "-addr", addr, "-batch", "-history", history), ceilingExtra...)
		cmp.Ceiling, err = runTarget(ctx, cfg, "ceiling", "http://"+addr, 0, spawn, logf)
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			cmp.CeilingErr = err.Error()
			logf("%v", err)
		}
		// Let sockets and the machine settle before the next server.
		if err := sleepCtx(ctx, 2*time.Second); err != nil {
			return err
		}
	}

	port, err := freePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	spawn := append([]string{statecastBin, "serve", "--store", "memory", "--addr", addr,
		"--history", history, "--write-rate", "1000000", "--log-level", "warn"}, statecastExtra...)
	cmp.Statecast, err = runTarget(ctx, cfg, "statecast", "http://"+addr, 0, spawn, logf)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		cmp.StatecastErr = err.Error()
		logf("%v", err)
	}
	cmp.ratios()
	if cfg.json {
		b, err := json.Marshal(cmp)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(out, "%s\n", b)
		return err
	}
	printComparison(out, cmp)
	if cmp.Ceiling == nil && cmp.Statecast == nil {
		return errors.New("bench compare: both runs failed")
	}
	return nil
}

func optionalCommand(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	return proc.Split(s)
}

// comparison is one scenario run against both servers.
type comparison struct {
	Scenario     string             `json:"scenario"`
	Command      string             `json:"command"`
	Ceiling      *result            `json:"ceiling,omitempty"`
	Statecast    *result            `json:"statecast,omitempty"`
	CeilingErr   string             `json:"ceiling_error,omitempty"`
	StatecastErr string             `json:"statecast_error,omitempty"`
	Ratios       map[string]float64 `json:"ratios,omitempty"` // statecast / ceiling, by row name
}

// compareRow is one figure of both runs.
type compareRow struct {
	name                string
	ceiling, statecast  *figure
	ratio               float64
	hasRatio, bothEqual bool
}

func rowsByName(r *result) map[string]*figure {
	m := map[string]*figure{}
	if r == nil {
		return m
	}
	rows := r.rows()
	for i := range rows {
		m[rows[i].name] = &rows[i]
	}
	return m
}

// table lines up the rows of both results: statecast's order, then the
// ceiling's rows statecast lacks.
func (c *comparison) table() []compareRow {
	cm, sm := rowsByName(c.Ceiling), rowsByName(c.Statecast)
	var names []string
	seen := map[string]bool{}
	for _, r := range []*result{c.Statecast, c.Ceiling} {
		if r == nil {
			continue
		}
		for _, row := range r.rows() {
			if !seen[row.name] {
				seen[row.name] = true
				names = append(names, row.name)
			}
		}
	}
	var out []compareRow
	for _, n := range names {
		row := compareRow{name: n, ceiling: cm[n], statecast: sm[n]}
		if row.ceiling != nil && row.statecast != nil {
			switch {
			case row.ceiling.v != 0:
				row.ratio, row.hasRatio = row.statecast.v/row.ceiling.v, true
			case row.statecast.v == 0:
				row.bothEqual = true
			}
		}
		out = append(out, row)
	}
	return out
}

func (c *comparison) ratios() {
	for _, row := range c.table() {
		if row.hasRatio {
			if c.Ratios == nil {
				c.Ratios = map[string]float64{}
			}
			c.Ratios[row.name] = row.ratio
		}
	}
}

func printComparison(out io.Writer, c *comparison) {
	fmt.Fprintf(out, "$ %s\n", c.Command)
	for _, r := range []*result{c.Ceiling, c.Statecast} {
		if r != nil {
			fmt.Fprintf(out, "%-9s  %s (pid %d)\n", r.Target+":", r.ServerCmd, r.ServerPID)
		}
	}
	fmt.Fprintln(out)
	t := [][]string{{c.Scenario, "ceiling", "statecast", "statecast/ceiling"}}
	for _, row := range c.table() {
		cell := func(r *figure) string {
			if r == nil {
				return "-"
			}
			return fmtValue(*r)
		}
		ratio := "-"
		switch {
		case row.hasRatio:
			ratio = strconv.FormatFloat(row.ratio, 'f', 2, 64)
		case row.bothEqual:
			ratio = "="
		}
		t = append(t, []string{row.name, cell(row.ceiling), cell(row.statecast), ratio})
	}
	printTable(out, t)
	if c.CeilingErr != "" {
		fmt.Fprintf(out, "ceiling: %s\n", c.CeilingErr)
	}
	if c.StatecastErr != "" {
		fmt.Fprintf(out, "statecast: %s\n", c.StatecastErr)
	}
	for _, r := range []*result{c.Ceiling, c.Statecast} {
		if r != nil {
			printNotes(out, r)
		}
	}
}
