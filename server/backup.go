package server

import (
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/statecast/statecast/server/wire"
	"github.com/statecast/statecast/store"
)

// handleBackup streams a backup of the store (docs/BACKUP.md), with the
// inspector's admin rights. Once the first byte is sent the status cannot
// change: a backup that fails halfway ends without its trailer, which a
// reader refuses.
func (s *Server) handleBackup(c echo.Context) error {
	if err := s.checkAdmin(c.Request()); err != nil {
		return err
	}
	ex, ok := s.store.(store.Exporter)
	if !ok {
		return newError(wire.CodeBadRequest, "this store cannot be backed up")
	}
	h := ex.BackupHeader()
	h.Time = time.Now().UTC()
	resp := c.Response()
	resp.Header().Set(echo.HeaderContentType, "application/x-ndjson")
	resp.Header().Set(echo.HeaderCacheControl, "no-store")
	resp.WriteHeader(http.StatusOK)
	bw, err := store.NewBackupWriter(resp, h)
	if err == nil {
		err = ex.Export(c.Request().Context(), bw.Room)
	}
	if err == nil {
		err = bw.Close()
	}
	if err != nil {
		s.log.Error("backup failed", "err", err, "rooms", bw.Rooms())
	}
	return nil
}
