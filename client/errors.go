package client

import (
	"errors"
	"fmt"

	"github.com/coder/websocket"

	"github.com/statecast/statecast/server/wire"
)

// Error is an error the server answered with: an err message on the
// WebSocket, or an HTTP error body. Code is one of the wire.Code*
// constants; Key, ModRev and Rev are set for conflicts.
type Error struct {
	Code    string
	Message string
	Key     string // conflict: the key whose condition failed
	ModRev  uint64 // conflict: its current mod_rev (0 = absent)
	Rev     uint64 // conflict: the room's revision
	Status  int    // HTTP API only: the response status
	// invalid_filter: where in the expression the fault is (from 1)
	Line, Column int
}

func (e *Error) Error() string {
	if e.Code == wire.CodeConflict && e.Key != "" {
		// The one error a user is expected to act on: say what is there.
		if e.ModRev == 0 {
			return fmt.Sprintf("conflict: key %q does not exist", e.Key)
		}
		return fmt.Sprintf("conflict: key %q has mod_rev %d", e.Key, e.ModRev)
	}
	if e.Message == "" {
		return e.Code
	}
	return e.Code + ": " + e.Message
}

// Is matches the sentinel errors below by code, so that
// errors.Is(err, client.ErrConflict) holds for every conflict.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Sentinels for errors.Is, one per error code callers commonly branch on.
var (
	ErrBadRequest   = &Error{Code: wire.CodeBadRequest}
	ErrInvalidValue = &Error{Code: wire.CodeInvalidValue}
	ErrConflict     = &Error{Code: wire.CodeConflict}
	ErrUnauthorized = &Error{Code: wire.CodeUnauthorized}
	ErrForbidden    = &Error{Code: wire.CodeForbidden}
	ErrNotFound     = &Error{Code: wire.CodeNotFound}
	ErrRateLimited  = &Error{Code: wire.CodeRateLimited}
	ErrUnavailable  = &Error{Code: wire.CodeUnavailable}
	// ErrOutcomeUnknown: the write may or may not have been applied
	// (PROTOCOL.md §4). It matches both the server's outcome_unknown reply
	// and a write whose reply was lost with its connection or given up on
	// by its context. Re-read, or repeat it only as a conditional write.
	ErrOutcomeUnknown = &Error{Code: wire.CodeOutcomeUnknown}
)

var (
	// ErrClosed: the connection has ended; Err says how.
	ErrClosed = errors.New("client: connection closed")
	// ErrUnsubscribed: the subscription was ended by Unsubscribe.
	ErrUnsubscribed = errors.New("client: unsubscribed")
)

// CloseCode returns the WebSocket close status carried by err (as from
// Conn.Err, Dial, or a request that failed with its connection), or -1.
func CloseCode(err error) int {
	return int(websocket.CloseStatus(err))
}

func errorFromMessage(m *wire.Message) *Error {
	return &Error{Code: m.Code, Message: m.Message, Key: m.Key, ModRev: m.ModRev, Rev: m.Rev, Line: m.Line, Column: m.Column}
}
