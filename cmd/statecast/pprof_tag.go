//go:build pprof

package main

// A build for profiling (go build -tags pprof): STATECAST_PPROF=ADDR
// serves net/http/pprof there. Left out of release builds, so that no
// flag can expose it by mistake.

import (
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	if addr := os.Getenv("STATECAST_PPROF"); addr != "" {
		go func() { _ = http.ListenAndServe(addr, nil) }()
	}
}
