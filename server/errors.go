package server

import (
	"context"
	"errors"
	"fmt"

	"github.com/statecast/statecast/rooms"
	"github.com/statecast/statecast/rooms/filter"
	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// Error is a protocol error: a code from the table and a message safe to
// show a user. HTTP handlers map Code to a status.
type Error struct {
	Code    string
	Message string
	Key     string // conflict: the failing key; not_found: the missing key
	ModRev  uint64 // conflict: its current mod_rev
	Rev     uint64 // conflict: the room's head
	Epoch   string // conflict: the epoch of ModRev and Rev (HTTP: a header)
	// invalid_filter: where in the expression (from 1; 0 = not known)
	Line, Column int
	// cause: the failure behind an internal, unavailable or
	// outcome_unknown error, for the log (never sent).
	cause error
}

func (e *Error) Error() string { return e.Message }

func newError(code, msg string) *Error { return &Error{Code: code, Message: msg} }

// causedBy records err as e's cause, for the log.
func causedBy(err error, e *Error) *Error {
	e.cause = err
	return e
}

// errorOf maps an error from the store, the engine or a handler to a
// protocol error. A write that failed for a reason not known to leave the
// store untouched is reported as outcome_unknown, never as not applied.
func errorOf(err error, write bool) *Error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	var qe *store.QuotaError
	if errors.As(err, &qe) {
		return newError(wire.CodeQuotaExceeded, fmt.Sprintf("the room is full: the write would make it %d keys and %d bytes of keys and values, over its quota of %d keys and %d bytes; nothing was written (delete keys first)",
			qe.Keys, qe.Bytes, qe.MaxKeys, qe.MaxBytes))
	}
	var ce *store.ConflictError
	if errors.As(err, &ce) {
		return &Error{Code: wire.CodeConflict, Message: ce.Error(), Key: ce.Key, ModRev: ce.ModRev, Rev: ce.Rev, Epoch: ce.Epoch}
	}
	var re *store.WidReusedError
	if errors.As(err, &re) {
		return &Error{Code: wire.CodeWidReused, Rev: re.Rev, Message: fmt.Sprintf(
			"this write id already committed at revision %d with other conditions or operations; nothing was written (a resend must repeat the write exactly; a new write needs a new id)", re.Rev)}
	}
	var ke *store.KeyNotFoundError
	if errors.As(err, &ke) {
		return &Error{Code: wire.CodeNotFound, Message: ke.Error(), Key: ke.Key}
	}
	if fe, ok := filter.AsError(err); ok {
		return &Error{Code: wire.CodeInvalidFilter, Message: fe.Error(), Line: fe.Line, Column: fe.Column}
	}
	switch {
	case errors.Is(err, store.ErrInvalidRoom):
		return newError(wire.CodeInvalidRoom, err.Error())
	case errors.Is(err, store.ErrInvalidKey), errors.Is(err, store.ErrDuplicateKey):
		return newError(wire.CodeInvalidKey, err.Error())
	case errors.Is(err, store.ErrValueTooLarge), errors.Is(err, store.ErrTooManyOps):
		return newError(wire.CodeTooLarge, err.Error())
	case errors.Is(err, store.ErrInvalidOp), errors.Is(err, store.ErrEmptyWrite), errors.Is(err, store.ErrCrossRoom),
		errors.Is(err, store.ErrInvalidWid):
		return newError(wire.CodeBadRequest, err.Error())
	case errors.Is(err, store.ErrWidCompacted):
		return newError(wire.CodeOutcomeUnknown, "wid not found, and the room's history since the revision given in since has been compacted: "+
			"whether the write was applied before cannot be told; it was not applied now")
	case errors.Is(err, store.ErrClosed), errors.Is(err, rooms.ErrClosed):
		return newError(wire.CodeUnavailable, "server is shutting down")
	case errors.Is(err, rooms.ErrFilterTooSlow):
		return filterTooSlow()
	case errors.Is(err, rooms.ErrTooManyFilters):
		return newError(wire.CodeTooManySubs, "this room is watched with as many distinct filters as it serves (--max-room-filters); use a filter already in use, or none")
	case errors.Is(err, rooms.ErrUnsynced):
		return newError(wire.CodeUnavailable, "this node could not catch up with the store in time; retry")
	case errors.Is(err, store.ErrUnavailable):
		return causedBy(err, newError(wire.CodeUnavailable, "the store is unreachable; nothing was written"))
	case write && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		return causedBy(err, newError(wire.CodeOutcomeUnknown, "the store did not confirm the write in time; it may or may not have been applied"))
	case write:
		return causedBy(err, newError(wire.CodeOutcomeUnknown, "the store failed while writing; the write may or may not have been applied"))
	}
	return causedBy(err, newError(wire.CodeInternal, "internal error"))
}

// filterTooSlow is what a watch learns when its filter took longer than
// the room's time budget to evaluate (rooms.ErrFilterTooSlow).
func filterTooSlow() *Error {
	return newError(wire.CodeRateLimited, fmt.Sprintf("the filter took longer than its time budget to evaluate in this room; "+
		"it is refused here for %s: simplify it", rooms.FilterBanTime))
}
