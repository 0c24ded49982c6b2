//go:build !linux || 386

package server

import "errors"

// readBufferSize: without readAhead the websocket read fills its buffer
// from the socket, a few requests a syscall.
const readBufferSize = 512

// waitReadable returns at once: the reader waits inside the websocket
// read (a larger idle stack, and a goroutine; see readable_linux.go).
func (c *conn) waitReadable() (parked bool) { return false }

// idlePoller exists on Linux only (poller_linux.go).
type idlePoller struct{}

func newIdlePoller() (*idlePoller, error) {
	return nil, errors.New("no idle poller on this platform")
}

func (p *idlePoller) stop()        {}
func (p *idlePoller) forget(*conn) {}
