package server

import (
	"net/http"
	"testing"

	"github.com/statecast/statecast/server/internal/openapicheck"
)

// CheckedByOpenAPI serves h, checking every request and answer against
// openapi.json (openapicheck), for the tests of package server_test.
func CheckedByOpenAPI(t testing.TB, h http.Handler) http.Handler {
	return openapicheck.Handler(t, loadOpenAPI(t), h)
}
