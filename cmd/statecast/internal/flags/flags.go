// Package flags holds what the statecast subcommands share in parsing their
// flags: defaults from the environment and a repeatable list flag.
package flags

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// FromEnv sets every flag of fs not given on the command line from
// STATECAST_<NAME> in the environment, so each flag is also settable by
// environment. It runs after Parse and reports bad values like Parse does.
func FromEnv(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] || err != nil {
			return
		}
		name := "STATECAST_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %v", name, v, e)
			}
		}
	})
	return err
}

// List is a repeatable flag that also splits on commas.
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

func (l *List) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
