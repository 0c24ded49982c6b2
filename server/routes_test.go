package server

import (
	"testing"

	"github.com/statecast/statecast/server/wire"
)

// TestErrorStatusTable: every error code answers with its HTTP status,
// and every status the router, a middleware or the WebSocket upgrade
// raises gets a code, both read from the one table.
func TestErrorStatusTable(t *testing.T) {
	statuses := map[string]int{
		wire.CodeBadRequest: 400, wire.CodeInvalidRoom: 400, wire.CodeInvalidKey: 400, wire.CodeInvalidValue: 400,
		wire.CodeUnauthorized: 401, wire.CodeForbidden: 403, wire.CodeNotFound: 404, wire.CodeConflict: 412,
		wire.CodeTooLarge: 413, wire.CodeRateLimited: 429, wire.CodeInternal: 500, wire.CodeTooManySubs: 429, wire.CodeInvalidFilter: 400,
		wire.CodeUnavailable: 503, wire.CodeOutcomeUnknown: 504, wire.CodeWidReused: 422,
	}
	for code, want := range statuses {
		if got := statusOf(&Error{Code: code}); got != want {
			t.Errorf("statusOf(%s) = %d, want %d", code, got, want)
		}
	}
	codes := map[int]string{
		400: wire.CodeBadRequest, 415: wire.CodeBadRequest, 401: wire.CodeUnauthorized, 403: wire.CodeForbidden,
		404: wire.CodeNotFound, 405: wire.CodeNotFound, 412: wire.CodeConflict, 413: wire.CodeTooLarge,
		426: wire.CodeInternal, 429: wire.CodeRateLimited, 500: wire.CodeInternal, 503: wire.CodeUnavailable,
		504: wire.CodeOutcomeUnknown,
	}
	for status, want := range codes {
		if got := codeForStatus(status); got != want {
			t.Errorf("codeForStatus(%d) = %s, want %s", status, got, want)
		}
	}
}
