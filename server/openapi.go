package server

import (
	_ "embed"
	"net/http"

	"github.com/labstack/echo/v4"
)

// openAPI is the OpenAPI 3.1 description of the HTTP API, served at
// /v1/openapi.json. The tests check every request they send and every
// answer they get against it (openapi_test.go), so it cannot drift.
//
//go:embed openapi.json
var openAPI []byte

func handleOpenAPI(c echo.Context) error {
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPI)
}
