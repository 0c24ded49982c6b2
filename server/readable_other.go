//go:build !linux || 386

package server

// waitReadable returns at once: the reader waits inside the websocket
// read (a larger idle stack; see readable_linux.go).
func (c *conn) waitReadable() {}
