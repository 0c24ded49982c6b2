//go:build !linux || 386

package server

import "net"

// waitReadable returns at once: the reader waits inside the websocket
// read (a larger idle stack; see readable_linux.go).
func waitReadable(net.Conn) {}
