package server

import (
	"net/http"
	"testing"
)

// CheckedByOpenAPI serves h, checking every request and answer against
// openapi.json (openapi_test.go), for the tests of package server_test.
func CheckedByOpenAPI(t testing.TB, h http.Handler) http.Handler { return checkedByOpenAPI(t, h) }
