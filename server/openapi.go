package server

import (
	_ "embed"
	"net/http"
	"slices"

	"github.com/labstack/echo/v4"
)

// openAPI is the OpenAPI 3.1 description of the HTTP API, served at
// /v1/openapi.json. Every test server checks every request the tests send
// and every answer they get against it (servertest.CheckOpenAPI), so it
// cannot drift.
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the OpenAPI 3.1 description of the HTTP API, as served
// at /v1/openapi.json.
func OpenAPI() []byte { return slices.Clone(openAPI) }

func handleOpenAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPI)
}
